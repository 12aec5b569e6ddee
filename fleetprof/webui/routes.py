"""The web UI's HTTP side over any QueryTarget: the page, its static files, and the JSON endpoints it reads.

  GET /                         the page (static/index.html); GET /static/... its modules, CSS and vendored uPlot
  GET /api/timeseries           NVML device and per-process series and profile activity, bucketed for charts
  GET /api/nodes                nodes with data in the range;  GET /api/processes  processes (node, pid, comm),
                                the busiest first, kernel threads marked
  GET /api/flamegraph           one range's CPU or GPU-time flame graph, frames interned, each process's stacks
                                rooted at a frame of its own (see model.py)
  GET /api/flamegraph/diff      the range against base_since / base_until
  GET /api/timeline             the sampled GPU kernels, copies and sets of from..to (at most timeline.MAX_RANGE_S),
                                one bar each, per node, device and stream (see timeline.py); node, pid, collectives
  GET /api/workloads            GPU utilization per workload (by=namespace|pod|job|team|container): GPUs,
                                GPU-hours, busy and idle hours, mean utilization (gpu_utilization_by_workload)
  GET /api/export               the range as pprof, folded, speedscope, json or html: the same bytes as
                                `fleetprof query flamegraph --format F` with the same options
Parameters: since, until (5m, 2h, epoch seconds or ISO-8601; a relative since counts back from until), kind=cpu|gpu,
node, pid, comm ('' and 0 mean "all"); namespace, pod, job, container: the workload filters of every endpoint
('' = all; sql/parts/workload_match.sql); for kind=gpu, collectives=all|hide|only: NCCL's collective kernels shown,
left out or alone (the flame graphs and the export; NCCL kernels read as fleetprof/collectives.py labels them);
what=all|kernels|copies (memory copies and sets, '[memcpy HtoD]' and '[memset]' leaves), nvtx_range=RANGE (only GPU
time under a matching NVTX range, fleetprof/gpu_filters.py) and nvtx_level=0|1 (the range path as '[nvtx] <range>'
frames between the process and the launching stack).
The charts and each flame graph say which of their data came from a simulated source
(sql/queries/simulated_sources.sql: NVML readings for the charts, the kind's samples for a flame graph), per node,
in `simulated` (nodes) and `simulated_line` (what the page shows). Errors are {"error": "<one line>"}: 400 for
a bad parameter, 503 when the store did not answer. Big answers are compressed: zstd where the client accepts it,
else gzip.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from clickhouse_connect.driver.exceptions import ClickHouseError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from fleetprof.collectives import COLLECTIVE_CHOICES, nccl_label
from fleetprof.gpu_filters import WHAT_CHOICES
from fleetprof.profile_kinds import KINDS, export_profile
from fleetprof.query_client import QueryError, QueryTarget, StoreTarget
from fleetprof.simulated_sources import simulated_line, simulated_sources
from fleetprof.store import Store, StoreError, one_line, parse_time
from fleetprof.webui import STATIC_DIR, model, timeline
from fleetprof.workload_filters import WORKLOAD_BY, WORKLOAD_FILTERS
from schemas.wire import GPU_BINARY

try:
    from compression import zstd  # Python 3.14 and later
except ImportError:
    from backports import zstd

SERIES_ROW_LIMIT = 200_000  # chart points per answer: 330 GPUs (or processes) at 600 buckets each
COMPRESS_MIN_BYTES = 32 * 1024  # flame graphs of big ranges are megabytes of JSON; small ones are not worth it
EXPORTS = {  # every format of `fleetprof query flamegraph`: (media type, file name suffix)
    "pprof": ("application/octet-stream", "pb.gz"),  # not application/gzip: browsers would unpack it on download
    "folded": ("text/plain; charset=utf-8", "folded"),
    "speedscope": ("application/json", "speedscope.json"),
    "json": ("application/json", "json"),
    "html": ("text/html; charset=utf-8", "html"),
}


class BadRequest(ValueError):
    """A request parameter that does not parse; its message is the one-line answer."""


class BorrowedStore(StoreTarget):
    """A StoreTarget over a store another part of this process owns (`fleetprof up`): close() leaves it open."""

    def close(self) -> None:
        pass


# --- parameters -----------------------------------------------------------------------------------------------------


def _window(request: Request, since_key: str = "since", until_key: str = "until",
            default_since: str | None = "1h") -> tuple[datetime, datetime]:
    q = request.query_params
    since_text = q.get(since_key, default_since)
    if since_text is None:
        raise BadRequest(f"{since_key} is required")
    try:
        until = parse_time(q.get(until_key) or "now")
        since = parse_time(since_text, now=until)
    except ValueError as exc:
        raise BadRequest(f"{since_key}/{until_key}: {exc}") from None
    if since >= until:
        raise BadRequest(f"{since_key} ({since.isoformat()}) must be before {until_key} ({until.isoformat()})")
    return since, until


def _kind(request: Request) -> str:
    kind = request.query_params.get("kind", "cpu")
    if kind not in KINDS:
        raise BadRequest(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
    return kind


def _filters(request: Request, comm: bool = True, kind: str | None = None) -> dict[str, Any]:
    """node, pid (and comm) for any query; with a `kind`, the profile's filters: collectives too for gpu."""
    q = request.query_params
    pid_text = q.get("pid") or "0"
    if not (pid_text.isascii() and pid_text.isdigit()) or int(pid_text) >= 2**32:
        raise BadRequest(f"pid must be a process id (0 for all), not {pid_text!r}")
    filters: dict[str, Any] = {"node": q.get("node", ""), "pid": int(pid_text), **_workload(request)}
    if comm:
        filters["comm"] = q.get("comm", "")
    if kind is None:
        return filters
    collectives = q.get("collectives") or "all"
    if collectives not in COLLECTIVE_CHOICES:
        raise BadRequest(f"collectives must be one of {', '.join(COLLECTIVE_CHOICES)}, not {collectives!r}")
    if kind == "gpu":
        filters["collectives"] = collectives
    elif collectives != "all":
        raise BadRequest("collectives picks NCCL kernels: it goes with kind=gpu")
    return {**filters, **_gpu_filters(request, kind)}


def _workload(request: Request) -> dict[str, str]:
    """namespace, pod, job and container ('' = no filter), as the named queries take them."""
    return {name: request.query_params.get(name, "") for name in WORKLOAD_FILTERS}


def _gpu_filters(request: Request, kind: str) -> dict[str, Any]:
    """what, nvtx_range and nvtx_level (fleetprof/gpu_filters.py): for kind=gpu; refused with another kind."""
    q = request.query_params
    what, nvtx_range, level = q.get("what") or "all", q.get("nvtx_range", ""), q.get("nvtx_level") or "0"
    if what not in WHAT_CHOICES:
        raise BadRequest(f"what must be one of {', '.join(WHAT_CHOICES)}, not {what!r}")
    if level not in ("0", "1"):
        raise BadRequest(f"nvtx_level must be 0 or 1, not {level!r}")
    if kind == "gpu":
        return {"what": what, "nvtx_range": nvtx_range, "nvtx_level": int(level)}
    if what != "all" or nvtx_range or level != "0":
        raise BadRequest("what, nvtx_range and nvtx_level pick GPU time: they go with kind=gpu")
    return {}


def _ms(t: datetime) -> int:
    return round(t.timestamp() * 1000)


def _ns(t: datetime) -> int:
    """Unix ns of an aware datetime, exactly (a float of seconds holds only about a quarter of a microsecond)."""
    return (t - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1) * 1000


def _named(target: QueryTarget, name: str, params: dict[str, Any]) -> tuple[list[str], list[Sequence[Any]]]:
    """A named query's columns and rows, straight from the store when this process has it open (as _stack_rows)."""
    if not isinstance(target, StoreTarget):
        return target.named(name, params)
    with _store_errors():
        return target.store.query_named(name, params)


def _stack_rows(target: QueryTarget, name: str, params: dict[str, Any]) -> list[Sequence[Any]]:
    """A flame graph query's rows (names, ids and numbers). Straight from the store when this process has it open:
    they hold nothing that needs StoreTarget's per-value JSON conversion, which costs seconds at 100k stacks."""
    if not isinstance(target, StoreTarget):
        return target.named(name, params)[1]
    with _store_errors():
        return target.store.query_named(name, params)[1]


def _stack_ids(target: QueryTarget, name: str, params: dict[str, Any]) -> model.StackIds:
    """A flamegraph_ids_* query's stacks as arrays: from the store as Arrow columns when this process has it open
    (2.5M frame ids at 100k stacks, never one Python object each), else from the API's JSON rows."""
    if not isinstance(target, StoreTarget):
        return model.StackIds.from_rows(target.named(name, params)[1])
    with _store_errors():
        return model.StackIds.from_arrow(target.store.query_named_arrow(name, params))


@contextmanager
def _store_errors() -> Iterator[None]:
    """The store's failures as QueryError, as StoreTarget raises them."""
    try:
        yield
    except ClickHouseError as exc:
        raise QueryError(one_line(exc)) from None
    except StoreError as exc:
        raise QueryError(str(exc)) from None


# --- responses ------------------------------------------------------------------------------------------------------


def _json(request: Request, payload: Any) -> Response:
    # orjson: a seventh of json's time on a 100k-stack flame graph, and it writes the numpy arrays model.py makes
    body = orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)
    headers = {"Cache-Control": "no-store"}
    if len(body) >= COMPRESS_MIN_BYTES:
        accepted = _accepted_encodings(request)
        # level 1 of either: most of the size for a fraction of the time; zstd (Chromium, Firefox) takes a quarter of
        # gzip's time and gives a smaller answer (100k stacks, 13.7 MB: 5.2 MB in 0.03 s against 6.0 MB in 0.1 s)
        if "zstd" in accepted:
            body, headers["Content-Encoding"] = zstd.compress(body, 1), "zstd"
        elif "gzip" in accepted:
            body, headers["Content-Encoding"] = gzip.compress(body, compresslevel=1), "gzip"
        headers["Vary"] = "Accept-Encoding"
    return Response(body, media_type="application/json", headers=headers)


def _accepted_encodings(request: Request) -> set[str]:
    """The content codings an Accept-Encoding header allows (those not given q=0)."""
    accepted = set()
    for item in request.headers.get("accept-encoding", "").split(","):
        name, _, weight = item.partition(";")
        try:
            allowed = float(weight.strip().removeprefix("q=")) > 0 if weight.strip() else True
        except ValueError:
            allowed = False
        if allowed and name.strip():
            accepted.add(name.strip().lower())
    return accepted


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _answering(handler: Callable[[Request], Response]) -> Callable[[Request], Response]:
    """A handler whose bad parameters are 400s and whose store failures are 503s, each a one-line error."""

    def wrapped(request: Request) -> Response:
        try:
            return handler(request)
        except BadRequest as exc:
            return _error(400, str(exc))
        except QueryError as exc:
            return _error(503, str(exc))

    return wrapped


# --- the endpoints --------------------------------------------------------------------------------------------------


def ui_routes(target: QueryTarget) -> list[BaseRoute]:
    """The page, its files and its endpoints, answering from `target` (sync handlers: Starlette's thread pool)."""

    def index(request: Request) -> Response:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    def simulated(kind: str, since: datetime, until: datetime, node: str) -> dict[str, Any]:
        """The nodes whose data of `kind` ('cpu', 'gpu', 'nvml') in the range came from a simulated source."""
        nodes = simulated_sources(target, since, until, node).get(kind, [])
        return {"simulated": nodes, "simulated_line": simulated_line(kind, nodes) if nodes else ""}

    def timeseries(request: Request) -> Response:
        since, until = _window(request)
        filters = _filters(request, comm=False)
        step = model.step_ms(since, until)
        window = {"since": since, "until": until, "node": filters["node"], **_workload(request)}
        limit = {"step_ms": step, "limit": SERIES_ROW_LIMIT}
        dev_cols, dev_rows = target.named("ui_gpu_series", {**window, **limit})
        proc_cols, proc_rows = target.named("ui_gpu_process_series", {**window, "pid": filters["pid"], **limit})
        activity_step = max(step, model.MIN_ACTIVITY_STEP_MS)
        _, act_rows = target.named("ui_profile_activity", {**window, "pid": filters["pid"], "step_ms": activity_step})
        devices = model.series(dev_cols, dev_rows, ("node", "gpu_index", "uuid"), model.DEVICE_FIELDS)
        processes = model.series(proc_cols, proc_rows, ("node", "gpu_index", "pid"), model.PROCESS_FIELDS)
        return _json(request, {
            "since_ms": _ms(since), "until_ms": _ms(until), "step_ms": step, "activity_step_ms": activity_step,
            **simulated("nvml", since, until, filters["node"]),
            "truncated": max(len(dev_rows), len(proc_rows)) >= SERIES_ROW_LIMIT,
            "devices": devices, "processes": processes, "activity": model.activity(act_rows)})

    def nodes(request: Request) -> Response:
        since, until = _window(request)
        columns, rows = target.named("ui_nodes", {"since": since, "until": until})
        return _json(request, {"nodes": [dict(zip(columns, r, strict=True)) for r in rows]})

    def processes(request: Request) -> Response:
        since, until = _window(request)
        columns, rows = target.named("ui_processes", {"since": since, "until": until,
                                                      "node": request.query_params.get("node", ""),
                                                      **_workload(request)})
        return _json(request, {"processes": [dict(zip(columns, r, strict=True)) for r in rows]})

    def workloads(request: Request) -> Response:
        since, until = _window(request)
        by = request.query_params.get("by") or "pod"
        if by not in WORKLOAD_BY:
            raise BadRequest(f"by must be one of {', '.join(WORKLOAD_BY)}, not {by!r}")
        columns, rows = target.named("gpu_utilization_by_workload", {
            "since": since, "until": until, "node": request.query_params.get("node", ""), "by": by,
            **_workload(request)})
        return _json(request, {"since_ms": _ms(since), "until_ms": _ms(until), "by": by,
                               "workloads": [dict(zip(columns, r, strict=True)) for r in rows]})

    def stacks(kind: str, since: datetime, until: datetime, filters: dict[str, Any]) -> model.StackIds:
        return _stack_ids(target, f"flamegraph_ids_{kind}", {"since": since, "until": until, **filters})

    def names(kind: str, since: datetime, until: datetime, filters: dict[str, Any]) -> list[Sequence[Any]]:
        rows = _stack_rows(target, f"flamegraph_names_{kind}", {"since": since, "until": until, **filters})
        if kind != "gpu":
            return rows
        # kernel frames named as the exports name them: an NCCL kernel as its collective and type, then itself
        return [(frame_id, nccl_label(function) if binary == GPU_BINARY else function, binary, *rest)
                for frame_id, function, binary, *rest in rows]

    def header(kind: str, since: datetime, until: datetime, filters: dict[str, Any]) -> dict[str, Any]:
        return {"kind": kind, "unit": KINDS[kind].unit, "since_ms": _ms(since), "until_ms": _ms(until),
                "filters": filters, **simulated(kind, since, until, filters["node"])}

    def flamegraph(request: Request) -> Response:
        kind, (since, until) = _kind(request), _window(request)
        filters = _filters(request, kind=kind)
        payload = model.flamegraph_of_ids(stacks(kind, since, until, filters), names(kind, since, until, filters),
                                          one_node=bool(filters["node"]))
        return _json(request, {**header(kind, since, until, filters), **payload})

    def flamegraph_diff(request: Request) -> Response:
        kind, (since, until) = _kind(request), _window(request)
        filters = _filters(request, kind=kind)
        base_since, base_until = _window(request, "base_since", "base_until", default_since=None)
        payload = model.flamegraph_diff_of_ids(
            stacks(kind, since, until, filters), stacks(kind, base_since, base_until, filters),
            [*names(kind, since, until, filters), *names(kind, base_since, base_until, filters)],
            one_node=bool(filters["node"]))
        return _json(request, {**header(kind, since, until, filters), "base_since_ms": _ms(base_since),
                               "base_until_ms": _ms(base_until), **payload})

    def export(request: Request) -> Response:
        kind, (since, until) = _kind(request), _window(request)
        filters = _filters(request, kind=kind)
        fmt = request.query_params.get("format", "folded")
        if fmt not in EXPORTS:
            raise BadRequest(f"format must be one of {', '.join(EXPORTS)}, not {fmt!r}")
        processes = request.query_params.get("processes", "split")
        if processes not in ("split", "merge"):
            raise BadRequest(f"processes must be split or merge, not {processes!r}")
        # The CLI's export (fleetprof query flamegraph, --merge-processes for merge), so both give the same bytes.
        data = export_profile(lambda name, params: _stack_rows(target, name, params), kind, fmt, since, until,
                              filters, merge_processes=processes == "merge").data
        media_type, suffix = EXPORTS[fmt]
        name = f"fleetprof-{kind}-{since:%Y%m%dT%H%M%SZ}-{until:%Y%m%dT%H%M%SZ}.{suffix}"
        return Response(data, media_type=media_type,
                        headers={"Content-Disposition": f'attachment; filename="{name}"', "Cache-Control": "no-store"})

    def timeline_bars(request: Request) -> Response:
        since, until = _window(request, "from", "to", default_since=None)
        # node, pid, collectives, what and nvtx_range, as the GPU flame graph; its NVTX level draws no bars
        filters = _filters(request, comm=False, kind="gpu")
        filters.pop("nvtx_level")
        if (until - since).total_seconds() > timeline.MAX_RANGE_S:
            raise BadRequest(f"the timeline shows at most {timeline.MAX_RANGE_S // 60} minutes: select a shorter "
                             f"range (this one is {(until - since).total_seconds():.0f} s)")
        since_ns, until_ns = _ns(since), _ns(until)
        params = {"since": since, "until": until, **filters}
        columns, rows = _named(target, "timeline_bars", {**params, "limit": timeline.BAR_LIMIT + 1})
        payload = timeline.timeline(columns, rows, _stack_rows(target, "timeline_stacks", params),
                                    _stack_rows(target, "timeline_frames", params), since_ns, until_ns,
                                    timeline.BAR_LIMIT, one_node=bool(filters["node"]))
        expired = timeline.expired_note(since_ns, _ns(datetime.now(tz=UTC)))
        return _json(request, {**payload, "filters": filters, "expired": expired,
                               **simulated("gpu", since, until, filters["node"])})

    return [
        Route("/", index, methods=["GET"]),
        Mount("/static", StaticFiles(directory=STATIC_DIR), name="static"),
        Route("/api/timeseries", _answering(timeseries), methods=["GET"]),
        Route("/api/nodes", _answering(nodes), methods=["GET"]),
        Route("/api/processes", _answering(processes), methods=["GET"]),
        Route("/api/workloads", _answering(workloads), methods=["GET"]),
        Route("/api/flamegraph", _answering(flamegraph), methods=["GET"]),
        Route("/api/flamegraph/diff", _answering(flamegraph_diff), methods=["GET"]),
        Route("/api/export", _answering(export), methods=["GET"]),
        Route("/api/timeline", _answering(timeline_bars), methods=["GET"]),
    ]


def borrowed_routes(store: Store) -> list[BaseRoute]:
    """The UI's routes over a store this process owns elsewhere (`fleetprof up`'s), which they never close."""
    return ui_routes(BorrowedStore(store))


def ui_app(target: QueryTarget) -> Starlette:
    """The UI on its own (`fleetprof ui`): the routes above plus a health check naming where it reads from."""

    def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "service": "fleetprof-ui", "store": target.where})

    return Starlette(routes=[Route("/healthz", healthz, methods=["GET"]), *ui_routes(target)])
