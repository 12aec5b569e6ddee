"""symbolize_batch: frames root first, return addresses stepped back, unknowns kept, stable ids, split outputs; the
same output whether a process's stacks are StackCount dicts or the columns the columnar decoder gives."""

from __future__ import annotations

from processors.stack_ids import frame_id
from processors.symbol_tables import SymbolTables
from processors.symbolize import FrameMemo, SymbolizeStats, symbolize_batch
from schemas import single_object
from schemas.cpu_batch_reader import decode_columnar
from schemas.packed_stacks import PackedStacks
from schemas.wire import LOST_STACK_FRAME, TRUNCATED_FRAME, python_frame, u64_to_long
from simulate.synthetic_binaries import KERNEL_BUILD_ID
from simulate.synthetic_fleet import FREQUENCY_HZ, SyntheticFleet

LIBC = "aa" * 20
KERNEL = "kernel-test"
KBASE = 0xFFFFFFFF81000000


def _tables() -> SymbolTables:
    t = SymbolTables()
    # libc: text segment at file offset 0x1000 mapped to vaddr 0x2000 (non-identity, like many real ELF files)
    t.add_chunk({"build_id": LIBC, "binary": "libc.so.6", "kind": "ELF", "chunk_index": 1, "chunk_count": 2,
                 "load_segments": [{"file_offset": 0x1000, "vaddr": 0x2000, "memsz": 0x1000}],
                 "addrs": [0x2400], "sizes": [0x100], "names": ["read"]})
    t.add_chunk({"build_id": LIBC, "binary": "libc.so.6", "kind": "ELF", "chunk_index": 0, "chunk_count": 2,
                 "load_segments": [{"file_offset": 0x1000, "vaddr": 0x2000, "memsz": 0x1000}],
                 "addrs": [0x2000, 0x2100], "sizes": [0x100, 0x100], "names": ["main", "work"]})
    t.add_chunk({"build_id": KERNEL, "binary": "[kernel.kallsyms]", "kind": "KERNEL", "chunk_index": 0,
                 "chunk_count": 1, "load_segments": [],
                 "addrs": [u64_to_long(KBASE), u64_to_long(KBASE + 0x100)], "sizes": [0, 0],
                 "names": ["entry_SYSCALL_64", "ksys_read"]})
    return t


def _batch(stacks, mappings=None) -> dict:
    base = 0x7F0000000000
    maps = mappings if mappings is not None else [
        {"start": base, "limit": base + 0x2000, "file_offset": 0x1000, "path": "/usr/lib/libc.so.6",
         "build_id": LIBC}]
    return {"node": "n1", "window_start_ns": 10**18, "window_ns": 10**10, "frequency_hz": 99,
            "kernel_build_id": KERNEL, "simulated": False,
            "processes": [{"pid": 7, "comm": "app", "exe": "/app", "cgroup": "", "container_id": "c1",
                           "mappings": maps, "stacks": stacks}]}


def _symbolize(batch: dict, tables: SymbolTables, memo: FrameMemo | None = None,
               stats: SymbolizeStats | None = None) -> dict:
    """symbolize_batch of the dict batch, checked equal (output and stats) to that of its columnar decoding."""
    memo_cols, stats_cols = FrameMemo(), SymbolizeStats()
    stats = stats if stats is not None else SymbolizeStats()
    out = symbolize_batch(batch, tables.get, memo if memo is not None else FrameMemo(), stats)
    _, cols = decode_columnar(single_object.encode("CpuStackBatch", batch))
    assert all(isinstance(p["stacks"], PackedStacks) for p in cols["processes"])
    assert symbolize_batch(cols, tables.get, memo_cols, stats_cols) == out
    assert vars(stats_cols) == vars(stats)
    return out


def _names(out):
    byid = {f["frame_id"]: f for f in out["frames"]}
    return {tuple(byid[i]["function"] for i in s["frame_ids"]): s["stack_id"] for s in out["stacks"]}


def test_user_and_kernel_frames_root_first_and_counts_summed():
    base = 0x7F0000000000
    # vaddr 0x2400+x lives at file offset 0x1400+x, i.e. address base + 0x400 + x
    leaf, caller, root = base + 0x410, base + 0x110, base + 0x010
    k_leaf, k_root = KBASE + 0x120, KBASE + 0x8
    stacks = [
        {"tid": 1, "user_addrs": [leaf, caller, root], "kernel_addrs": [u64_to_long(k_leaf), u64_to_long(k_root)],
         "count": 3},
        # same symbols via different addresses and another thread: merges into the same stack
        {"tid": 2, "user_addrs": [leaf + 4, caller + 8, root + 2],
         "kernel_addrs": [u64_to_long(k_leaf + 1), u64_to_long(k_root + 1)], "count": 2},
    ]
    out = _symbolize(_batch(stacks), _tables())
    names = _names(out)
    assert list(names) == [("main", "work", "read", "entry_SYSCALL_64", "ksys_read")]
    assert [(s["pid"], s["comm"], s["container_id"], s["count"]) for s in out["samples"]] == [(7, "app", "c1", 5)]
    kinds = {f["function"]: (f["kind"], f["binary"]) for f in out["frames"]}
    assert kinds["ksys_read"] == ("KERNEL", "[kernel.kallsyms]")
    assert kinds["read"] == ("NATIVE", "libc.so.6")


def test_return_address_at_function_end_belongs_to_caller():
    base = 0x7F0000000000
    # a caller whose call is its last instruction: the return address is the first byte past `work`
    stacks = [{"tid": 1, "user_addrs": [base + 0x410, base + 0x200], "kernel_addrs": [], "count": 1}]
    out = _symbolize(_batch(stacks), _tables())
    assert list(_names(out)) == [("work", "read")]


def test_unknown_frames_are_kept_with_binary_and_offset():
    base = 0x7F0000000000
    stacks = [{"tid": 1, "user_addrs": [base + 0x1F00, 0x1234], "kernel_addrs": [u64_to_long(KBASE - 0x10)],
               "count": 1}]
    maps = [{"start": base, "limit": base + 0x2000, "file_offset": 0x1000, "path": "/gone/libx.so (deleted)",
             "build_id": "bb" * 20}]
    stats = SymbolizeStats()
    out = _symbolize(_batch(stacks, maps), _tables(), FrameMemo(), stats)
    assert list(_names(out)) == [("[unknown] 0x1234", "[unknown] libx.so+0x2f00",
                                  f"[unknown] [kernel.kallsyms]+0x{KBASE - 0x10:x}")]
    assert stats.unknown_frames == 3
    assert stats.missing_build_ids == {"bb" * 20}


def test_ids_are_stable_across_memos():
    base = 0x7F0000000000
    stacks = [{"tid": 1, "user_addrs": [base + 0x110, base + 0x010], "kernel_addrs": [], "count": 1}]
    a = _symbolize(_batch(stacks), _tables(), FrameMemo())
    b = _symbolize(_batch(stacks), _tables(), FrameMemo())
    assert a["stacks"] == b["stacks"]
    assert {f["frame_id"] for f in a["frames"]} == {frame_id("main", "libc.so.6", "NATIVE"),
                                                     frame_id("work", "libc.so.6", "NATIVE")}


def test_large_outputs_split_by_samples_and_keep_every_count():
    from processors.symbolize import estimated_bytes, split_samples

    base = 0x7F0000000000
    stacks = [{"tid": i, "user_addrs": [base + 0x410 + (i % 8), base + 0x110, base + 0x10 + i % 3],
               "kernel_addrs": [], "count": i + 1} for i in range(40)]
    batch = _batch(stacks)
    batch["processes"] = [dict(batch["processes"][0], pid=p, stacks=stacks) for p in range(50)]
    rec = _symbolize(batch, _tables())
    parts = split_samples(rec, max_bytes=400)
    assert len(parts) > 5
    assert sum(s["count"] for p in parts for s in p["samples"]) == sum(s["count"] for s in rec["samples"])
    for part in parts:
        assert len(single_object.encode("CpuSamples", part)) <= max(estimated_bytes(part), 400) + 64
        ids = {s["stack_id"] for s in part["samples"]}
        assert {s["stack_id"] for s in part["stacks"]} == ids
        assert {f["frame_id"] for f in part["frames"]} == {i for s in part["stacks"] for i in s["frame_ids"]}
    assert split_samples(rec, max_bytes=10**9) == [rec]


def test_processes_without_stacks_or_mappings_and_empty_batches():
    base = 0x7F0000000000
    batch = _batch([{"tid": 1, "user_addrs": [base + 0x410], "kernel_addrs": [], "count": 2}])
    first = batch["processes"][0]
    batch["processes"] += [dict(first, pid=8, stacks=[]), dict(first, pid=9, mappings=[])]
    out = _symbolize(batch, _tables())
    assert [(s["pid"], s["count"]) for s in out["samples"]] == [(7, 2), (9, 2)]
    assert {f["function"] for f in out["frames"]} == {"read", f"[unknown] 0x{base + 0x410:x}"}
    empty = _symbolize({**batch, "processes": []}, _tables())
    assert (empty["frames"], empty["stacks"], empty["samples"]) == ([], [], [])


def test_synthetic_fleet_batch_symbolizes_the_same_from_columns():
    fleet = SyntheticFleet(seed=5)
    tables = SymbolTables()
    for b in fleet.binaries:
        for c in b.symbol_chunks():
            tables.add_chunk(c)
    node = fleet.node(2)
    _, procs, _ = fleet.cpu_window(node, 1520)
    batch = {"node": node.name, "window_start_ns": 10**18, "window_ns": 10**10, "frequency_hz": FREQUENCY_HZ,
             "kernel_build_id": KERNEL_BUILD_ID, "simulated": True,
             "processes": [{**p, "stacks": p["stacks"].records()} for p in procs]}
    stats = SymbolizeStats()
    out = _symbolize(batch, tables, FrameMemo(), stats)
    assert stats.unknown_frames == 0 and stats.frames == sum(
        len(s["user_addrs"]) + len(s["kernel_addrs"]) for p in batch["processes"] for s in p["stacks"])
    assert sum(s["count"] for s in out["samples"]) == 1520


def test_perf_map_frames_of_cpython_are_interpreted_and_other_jit_code_native():
    t = _tables()
    jit = 0x7E0000000000
    t.add_chunk({"build_id": "perfmap:ab12", "binary": "[jit]", "kind": "PERFMAP", "chunk_index": 0,
                 "chunk_count": 1, "load_segments": [], "addrs": [jit, jit + 0x100], "sizes": [0x100, 0x100],
                 "names": ["py::handle:/srv/app.py", "LazyCompile:*render"]})
    base = 0x7F0000000000
    maps = [{"start": base, "limit": base + 0x2000, "file_offset": 0x1000, "path": "/usr/lib/libc.so.6",
             "build_id": LIBC},
            {"start": jit, "limit": jit + 0x1000, "file_offset": jit, "path": "[jit]", "build_id": "perfmap:ab12"}]
    out = _symbolize(_batch([{"tid": 7, "user_addrs": [jit + 0x110, jit + 0x20, base + 0x10], "kernel_addrs": [],
                              "count": 3}], maps), t)
    kinds = {f["function"]: (f["kind"], f["binary"]) for f in out["frames"]}
    assert kinds == {"main": ("NATIVE", "libc.so.6"), "py::handle:/srv/app.py": ("INTERPRETED", "[jit]"),
                     "LazyCompile:*render": ("NATIVE", "[jit]")}


def test_python_frames_are_named_from_their_process_code_objects():
    base = 0x7F0000000000
    codes = [{"qualname": "Model.forward", "file": "/srv/model.py", "first_line": 10},
             {"qualname": "<module>", "file": "/srv/train.py", "first_line": 1}]
    # leaf first: libc's read, called from Model.forward line 12, from the module's line 40; then a frame whose
    # index no code object has (a batch cut wrong) and the agent's mark of a chain cut short
    stacks = [{"tid": 7, "user_addrs": [u64_to_long(x) for x in (
        base + 0x1410, python_frame(0, 12), python_frame(1, 40), python_frame(5, 3), TRUNCATED_FRAME)],
        "kernel_addrs": [], "count": 4}]
    batch = _batch(stacks)
    batch["processes"][0]["code_objects"] = codes
    stats = SymbolizeStats()
    out = _symbolize(batch, _tables(), stats=stats)
    frames = {f["frame_id"]: f for f in out["frames"]}
    [stack] = out["stacks"]
    named = [(frames[f]["function"], frames[f]["binary"], frames[f]["kind"]) for f in stack["frame_ids"]]
    assert named == [("[truncated]", "[truncated]", "UNKNOWN"),
                     ("[unknown] python frame 5", "[unknown]", "UNKNOWN"),
                     ("<module> (/srv/train.py:40)", "/srv/train.py", "INTERPRETED"),
                     ("Model.forward (/srv/model.py:12)", "/srv/model.py", "INTERPRETED"),
                     ("read", "libc.so.6", "NATIVE")]
    assert stats.unknown_frames == 1 and stats.truncated_stacks == 1
    # without code objects (a v1 batch), the same words are unknown frames, never a crash
    del batch["processes"][0]["code_objects"]
    assert len(_symbolize(batch, _tables())["frames"]) == 5


def test_a_lost_stack_is_named_for_its_cause_and_the_batch_source_carries_through():
    """The agent's LOST_STACK_FRAME (its stack map was full) becomes one frame that names the cause and the setting,
    alone (the whole stack lost) or as the leaf under the user frames (the kernel part lost); the batch's simulated
    flag and sampling frequency reach the CpuSamples record (for labels and pprof's period)."""
    base = 0x7F0000000000
    stacks = [{"tid": 7, "user_addrs": [u64_to_long(LOST_STACK_FRAME)], "kernel_addrs": [], "count": 2},
              {"tid": 7, "user_addrs": [u64_to_long(LOST_STACK_FRAME), base + 0x10], "kernel_addrs": [],
               "count": 1}]
    batch = {**_batch(stacks), "simulated": True}
    stats = SymbolizeStats()
    out = _symbolize(batch, _tables(), stats=stats)
    frames = {f["frame_id"]: f for f in out["frames"]}
    named = sorted([(frames[f]["function"], frames[f]["binary"]) for f in s["frame_ids"]] for s in out["stacks"])
    assert named == [[("[stack lost: map full, raise agent --stack-entries]", "[lost]")],
                     [("main", "libc.so.6"), ("[stack lost: map full, raise agent --stack-entries]", "[lost]")]]
    assert stats.lost_stacks == 2 and stats.unknown_frames == 0
    # a frame keeps its binary's GNU build id (for pprof's mappings); the mark has none
    assert sorted((f["function"], f["build_id"]) for f in out["frames"]) == [
        ("[stack lost: map full, raise agent --stack-entries]", ""), ("main", LIBC)]
    assert (out["simulated"], out["frequency_hz"]) == (True, 99)
    assert single_object.decode(single_object.encode("CpuSamples", out))[1] == out


def test_the_stage_sizes_what_goes_out_definitions_sent_before_left_out(monkeypatch):
    """A node's window whose definitions take it over the output bound is split the first time; once they went out
    (the batch committed), the same stacks again are one message of samples: the definitions sent before are not in
    it, so they do not count toward its size."""
    from processors import symbolize_stage
    from processors.messages import Message
    from processors.symbolize import estimated_bytes
    from processors.symbolize_stage import SymbolizeStage
    from schemas import topics

    base = 0x7F0000000000
    tables = _tables()  # and an app of 64 functions, 0x40 bytes each: 40 stacks of three, each its own
    tables.add_chunk({"build_id": "bb" * 20, "binary": "app", "kind": "ELF", "chunk_index": 0, "chunk_count": 1,
                      "load_segments": [], "addrs": [0x40 * f for f in range(64)], "sizes": [0x40] * 64,
                      "names": [f"function_number_{f}" for f in range(64)]})
    app = {"start": base + 0x10000, "limit": base + 0x11000, "file_offset": 0, "path": "/app", "build_id": "bb" * 20}
    stacks = [{"tid": i, "user_addrs": [base + 0x10000 + 0x40 * f + 8 for f in (i, (i + 7) % 64, (i * 5) % 64)],
               "kernel_addrs": [], "count": i + 1} for i in range(40)]
    batch = _batch(stacks)
    batch["processes"][0]["mappings"].append(app)
    rec = _symbolize(batch, tables)
    assert len(rec["stacks"]) == len(rec["samples"]) == 40
    whole, samples_only = estimated_bytes(rec), estimated_bytes({**rec, "frames": [], "stacks": []})
    bound = (whole + samples_only) // 2
    monkeypatch.setattr(symbolize_stage, "STAGE_OUTPUT_MAX_BYTES", bound)
    stage = SymbolizeStage(tables)
    outputs = []
    for offset in range(2):
        message = Message(topics.CPU_STACKS.name, 0, offset, None, "fleetprof.CpuStackBatch", batch, b"")
        stage.before_batch([message])
        outputs.append([p.record for p in stage.process([message])])
        stage.after_commit()
    first, again = outputs
    total = sum(s["count"] for s in stacks)
    assert len(first) > 1 and sum(s["count"] for p in first for s in p["samples"]) == total
    assert {s["stack_id"] for p in first for s in p["stacks"]} == {s["stack_id"] for s in rec["samples"]}
    assert all(estimated_bytes(p) <= bound for p in first)
    assert len(again) == 1 and not again[0]["stacks"] and not again[0]["frames"]
    assert again[0]["samples"] == rec["samples"]
