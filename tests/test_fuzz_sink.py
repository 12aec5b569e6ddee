"""The sink over records that decode but hold values its tables cannot (negative pids and counts, times before 1970,
utilization of 300%): the message is refused when its rows are built (a dead letter), never at the insert, where the
whole batch would fail on every retry and the sink would stall."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from processors import sink
from processors.sink import COLUMN_RANGES, rows_for
from tests.fuzz import targets
from tests.fuzz.make_corpus import RECORDS
from tests.fuzz.records import record_of

FUZZ = settings(max_examples=15, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TOPIC_OF = {"CpuSamples": "cpu.samples", "GpuSamples": "gpu.samples", "GpuMetrics": "gpu.metrics", "Alert": "alerts"}
WRITTEN = {"frames": sink.FRAME_COLUMNS, "stacks": sink.STACK_COLUMNS, "cpu_samples": sink.CPU_SAMPLE_COLUMNS,
           "gpu_device_metrics": sink.DEVICE_COLUMNS, "gpu_process_metrics": sink.PROCESS_COLUMNS,
           "gpu_kernel_samples": sink.GPU_SAMPLE_COLUMNS, "gpu_unmatched": sink.GPU_UNMATCHED_COLUMNS,
           "alerts": sink.ALERT_COLUMNS, "process_names": sink.PROCESS_NAME_COLUMNS}
INTEGER_RANGES = {f"{s}Int{b}": ((0, 2**b - 1) if s == "U" else (-(2 ** (b - 1)), 2 ** (b - 1) - 1))
                  for s in ("U", "") for b in (8, 16, 32, 64)}


FRAME = {"frame_id": -1, "function": "f", "binary": "b", "kind": "NATIVE"}
VALID = {
    "GpuMetrics": RECORDS["GpuMetrics"],
    "CpuSamples": {"node": "n", "window_start_ns": 10**18, "window_ns": 10**10, "frames": [FRAME],
                   "stacks": [{"stack_id": -2, "frame_ids": [-1]}],
                   "samples": [{"pid": 1, "comm": "c", "container_id": "", "stack_id": -2, "count": 3}]},
    "GpuSamples": {"node": "n", "window_start_ns": 10**18, "window_ns": 10**10, "frames": [FRAME],
                   "stacks": [{"stack_id": -2, "frame_ids": [-1]}],
                   "samples": [{"pid": 1, "comm": "", "container_id": "", "device": 0, "stream": 7, "stack_id": -2,
                                "kernel_name": "k", "duration_ns": 5, "launches": 1}],
                   "unmatched": [{"pid": 1, "side": "LAUNCH", "reason": "LATE", "events": 1, "duration_ns": 0,
                                  "launches": 1}]},
    "Alert": {"alert_id": "a", "kind": "gpu_utilization_drop", "state": "FIRING", "node": "n", "gpu_index": 0,
              "gpu_uuid": "GPU-1", "started_ns": -(2**63), "time_ns": 2**63 - 1, "threshold": 20.0,
              "observed": float("nan"), "message": "m", "evidence": []},
}


def _base_type(ch_type: str) -> str:
    while (m := re.fullmatch(r"(?:Nullable|Array|LowCardinality)\((.*)\)", ch_type)) is not None:
        ch_type = m[1]
    return ch_type


def test_the_ranges_are_those_of_the_tables(store):
    """Every integer column the sink writes, but for Int64 (an Avro long always fits), has its type's range."""
    _, rows = store.query_sql("SELECT table, name, type FROM system.columns WHERE database = currentDatabase()")
    types = {(t, n): _base_type(ty) for t, n, ty in rows}
    for table, columns in WRITTEN.items():
        expected = {c: INTEGER_RANGES[types[(table, c)]] for c in columns
                    if types[(table, c)] in INTEGER_RANGES and types[(table, c)] != "Int64"}
        assert COLUMN_RANGES.get(table, {}) == expected, table


@pytest.mark.parametrize("schema", sorted(TOPIC_OF))
def test_bogus_records_give_rows_that_insert_or_are_refused(store, schema):
    refused, inserted = [], 0

    @FUZZ
    @given(st.lists(record_of(schema, max_items=3), min_size=1, max_size=2))
    def check(records):
        nonlocal inserted
        messages = targets.as_messages(TOPIC_OF[schema], records)
        try:
            tables = rows_for(messages)
        except ValueError as exc:  # the store writer's isolation turns this into a dead letter per message
            targets.one_line(str(exc))
            refused.append(str(exc))
            return
        for table, rows in tables.items():
            if len(rows):
                store.insert(table, rows.as_rows(), rows.columns)
                inserted += len(rows)

    check = example([VALID[schema]])(check)  # most random records hold some value out of range: one goes in
    check()
    assert refused and inserted  # both outcomes were reached


@pytest.mark.parametrize("record, reason", [
    ({"window_start_ns": -1}, "time -1 ns lies outside ClickHouse DateTime (1970 to 2106)"),
    ({"window_start_ns": 2**32 * 10**9}, f"time {2**32 * 10**9} ns lies outside ClickHouse DateTime (1970 to 2106)"),
    ({"samples": [{"pid": -1, "comm": "", "container_id": "", "stack_id": 1, "count": 1}]},
     "cpu_samples.pid = -1 lies outside [0, 4294967295]"),
    ({"samples": [{"pid": 1, "comm": "", "container_id": "", "stack_id": 1, "count": -5}]},
     "cpu_samples.count = -5 lies outside [0, 18446744073709551615]"),
])
def test_values_the_tables_cannot_hold_name_themselves(record, reason):
    """Before the check these reached the insert: chDB's client refused the whole batch, and the store writer
    retried it for ever."""
    good = {"node": "n", "window_start_ns": 10**18, "window_ns": 10**10, "frames": [], "stacks": [], "samples": []}
    (m,) = targets.as_messages("cpu.samples", [{**good, **record}])
    with pytest.raises(ValueError) as err:
        rows_for([m])
    assert str(err.value) == reason
