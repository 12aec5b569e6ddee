"""The ClickHouse store, always through clickhouse-connect: chDB in-process (chdb:///dir) or a server (http(s)://).

A `Store` is safe to share between threads (the sink inserting while API threads query): each call leases a client
of its own from a small pool, because one chDB handle (or one HTTP session) runs one statement at a time and its
session state (database, settings) must not leak between callers. Ad-hoc SQL runs on separate clients created with
readonly=1, so ClickHouse itself refuses anything that writes.

chDB allows one process per data directory; a second process gets `StoreBusy`.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetprof import dedup_records
from fleetprof.rebuild_guard import rebuild_refusal
from fleetprof.sql_files import (  # noqa: F401 - the store's API: the SQL files it runs
    MIGRATIONS_DIR,
    PARTS_DIR,
    QUERIES_DIR,
    NamedQuery,
    bind_named,
    migration_files,
    named_queries,
    named_query,
    parse_query,
    query_file,
    split_statements,
)
from fleetprof.store_columns import native_columns
from fleetprof.store_errors import ParamError, StoreError, UnknownQuery  # noqa: F401 - the store's API
from fleetprof.store_params import _unwrap, coerce_param, parse_time  # noqa: F401 - the store's API
from fleetprof.store_statements import store_sql
from processors.process_ids import NAME_COLUMNS, NAMED_TABLES, PROCESS_NAME_COLUMNS, rows_with_process_ids

if TYPE_CHECKING:
    import pyarrow
    from clickhouse_connect.driver.client import Client

log = logging.getLogger(__name__)

CHDB_PREFIX = "chdb://"
USER_ENV = "FLEETPROF_CLICKHOUSE_USER"
PASSWORD_ENV = "FLEETPROF_CLICKHOUSE_PASSWORD"

_TABLE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DATABASE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]*$")


class StoreBusy(StoreError):
    """The chDB directory is held by another process (chDB allows one process per directory)."""

    def __init__(self, path: Path, pid: int | None = None):
        self.path = path
        self.pid = pid
        owner = f"process {pid}" if pid else "another process"
        super().__init__(f"the chDB store at {path} is in use by {owner}")


def clickhouse_error() -> type[Exception]:
    """clickhouse-connect's error class, for `except` clauses: an except clause's class is looked up only when an
    exception is raised, and loading clickhouse-connect takes ~0.4 s that a command which only asks the API (it
    opens no store) need not spend."""
    from clickhouse_connect.driver.exceptions import ClickHouseError

    return ClickHouseError


def one_line(exc: BaseException) -> str:
    """The first line of an exception's message, without ClickHouse's version trailer."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return re.sub(r"\s*\(version [^)]*\)", "", text)


# --- opening --------------------------------------------------------------------------------------------------------


def _chdb_path(dsn: str) -> Path:
    raw = dsn[len(CHDB_PREFIX):].split("?", 1)[0]
    if not raw or raw in ("memory", ":memory:"):
        raise StoreError(f"{dsn}: fleetprof needs a chDB data directory (chdb:///path/to/dir)")
    # realpath: chDB compares engine paths literally, and clickhouse-connect reads chdb://a/b as host a, database b
    return Path(os.path.realpath(raw))


def _holder(path: Path) -> int | None:
    """The pid of another live process that holds chDB's lock on this directory, 0 if unknown pid, None if free."""
    status = path / "status"
    try:
        content = status.read_text()
    except OSError:
        return None  # chDB removes the status file when its engine shuts down cleanly
    match = re.search(r"PID:\s*(\d+)", content)
    pid = int(match.group(1)) if match else 0
    if pid == os.getpid():
        return None  # this process's own engine: more clients on the same directory are fine
    # The file outlives a crashed owner, so ask the lock itself. flock locks belong to an open file, so probing from
    # this process is only safe because the pid above says this process does not own the engine.
    try:
        fd = os.open(status, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return pid
        return None
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


# Clients return aware datetimes (tz_mode="aware"): by default they come back naive when the server's zone is UTC
# and aware otherwise, which differs between a laptop and a fleet's server.


def _chdb_factory(path: Path) -> Callable[[str | None, bool], Client]:
    dsn = f"{CHDB_PREFIX}{path}"

    def make(database: str | None, readonly: bool) -> Client:
        settings = {"readonly": 1} if readonly else {}
        import clickhouse_connect  # here, not at the top: see clickhouse_error

        try:
            return clickhouse_connect.get_client(dsn=dsn, database=database, settings=settings, tz_mode="aware")
        except clickhouse_error() as exc:
            message = str(exc)
            if "cannot connect with different path" in message:
                raise StoreError(f"this process already has another chDB store open; cannot also open {path}") from None
            holder = _holder(path)
            if holder is not None:
                raise StoreBusy(path, holder or None) from None
            raise StoreError(f"cannot open the chDB store at {path}: {one_line(exc)}") from exc

    return make


def _server_factory(url: str, username: str | None, password: str | None) -> Callable[[str | None, bool], Client]:
    # Credentials come from Settings (environment or config file; never flags, never logged); a URL's own
    # user:password also works.

    def make(database: str | None, readonly: bool) -> Client:
        kwargs: dict[str, Any] = {"dsn": url, "database": database, "autogenerate_session_id": False,
                                  "tz_mode": "aware"}
        if username:
            kwargs["username"] = username
        if password is not None:
            kwargs["password"] = password
        if readonly:
            kwargs["settings"] = {"readonly": 1}
        import clickhouse_connect  # here, not at the top: see clickhouse_error

        try:
            return clickhouse_connect.get_client(**kwargs)
        except clickhouse_error() as exc:
            raise StoreError(f"cannot reach ClickHouse at {_redact(url)}: {one_line(exc)}") from exc

    return make


def _redact(url: str) -> str:
    return re.sub(r"//[^@/]*@", "//", url)


def open_store(dsn: str, database: str, *, username: str | None = None, password: str | None = None) -> Store:
    """Open the store at `dsn` (chdb:///dir or http(s)://host:port), creating `database` if missing. A server's
    credentials: `username` / `password` (Settings.clickhouse_credentials()), else FLEETPROF_CLICKHOUSE_USER /
    _PASSWORD from the environment.

    Raises StoreBusy when another process holds the chDB directory.
    """
    if not _DATABASE_RE.match(database):
        raise StoreError(f"not a usable database name: {database!r} (letters, digits, _ and -)")
    if dsn.startswith(CHDB_PREFIX):
        path = _chdb_path(dsn)
        holder = _holder(path)  # checked first so a busy store fails fast, before chDB prints its own complaint
        if holder is not None:
            raise StoreBusy(path, holder or None)
        path.mkdir(parents=True, exist_ok=True)
        factory = _chdb_factory(path)
        location = str(path)
    elif dsn.startswith(("http://", "https://")):
        if username is None and password is None:
            username, password = os.environ.get(USER_ENV) or None, os.environ.get(PASSWORD_ENV)
        factory = _server_factory(dsn, username, password)
        location = _redact(dsn)
    else:
        raise StoreError(f"unsupported store address {dsn!r} (use chdb:///dir or http(s)://host:port)")
    bootstrap = factory(None, False)
    try:
        bootstrap.command(store_sql("create_database"), parameters={"database": database})
        return Store(factory, database, location, embedded=dsn.startswith(CHDB_PREFIX))
    finally:
        # closed only after the Store's own client exists, so chDB's engine is not shut down and restarted
        bootstrap.close()


# --- the store ------------------------------------------------------------------------------------------------------


class _Pool:
    """Clients handed out one caller at a time, created on demand, all closed together."""

    def __init__(self, make: Callable[[], Client]):
        self._make = make
        self._idle: list[Client] = []
        self._all: list[Client] = []
        self._lock = threading.Lock()
        self._closed = False

    @contextmanager
    def lease(self) -> Iterator[Client]:
        with self._lock:
            if self._closed:
                raise StoreError("the store is closed")
            client = self._idle.pop() if self._idle else None
        if client is None:
            client = self._make()
            with self._lock:
                self._all.append(client)
        try:
            yield client
        finally:
            with self._lock:
                if not self._closed:
                    self._idle.append(client)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            clients, self._all, self._idle = self._all, [], []
        for client in clients:
            client.close()


class Store:
    """The fleetprof tables in one ClickHouse database; share one instance between threads."""

    def __init__(self, factory: Callable[[str | None, bool], Client], database: str, location: str,
                 embedded: bool = False):
        self.database = database
        self.location = location
        self.embedded = embedded  # chDB in this process: its inserts die with it (fleetprof/dedup_records.py)
        # For callers that need the raw clickhouse-connect API; the Store's own methods lease pooled clients instead,
        # so this one is never busy with their work.
        self.client: Client = factory(database, False)
        self._writers = _Pool(lambda: factory(database, False))
        self._readers = _Pool(lambda: factory(database, True))
        self._no_dedup = self._no_dedup_settings()
        self._types: dict[str, dict[str, str]] = {}

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self.location}, database={self.database})"

    def _no_dedup_settings(self) -> dict[str, Any]:
        # Tables with non_replicated_deduplication_window also drop a block identical to a recent one when no token
        # is given; two equal partial aggregates are legitimate, so without a token nothing is deduplicated.
        # Newer servers replaced insert_deduplicate with deduplicate_insert and ignore the old one.
        known = self.client.query(store_sql("server_setting"), parameters={"name": "deduplicate_insert"})
        if known.result_rows[0][0]:
            return {"deduplicate_insert": "disable"}
        return {"insert_deduplicate": 0}

    def migrate(self) -> list[str]:
        """Apply the sql/migrations files not yet recorded in schema_migrations, in order; return their names."""
        with self._writers.lease() as client:
            present = client.query(store_sql("table_present"),
                                   parameters={"name": "schema_migrations"}).result_rows[0][0]
            applied = {r[0] for r in client.query(store_sql("applied_migrations")).result_rows} if present else set()
            done = []
            for version, name, path in migration_files():
                if version in applied:
                    continue
                statements = split_statements(path.read_text())
                refusal = rebuild_refusal(client, name, statements, store_sql)
                if refusal:
                    raise StoreError(refusal)
                for statement in statements:
                    client.command(statement)
                client.insert("schema_migrations", [[version, name, datetime.now(tz=UTC)]],
                              column_names=["version", "name", "applied_at"])
                log.info("applied migration %s to %s", name, self.database)
                done.append(name)
            return done

    def insert(self, table: str, rows: Sequence[Sequence[Any]], column_names: list[str],
               dedup_token: str | None = None, column_oriented: bool = False) -> None:
        """Insert rows (column_oriented: `rows` is one sequence per column); with a dedup_token, inserting the same
        token again (e.g. after a crash) is a no-op."""
        if not _TABLE_RE.match(table):
            raise StoreError(f"not a table name: {table!r}")
        if not rows:
            return
        settings = {"insert_deduplication_token": dedup_token} if dedup_token else self._no_dedup
        # Summing, Aggregating and Replacing tables would merge the block's rows with equal keys on insert: that
        # costs the engine ~3 us a row (cpu_samples: 0.92 -> 0.11 s per 300k rows without it, bench/RESULTS.md) and
        # changes no answer: the same rows merge in the background, and every query sums or picks per key anyway,
        # as it must across parts. A view's block is grouped by its key already.
        # A batch's rows may span more hours than the 100 partitions ClickHouse lets one insert make by default (the
        # timeline and the 1 s NVML readings are partitioned by hour): late polls, a node whose clock is days off.
        # Refused, the batch would fail on every retry and stall the sink.
        settings = {**settings, "optimize_on_insert": 0, "max_partitions_per_insert_block": 0}
        if table in NAMED_TABLES and not set(NAME_COLUMNS).isdisjoint(column_names) and \
                self._column_types(table, ["proc_id"]) is not None:
            rows, column_names = self._store_process_names(rows, column_names, column_oriented)
        types = self._column_types(table, column_names)
        if column_oriented:
            rows = native_columns(rows, types)
        try:
            with self._writers.lease() as client:
                context = client.create_insert_context(table, column_names, column_type_names=types,
                                                       column_oriented=column_oriented, settings=settings)
                try:
                    context.data = rows
                    client.data_insert(context)
                finally:
                    # clickhouse-connect's InsertContext keeps a bound method of itself: a reference cycle that
                    # held the batch's rows until a collection freed them (0.2 s of the sink thread's CPU each, at
                    # 100 nodes: bench/RESULTS.md). Without it the rows go when `context` does.
                    vars(context).pop("_next_block_data", None)
        except Exception:
            self._types.pop(table, None)  # a migration may have changed the table since: ask again on the retry
            raise
        if table == "process_names":
            # the sample tables name their processes through a dictionary over this table (migration 0025): loaded
            # again before this returns, so the rows written next that carry these ids read their names at once
            self.reload_process_names()

    def _store_process_names(self, rows: Sequence[Sequence[Any]], column_names: list[str],
                             column_oriented: bool) -> tuple[list, list[str]]:
        """Sample rows given with their process's strings (as before migration 0025: tools, tests, other writers)
        stored as the sink stores them: the names written and loaded first, the rows with their ids."""
        stored, columns, names = rows_with_process_ids(list(rows), column_names, column_oriented)
        seen = int(datetime.now(tz=UTC).timestamp())
        self.insert("process_names", [[*n, seen] for n in names], PROCESS_NAME_COLUMNS)
        return stored, columns

    def reload_process_names(self) -> None:
        """Load the process names dictionary again (migration 0025); insert() into process_names does."""
        with self._writers.lease() as client:
            client.command(store_sql("process_names_reload"))

    def insert_again(self, table: str, rows: Sequence[Sequence[Any]], column_names: list[str], dedup_token: str,
                     column_oriented: bool = False) -> list[str]:
        """insert() of an interrupted batch's rows: a server's inserts are whole or not at all; an embedded store's
        can be cut by the process's death, which dedup_records.insert_again repairs. Returns what it repaired."""
        if not self.embedded:
            self.insert(table, rows, column_names, dedup_token=dedup_token, column_oriented=column_oriented)
            return []
        return dedup_records.insert_again(self, table, dedup_token, lambda into, token: self.insert(
            into, rows, column_names, dedup_token=token, column_oriented=column_oriented))

    def _column_types(self, table: str, column_names: list[str]) -> list[str] | None:
        """The columns' types, asked once per table (clickhouse-connect would describe the table before every insert:
        a query that costs the engine about what a small insert does); None for a column the table lacks."""
        if not set(column_names) <= self._types.get(table, {}).keys():
            _, rows = self.query_sql(store_sql("column_types"), {"database": self.database, "table": table})
            self._types[table] = dict(rows)
        known = self._types[table]
        return [known[c] for c in column_names] if set(column_names) <= known.keys() else None

    def query_named(self, name: str, params: dict[str, Any]) -> tuple[list[str], list[tuple]]:
        """Run sql/queries/<name>.sql; text values are coerced to the placeholders' types, defaults fill the rest."""
        query = named_query(name)
        bound = bind_named(query, params)
        with self._writers.lease() as client:
            result = client.query(query.sql, parameters=bound)
        return list(result.column_names), list(result.result_rows)

    def query_store(self, name: str, params: dict[str, Any]) -> tuple[list[str], list[tuple]]:
        """Run sql/store/<name>.sql, one of the statements the store's own writers run (the sink's state)."""
        return self.query_sql(store_sql(name), params)

    def query_named_arrow(self, name: str, params: dict[str, Any]) -> pyarrow.Table:
        """query_named's result as an Arrow table: typed columns, an Array column as one flat array plus offsets,
        for results too big to turn into Python rows (a 100k-stack flame graph's frame ids)."""
        query = named_query(name)
        bound = bind_named(query, params)
        with self._writers.lease() as client:
            return client.query_arrow(query.sql, parameters=bound)

    def query_sql(self, sql: str, params: dict[str, Any] | None = None, *,
                  readonly: bool = True) -> tuple[list[str], list[tuple]]:
        """Run one statement with bound `{name:Type}` parameters; read-only (enforced by ClickHouse) by default."""
        pool = self._readers if readonly else self._writers
        with pool.lease() as client:
            result = client.query(sql, parameters=params or {})
        return list(result.column_names), list(result.result_rows)

    def close(self) -> None:
        """Close every client; chDB's engine (and its directory lock) goes when the process's last client closes."""
        self._readers.close()
        self._writers.close()
        self.client.close()
