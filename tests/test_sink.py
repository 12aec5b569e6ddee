"""sink rows: result records to ClickHouse rows, exactly (ids as UInt64, times as the window start)."""

import time
from datetime import UTC, datetime

import numpy as np
import pytest

from processors.messages import Message
from processors.process_ids import process_id
from processors.sink import Rows, check_ranges, cpu_samples_rows, gpu_metrics_rows, identity_rows, rows_for
from producers.workload_identity import Identity

T = 1_764_000_000_123_456_789


def test_cpu_samples_rows():
    rec = {"node": "n", "window_start_ns": T, "window_ns": 10**10,
           "frames": [{"frame_id": -1, "function": "f", "binary": "b", "kind": "NATIVE"}],
           "stacks": [{"stack_id": -2, "frame_ids": [-1, 5]}],
           "samples": [{"pid": 3, "comm": "c", "container_id": "k", "stack_id": -2, "count": 9},
                       {"pid": 4, "comm": "c", "container_id": "", "identity_id": -2, "stack_id": -2, "count": 1}]}
    rows = cpu_samples_rows(rec)
    ts = T // 10**9  # DateTime: seconds since 1970, as the column holds them
    assert rows["frames"].rows == [[2**64 - 1, "f", "b", "NATIVE", ts, ""]]
    assert rows["stacks"].rows == [[2**64 - 2, [2**64 - 1, 5], ts]]
    # a v2 sample (no identity_id) stores '', an id its 16 hex digits of the unsigned value; each process's strings
    # go to process_names once, the rows carry its id (migration 0025)
    first, second = process_id("c", "k", ""), process_id("c", "", "fffffffffffffffe")
    assert rows["cpu_samples"].as_rows() == [[ts, "n", 3, first, 2**64 - 2, 9], [ts, "n", 4, second, 2**64 - 2, 1]]
    assert rows["process_names"].rows == [[first, "c", "k", "", ts], [second, "c", "", "fffffffffffffffe", ts]]
    assert list(rows).index("process_names") < list(rows).index("cpu_samples")  # written before the rows naming it


def test_gpu_metrics_rows_keep_nulls_and_the_simulated_label():
    dev = {"index": 1, "uuid": "GPU-1", "name": "H100 (simulated)", "parent_uuid": "", "gpu_util_pct": None,
           "mem_util_pct": 5, "mem_used_bytes": 7, "mem_total_bytes": 8, "sm_clock_mhz": 1, "mem_clock_mhz": 2,
           "power_mw": 3, "power_limit_mw": 4, "temperature_c": 40, "pcie_tx_kbps": None, "pcie_rx_kbps": 6,
           "clock_event_reasons": 0, "xid_errors": [79]}
    proc = {"device_index": 1, "pid": 9, "comm": "python", "container_id": "", "sm_util_pct": 50,
            "mem_util_pct": None, "used_memory_bytes": 100, "identity_id": 0x1234}
    rec = {"node": "n", "time_ns": T, "simulated": True, "devices": [dev, dev | {"identity_id": 5}],
           "processes": [proc]}
    rows = gpu_metrics_rows(rec)
    ts = 1_764_000_000_123  # DateTime64(3): milliseconds
    device = [ts, "n", 1, "GPU-1", "H100 (simulated)", "", None, 5, 7, 8, 1, 2, 3, 4, 40, None, 6, 0, [79], True]
    assert rows["gpu_device_metrics"].as_rows() == [device + [""], device + ["0000000000000005"]]
    assert rows["gpu_process_metrics"].as_rows() == [[ts, "n", 1, 9, "python", "", 50, None, 100, True,
                                                 "0000000000001234"]]
    # read as columns (the sink's decode): the same rows, column by column; records before identities store ''
    columnar = rec | {"devices": {k: [d.get(k, 0) for d in rec["devices"]] for k in dev | {"identity_id": 0}},
                      "processes": {k: [p[k] for p in rec["processes"]] for k in proc if k != "identity_id"}}
    by_columns = gpu_metrics_rows(columnar)
    for table, want in [("gpu_device_metrics", [device + [""], device + ["0000000000000005"]]),
                        ("gpu_process_metrics", [[ts, "n", 1, 9, "python", "", 50, None, 100, True, ""]])]:
        assert by_columns[table].as_rows() == want


def test_identity_rows_are_the_dimension_table_row():
    ident = Identity("pod", container_runtime="containerd", container_id="ab" * 32, container_name="trainer",
                     pod_name="train-0", namespace="ml", pod_uid="u-1", labels=(("team", "vision"),), team="vision")
    rec = ident.record("node-1", T, simulated=True)
    (row,) = identity_rows(rec)["workload_identities"].rows
    assert row == [f"{ident.identity_id:016x}", "node-1", 1_764_000_000_123, "pod",
                   "containerd", "ab" * 32, "trainer", "train-0", "ml", "u-1", {"team": "vision"}, "", "", "", "", "",
                   "", "", "vision", True]
    with pytest.raises(ValueError, match="identity_id 0"):
        identity_rows(rec | {"identity_id": 0})


def test_rows_for_merges_tables_in_message_order():
    rec = {"node": "n", "window_start_ns": T, "window_ns": 1, "frames": [], "stacks": [],
           "samples": [{"pid": 1, "comm": "c", "container_id": "", "stack_id": 1, "count": 1}]}
    msgs = [Message("cpu.samples", 0, i, None, "fleetprof.CpuSamples", dict(rec, node=f"n{i}")) for i in range(3)]
    assert [r[1] for r in rows_for(msgs)["cpu_samples"].as_rows()] == ["n0", "n1", "n2"]


def test_a_definition_first_carried_by_an_old_window_is_written_as_seen_now(store) -> None:
    # ids are content hashes shared by every node: a definition that reached the store already past its 90-day TTL
    # would be dropped on insert, and newer samples of the frame would stay unnamed until it is re-sent
    old = 1_577_836_800 * 10**9  # 2020-01-01
    rec = {"node": "n", "window_start_ns": old, "window_ns": 10**10,
           "frames": [{"frame_id": 7, "function": "f", "binary": "b", "kind": "NATIVE"}],
           "stacks": [{"stack_id": 8, "frame_ids": [7]}],
           "samples": [{"pid": 3, "comm": "c", "container_id": "", "stack_id": 8, "count": 1}]}
    now = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)
    rows = rows_for([Message("cpu.samples", 0, 0, None, "fleetprof.CpuSamples", rec)], now)
    now_s = int(now.timestamp())
    assert rows["frames"].rows[0][4] == now_s and rows["stacks"].rows[0][2] == now_s
    assert rows["cpu_samples"].as_rows()[0][0] == old // 10**9  # samples keep their window
    newer = dict(rec, window_start_ns=int(now.timestamp() + 60) * 10**9)
    assert rows_for([Message("cpu.samples", 0, 1, None, "fleetprof.CpuSamples", newer)], now)["frames"].rows[0][4] \
        == now_s + 60
    for table in ("frames", "stacks"):
        store.insert(table, rows[table].as_rows(), rows[table].columns)
    _, found = store.query_sql("SELECT function FROM frames WHERE frame_id = 7", {})
    assert found == [("f",)]


def test_samples_read_as_columns_give_the_rows_their_records_give(store) -> None:
    recent = (int(time.time()) // 10 * 10 - 3600) * 10**9  # inside the table's TTL
    rec = {"node": "n", "window_start_ns": recent, "window_ns": 10**10, "frames": [], "stacks": [],
           "frequency_hz": 19,
           "samples": [{"pid": 3, "comm": "c", "container_id": "k", "stack_id": -2, "count": 9, "identity_id": 0},
                       {"pid": 4, "comm": "d", "container_id": "", "identity_id": -2, "stack_id": 7, "count": 1}]}
    items = rec["samples"]
    columnar = rec | {"samples": {name: [s[name] for s in items] for name in items[0]}}
    by_rows, by_columns = cpu_samples_rows(rec), cpu_samples_rows(columnar)
    assert by_columns["cpu_samples"].by_column is not None
    assert by_columns["cpu_samples"].as_rows() == by_rows["cpu_samples"].as_rows()
    assert by_columns["profile_windows"].rows == by_rows["profile_windows"].rows != []
    none = cpu_samples_rows(rec | {"samples": {}})  # no samples: no rows, and no window row
    assert len(none["cpu_samples"]) == 0 and none["profile_windows"].rows == []
    # a batch of records read either way merges in message order, as columns
    msgs = [Message("cpu.samples", 0, i, None, "fleetprof.CpuSamples", r | {"node": f"n{i}"})
            for i, r in enumerate([columnar, rec, columnar])]
    assert [r[1] for r in rows_for(msgs)["cpu_samples"].as_rows()] == ["n0", "n0", "n1", "n1", "n2", "n2"]
    merged = rows_for([msgs[0], msgs[2]])["cpu_samples"]
    assert merged.by_column[1] == ["n0", "n0", "n2", "n2"] and len(merged) == 4
    # integer columns as arrays, ids as the unsigned values their longs carry (the store casts them to the column)
    pid, stack, count = (merged.by_column[merged.columns.index(c)] for c in ("pid", "stack_id", "count"))
    assert pid.dtype == count.dtype == np.int64 and stack.dtype == np.uint64
    assert stack.tolist() == [2**64 - 2, 7, 2**64 - 2, 7] and count.tolist() == [9, 1, 9, 1]
    with pytest.raises(KeyError):  # a record without a field it must have: row building fails (a dead letter)
        cpu_samples_rows(rec | {"samples": [{"pid": 1}]})
    with pytest.raises(ValueError, match="pid"):  # a column is range-checked as a whole
        rows_for([Message("cpu.samples", 0, 9, None, "fleetprof.CpuSamples",
                          columnar | {"samples": columnar["samples"] | {"pid": [3, -1]}})])
    names = rows_for([msgs[0], msgs[2]])["process_names"]
    store.insert("process_names", names.rows, names.columns)  # as the sink does: the names (loaded), then the rows
    store.insert("cpu_samples", merged.by_column, merged.columns, column_oriented=True)
    _, found = store.query_sql("SELECT node, pid, stack_id, count, identity FROM cpu_samples WHERE node IN "
                               "('n0', 'n2') ORDER BY node, pid", {})
    assert found == [("n0", 3, 2**64 - 2, 9, ""), ("n0", 4, 7, 1, "fffffffffffffffe"),
                     ("n2", 3, 2**64 - 2, 9, ""), ("n2", 4, 7, 1, "fffffffffffffffe")]


@pytest.mark.parametrize("column, values, bad", [
    ("gpu_util_pct", [None, 5, None], None), ("gpu_util_pct", [None, None], None),
    ("gpu_util_pct", [None, 256, 3], 256), ("temperature_c", [-5, None, -40000], -40000),
    ("xid_errors", [[], [79, 13], []], None), ("xid_errors", [[], [79, 2**32]], 2**32),
])
def test_nullable_and_array_columns_are_range_checked_whole(column, values, bad) -> None:
    rows = Rows(["node", column], [["n", v] for v in values])
    if bad is None:
        assert check_ranges("gpu_device_metrics", rows) is rows
    else:
        with pytest.raises(ValueError, match=f"gpu_device_metrics.{column} = {bad} lies outside"):
            check_ranges("gpu_device_metrics", rows)
