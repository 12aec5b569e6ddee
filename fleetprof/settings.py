"""Settings shared by every fleetprof process: flags first, then FLEETPROF_* environment, then defaults.

Secrets (Kafka SASL password, ClickHouse password) come only from the environment or a config file, never flags.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SQL_DIR = REPO_ROOT / "sql"
INFRA_DIR = REPO_ROOT / "infra"

DEFAULT_KAFKA = "127.0.0.1:9092"
DEFAULT_API = "127.0.0.1:7474"
DEFAULT_DATABASE = "fleetprof"


def default_data_dir() -> Path:
    env = os.environ.get("FLEETPROF_DATA_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "fleetprof"


@dataclass
class Settings:
    data_dir: Path = field(default_factory=default_data_dir)
    kafka: str = field(default_factory=lambda: os.environ.get("FLEETPROF_KAFKA", DEFAULT_KAFKA))
    clickhouse: str = field(default_factory=lambda: os.environ.get("FLEETPROF_CLICKHOUSE", ""))
    database: str = field(default_factory=lambda: os.environ.get("FLEETPROF_DATABASE", DEFAULT_DATABASE))
    api: str = field(default_factory=lambda: os.environ.get("FLEETPROF_API", DEFAULT_API))

    @property
    def clickhouse_dsn(self) -> str:
        """The store to use: a ClickHouse server URL, or chDB in the data directory."""
        return self.clickhouse or f"chdb://{self.data_dir / 'chdb'}"

    @property
    def is_embedded_store(self) -> bool:
        return self.clickhouse_dsn.startswith("chdb://")

    @property
    def kafka_is_local(self) -> bool:
        """A plaintext loopback address: `fleetprof up` may start its own broker there."""
        host = self.kafka.rsplit(":", 1)[0]
        return host in ("127.0.0.1", "localhost") and "FLEETPROF_KAFKA_SECURITY_PROTOCOL" not in os.environ

    def kafka_config(self) -> dict[str, str]:
        """librdkafka settings: bootstrap servers plus FLEETPROF_KAFKA_<SETTING> security settings from env."""
        cfg = {"bootstrap.servers": self.kafka}
        for env_name, key in _KAFKA_ENV.items():
            value = os.environ.get(env_name)
            if value:
                cfg[key] = value
        password_file = os.environ.get("FLEETPROF_KAFKA_SASL_PASSWORD_FILE")
        if password_file:
            cfg["sasl.password"] = Path(password_file).read_text().strip()
        return cfg


_KAFKA_ENV = {
    "FLEETPROF_KAFKA_SECURITY_PROTOCOL": "security.protocol",
    "FLEETPROF_KAFKA_SASL_MECHANISM": "sasl.mechanism",
    "FLEETPROF_KAFKA_SASL_USERNAME": "sasl.username",
    "FLEETPROF_KAFKA_SASL_PASSWORD": "sasl.password",
    "FLEETPROF_KAFKA_SSL_CA_LOCATION": "ssl.ca.location",
    # how soon a consumer group gives a dead member's partitions to the others (librdkafka's default: 45 s)
    "FLEETPROF_KAFKA_SESSION_TIMEOUT_MS": "session.timeout.ms",
}
