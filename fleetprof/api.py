"""The small HTTP query API that the process owning the store (`fleetprof up`) serves on 127.0.0.1.

chDB lets one process open a data directory, so every other command reaches the store through this API:
  GET  /healthz                      {"status": "ok", "service": "fleetprof", "database": ...}
  GET  /api/query/{name}?param=...   a named query (sql/queries/<name>.sql); text parameters typed by its placeholders
  POST /api/sql {"sql", "params"}    one read-only statement (readonly=1, enforced by ClickHouse itself)
  GET  /                             the web UI, with its own endpoints under /api/ (fleetprof/webui/routes.py)
Results are {"columns": [...], "rows": [[...]]}; errors are {"error": "<one line>"} with 400/403/404/503.
There is no authentication, which is why it binds to loopback unless told otherwise.
"""

from __future__ import annotations

import base64
import ipaddress
import logging
import math
import socket
import threading
import time
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import uvicorn
from clickhouse_connect.driver.exceptions import ClickHouseError, OperationalError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from fleetprof.store import ParamError, Store, StoreError, UnknownQuery, one_line

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 7474
READONLY_CODE = 164  # ClickHouse's READONLY error
STARTUP_TIMEOUT_S = 10.0


def jsonable(value: Any) -> Any:
    """A query result value as JSON: times in UTC ISO-8601, non-finite floats as null, bytes as text or base64."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, datetime):
        # the store's clients return aware datetimes; a naive one is taken as UTC, as ClickHouse's default zone
        return (value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)).isoformat()
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return base64.b64encode(value).decode()
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [jsonable(v) for v in value]
    return str(value)  # UUID, IPv4/IPv6, Enum members, ...


def parse_address(address: str) -> tuple[str, int]:
    """`host:port` (or `[v6]:port`) to (host, port)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"not a host:port address: {address!r}")
    return host.strip("[]") or DEFAULT_HOST, int(port)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _result(columns: list[str], rows: list[tuple]) -> JSONResponse:
    return JSONResponse({"columns": columns, "rows": [jsonable(list(r)) for r in rows]})


def _clickhouse_error(exc: ClickHouseError) -> JSONResponse:
    if isinstance(exc, OperationalError):
        return _error(503, f"store unavailable: {one_line(exc)}")
    status = 403 if getattr(exc, "code", None) == READONLY_CODE else 400
    return _error(status, one_line(exc))


def create_app(store: Store) -> Starlette:
    """The Starlette app over one Store. Handlers are sync, so Starlette runs them in its thread pool."""

    def metrics(request: Request) -> Response:
        # the processes that host the API also run the sink: its counters are this registry's
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "service": "fleetprof", "database": store.database})

    def named(request: Request) -> JSONResponse:
        params = dict(request.query_params)
        try:
            columns, rows = store.query_named(request.path_params["name"], params)
        except UnknownQuery as exc:
            return _error(404, str(exc))
        except ParamError as exc:
            return _error(400, str(exc))
        except ClickHouseError as exc:
            return _clickhouse_error(exc)
        except StoreError as exc:
            return _error(503, str(exc))
        return _result(columns, rows)

    async def sql(request: Request) -> JSONResponse:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, 'expected a JSON body {"sql": "...", "params": {...}}')
        if not isinstance(body, dict) or not isinstance(body.get("sql"), str) or not body["sql"].strip():
            return _error(400, 'expected a JSON body {"sql": "...", "params": {...}}')
        params = body.get("params") or {}
        if not isinstance(params, dict):
            return _error(400, "params must be a JSON object")
        try:
            # The query blocks: run it in the thread pool like the sync handlers, off the event loop.
            columns, rows = await run_in_threadpool(store.query_sql, body["sql"], params, readonly=True)
        except ClickHouseError as exc:
            return _clickhouse_error(exc)
        except StoreError as exc:
            return _error(503, str(exc))
        return _result(columns, rows)

    # Imported here: the UI's routes read through fleetprof.query_client, which imports this module.
    from fleetprof.webui.routes import borrowed_routes

    return Starlette(routes=[
        Route("/healthz", healthz, methods=["GET"]),
        Route("/api/query/{name}", named, methods=["GET"]),
        Route("/api/sql", sql, methods=["POST"]),
        Route("/metrics", metrics, methods=["GET"]),
        *borrowed_routes(store),
    ])


class ApiServer:
    """A running API: uvicorn in a background thread on a socket bound before the thread starts."""

    def __init__(self, server: uvicorn.Server, thread: threading.Thread, sock: socket.socket):
        self._server = server
        self._thread = thread
        self._sock = sock
        self.host, self.port = sock.getsockname()[:2]

    @property
    def address(self) -> str:
        """host:port, as Settings.api spells it."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def stop(self, timeout: float = 10.0) -> None:
        """Stop accepting, finish requests in flight, and join the thread."""
        self._server.should_exit = True
        self._thread.join(timeout)
        self._sock.close()


def serve_api(store: Store, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> ApiServer:
    """Serve the API (and the web UI) for `store` on host:port (port 0 picks a free one) until .stop(); raises
    OSError if taken."""
    if not is_loopback(host):
        log.warning("the query API has no authentication and now listens on %s, beyond this machine", host)
    return serve_app(create_app(store), host, port, "the query API")


def serve_app(app: Starlette, host: str, port: int, what: str) -> ApiServer:
    """Serve `app` on host:port in a background thread until .stop(); raises OSError if the port is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        # Bound here, not in uvicorn, so a taken port is an OSError for the caller instead of a sys.exit in a thread.
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    # uvicorn installs signal handlers only on the main thread, so this thread leaves the caller's handlers alone.
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="fleetprof-api", daemon=True)
    thread.start()
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise OSError(f"{what} did not start on {host}:{port}")
        time.sleep(0.01)
    return ApiServer(server, thread, sock)


def is_loopback(host: str) -> bool:
    """Whether `host` is only reachable from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
