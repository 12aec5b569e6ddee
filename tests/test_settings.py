"""Settings: flags over FLEETPROF_* environment over defaults; secrets only from the environment or a file."""

from pathlib import Path

from fleetprof.settings import Settings


def test_defaults_are_loopback_and_embedded(monkeypatch, tmp_path):
    for name in ("FLEETPROF_KAFKA", "FLEETPROF_CLICKHOUSE", "FLEETPROF_API", "FLEETPROF_KAFKA_SECURITY_PROTOCOL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FLEETPROF_DATA_DIR", str(tmp_path))
    s = Settings()
    assert s.kafka == "127.0.0.1:9092" and s.api == "127.0.0.1:7474"
    assert s.clickhouse_dsn == f"chdb://{tmp_path / 'chdb'}" and s.is_embedded_store
    assert s.kafka_is_local


def test_kafka_security_comes_from_the_environment(monkeypatch, tmp_path):
    secret = tmp_path / "pw"
    secret.write_text("s3cret\n")
    monkeypatch.setenv("FLEETPROF_KAFKA", "kafka.example:9093")
    monkeypatch.setenv("FLEETPROF_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("FLEETPROF_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("FLEETPROF_KAFKA_SASL_USERNAME", "agent")
    monkeypatch.setenv("FLEETPROF_KAFKA_SASL_PASSWORD_FILE", str(secret))
    s = Settings()
    assert not s.kafka_is_local
    assert s.kafka_config() == {"bootstrap.servers": "kafka.example:9093", "security.protocol": "SASL_SSL",
                                "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "agent",
                                "sasl.password": "s3cret"}


def test_a_server_url_replaces_the_embedded_store(monkeypatch):
    monkeypatch.setenv("FLEETPROF_CLICKHOUSE", "https://ch.example:8443")
    s = Settings(data_dir=Path("/nonexistent"))
    assert s.clickhouse_dsn == "https://ch.example:8443" and not s.is_embedded_store
