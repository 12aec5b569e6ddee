"""symbolize_cached: the record and stats symbolize_batch gives, batch after batch, with rows from its cache; rows
that needed a missing table (or a code object the process did not send) are symbolized again; a replaced table
drops what was kept."""

from __future__ import annotations

from processors.symbol_tables import SymbolTables
from processors.symbolize import FrameMemo, SymbolizeStats, symbolize_batch
from processors.symbolize_cache import StackCache, symbolize_cached
from schemas import single_object
from schemas.cpu_batch_reader import decode_columnar
from schemas.wire import LOST_STACK_FRAME, TRUNCATED_FRAME, python_frame, u64_to_long
from simulate.loadgen import _Run
from simulate.synthetic_fleet import SyntheticFleet
from tests.test_symbolize import KBASE, LIBC, _batch, _tables

BASE = 0x7F0000000000
OTHER = "bb" * 20  # a build id whose table comes later


def _same(batch: dict, tables: SymbolTables, memo: FrameMemo, cache: StackCache) -> dict:
    """symbolize_cached's record and stats, checked equal to symbolize_batch's (fresh memo) on the same batch."""
    want_stats, got_stats = SymbolizeStats(), SymbolizeStats()
    want = symbolize_batch(batch, tables.get, FrameMemo(), want_stats)
    got = symbolize_cached(batch, tables.get, tables.generation, memo, cache, got_stats)
    assert got.record() == want
    assert got.estimated_bytes() == _estimated(want)
    assert vars(got_stats) == vars(want_stats)
    return want


def _estimated(rec: dict) -> int:
    from processors.symbolize import estimated_bytes
    return estimated_bytes(rec)


class _Capture:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, bytes]] = []

    def publish(self, topic: str, key: str, value: bytes) -> None:
        self.sent.append((topic, key, value))


def test_synthetic_fleet_windows_give_symbolize_batch_records() -> None:
    fleet = SyntheticFleet(seed=3)
    nodes = [fleet.node(i) for i in range(3)]
    cap = _Capture()
    run = _Run(fleet, cap, 10**10, 1 << 20)  # type: ignore[arg-type]
    run.symbols()
    tables = SymbolTables()
    for topic, _, value in cap.sent:
        if topic == "symbols":
            tables.add_chunk(single_object.decode(value)[1])
    memo, cache = FrameMemo(), StackCache()
    for w in range(4):
        cap.sent.clear()
        for n, node in enumerate(nodes):
            run.cpu(n, node, 10**18 + w * 10**10, 1520)
        for topic, _, value in cap.sent:
            if topic == "cpu.stacks":
                _same(decode_columnar(value)[1], tables, memo, cache)
    assert cache.rows  # windows repeat stacks: the later ones came from the cache


def _marked_batch() -> dict:
    codes = [{"qualname": "Model.forward", "file": "/srv/model.py", "first_line": 10}]
    stacks = [
        {"tid": 7, "user_addrs": [u64_to_long(x) for x in (BASE + 0x1410, python_frame(0, 12), TRUNCATED_FRAME)],
         "kernel_addrs": [u64_to_long(KBASE + 0x104)], "count": 4},
        {"tid": 8, "user_addrs": [u64_to_long(x) for x in (BASE + 0x1f00, python_frame(3, 1))], "kernel_addrs": [],
         "count": 2},
        {"tid": 9, "user_addrs": [u64_to_long(LOST_STACK_FRAME)], "kernel_addrs": [], "count": 1},
        {"tid": 9, "user_addrs": [u64_to_long(0x1234)], "kernel_addrs": [u64_to_long(0x10)], "count": 3},
        {"tid": 10, "user_addrs": [u64_to_long(BASE + 0x1410)], "kernel_addrs": [], "count": 5},
        {"tid": 11, "user_addrs": [u64_to_long(BASE + 0x1410)], "kernel_addrs": [], "count": 6},
        {"tid": 12, "user_addrs": [], "kernel_addrs": [], "count": 1},
    ]
    batch = _batch(stacks)
    batch["processes"][0]["code_objects"] = codes
    return batch


def test_unknown_truncated_lost_and_bad_python_frames_count_the_same_from_the_cache() -> None:
    tables, memo, cache = _tables(), FrameMemo(), StackCache()
    batch = _marked_batch()
    for _ in range(3):
        _same(batch, tables, memo, cache)
    # the row with a code object index its process did not send is never kept (it counts once per batch)
    assert len(cache.rows) == len(batch["processes"][0]["stacks"]) - 2  # and the duplicate row shares one entry


def test_a_table_that_arrives_later_names_the_rows_that_needed_it() -> None:
    tables, memo, cache = _tables(), FrameMemo(), StackCache()
    maps = [{"start": BASE, "limit": BASE + 0x2000, "file_offset": 0x1000, "path": "/usr/lib/libc.so.6",
             "build_id": LIBC},
            {"start": BASE + 0x10000, "limit": BASE + 0x12000, "file_offset": 0, "path": "/opt/libx.so",
             "build_id": OTHER}]
    batch = _batch([{"tid": 1, "user_addrs": [u64_to_long(BASE + 0x10010), u64_to_long(BASE + 0x1410)],
                     "kernel_addrs": [], "count": 1},
                    {"tid": 2, "user_addrs": [u64_to_long(BASE + 0x1410)], "kernel_addrs": [], "count": 1}], maps)
    before = _same(batch, tables, memo, cache)
    assert len(cache.rows) == 1  # the row in libx.so waits for its table
    tables.add_chunk({"build_id": OTHER, "binary": "libx.so", "kind": "ELF", "chunk_index": 0, "chunk_count": 1,
                      "load_segments": [], "addrs": [0x0], "sizes": [0x100], "names": ["xfunc"]})
    after = _same(batch, tables, memo, cache)
    assert "xfunc" in {f["function"] for f in after["frames"]} - {f["function"] for f in before["frames"]}


def test_a_replaced_table_drops_what_was_kept() -> None:
    tables, memo, cache = _tables(), FrameMemo(), StackCache()
    batch = _batch([{"tid": 1, "user_addrs": [u64_to_long(BASE + 0x1410)], "kernel_addrs": [], "count": 1}])
    _same(batch, tables, memo, cache)
    tables.add_chunk({"build_id": LIBC, "binary": "libc.so.6", "kind": "ELF", "chunk_index": 0, "chunk_count": 1,
                      "load_segments": [{"file_offset": 0x1000, "vaddr": 0x2000, "memsz": 0x1000}],
                      "addrs": [0x2400], "sizes": [0x100], "names": ["read_v2"]})
    memo = FrameMemo()  # the stage starts a new memo when a table is replaced (its keys are symbol indexes)
    out = _same(batch, tables, memo, cache)
    assert [f["function"] for f in out["frames"]] == ["read_v2"]


def test_rows_of_one_stack_and_a_process_listed_twice_sum_as_symbolize_batch_sums_them() -> None:
    """Several rows of one stack (threads) sum into one sample; a process in two entries of a batch (its comm the
    same) sums across them, in the order symbolize_batch gives; counts past an Avro long are clamped the same."""
    rows = [{"tid": t, "user_addrs": [BASE + 0x410, BASE + 0x110, BASE + 0x10], "kernel_addrs": [], "count": n}
            for t, n in ((1, 3), (2, 4), (3, (1 << 63) - 2))]
    other = [{"tid": 9, "user_addrs": [BASE + 0x110, BASE + 0x10], "kernel_addrs": [], "count": 5}]
    batch = _batch(rows + other)
    twice = dict(batch["processes"][0], stacks=other + rows[:1])
    batch["processes"] += [dict(batch["processes"][0], pid=8, stacks=rows[:2]), twice]
    memo, cache = FrameMemo(), StackCache()
    for _ in range(2):  # symbolized, then from the cache
        want = _same(batch, _tables(), memo, cache)
    counts = [(s["pid"], s["count"]) for s in want["samples"]]
    assert counts == [(7, (1 << 63) - 1), (7, 10), (8, 7)]
