"""Launch stacks symbolized once per code path: processes with their own address-space layouts share the result,
each process's stack still resolves to exactly the frames symbolize gives it, a stack resolved while its table was
missing is not kept, and unknown frames are counted for every process that shows them."""

from __future__ import annotations

import pytest

import processors.launch_stacks as launch_stacks
from processors.correlate import SECOND_NS, Correlator, Outcome
from processors.launch_stacks import LaunchStacks
from processors.symbol_tables import SymbolTables
from processors.symbolize import FrameMemo, SymbolizeStats, symbolize_batch
from tests.pipeline_helpers import APP_BASE, addr, build_id_for, stack, symbol_chunks

BUILD_ID = build_id_for("launch-stacks")
T0 = 1_767_000_000 * SECOND_NS
PATH = ["main", "run", "compute"]
KERNEL_NAME = "ampere_sgemm_128x64_tn"


def tables(with_app: bool = True) -> SymbolTables:
    t = SymbolTables()
    for c in symbol_chunks(BUILD_ID) if with_app else ():
        t.add_chunk(c)
    return t


def mappings(shift: int) -> list[dict]:
    return [{"start": APP_BASE + shift, "limit": APP_BASE + shift + 0x10000, "file_offset": 0, "path": "/opt/app",
             "build_id": BUILD_ID}]


def matches(join: Correlator, shifts: list[int], extra: list[int] | None = None) -> list[tuple]:
    """One launch + kernel pair per new process; each process's layout is the app moved by its shift, and its stack
    has the addresses `extra` (outside every mapping) at its root."""
    out = Outcome()
    first = len(join.parts[0].procs) if join.parts else 0
    for i, shift in enumerate(shifts):
        pid = 100 + first + i
        addrs = [addr(f, n == 0) + shift for n, f in enumerate(reversed(PATH))] + (extra or [])
        join.process(0, 0, -1, {"node": "n", "pid": pid, "tid": pid, "process_start_ns": 1, "time_ns": T0 + i,
                                "correlation_id": 1, "callback_id": 211, "api_name": "cudaLaunchKernel",
                                "weight": 1, "user_addrs": addrs, "mappings": mappings(shift),
                                "simulated": False}, out)
        join.process(0, 1, -1, {"node": "n", "pid": pid, "process_start_ns": 1, "correlation_id": 1,
                                "start_ns": T0 + i + 10, "end_ns": T0 + i + 20, "device_id": 0, "stream_id": 0,
                                "kernel_name": KERNEL_NAME, "simulated": False}, out)
    assert len(out.matches) == len(shifts)
    return out.matches


@pytest.fixture
def resolved_addresses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many addresses each call of the row resolver was given."""
    calls: list[int] = []
    real = launch_stacks.user_frame_ids

    def counting(group, *args, **kwargs):
        calls.append(len(group))
        return real(group, *args, **kwargs)

    monkeypatch.setattr(launch_stacks, "user_frame_ids", counting)
    return calls


def test_processes_with_their_own_layouts_share_one_symbolization(resolved_addresses):
    stacks, stats = LaunchStacks(), SymbolizeStats()
    join = Correlator()
    first = stacks.resolve(matches(join, [0, 0x10_0000, 0x2000_0000]), tables().get, stats)
    assert resolved_addresses == [len(PATH)]  # three processes' stacks, one code path
    assert len(stacks.cpu) == 3 and len(stacks.by_offsets) == 1
    # each is what symbolize names in that process, the GPU kernel as the leaf
    proc = {"pid": 1, "comm": "", "mappings": mappings(0x10_0000),
            "stacks": [stack(PATH, 1)]}
    proc["stacks"][0]["user_addrs"] = [a + 0x10_0000 for a in proc["stacks"][0]["user_addrs"]]
    cpu = symbolize_batch({"node": "", "window_start_ns": 0, "window_ns": 0, "kernel_build_id": "",
                           "processes": [proc]}, tables().get, stacks.memo)
    names = {f["frame_id"]: f["function"] for f in cpu["frames"]}
    assert [names[f] for f in cpu["stacks"][0]["frame_ids"]] == PATH
    for sid, ids, frames in first:
        assert (sid, ids) == first[0][:2]
        assert [f[1] for f in frames] == [*PATH, KERNEL_NAME]
    assert stats.frames == 3 * len(PATH) and stats.unknown_frames == 0
    # a later process with the same path: a lookup, no resolver call
    later = stacks.resolve(matches(join, [0x3000_0000]), tables().get, stats)
    assert resolved_addresses == [len(PATH)] and len(stacks.cpu) == 4
    assert later[0][:2] == first[0][:2]


def test_a_stack_whose_table_is_missing_is_resolved_again_once_it_arrives(resolved_addresses):
    stacks, stats = LaunchStacks(FrameMemo()), SymbolizeStats()
    ms = matches(Correlator(), [0, 0x10_0000])
    missing = stacks.resolve(ms, tables(with_app=False).get, stats)
    assert BUILD_ID in stats.missing_build_ids
    assert not stacks.cpu and not stacks.by_offsets and not stacks.gpu
    assert all(f[1] != "main" for _, _, frames in missing for f in frames)
    later = stacks.resolve(ms, tables().get, SymbolizeStats())
    assert [f[1] for f in later[1][2]] == [*PATH, KERNEL_NAME]
    assert resolved_addresses == [len(PATH), len(PATH)]  # the two processes' one path, each time


def test_unknown_frames_count_for_every_process_that_shows_them():
    outside = 0x7000_0000_0000  # in no mapping of any process
    stacks, stats = LaunchStacks(), SymbolizeStats()
    join = Correlator()
    out = stacks.resolve(matches(join, [0, 0x10_0000], extra=[outside]), tables().get, stats)
    assert stats.unknown_frames == 2
    stacks.resolve(matches(join, [0x2000_0000], extra=[outside]), tables().get, stats)
    assert stats.unknown_frames == 3
    assert out[0][2][0][1] == out[1][2][0][1] and "0x7000" in out[0][2][0][1]  # the root: unknown, by address
