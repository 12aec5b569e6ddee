"""sink: decoded result records in, ClickHouse rows out (per table). Pure; processors/store_writer.py writes."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from itertools import chain

import numpy as np

from processors.messages import Message
from processors.process_ids import process_ids
from processors.sink_columns import (  # noqa: F401 - the sink's column lists, used here and by its users
    ALERT_COLUMNS,
    CPU_SAMPLE_COLUMNS,
    DEVICE_COLUMNS,
    FRAME_COLUMNS,
    GPU_COPY_COLUMNS,
    GPU_SAMPLE_COLUMNS,
    GPU_TIMELINE_COLUMNS,
    GPU_UNMATCHED_COLUMNS,
    IDENTITY_COLUMNS,
    PROCESS_COLUMNS,
    PROCESS_NAME_COLUMNS,
    PROFILE_WINDOW_COLUMNS,
    STACK_COLUMNS,
)
from schemas.wire import COPY_LABEL_PREFIXES, long_to_u64, longs_to_u64
from schemas.wire import identity_key as _identity_key

_IDENTITY_FIELDS = IDENTITY_COLUMNS[3:-1]  # the WorkloadIdentity fields stored as they are
# the GpuMetrics device and process fields stored as they are, in column order (between node and simulated)
_DEVICE_FIELDS = ("index", *DEVICE_COLUMNS[3:-2])
_PROCESS_FIELDS = ("device_index", *PROCESS_COLUMNS[3:-2])

# Tables whose rows are keyed by content (ReplacingMergeTree): safe to write again, no dedup token needed.
DEFINITION_TABLES = ("frames", "stacks", "process_names")
# Definitions with a TTL from their time column: never written older than the write (see _not_older_than); the
# column and its ticks per second (DateTime: seconds, DateTime64(3): milliseconds)
REFRESHED = {"frames": ("last_seen", 1), "stacks": ("last_seen", 1), "process_names": ("last_seen", 1),
             "workload_identities": ("updated", 1000)}


@dataclass
class Rows:
    """A table's rows: as lists of values (`rows`), or, where the record came as columns, as one column per table
    column (`by_column`, inserted column-oriented: no list per row, no pivot in clickhouse-connect). An integer
    column is an int64 or uint64 numpy array (the compiled reader's are), any other a list."""

    columns: list[str]
    rows: list[list] = field(default_factory=list)
    by_column: list[list | np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.by_column[0]) if self.by_column is not None else len(self.rows)

    @staticmethod
    def joined(parts: list[Rows]) -> Rows:
        """The rows of `parts` (one table's, built the same way) one after the other, each column joined once."""
        first = parts[0]
        if first.by_column is None:
            return Rows(first.columns, list(chain.from_iterable(p.rows for p in parts)))
        return Rows(first.columns, by_column=[_joined([p.by_column[i] for p in parts])
                                              for i in range(len(first.columns))])

    def as_rows(self) -> list[list]:
        """The rows as lists of Python values, whichever way they are held."""
        if self.by_column is None:
            return self.rows
        return [list(r) for r in zip(*map(_as_list, self.by_column), strict=True)]


def _as_list(column: list | np.ndarray) -> list:
    return column.tolist() if isinstance(column, np.ndarray) else column


def _joined(columns: list[list | np.ndarray]) -> list | np.ndarray:
    """Parts of a column as one: an array where every part is one, else a list."""
    if all(isinstance(c, np.ndarray) for c in columns):
        return columns[0] if len(columns) == 1 else np.concatenate(columns)
    return list(chain.from_iterable(map(_as_list, columns)))


def _ints(column: list | np.ndarray) -> np.ndarray:
    """An int or long field's column as int64 (the compiled reader's is; fastavro's and a list of records' are
    lists)."""
    return column if isinstance(column, np.ndarray) else np.array(column, dtype=np.int64)


def _u64(column: list | np.ndarray) -> np.ndarray:
    """The unsigned 64-bit values a column of Avro longs carries (ids: the same bits)."""
    return _ints(column).view(np.uint64)


def _take(column: list | np.ndarray, at: list[int]) -> list | np.ndarray:
    """The values of `column` at the indexes `at`."""
    if isinstance(column, np.ndarray):
        return column[np.array(at, dtype=np.intp)]
    return [column[i] for i in at]


# The unsigned and narrow integer columns of the tables (sql/migrations). Avro's int and long are signed and wider: a
# value outside its column would fail the batch's insert on every retry, stalling the sink, so the message that
# holds it is dead-lettered instead. tests/test_fuzz_sink.py checks these against the migrated tables.
_U8, _U16, _U32, _U64, _I16 = (0, 2**8 - 1), (0, 2**16 - 1), (0, 2**32 - 1), (0, 2**64 - 1), (-(2**15), 2**15 - 1)
COLUMN_RANGES: dict[str, dict[str, tuple[int, int]]] = {
    "frames": {"frame_id": _U64},
    "stacks": {"stack_id": _U64, "frame_ids": _U64},
    "process_names": {"proc_id": _U64},
    "cpu_samples": {"pid": _U32, "proc_id": _U64, "stack_id": _U64, "count": _U64},
    "gpu_device_metrics": {"gpu_index": _U16, "gpu_util_pct": _U8, "mem_util_pct": _U8, "mem_used_bytes": _U64,
                           "mem_total_bytes": _U64, "sm_clock_mhz": _U32, "mem_clock_mhz": _U32, "power_mw": _U32,
                           "power_limit_mw": _U32, "temperature_c": _I16, "pcie_tx_kbps": _U32,
                           "pcie_rx_kbps": _U32, "clock_event_reasons": _U64, "xid_errors": _U32},
    "gpu_process_metrics": {"gpu_index": _U16, "pid": _U32, "sm_util_pct": _U8, "mem_util_pct": _U8,
                            "used_memory_bytes": _U64},
    "gpu_kernel_samples": {"pid": _U32, "proc_id": _U64, "device": _U16, "stream": _U32, "stack_id": _U64,
                           "duration_ns": _U64, "launches": _U64},
    "gpu_copy_samples": {"pid": _U32, "device": _U16, "stream": _U32, "stack_id": _U64, "duration_ns": _U64,
                         "bytes": _U64, "launches": _U64},
    "gpu_timeline": {"pid": _U32, "device": _U16, "stream": _U32, "start_ns": _U64, "duration_ns": _U64,
                     "stack_id": _U64, "weight": _U32, "bytes": _U64, "graph_id": _U32, "graph_node_id": _U64,
                     "correlation_id": _U32},
    "gpu_unmatched": {"pid": _U32, "events": _U64, "duration_ns": _U64, "launches": _U64},
    "alerts": {"gpu_index": _U16},
    "profile_windows": {"frequency_hz": _U32},
}
# Columns whose values come through long_to_u64 (or a hash: proc_id): in range by construction, so check_ranges skips
# them
_U64_BY_CONSTRUCTION = frozenset({"frame_id", "stack_id", "frame_ids", "graph_node_id", "proc_id"})
_DATETIME_MAX_S = 2**32 - 1  # DateTime is seconds since 1970 in a UInt32
# a few ids per node, each on hundreds of rows a window
identity_key = lru_cache(maxsize=1 << 16)(_identity_key)

# Time columns are given as ClickHouse stores them, ticks since 1970 (DateTime: seconds, DateTime64(3): ms), not as
# datetime objects: clickhouse-connect would call .timestamp() on each of them (~5% of the sink thread, py-spy).


def _ts(ns: int) -> int:
    """A DateTime column's value (seconds); ValueError outside its range (1970 to 2106)."""
    seconds = ns // 1_000_000_000
    if not 0 <= seconds <= _DATETIME_MAX_S:
        raise ValueError(f"time {ns} ns lies outside ClickHouse DateTime (1970 to 2106)")
    return seconds


def check_ranges(table: str, rows: Rows) -> Rows:
    """`rows`, or ValueError naming the first value that its column cannot hold."""
    ranges = COLUMN_RANGES.get(table, {})
    for i, name in enumerate(rows.columns):
        if name not in ranges or name in _U64_BY_CONSTRUCTION or not len(rows):
            continue
        lo, hi = ranges[name]
        column = rows.by_column[i] if rows.by_column is not None else [row[i] for row in rows.rows]
        if isinstance(column, np.ndarray):  # never None; uint64 arrays are ids, in range by construction
            if column.dtype == np.uint64 or (lo <= int(column.min()) and int(column.max()) <= hi):
                continue
            bad = next(int(v) for v in column if not lo <= v <= hi)
            raise ValueError(f"{table}.{name} = {bad} lies outside [{lo}, {hi}]")
        try:  # a whole column at C speed: an array column's elements, a nullable column's values
            values = list(chain.from_iterable(column)) if isinstance(column[0], list) else column
            if _within(values, lo, hi):
                continue
        except TypeError:  # not all numbers: value by value below, which names the first bad one
            pass
        for value in column:
            for v in value if isinstance(value, list) else (value,):
                if v is not None and not lo <= v <= hi:
                    raise ValueError(f"{table}.{name} = {v} lies outside [{lo}, {hi}]")
    return rows


def _within(values: list, lo: int, hi: int) -> bool:
    """Every value but None lies in [lo, hi] (min and max first: a None makes them raise, most columns have none)."""
    try:
        return not values or (lo <= min(values) and max(values) <= hi)
    except TypeError:
        values = [v for v in values if v is not None]
        return not values or (lo <= min(values) and max(values) <= hi)


def _ts_ms(ns: int) -> int:
    """A DateTime64(3) column's value (milliseconds)."""
    return ns // 1_000_000


def _definitions(rec: dict, ts: int) -> dict[str, Rows]:
    """The frames and stacks a CpuSamples or GpuSamples record defines (both have the same shapes)."""
    return {
        "frames": Rows(FRAME_COLUMNS, [[long_to_u64(f["frame_id"]), f["function"], f["binary"], f["kind"], ts,
                                        f.get("build_id", "")] for f in rec["frames"]]),
        "stacks": Rows(STACK_COLUMNS, [[long_to_u64(s["stack_id"]), longs_to_u64(s["frame_ids"]), ts]
                                       for s in rec["stacks"]]),
    }


def _profile_window(rec: dict, ts: int, kind: str, samples: int) -> Rows:
    """Where a window's samples came from (migration 0012): simulated or not, and the CPU sampling frequency."""
    if not samples:
        return Rows(PROFILE_WINDOW_COLUMNS)
    return Rows(PROFILE_WINDOW_COLUMNS, [[ts, rec["node"], kind, bool(rec.get("simulated", False)),
                                          rec.get("frequency_hz", 0)]])


def _columns(items: list[dict] | dict[str, list], fields: tuple[str, ...],
             defaults: dict[str, object]) -> tuple[dict[str, list | np.ndarray], int]:
    """An array of records as {field: column} and its length: as the sink reads it (READ_AS_COLUMNS: int fields as
    int64 arrays), or made from a list of records (lists: the row builders take int fields through _ints).
    `defaults`: the fields a record may predate, with the value it stands for."""
    if isinstance(items, dict):
        columns = dict(items)
        n = len(next(iter(columns.values()), ()))
    else:
        n = len(items)
        columns = {f: [item[f] for item in items] for f in fields}
        columns.update({f: [item.get(f, d) for item in items] for f, d in defaults.items()})
    for f, d in defaults.items():
        columns.setdefault(f, [d] * n)
    if n == 0:
        for f in fields:
            columns.setdefault(f, [])
    return columns, n


def _identity_column(ids: list[int] | np.ndarray) -> list[str]:
    # a window's rows carry a handful of identities, most often one: each formatted once
    if isinstance(ids, np.ndarray):
        if not len(ids):
            return []
        if (ids == ids[0]).all():
            return [identity_key(int(ids[0]))] * len(ids)
        ids = ids.tolist()
    keys = {i: identity_key(i) for i in set(ids)}
    return list(map(keys.__getitem__, ids))


_CPU_SAMPLE_FIELDS = ("pid", "comm", "container_id", "stack_id", "count")


def cpu_samples_rows(rec: dict) -> dict[str, Rows]:
    """The rows of a CpuSamples record (its samples as columns, or records)."""
    ts, node = _ts(rec["window_start_ns"]), rec["node"]
    s, n = _columns(rec["samples"], _CPU_SAMPLE_FIELDS, {"identity_id": 0})
    names, ids = _process_names(s["comm"], s["container_id"], _identity_column(s["identity_id"]), ts)
    table = Rows(CPU_SAMPLE_COLUMNS, by_column=[
        [ts] * n, [node] * n, _ints(s["pid"]), ids, _u64(s["stack_id"]), _ints(s["count"])])
    return {**_definitions(rec, ts), "process_names": names, "cpu_samples": table,
            "profile_windows": _profile_window(rec, ts, "cpu", n)}


def _process_names(comms: list[str], container_ids: list[str], identities: list[str],
                   ts: int) -> tuple[Rows, list[int]]:
    """Each sample's process id, and the names row of each id (a definition: written before the rows that carry
    it)."""
    ids, names = process_ids(comms, container_ids, identities)
    return Rows(PROCESS_NAME_COLUMNS, [[*row, ts] for row in names]), ids


def gpu_metrics_rows(rec: dict) -> dict[str, Rows]:
    """The rows of a GpuMetrics record (its devices and processes as columns, or records)."""
    ts, node, sim = _ts_ms(rec["time_ns"]), rec["node"], rec.get("simulated", False)
    return {"gpu_device_metrics": _metric_rows(rec["devices"], DEVICE_COLUMNS, _DEVICE_FIELDS, ts, node, sim),
            "gpu_process_metrics": _metric_rows(rec["processes"], PROCESS_COLUMNS, _PROCESS_FIELDS, ts, node, sim)}


def _metric_rows(items: list[dict] | dict[str, list], columns: list[str], fields: tuple[str, ...], ts: int,
                 node: str, sim: bool) -> Rows:
    """ts, node, `fields`, simulated and identity of each device or process."""
    c, n = _columns(items, fields, {"identity_id": 0})
    return Rows(columns, by_column=[[ts] * n, [node] * n, *(c[f] for f in fields), [sim] * n,
                                    _identity_column(c["identity_id"])])


_GPU_SAMPLE_FIELDS = ("pid", "comm", "container_id", "device", "stream", "stack_id", "kernel_name", "duration_ns",
                      "launches")
_GPU_SAMPLE_DEFAULTS = {"identity_id": 0, "nvtx_range": "", "bytes": 0, "memory_kinds": ""}
_TIMELINE_FIELDS = ("pid", "device", "stream", "start_ns", "end_ns", "activity", "name", "stack_id", "weight")
_TIMELINE_DEFAULTS = {"bytes": 0, "nvtx_range": "", "graph_id": 0, "graph_node_id": 0, "correlation_id": 0,
                      "identity_id": 0}


def gpu_samples_rows(rec: dict) -> dict[str, Rows]:
    """GpuSamples v1 to v4 (a field an older record lacks reads as its default: no range, no bytes, no timeline).
    Copies and sets are rows of gpu_kernel_samples like kernels (their GPU time), and of gpu_copy_samples with their
    bytes too (migration 0014)."""
    ts, node = _ts(rec["window_start_ns"]), rec["node"]
    s, n = _columns(rec["samples"], _GPU_SAMPLE_FIELDS, _GPU_SAMPLE_DEFAULTS)
    stack, ident = _u64(s["stack_id"]), _identity_column(s["identity_id"])
    for f in ("pid", "device", "stream", "duration_ns", "launches", "bytes"):
        s[f] = _ints(s[f])
    names, ids = _process_names(s["comm"], s["container_id"], ident, ts)
    kernels = [[ts] * n, [node] * n, s["pid"], ids, s["device"], s["stream"], stack, s["kernel_name"],
               s["duration_ns"], s["launches"], s["nvtx_range"]]
    at = [i for i, name in enumerate(s["kernel_name"]) if name.startswith(COPY_LABEL_PREFIXES)]
    copies = [[ts] * len(at), [node] * len(at), *(_take(column, at) for column in (
        s["pid"], s["comm"], s["container_id"], s["device"], s["stream"], stack, s["kernel_name"], s["memory_kinds"],
        s["nvtx_range"], s["duration_ns"], s["bytes"], s["launches"], ident))]
    return {
        **_definitions(rec, ts),
        "process_names": names,
        "gpu_kernel_samples": Rows(GPU_SAMPLE_COLUMNS, by_column=kernels),
        "gpu_copy_samples": Rows(GPU_COPY_COLUMNS, by_column=copies),
        "gpu_timeline": _timeline(rec.get("timeline", []), s, node),
        "gpu_unmatched": Rows(GPU_UNMATCHED_COLUMNS, [
            [ts, node, u["pid"], u["side"], u["reason"], u["events"], u["duration_ns"], u["launches"]]
            for u in rec["unmatched"]]),
        "profile_windows": _profile_window(rec, ts, "gpu", n),
    }


def _timeline(items: list[dict] | dict[str, list], samples: dict[str, list], node: str) -> Rows:
    """One row per matched record, stamped (ts) with its own start second: the timeline reads a time range by it.
    Timeline records carry no comm: a process's is the one its samples in the same record carry."""
    comms: dict[int, str] = {}
    for pid, comm in zip(_as_list(samples["pid"]), samples["comm"], strict=True):
        if comm:
            comms.setdefault(pid, comm)
    t, n = _columns(items, _TIMELINE_FIELDS, _TIMELINE_DEFAULTS)
    starts, ends, pids = _ints(t["start_ns"]), _ints(t["end_ns"]), _ints(t["pid"])
    if n:  # every start a DateTime, checked at its ends (ns fit in a long: seconds are monotone in them)
        _ts(int(starts.min()))
        _ts(int(starts.max()))
    # the table keeps durations (migration 0020): an end before its start is a negative one, refused by the checks;
    # an end below 0 could wrap int64 in the subtraction: those in Python ints
    durations = ends - starts
    if n and ends.min() < 0:
        durations = [end - start for start, end in zip(starts.tolist(), ends.tolist(), strict=True)]
    return Rows(GPU_TIMELINE_COLUMNS, by_column=[
        (starts // 1_000_000_000).tolist(), [node] * n, pids, [comms.get(p, "") for p in pids.tolist()],
        _ints(t["device"]), _ints(t["stream"]), starts, durations, t["activity"], t["name"], _u64(t["stack_id"]),
        _ints(t["weight"]), _ints(t["bytes"]), t["nvtx_range"], _ints(t["graph_id"]), _u64(t["graph_node_id"]),
        _ints(t["correlation_id"]), _identity_column(t["identity_id"])])


def identity_rows(rec: dict) -> dict[str, Rows]:
    """One row of the workload_identities dimension table per WorkloadIdentity definition (migration 0015)."""
    if not rec["identity_id"]:  # 0 means "none": a definition of it would name every unidentified row
        raise ValueError("a WorkloadIdentity with identity_id 0")
    return {"workload_identities": Rows(IDENTITY_COLUMNS, [[
        identity_key(rec["identity_id"]), rec["node"], _ts_ms(rec["time_ns"]),
        *(rec[name] for name in _IDENTITY_FIELDS), rec.get("simulated", False)]])}


def alert_rows(rec: dict) -> dict[str, Rows]:
    # evidence as JSON text: people read it whole, and a JSON column type would tie the table to a server version
    evidence = json.dumps(rec["evidence"], ensure_ascii=False)
    return {"alerts": Rows(ALERT_COLUMNS, [[
        rec["alert_id"], rec["kind"], rec["state"], rec["node"], rec["gpu_index"], rec["gpu_uuid"],
        _ts_ms(rec["started_ns"]), _ts_ms(rec["time_ns"]), rec["threshold"], rec["observed"], rec["message"],
        evidence]])}


ROW_BUILDERS = {
    "fleetprof.CpuSamples": cpu_samples_rows,
    "fleetprof.GpuMetrics": gpu_metrics_rows,
    "fleetprof.GpuSamples": gpu_samples_rows,
    "fleetprof.Alert": alert_rows,
    "fleetprof.WorkloadIdentity": identity_rows,
}
SINK_INPUTS = ("cpu.samples", "gpu.metrics", "gpu.samples", "alerts", "identities")
# the records whose arrays of records the sink reads as columns (decode_message's `columns`): a CpuSamples record
# holds ~1,500 samples, each a cpu_samples row, and its columns go to the insert as they are; a GpuMetrics record a
# row per GPU and per GPU process, a GpuSamples record one per sample and per timeline record
READ_AS_COLUMNS = {"fleetprof.CpuSamples": ("samples",), "fleetprof.GpuMetrics": ("devices", "processes"),
                   "fleetprof.GpuSamples": ("samples", "timeline")}


def rows_for(messages: list[Message], written_at: datetime | None = None) -> dict[str, Rows]:
    """All rows of a batch, merged per table, in message order. `written_at`: when the batch is written; no
    definition's last_seen is older (see _not_older_than)."""
    parts: dict[str, list[Rows]] = {}
    written_s = None if written_at is None else int(written_at.timestamp())
    for m in messages:
        for table, rows in ROW_BUILDERS[m.name](m.record).items():
            if written_s is not None and table in REFRESHED:
                column, per_second = REFRESHED[table]
                _not_older_than(rows, written_s * per_second, column)
            parts.setdefault(table, []).append(rows)
    out = {table: Rows.joined(rows) for table, rows in parts.items()}
    # once per table and batch, not per message (a message is one node's window or poll: checked one by one, the
    # checks were 13% of the sink's CPU in a 1,000-node fleet run, py-spy). A bad value fails the whole batch here
    # as it did there, and the store writer builds the batch again message by message to dead-letter the one.
    for table, rows in out.items():
        check_ranges(table, rows)
    return out


def _not_older_than(rows: Rows, written_at: int, column: str) -> None:
    """A definition's last_seen is its window's start, but never older than the write. Frame and stack ids are
    content hashes shared by every node and window, and a definition goes out once an hour: one first carried by an
    old window (a replay, a node with a wrong clock) would otherwise reach the table already past its 90-day TTL,
    be dropped on insert, and leave every newer sample of that frame unnamed until it is sent again. An identity's
    definition likewise: an agent sends it when first seen and then only every few hours."""
    at = rows.columns.index(column)
    for row in rows.rows:  # definitions are rows (their records are lists of records)
        if row[at] < written_at:
            row[at] = written_at
