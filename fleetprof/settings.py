"""Settings shared by every fleetprof process: flags first, then FLEETPROF_* environment, then the config file
(--config or FLEETPROF_CONFIG, TOML), then defaults.

Secrets (Kafka SASL and TLS key passwords, ClickHouse password) come only from the environment, a file named in the
environment, or the config file: never flags, never logs.
"""

from __future__ import annotations

import logging
import os
import stat
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("fleetprof.settings")

REPO_ROOT = Path(__file__).resolve().parent.parent
SQL_DIR = Path(__file__).resolve().parent / "sql"  # in a checkout a link to sql/; in a wheel the files themselves
INFRA_DIR = REPO_ROOT / "infra"

DEFAULT_KAFKA = "127.0.0.1:9092"
DEFAULT_API = "127.0.0.1:7474"
DEFAULT_DATABASE = "fleetprof"
CONFIG_ENV = "FLEETPROF_CONFIG"


class ConfigError(ValueError):
    """A config file that cannot be used; the message is one line and never holds a value from the file."""


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
    # the parsed config file: it may hold secrets, so it never shows in a repr
    config: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)
    config_path: Path | None = None

    @classmethod
    def load(cls, config_path: Path | None = None) -> Settings:
        """Settings from the environment, with the config file (`config_path`, else $FLEETPROF_CONFIG) filling in
        what the environment leaves unset."""
        path = config_path or (Path(os.environ[CONFIG_ENV]) if os.environ.get(CONFIG_ENV) else None)
        settings = cls()
        if path is None:
            return settings
        settings.config, settings.config_path = read_config(path), path
        kafka, clickhouse = settings.config.get("kafka", {}), settings.config.get("clickhouse", {})
        for env_name, attr, section, key in (("FLEETPROF_KAFKA", "kafka", kafka, "bootstrap"),
                                             ("FLEETPROF_CLICKHOUSE", "clickhouse", clickhouse, "url"),
                                             ("FLEETPROF_DATABASE", "database", clickhouse, "database")):
            if not os.environ.get(env_name) and key in section:
                setattr(settings, attr, section[key])
        return settings

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
        return (host in ("127.0.0.1", "localhost") and "FLEETPROF_KAFKA_SECURITY_PROTOCOL" not in os.environ
                and "security.protocol" not in self.config.get("kafka", {}))

    def kafka_config(self) -> dict[str, str]:
        """librdkafka settings: bootstrap servers, the config file's [kafka] client settings, then the
        FLEETPROF_KAFKA_<SETTING> environment (and its …_FILE variants for passwords) over them."""
        cfg = {"bootstrap.servers": self.kafka}
        cfg.update({k: str(v).lower() if isinstance(v, bool) else str(v)
                    for k, v in self.config.get("kafka", {}).items() if k != "bootstrap"})
        for env_name, key in _KAFKA_ENV.items():
            value = os.environ.get(env_name)
            if value:
                cfg[key] = value
        for env_name, key in _KAFKA_SECRET_FILES.items():
            if os.environ.get(env_name):
                cfg[key] = read_secret_file(env_name)
        return cfg

    def clickhouse_credentials(self) -> dict[str, str | None]:
        """ClickHouse user and password: FLEETPROF_CLICKHOUSE_USER / _PASSWORD (or _PASSWORD_FILE), else the config
        file's [clickhouse] user / password; None where none is given."""
        section = self.config.get("clickhouse", {})
        user = os.environ.get("FLEETPROF_CLICKHOUSE_USER") or section.get("user")
        if os.environ.get("FLEETPROF_CLICKHOUSE_PASSWORD") is not None:
            password = os.environ["FLEETPROF_CLICKHOUSE_PASSWORD"]
        elif os.environ.get("FLEETPROF_CLICKHOUSE_PASSWORD_FILE"):
            password = read_secret_file("FLEETPROF_CLICKHOUSE_PASSWORD_FILE")
        else:
            password = section.get("password")
        return {"username": user or None, "password": password}


_KAFKA_ENV = {
    "FLEETPROF_KAFKA_SECURITY_PROTOCOL": "security.protocol",
    "FLEETPROF_KAFKA_SASL_MECHANISM": "sasl.mechanism",
    "FLEETPROF_KAFKA_SASL_USERNAME": "sasl.username",
    "FLEETPROF_KAFKA_SASL_PASSWORD": "sasl.password",
    "FLEETPROF_KAFKA_SSL_CA_LOCATION": "ssl.ca.location",
    "FLEETPROF_KAFKA_SSL_CERTIFICATE_LOCATION": "ssl.certificate.location",  # mutual TLS: the client's certificate
    "FLEETPROF_KAFKA_SSL_KEY_LOCATION": "ssl.key.location",
    "FLEETPROF_KAFKA_SSL_KEY_PASSWORD": "ssl.key.password",
    # how soon a consumer group gives a dead member's partitions to the others (librdkafka's default: 45 s)
    "FLEETPROF_KAFKA_SESSION_TIMEOUT_MS": "session.timeout.ms",
}
_KAFKA_SECRET_FILES = {
    "FLEETPROF_KAFKA_SASL_PASSWORD_FILE": "sasl.password",
    "FLEETPROF_KAFKA_SSL_KEY_PASSWORD_FILE": "ssl.key.password",
}
_SECTIONS = {
    "kafka": None,  # any librdkafka client setting, plus `bootstrap`
    "clickhouse": {"url", "user", "password", "database"},
}


def read_secret_file(env_name: str) -> str:
    """The secret in the file that `env_name` names (a mounted Secret, say), without its trailing newline."""
    path = Path(os.environ[env_name])
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"{env_name}: cannot read {path}: {exc.strerror}") from None


def read_config(path: Path) -> dict[str, dict[str, Any]]:
    """The TOML config file: [kafka] and [clickhouse] tables of strings, numbers and booleans."""
    try:
        text = path.read_text()
        mode = path.stat().st_mode
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:  # its message names a line and column, never a value
        raise ConfigError(f"config file {path}: not valid TOML ({exc})") from None
    for section, table in data.items():
        if section not in _SECTIONS or not isinstance(table, dict):
            raise ConfigError(f"config file {path}: unknown section [{section}] (use [kafka] and [clickhouse])")
        allowed = _SECTIONS[section]
        for key, value in table.items():
            if allowed is not None and key not in allowed:
                raise ConfigError(f"config file {path}: unknown key {key!r} in [{section}] "
                                  f"(use {', '.join(sorted(allowed))})")
            if not isinstance(value, str | int | float | bool):
                raise ConfigError(f"config file {path}: [{section}] {key} must be a string, number or boolean")
    holds_secret = any("password" in key for table in data.values() for key in table)
    if holds_secret and mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("config file %s holds a password and is readable by others than its owner (chmod 600)", path)
    return data
