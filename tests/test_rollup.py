"""The hourly rollups (migration 0010): the flame-graph queries, which read whole hours from cpu_samples_1h /
gpu_kernel_samples_1h and the ragged edges from the 10 s windows, give exactly the sums of the windows alone; a
retried sink batch counts once in the rollups too; rows stored before the migration are backfilled."""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest

from fleetprof.store import migration_files, open_store, split_statements
from fleetprof.webui.model import ch_hex
from processors.store_writer import StoreRunner
from tests.migration_names import migrations_from
from tests.pipeline_helpers import Running, sink, symbolizer, wait_for
from tests.test_exactly_once import Crash, StoreDyingBeforeAfter, _send

CPU_COLUMNS = ["ts", "node", "pid", "comm", "container_id", "stack_id", "count"]
GPU_COLUMNS = ["ts", "node", "pid", "comm", "container_id", "device", "stream", "stack_id", "kernel_name",
               "duration_ns", "launches"]
FUNCTIONS = {1: "main", 2: "run", 3: "compute", 4: "io", 5: "idle", 6: "launch", 7: "gemm"}
STACKS = {101: [1, 2, 3], 102: [1, 2, 4], 103: [1, 5], 104: [1, 6, 7]}  # 105 and 106 are sampled, never defined
# seconds from the first whole hour H: on, just before and just after hour boundaries, and inside hours
OFFSETS = [-10, 0, 10, 1790, 3590, 3600, 3610, 5400, 7190, 7200, 10790, 10800, 14390, 14400, 14410]


def first_hour() -> datetime:
    """H: a whole UTC hour, six hours ago, so every row is well inside the tables' 30-day TTL and before now."""
    return datetime.now(tz=UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=6)


def known_rows(h: datetime) -> tuple[list[list], list[list]]:
    """CPU rows of two nodes and two processes, plus n3/pid 30 seen on CPU (comm train) only at H+1800; GPU rows of
    n1/pid 10 and n3/pid 30, whose comm is '' as the correlator writes it. Counts vary per row, so a row read twice
    or missed changes a sum."""
    cpu, gpu = [], []
    for i, offset in enumerate(OFFSETS):
        ts = h + timedelta(seconds=offset)
        for node in ("n1", "n2"):
            for pid, comm in ((10, "train"), (20, "serve")):
                for stack in (101, 102, 103, 106):
                    if (i + stack + pid) % 3:
                        cpu.append([ts, node, pid, comm, "", stack, 1 + (i * 7 + stack * 3 + pid) % 13])
        for node, pid in (("n1", 10), ("n3", 30)):
            for stack, kernel in ((104, "gemm"), (105, "reduce")):
                gpu.append([ts, node, pid, "", "", 0, 7, stack, kernel, 1000 * (1 + (i * 5 + stack) % 7), 1 + i % 3])
    cpu.append([h + timedelta(seconds=1800), "n3", 30, "train", "", 103, 4])
    return cpu, gpu


def put_definitions(store, when: datetime) -> None:
    store.insert("frames", [[f, name, "app", "GPU_KERNEL" if f == 7 else "NATIVE", when]
                            for f, name in FUNCTIONS.items()], ["frame_id", "function", "binary", "kind", "last_seen"])
    store.insert("stacks", [[s, frames, when] for s, frames in STACKS.items()], ["stack_id", "frame_ids", "last_seen"])


@pytest.fixture
def known(store):
    h = first_hour()
    cpu, gpu = known_rows(h)
    put_definitions(store, h)
    # several inserts, each of many windows: the views pass the rows on (0018), and merges or queries add them up
    for part in range(3):
        store.insert("cpu_samples", cpu[part::3], CPU_COLUMNS)
        store.insert("gpu_kernel_samples", gpu[part::3], GPU_COLUMNS)
    return store, h, cpu, gpu


# --- the expected results, from the rows themselves ----------------------------------------------------------------


def in_range(row, since, until, node, pid) -> bool:
    return since <= row[0] < until and node in ("", row[1]) and pid in (0, row[2])


def cpu_sums(cpu, since, until, node="", pid=0, comm="") -> dict[int, int]:
    sums: dict[int, int] = defaultdict(int)
    for row in cpu:
        if in_range(row, since, until, node, pid) and comm in ("", row[3]):
            sums[row[5]] += row[6]
    return dict(sums)


def gpu_sums(cpu, gpu, since, until, node="", pid=0, comm="") -> dict[int, int]:
    # a comm filter also takes the processes the CPU sampler saw under that comm in the range
    seen = {(r[1], r[2]) for r in cpu if since <= r[0] < until and r[3] == comm}
    sums: dict[int, int] = defaultdict(int)
    for row in gpu:
        if in_range(row, since, until, node, pid) and (comm in ("", row[3]) or (row[1], row[2]) in seen):
            sums[row[7]] += row[9]
    return dict(sums)


def names_of(stack: int) -> tuple[str, ...]:
    if stack in STACKS:
        return tuple(FUNCTIONS[f] for f in STACKS[stack])
    return (f"[unknown stack 0x{ch_hex(stack)}]",)


def by_names(sums: dict[int, int]) -> list[tuple]:
    merged: dict[tuple, int] = defaultdict(int)
    for stack, value in sums.items():
        merged[names_of(stack)] += value
    return sorted(merged.items())


def query(store, name: str, params: dict) -> list[tuple]:
    return store.query_named(name, params)[1]


# --- exactness ------------------------------------------------------------------------------------------------------


def ranges(h: datetime) -> dict[str, tuple[datetime, datetime]]:
    s = timedelta(seconds=1)
    return {
        "whole hours": (h, h + timedelta(hours=4)),
        "ragged both ends": (h - 10 * s, h + timedelta(hours=4) + 11 * s),
        "ragged, ends inside hours": (h + 5 * s, h + timedelta(hours=3, minutes=59, seconds=55)),
        "across one boundary, no whole hour": (h + 1790 * s, h + 3610 * s),
        "inside one hour": (h + 10 * s, h + 1800 * s),
        "exactly one hour": (h + timedelta(hours=1), h + timedelta(hours=2)),
        "one hour and a second": (h + timedelta(hours=1) - s, h + timedelta(hours=2)),
        "empty": (h + 20 * s, h + 20 * s),
    }


FILTERS = [{}, {"node": "n1"}, {"pid": 20}, {"comm": "train"}, {"node": "n1", "comm": "serve"}, {"node": "n3"},
           {"node": "n3", "comm": "train"}]
PROCESS_FILTERS = [{}, {"comm": "train"}, {"node": "n3"}]
# Every range under the filters that reach the rollup differently (none; comm, which the GPU side resolves through
# CPU rows; node and comm together), every filter under the ranges with whole hours, ragged edges and no whole hour:
# each way a range is cut meets each way rows are filtered, without the whole cross product (that repeated ~500
# queries for ~100 s)
EVERY_RANGE_FILTERS = [{}, {"comm": "train"}, {"node": "n3", "comm": "train"}]
EVERY_FILTER_RANGES = ["whole hours", "ragged both ends", "across one boundary, no whole hour"]


def cases(h: datetime) -> list[tuple[str, tuple[datetime, datetime], dict]]:
    """(range label, range, filters) of the comparison."""
    return [(label, span, filters) for label, span in ranges(h).items() for filters in FILTERS
            if filters in EVERY_RANGE_FILTERS or label in EVERY_FILTER_RANGES]


def per_stack(rows: list) -> list[tuple[int, tuple, int]]:
    """flamegraph_ids_* rows (stack id, frame ids, value, node, pid, comm) summed over the processes."""
    sums: dict[tuple, int] = {}
    for stack_id, frame_ids, value, *_process in rows:
        key = (int(stack_id), tuple(frame_ids))
        sums[key] = sums.get(key, 0) + int(value)
    return sorted((s, f, v) for (s, f), v in sums.items())


def per_names(rows: list) -> list[tuple[tuple, int]]:
    """flamegraph_processes_* rows (node, pid, comm, functions, binaries, …, value) summed over the processes."""
    sums: dict[tuple, int] = {}
    for _node, _pid, _comm, functions, _binaries, *_, value in rows:
        sums[tuple(functions)] = sums.get(tuple(functions), 0) + int(value)
    return sorted(sums.items())


def test_flame_graphs_are_exactly_the_window_sums_for_every_range_and_filter(known):
    store, h, cpu, gpu = known
    checked = 0
    todo = cases(h)
    assert len(todo) == 36 and {label for label, _, _ in todo} == set(ranges(h)) and \
        all(f in [f for _, _, f in todo] for f in FILTERS)
    for label, (since, until), filters in todo:
        params = {"since": since, "until": until, **filters}
        case = f"{label} {filters}"
        want_cpu, want_gpu = cpu_sums(cpu, **params), gpu_sums(cpu, gpu, **params)

        got = sorted((tuple(f), int(c)) for f, c in query(store, "flamegraph_cpu", params))
        assert got == by_names(want_cpu), case
        got = per_stack(query(store, "flamegraph_ids_cpu", params))
        assert got == sorted((s, tuple(STACKS.get(s, [])), v) for s, v in want_cpu.items()), case
        if filters in PROCESS_FILTERS:  # the export's per-process query reads the same samples per process
            got = per_names(query(store, "flamegraph_processes_cpu", params))
            assert got == by_names(want_cpu), case
        got = sorted(int(r[0]) for r in query(store, "flamegraph_names_cpu", params))
        assert got == sorted({f for s in want_cpu for f in STACKS.get(s, [])}), case

        got = sorted((tuple(f), int(c)) for f, c in query(store, "flamegraph_gpu", params))
        assert got == by_names(want_gpu), case
        got = per_stack(query(store, "flamegraph_ids_gpu", params))
        assert got == sorted((s, tuple(STACKS.get(s, [])), v) for s, v in want_gpu.items()), case
        if filters in PROCESS_FILTERS:
            got = per_names(query(store, "flamegraph_processes_gpu", params))
            assert got == by_names(want_gpu), case
        got = sorted(int(r[0]) for r in query(store, "flamegraph_names_gpu", params))
        assert got == sorted({f for s in want_gpu for f in STACKS.get(s, [])}), case
        checked += bool(want_cpu) + bool(want_gpu)
    assert checked >= 50  # most cases hold rows: the comparisons above are not of empty results


def test_the_known_data_covers_what_the_comparison_needs(known):
    store, h, cpu, gpu = known
    whole = {"since": h, "until": h + timedelta(hours=4)}
    later = {"since": h + timedelta(seconds=1801), "until": h + timedelta(hours=4)}

    def added(*sums: dict[int, int]) -> dict[int, int]:
        return {s: sum(x.get(s, 0) for x in sums) for s in set().union(*sums)}

    # the n3 process is found by comm only through its one CPU row, inside a whole hour: in the first range only
    assert gpu_sums(cpu, gpu, **whole, node="n3")
    assert gpu_sums(cpu, gpu, **whole, comm="train") == added(gpu_sums(cpu, gpu, **whole, node="n1"),
                                                             gpu_sums(cpu, gpu, **whole, node="n3"))
    assert gpu_sums(cpu, gpu, **later, comm="train") == gpu_sums(cpu, gpu, **later, node="n1")
    # every window row of the whole hours is in the rollup, once
    _, rows = store.query_sql(
        "SELECT sum(count) FROM cpu_samples_1h WHERE hour >= {h:DateTime} AND hour < {e:DateTime}",
        {"h": whole["since"], "e": whole["until"]})
    assert rows[0][0] == sum(r[6] for r in cpu if whole["since"] <= r[0] < whole["until"]) > 0


def test_whole_hours_come_from_the_rollup_and_edges_from_the_windows(known):
    # a row put into the rollup alone shows exactly when its hour is whole inside the range; a window row (which
    # the view also sums into the rollup) shows once either way
    store, h, _, _ = known
    hour = h + timedelta(hours=1)
    store.insert("cpu_samples_1h", [[hour, "marker", 1, "m", "", 101, 1000]], ["hour", *CPU_COLUMNS[1:]])
    store.insert("cpu_samples", [[hour + timedelta(seconds=20), "marker", 1, "m", "", 102, 1]], CPU_COLUMNS)
    s = timedelta(seconds=1)
    for since, until, want in ((h, h + timedelta(hours=3), {101: 1000, 102: 1}),
                               (h + s, hour + timedelta(hours=1), {101: 1000, 102: 1}),
                               (hour + s, h + timedelta(hours=3), {102: 1}),
                               (hour, hour + timedelta(hours=1) - s, {102: 1})):
        rows = query(store, "flamegraph_ids_cpu", {"since": since, "until": until, "node": "marker"})
        assert {int(r[0]): int(r[2]) for r in rows} == want, (since, until)


# --- deduplication --------------------------------------------------------------------------------------------------


def rollup_totals(store, node: str) -> tuple[int, int]:
    _, rows = store.query_sql(
        "SELECT (SELECT sum(count) FROM cpu_samples_1h WHERE node = {n:String}),"
        " (SELECT sum(duration_ns) FROM gpu_kernel_samples_1h WHERE node = {n:String})", {"n": node})
    return int(rows[0][0] or 0), int(rows[0][1] or 0)


def window_totals(store, node: str) -> tuple[int, int]:
    _, rows = store.query_sql(
        "SELECT (SELECT sum(count) FROM cpu_samples WHERE node = {n:String}),"
        " (SELECT sum(duration_ns) FROM gpu_kernel_samples WHERE node = {n:String})", {"n": node})
    return int(rows[0][0] or 0), int(rows[0][1] or 0)


def test_a_re_inserted_batch_counts_once_in_the_rollups(store):
    h = first_hour()
    cpu = [[h + timedelta(seconds=10), "dedup", 1, "a", "", 7, 5],
           [h + timedelta(seconds=3700), "dedup", 1, "a", "", 8, 2]]
    gpu = [[h + timedelta(seconds=10), "dedup", 1, "", "", 0, 0, 7, "k", 900, 3]]
    for _ in range(2):  # the sink's retry after a crash between insert and commit: same rows, same tokens
        store.insert("cpu_samples", cpu, CPU_COLUMNS, dedup_token="cpu.samples:0:10-19:cpu_samples")
        store.insert("gpu_kernel_samples", gpu, GPU_COLUMNS, dedup_token="gpu.samples:0:10-19:gpu_kernel_samples")
    assert window_totals(store, "dedup") == rollup_totals(store, "dedup") == (7, 900)
    # the next batch, with identical rows but its own token, counts
    store.insert("cpu_samples", cpu, CPU_COLUMNS, dedup_token="cpu.samples:0:20-29:cpu_samples")
    store.insert("gpu_kernel_samples", gpu, GPU_COLUMNS, dedup_token="gpu.samples:0:20-29:gpu_kernel_samples")
    assert window_totals(store, "dedup") == rollup_totals(store, "dedup") == (14, 1800)


def test_identical_blocks_without_a_token_both_count_in_the_rollups(store):
    h = first_hour()
    cpu = [[h + timedelta(seconds=10), "plain", 1, "a", "", 7, 5]]
    for _ in range(2):
        store.insert("cpu_samples", cpu, CPU_COLUMNS)
    assert window_totals(store, "plain") == rollup_totals(store, "plain") == (10, 0)


def test_a_sink_dying_after_its_insert_counts_once_in_the_rollup(kafka_bootstrap, store):
    # the real StoreRunner inserts a batch, 'dies' before recording it, and its successor re-inserts the same range
    # with the same tokens: the window table and the rollup each keep one copy
    run = uuid.uuid4().hex[:8]
    node = f"rollup-sink-{run}"
    _, want = _send(kafka_bootstrap, run, node, windows=4)
    stop = threading.Event()
    dying = Running(StoreRunner(StoreDyingBeforeAfter(store, node), {"bootstrap.servers": kafka_bootstrap},
                                group=f"sink-{run}", stop=stop, flush_interval=0.3), stop)
    with symbolizer(kafka_bootstrap, f"sym-{run}") as sym:
        with dying:
            wait_for(lambda: dying.error is not None, what="the sink to die", running=[sym])
        assert isinstance(dying.error, Crash)
        assert rollup_totals(store, node)[0] > 0  # the rows did reach the rollup before the 'crash'
        with sink(store, kafka_bootstrap, f"sink-{run}") as snk:
            wait_for(lambda: window_totals(store, node)[0] == want, what="exact total", running=[sym, snk])
            time.sleep(1.5)
    assert window_totals(store, node)[0] == want
    assert rollup_totals(store, node)[0] == want


# --- migrating a store that holds samples ---------------------------------------------------------------------------


def test_the_migration_backfills_rows_stored_before_it(chdb_dir):
    before = open_store(f"chdb://{chdb_dir}", f"t_rollup_backfill_{uuid.uuid4().hex[:8]}")
    try:
        for version, name, path in migration_files():
            if version >= 10:
                break
            for statement in split_statements(path.read_text()):
                before.client.command(statement)
            before.insert("schema_migrations", [[version, name, datetime.now(tz=UTC)]],
                          ["version", "name", "applied_at"])
        h = first_hour()
        cpu, gpu = known_rows(h)
        before.insert("cpu_samples", cpu, CPU_COLUMNS)
        before.insert("gpu_kernel_samples", gpu, GPU_COLUMNS)
        assert before.migrate() == migrations_from(10)
        for node in ("n1", "n2", "n3"):
            assert rollup_totals(before, node) == window_totals(before, node), node
        assert rollup_totals(before, "n1") == (sum(r[6] for r in cpu if r[1] == "n1"),
                                               sum(r[9] for r in gpu if r[1] == "n1"))
        # and from now on the views feed the rollup: once, not twice on top of the backfill
        before.insert("cpu_samples", cpu[:1], CPU_COLUMNS)
        assert rollup_totals(before, cpu[0][1]) == window_totals(before, cpu[0][1])
    finally:
        before.client.command("DROP DATABASE IF EXISTS {db:Identifier}", parameters={"db": before.database})
        before.close()
