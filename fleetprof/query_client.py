"""Where a command's queries go: the owning process's HTTP API, the chDB directory itself, or a ClickHouse server.

chDB lets one process open a data directory. When `fleetprof up` owns it, other commands ask its API; when nothing
owns it, a command opens it itself; when another process owns it and its API does not answer, the command says so.
Either way the caller gets the same shapes back: column names and JSON-like rows (see json_values.jsonable).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from datetime import date, datetime
from pathlib import Path
from typing import Any

import httpx

from fleetprof.addresses import parse_address
from fleetprof.json_values import jsonable
from fleetprof.settings import Settings
from fleetprof.store import CHDB_PREFIX, Store, StoreBusy, StoreError, clickhouse_error, one_line, open_store

PROBE_TIMEOUT = httpx.Timeout(1.0)
QUERY_TIMEOUT = httpx.Timeout(connect=2.0, read=600.0, write=30.0, pool=2.0)

Result = tuple[list[str], list[list[Any]]]


class QueryError(RuntimeError):
    """A query that could not run, with a one-line reason for people."""


class QueryTarget(ABC):
    """Runs named queries and read-only SQL somewhere; `where` says where, for messages."""

    where: str = ""

    @abstractmethod
    def named(self, name: str, params: dict[str, Any]) -> Result:
        """Run sql/queries/<name>.sql with `params` (text or typed values)."""

    @abstractmethod
    def sql(self, sql: str, params: dict[str, Any] | None = None) -> Result:
        """Run one read-only statement with bound `{name:Type}` parameters."""

    @abstractmethod
    def close(self) -> None:
        """Release what the target holds (the store, the HTTP connection pool)."""

    def __enter__(self) -> QueryTarget:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _wire(value: Any) -> Any:
    # URL query strings carry text: times as UTC ISO-8601, which the API parses back by the placeholder's type
    if isinstance(value, datetime | date):
        return jsonable(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


class ApiTarget(QueryTarget):
    """Queries through a fleetprof process's HTTP API."""

    def __init__(self, address: str, http: httpx.Client):
        self.where = f"the fleetprof API at {address}"
        self._address = address
        self._http = http

    def _call(self, method: str, path: str, **kwargs: Any) -> Result:
        try:
            response = self._http.request(method, path, timeout=QUERY_TIMEOUT, **kwargs)
        except httpx.HTTPError as exc:
            raise QueryError(f"{self.where} stopped answering: {one_line(exc)}") from None
        try:
            body = response.json()
        except ValueError:
            raise QueryError(f"{self.where} answered HTTP {response.status_code} without JSON") from None
        if not isinstance(body, dict):
            raise QueryError(f"{self.where} answered HTTP {response.status_code} with unexpected JSON")
        if response.status_code != 200:
            raise QueryError(str(body.get("error") or f"HTTP {response.status_code}"))
        return body["columns"], body["rows"]

    def named(self, name: str, params: dict[str, Any]) -> Result:
        return self._call("GET", f"/api/query/{name}", params={k: _wire(v) for k, v in params.items()})

    def sql(self, sql: str, params: dict[str, Any] | None = None) -> Result:
        params = {k: jsonable(v) for k, v in (params or {}).items()}
        return self._call("POST", "/api/sql", json={"sql": sql, "params": params})

    def close(self) -> None:
        self._http.close()


class StoreTarget(QueryTarget):
    """Queries a Store this process opened itself (a chDB directory nobody else owns, or a ClickHouse server)."""

    def __init__(self, store: Store):
        self.where = f"the store at {store.location}"
        self.store = store

    def named(self, name: str, params: dict[str, Any]) -> Result:
        try:
            columns, rows = self.store.query_named(name, params)
        except clickhouse_error() as exc:
            raise QueryError(one_line(exc)) from None
        except StoreError as exc:
            raise QueryError(str(exc)) from None
        return columns, [jsonable(list(r)) for r in rows]

    def sql(self, sql: str, params: dict[str, Any] | None = None) -> Result:
        try:
            columns, rows = self.store.query_sql(sql, params, readonly=True)
        except clickhouse_error() as exc:
            raise QueryError(one_line(exc)) from None
        except StoreError as exc:
            raise QueryError(str(exc)) from None
        return columns, [jsonable(list(r)) for r in rows]

    def close(self) -> None:
        self.store.close()


def _probe_api(address: str, database: str) -> ApiTarget | None:
    """An ApiTarget if a fleetprof API answers at `address`, None if nothing does."""
    try:
        host, port = parse_address(address)
    except ValueError as exc:
        raise QueryError(f"FLEETPROF_API: {exc}") from None
    base = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    http = httpx.Client(base_url=base, timeout=PROBE_TIMEOUT)
    try:
        response = http.get("/healthz")
        health = response.json() if response.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        http.close()
        return None
    if not isinstance(health, dict) or health.get("service") != "fleetprof":
        http.close()
        raise QueryError(f"something that is not fleetprof answers at {address}; set FLEETPROF_API to its API")
    if health.get("database") != database:
        http.close()
        raise QueryError(f"the fleetprof API at {address} serves database {health.get('database')!r}, "
                         f"not {database!r}")
    return ApiTarget(address, http)


def query_target(settings: Settings) -> QueryTarget:
    """The API at settings.api if it answers, else the embedded store opened here; a server URL directly."""
    if not settings.is_embedded_store:
        try:
            return StoreTarget(open_store(settings.clickhouse_dsn, settings.database,
                                          **settings.clickhouse_credentials()))
        except (StoreError, clickhouse_error()) as exc:
            raise QueryError(one_line(exc)) from None
    api = _probe_api(settings.api, settings.database)
    if api is not None:
        return api
    path = Path(settings.clickhouse_dsn[len(CHDB_PREFIX):])
    try:
        store = open_store(settings.clickhouse_dsn, settings.database, **settings.clickhouse_credentials())
    except StoreBusy as exc:
        raise QueryError(f"the store at {exc.path} is owned by another fleetprof process whose API does not answer "
                         f"at {settings.api}") from None
    except (StoreError, clickhouse_error()) as exc:
        raise QueryError(f"cannot open the store at {path}: {one_line(exc)}") from None
    try:
        # Nobody owns this store, so bring its tables up to date: an empty store then answers "no rows", not errors.
        store.migrate()
    except clickhouse_error() as exc:
        store.close()
        raise QueryError(f"cannot migrate the store at {path}: {one_line(exc)}") from None
    return StoreTarget(store)
