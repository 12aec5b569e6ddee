"""Settings: flags over FLEETPROF_* environment over the config file over defaults; secrets only from the
environment, a file it names, or the config file."""

from pathlib import Path

import click
import pytest

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


# ---- the config file (--config / FLEETPROF_CONFIG) ----------------------------------------------------------------

SECRET = "cfg-s3cret-91ab"
CONFIG_TEXT = f"""
[kafka]
bootstrap = "kafka-0.example:9093"
"security.protocol" = "SASL_SSL"
"sasl.mechanism" = "SCRAM-SHA-512"
"sasl.username" = "fleetprof"
"sasl.password" = "{SECRET}"
"ssl.ca.location" = "/etc/fleetprof/ca.pem"
"enable.ssl.certificate.verification" = true

[clickhouse]
url = "https://ch.example:8443"
user = "writer"
password = "{SECRET}"
database = "prod"
"""

_ENV = ("FLEETPROF_KAFKA", "FLEETPROF_CLICKHOUSE", "FLEETPROF_DATABASE", "FLEETPROF_CONFIG",
        "FLEETPROF_KAFKA_SECURITY_PROTOCOL", "FLEETPROF_KAFKA_SASL_PASSWORD", "FLEETPROF_KAFKA_SASL_PASSWORD_FILE",
        "FLEETPROF_CLICKHOUSE_USER", "FLEETPROF_CLICKHOUSE_PASSWORD", "FLEETPROF_CLICKHOUSE_PASSWORD_FILE")


def _config(tmp_path: Path, text: str = CONFIG_TEXT, mode: int = 0o600) -> Path:
    path = tmp_path / "fleetprof.toml"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_the_config_file_fills_in_kafka_and_clickhouse_settings(monkeypatch, tmp_path):
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FLEETPROF_CONFIG", str(_config(tmp_path)))
    s = Settings.load()
    assert s.kafka == "kafka-0.example:9093" and not s.kafka_is_local
    assert s.kafka_config() == {"bootstrap.servers": "kafka-0.example:9093", "security.protocol": "SASL_SSL",
                                "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "fleetprof",
                                "sasl.password": SECRET, "ssl.ca.location": "/etc/fleetprof/ca.pem",
                                "enable.ssl.certificate.verification": "true"}
    assert s.clickhouse_dsn == "https://ch.example:8443" and s.database == "prod"
    assert s.clickhouse_credentials() == {"username": "writer", "password": SECRET}
    assert SECRET not in repr(s)


def test_the_environment_overrides_the_config_file(monkeypatch, tmp_path):
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    key_pw = tmp_path / "key-pw"
    key_pw.write_text("k3y\n")
    ch_pw = tmp_path / "ch-pw"
    ch_pw.write_text("from-file\n")
    monkeypatch.setenv("FLEETPROF_KAFKA", "other:9093")
    monkeypatch.setenv("FLEETPROF_KAFKA_SASL_PASSWORD", "from-env")
    monkeypatch.setenv("FLEETPROF_KAFKA_SSL_CERTIFICATE_LOCATION", "/etc/fleetprof/client.pem")
    monkeypatch.setenv("FLEETPROF_KAFKA_SSL_KEY_LOCATION", "/etc/fleetprof/client.key")
    monkeypatch.setenv("FLEETPROF_KAFKA_SSL_KEY_PASSWORD_FILE", str(key_pw))
    monkeypatch.setenv("FLEETPROF_CLICKHOUSE_PASSWORD_FILE", str(ch_pw))
    s = Settings.load(_config(tmp_path))
    cfg = s.kafka_config()
    assert cfg["bootstrap.servers"] == "other:9093" and cfg["sasl.password"] == "from-env"
    assert (cfg["ssl.certificate.location"], cfg["ssl.key.location"], cfg["ssl.key.password"]) == \
        ("/etc/fleetprof/client.pem", "/etc/fleetprof/client.key", "k3y")
    assert s.clickhouse_credentials() == {"username": "writer", "password": "from-file"}
    monkeypatch.setenv("FLEETPROF_CLICKHOUSE_PASSWORD", "from-env")  # the variable beats the file it could name
    assert s.clickhouse_credentials()["password"] == "from-env"


def test_flags_override_the_config_file(monkeypatch, tmp_path):
    from click.testing import CliRunner

    from fleetprof.cli import cli

    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    seen = {}

    @cli.command("show-settings-for-test")
    @click.pass_obj
    def show(settings):
        seen["kafka"], seen["dsn"], seen["db"] = settings.kafka, settings.clickhouse_dsn, settings.database

    try:
        result = CliRunner().invoke(cli, ["--config", str(_config(tmp_path)), "--kafka", "flag:9092",
                                          "show-settings-for-test"])
    finally:
        cli.commands.pop("show-settings-for-test")
    assert result.exit_code == 0, result.output
    assert seen == {"kafka": "flag:9092", "dsn": "https://ch.example:8443", "db": "prod"}


@pytest.mark.parametrize("text, reason", [
    ("[kafka\nbootstrap = 1", "not valid TOML"),
    (f'[clickhouse]\npasword = "{SECRET}"', "unknown key 'pasword' in [clickhouse]"),
    (f'[store]\npassword = "{SECRET}"', "unknown section [store]"),
    (f'[kafka]\n"sasl.password" = ["{SECRET}"]', "[kafka] sasl.password must be a string, number or boolean"),
])
def test_a_bad_config_file_is_a_one_line_error_without_its_values(monkeypatch, tmp_path, text, reason):
    from click.testing import CliRunner

    from fleetprof.cli import cli

    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    result = CliRunner().invoke(cli, ["--config", str(_config(tmp_path, text)), "db", "migrate"])
    assert result.exit_code == 2
    assert reason in result.output and SECRET not in result.output
    assert "Traceback" not in result.output


def test_a_config_file_with_a_password_readable_by_others_is_warned_about(monkeypatch, tmp_path, caplog):
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    Settings.load(_config(tmp_path, mode=0o600))
    assert "readable by others" not in caplog.text
    Settings.load(_config(tmp_path, mode=0o644))
    assert "holds a password and is readable by others than its owner" in caplog.text
    assert SECRET not in caplog.text


def test_the_config_files_clickhouse_credentials_reach_the_server(monkeypatch, tmp_path):
    """A real HTTP server standing in for ClickHouse's endpoint records what clickhouse-connect sends: the user and
    password from the config file, and the store's error names the server without them."""
    import base64
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from fleetprof.store import StoreError, open_store

    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    heard: list[tuple[str, str]] = []

    class Refuse(BaseHTTPRequestHandler):
        def _answer(self):
            auth = self.headers.get("Authorization", "")
            if auth.startswith("Basic "):
                heard.append(tuple(base64.b64decode(auth[6:]).decode().split(":", 1)))
            else:
                heard.append((self.headers.get("X-ClickHouse-User", ""), self.headers.get("X-ClickHouse-Key", "")))
            body = b"Code: 516. DB::Exception: Authentication failed. (AUTHENTICATION_FAILED)"
            self.send_response(403)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        text = CONFIG_TEXT.replace("https://ch.example:8443", url)
        s = Settings.load(_config(tmp_path, text))
        with pytest.raises(StoreError) as err:
            open_store(s.clickhouse_dsn, s.database, **s.clickhouse_credentials())
    finally:
        server.shutdown()
    assert heard and set(heard) == {("writer", SECRET)}
    assert f"127.0.0.1:{server.server_port}" in str(err.value) and SECRET not in str(err.value)
