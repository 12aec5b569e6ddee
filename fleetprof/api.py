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

import logging

from clickhouse_connect.driver.exceptions import ClickHouseError, OperationalError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from fleetprof.addresses import DEFAULT_HOST, is_loopback
from fleetprof.app_server import AppServer, serve_app
from fleetprof.json_values import jsonable
from fleetprof.store import ParamError, Store, StoreError, UnknownQuery, one_line
from fleetprof.webui.routes import borrowed_routes

log = logging.getLogger(__name__)

DEFAULT_PORT = 7474
READONLY_CODE = 164  # ClickHouse's READONLY error


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

    return Starlette(routes=[
        Route("/healthz", healthz, methods=["GET"]),
        Route("/api/query/{name}", named, methods=["GET"]),
        Route("/api/sql", sql, methods=["POST"]),
        Route("/metrics", metrics, methods=["GET"]),
        *borrowed_routes(store),
    ])


def serve_api(store: Store, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> AppServer:
    """Serve the API (and the web UI) for `store` on host:port (port 0 picks a free one) until .stop(); raises
    OSError if taken."""
    if not is_loopback(host):
        log.warning("the query API has no authentication and now listens on %s, beyond this machine", host)
    return serve_app(create_app(store), host, port, "the query API")
