"""The synthetic fleet behind loadgen: determinism, Zipf popularity, the symbolization contract, realistic names,
and CpuStackBatch encoding/splitting (exact bytes, every stack and count kept, sizes under the limit). Pure."""

from __future__ import annotations

import bisect
import os
import re
import shutil
import subprocess
from collections import Counter

import numpy as np
import pytest

from schemas.cpu_batch_writer import (
    encode_cpu_batch,
    encode_cpu_batches,
    long_bytes,
    split_cpu_batch,
    varints,
)
from schemas.packed_stacks import PackedStacks
from schemas.single_object import decode, encode
from schemas.wire import DEFAULT_MAX_BYTES, KERNEL_BINARY, long_to_u64
from simulate.synthetic_binaries import KERNEL_BUILD_ID, PAGE, mangle
from simulate.synthetic_fleet import FREQUENCY_HZ, SyntheticFleet
from simulate.synthetic_workload import GPU_KERNELS, GPU_NAME


def reference_symbolize(addr: int, mappings: list[dict], tables: dict[str, dict]) -> tuple[str, str] | None:
    """The symbolization contract for one user address, written as plainly as possible: (binary, function)."""
    for m in mappings:
        if m["start"] <= addr < m["limit"]:
            table = tables[m["build_id"]]
            file_off = addr - m["start"] + m["file_offset"]
            vaddr = file_off
            for s in table["load_segments"]:
                if s["file_offset"] <= file_off < s["file_offset"] + s["memsz"]:
                    vaddr = file_off - s["file_offset"] + s["vaddr"]
                    break
            return _lookup(table, vaddr)
    return None


def reference_symbolize_kernel(addr: int, table: dict) -> tuple[str, str] | None:
    """Kernel addresses (Avro longs with the u64 bits) are absolute."""
    return _lookup(table, long_to_u64(addr))


def _lookup(table: dict, vaddr: int) -> tuple[str, str] | None:
    i = bisect.bisect_right(table["u_addrs"], vaddr) - 1
    if i >= 0 and vaddr < table["u_addrs"][i] + table["sizes"][i]:
        return table["binary"], table["names"][i]
    return None


def tables_from_chunks(chunks: list[dict]) -> dict[str, dict]:
    """SymbolChunk records joined per build id, addresses as unsigned ints (what the reference looks up)."""
    out: dict[str, dict] = {}
    for c in sorted(chunks, key=lambda c: (c["build_id"], c["chunk_index"])):
        t = out.setdefault(c["build_id"], {"binary": c["binary"], "load_segments": c["load_segments"],
                                           "u_addrs": [], "sizes": [], "names": [], "chunks": set(),
                                           "chunk_count": c["chunk_count"]})
        t["u_addrs"] += [long_to_u64(a) for a in c["addrs"]]
        t["sizes"] += c["sizes"]
        t["names"] += c["names"]
        t["chunks"].add(c["chunk_index"])
    return out


@pytest.fixture(scope="module")
def fleet() -> SyntheticFleet:
    return SyntheticFleet(seed=7)


@pytest.fixture(scope="module")
def tables(fleet: SyntheticFleet) -> dict[str, dict]:
    return tables_from_chunks([c for b in fleet.binaries for c in b.symbol_chunks()])


def _batch(node_name: str, procs: list[dict]) -> dict:
    return {"node": node_name, "window_start_ns": 1_700_000_000 * 10**9, "window_ns": 10**10,
            "frequency_hz": FREQUENCY_HZ, "kernel_build_id": KERNEL_BUILD_ID, "simulated": True, "processes": procs}


def _stacks(batch: dict) -> Counter:
    return Counter((p["pid"], s["tid"], tuple(s["user_addrs"]), tuple(s["kernel_addrs"]))
                   for p in batch["processes"] for s in _records(p["stacks"]) for _ in range(s["count"]))


def _records(stacks: object) -> list[dict]:
    return stacks.records() if isinstance(stacks, PackedStacks) else stacks


def test_same_seed_same_bytes_other_seed_other_data() -> None:
    def first_batches(seed: int) -> list[bytes]:
        f = SyntheticFleet(seed=seed)
        out = []
        for i in range(2):
            node = f.node(i)
            for _ in range(2):
                _, procs, _ = f.cpu_window(node, 1520)
                out += encode_cpu_batches(_batch(node.name, procs))
        return out

    assert first_batches(3) == first_batches(3)
    assert first_batches(3) != first_batches(4)
    # build ids and symbol tables depend on the binary alone, never on the seed
    a, b = SyntheticFleet(seed=3), SyntheticFleet(seed=4)
    assert [x.symbol_chunks() for x in a.binaries] == [x.symbol_chunks() for x in b.binaries]


def test_popularity_is_zipf(fleet: SyntheticFleet) -> None:
    p = np.sort(fleet.probs)[::-1]
    ranks = np.arange(1, len(p) + 1)
    np.testing.assert_allclose(p / p[0], ranks ** -fleet.zipf_s, rtol=1e-9)
    assert fleet.zipf_s == pytest.approx(1.1)
    node = fleet.node(0)
    total = np.zeros(len(p), dtype=np.int64)
    for _ in range(200):
        total += fleet.cpu_window(node, 1520)[2]
    assert total.sum() == 200 * 1520
    by_rank = total[np.argsort(-fleet.probs)]
    slope = np.polyfit(np.log(ranks[:30]), np.log(by_rank[:30]), 1)[0]
    assert slope == pytest.approx(-1.1, abs=0.1)
    assert by_rank[0] / total.sum() == pytest.approx(p[0], rel=0.05)


def test_every_address_symbolizes_to_its_function(fleet: SyntheticFleet, tables: dict[str, dict]) -> None:
    t = fleet.templates
    kernel = tables[KERNEL_BUILD_ID]
    checked = 0
    for index in (0, 5):
        node = fleet.node(index)
        _, procs, counts = fleet.cpu_window(node, 3_000_000)  # enough samples to draw every (process, path) pair
        nz = np.flatnonzero(counts)
        assert len(nz) == len(counts), "every pair drawn at least once"
        stacks = [(p, s) for p in procs for s in p["stacks"].records()]
        assert len(stacks) == len(nz)
        for (proc, stack), tpl in zip(stacks, fleet.pair_tpl[nz], strict=True):
            want = t.frames[tpl]
            got = [reference_symbolize(a, proc["mappings"], tables) for a in stack["user_addrs"]]
            # a return address minus one (what symbolizers look up for callers) stays in the same function
            callers = [reference_symbolize(a - 1, proc["mappings"], tables) for a in stack["user_addrs"]]
            got_k = [reference_symbolize_kernel(a, kernel) for a in stack["kernel_addrs"]]
            assert got + got_k == want
            assert callers == want[: len(got)]
            assert stack["tid"] - proc["pid"] == t.thread[tpl]
            checked += 1
    assert checked > 8000


def test_processes_and_mappings_are_realistic(fleet: SyntheticFleet, tables: dict[str, dict]) -> None:
    node = fleet.node(3)  # a Kubernetes node: every process in a container (tests/test_synthetic_identity.py)
    comms = Counter(p.comm for p in node.processes)
    assert comms == {"pt_main_thread": 8, "pt_data_worker": 16, "vector": 1}
    assert len({p.pid for p in node.processes}) == len(node.processes)
    for proc in node.processes:
        maps = proc.mappings
        assert re.fullmatch(r"[0-9a-f]{64}", proc.container_id) and proc.container_id in proc.cgroup
        assert all(m["start"] % PAGE == 0 and m["limit"] % PAGE == 0 and m["file_offset"] % PAGE == 0 for m in maps)
        assert all(a["limit"] <= b["start"] for a, b in zip(maps, maps[1:], strict=False)), "no overlap"
        exe = next(m for m in maps if m["path"] == proc.exe)
        assert 0x550000000000 <= exe["start"] < 0x570000000000  # PIE executable
        assert all(0x7F0000000000 <= m["start"] < 0x800000000000 for m in maps if m is not exe)
        assert all(m["build_id"] in tables for m in maps)
    workers = [p for p in node.processes if p.kind == "worker"]
    assert workers[0].mappings is node.processes[0].mappings  # forked: the parent's layout


def test_symbol_tables_and_names(fleet: SyntheticFleet) -> None:
    by_name = {b.name: b for b in fleet.binaries}
    assert set(by_name) >= {"python3.11", "libpython3.11.so.1.0", "libc.so.6", "libstdc++.so.6", "libtorch_cpu.so",
                            "libtorch_cuda.so", "libcudart.so.12", "libcuda.so.1", "vector", KERNEL_BINARY}
    for b in fleet.binaries:
        chunks = b.symbol_chunks()
        assert [c["chunk_index"] for c in chunks] == list(range(chunks[0]["chunk_count"]))
        starts = [long_to_u64(a) for c in chunks for a in c["addrs"]]
        sizes = [s for c in chunks for s in c["sizes"]]
        assert all(a + s <= b2 for a, s, b2 in zip(starts, sizes, starts[1:], strict=False)), "sorted, disjoint"
        assert all(s >= 2 for s in sizes)
        assert all(len(encode("SymbolChunk", c)) < DEFAULT_MAX_BYTES for c in chunks)
        if b.kind == "ELF":
            assert re.fullmatch(r"[0-9a-f]{40}", b.build_id)
    small = by_name["libtorch_cpu.so"].symbol_chunks(64 * 1024)  # chunked by bytes, as the agent does
    assert len(small) > 1 and all(len(encode("SymbolChunk", c)) <= 64 * 1024 for c in small)
    assert [n for c in small for n in c["names"]] == by_name["libtorch_cpu.so"].names
    kernel = by_name[KERNEL_BINARY]
    assert kernel.build_id == "kernel-6.1.0-sim" and kernel.segments == []
    assert int(kernel.addrs.min()) >= 0xFFFFFFFF81000000
    assert all(a < 0 for a in kernel.symbol_chunks()[0]["addrs"])  # >= 2^63, carried as negative longs
    assert {"entry_SYSCALL_64", "do_syscall_64", "__x64_sys_read", "vfs_read"} <= set(kernel.names)
    names = {b.name: b.names for b in fleet.binaries}
    assert any(n.startswith("_ZN2at6native") for n in names["libtorch_cpu.so"])
    assert any(n.startswith("_ZN2at") for n in names["libtorch_cuda.so"])
    assert any(n.startswith("_ZNSt") for n in names["libstdc++.so.6"])
    assert any(n.startswith("_RNv") for n in names["vector"])  # Rust v0
    assert any(re.fullmatch(r"_ZN.*17h[0-9a-f]{16}E", n) for n in names["vector"])  # Rust legacy
    assert {"cudaLaunchKernel", "_PyEval_EvalFrameDefault", "__libc_start_main"} <= set(
        names["libcudart.so.12"]) | set(names["libpython3.11.so.1.0"]) | set(names["libc.so.6"])
    assert mangle("at::native::add", "at::Tensor const&, at::Tensor const&, c10::Scalar const&") == \
        "_ZN2at6native3addERKNS_6TensorES3_RKN3c106ScalarE"


@pytest.mark.skipif(shutil.which("c++filt") is None and not os.environ.get("CI"),
                    reason="c++filt (binutils) not installed")
def test_mangled_names_demangle(fleet: SyntheticFleet) -> None:
    mangled = [n for b in fleet.binaries for n in b.names if n.startswith(("_Z", "_R"))]
    mangled += [k for ks in GPU_KERNELS.values() for k, _, _ in ks if k.startswith("_Z")]
    out = subprocess.run(["c++filt"], input="\n".join(mangled), capture_output=True, text=True, check=True)
    plain = out.stdout.split("\n")
    assert [m for m, d in zip(mangled, plain, strict=False) if m == d] == []
    assert "std::condition_variable::wait(std::unique_lock<std::mutex>&)" in plain


def test_fast_encoding_matches_the_codec(fleet: SyntheticFleet) -> None:
    node = fleet.node(1)
    _, procs, _ = fleet.cpu_window(node, 1520)
    batch = _batch(node.name, procs)
    as_records = _batch(node.name, [{**p, "stacks": p["stacks"].records()} for p in procs])
    assert encode_cpu_batch(batch) == encode("CpuStackBatch", as_records) == encode_cpu_batch(as_records)
    assert encode_cpu_batch(_batch(node.name, [])) == encode("CpuStackBatch", _batch(node.name, []))
    edge = [0, 1, -1, 63, 64, -64, -65, 2**31, -(2**31), 2**62, 2**63 - 1, -(2**63), 0xFFFFFFFF81000000 - 2**64]
    data, nbytes = varints(np.array(edge, dtype=np.int64))
    assert data.tobytes() == b"".join(long_bytes(v) for v in edge)
    assert nbytes.tolist() == [len(long_bytes(v)) for v in edge]


def test_split_keeps_every_stack_and_fits(fleet: SyntheticFleet) -> None:
    node = fleet.node(3)
    _, procs, _ = fleet.cpu_window(node, 400_000)
    batch = _batch(node.name, procs)
    whole = _stacks(batch)
    for limit in (DEFAULT_MAX_BYTES, 64 * 1024, 12 * 1024):
        messages = encode_cpu_batches(batch, limit)
        assert all(len(m) <= limit for m in messages)
        decoded = [decode(m, expect="CpuStackBatch")[1] for m in messages]
        assert sum((_stacks(d) for d in decoded), Counter()) == whole
        for d in decoded:  # every part is a complete batch: same header, each process with all its mappings
            assert {k: d[k] for k in ("node", "window_start_ns", "kernel_build_id", "simulated")} == \
                {k: batch[k] for k in ("node", "window_start_ns", "kernel_build_id", "simulated")}
            maps = {p.pid: p.mappings for p in node.processes}
            assert all(p["mappings"] == maps[p["pid"]] for p in d["processes"])
    # the dict path (what the agent uses) splits the same way
    as_records = _batch(node.name, [{**p, "stacks": p["stacks"].records()} for p in procs])
    parts = split_cpu_batch(as_records, 64 * 1024)
    assert all(len(encode("CpuStackBatch", part)) <= 64 * 1024 for part in parts)
    assert sum((_stacks(p) for p in parts), Counter()) == whole


def test_one_huge_process_is_split_by_stacks(fleet: SyntheticFleet) -> None:
    node = fleet.node(4)
    _, procs, _ = fleet.cpu_window(node, 400_000)
    biggest = max(procs, key=lambda p: len(p["stacks"]))
    batch = _batch(node.name, [biggest])
    messages = encode_cpu_batches(batch, 8 * 1024)
    assert len(messages) > 3
    decoded = [decode(m)[1] for m in messages]
    assert all(len(d["processes"]) == 1 and d["processes"][0]["mappings"] == biggest["mappings"] for d in decoded)
    assert sum((_stacks(d) for d in decoded), Counter()) == _stacks(batch)
    with pytest.raises(ValueError, match="does not fit"):
        encode_cpu_batches(batch, 1024)


def test_default_batches_fit_one_message(fleet: SyntheticFleet) -> None:
    node = fleet.node(0)
    _, procs, _ = fleet.cpu_window(node, 1520)
    (message,) = encode_cpu_batches(_batch(node.name, procs))
    assert len(message) < DEFAULT_MAX_BYTES // 4


def test_gpu_records(fleet: SyntheticFleet, tables: dict[str, dict]) -> None:
    node = fleet.node(6)
    last: dict[int, int] = {}
    for w in range(3):
        start = 1_700_000_000 * 10**9 + w * 10**10
        launches, kernels = fleet.gpu_window(node, start, 10**10, 2.0)
        assert launches and len(launches) == len(kernels)
        for launch, kernel in zip(launches, kernels, strict=True):
            assert launch["correlation_id"] == kernel["correlation_id"] > last.get(launch["pid"], 0)
            last[launch["pid"]] = launch["correlation_id"]
            assert start <= launch["time_ns"] < start + 10**10
            assert launch["time_ns"] < kernel["start_ns"] < kernel["end_ns"]
            assert launch["simulated"] and kernel["simulated"] and launch["weight"] >= 1
            proc = next(p for p in node.processes if p.pid == launch["pid"])
            assert kernel["device_id"] == proc.device and proc.comm == "pt_main_thread"
            assert reference_symbolize(launch["user_addrs"][0], proc.mappings, tables) == \
                ("libcudart.so.12", "cudaLaunchKernel")
            assert kernel["kernel_name"] in {k for ks in GPU_KERNELS.values() for k, _, _ in ks}
            decode(encode("GpuLaunch", launch))
            decode(encode("GpuKernel", kernel))
        firsts = [x for x in launches if x["mappings"]]
        assert len(firsts) == len({x["pid"] for x in launches})  # mappings once per process and window
    poll = fleet.metrics(node, 1_700_000_000 * 10**9)
    assert decode(encode("GpuMetrics", poll))[1] == poll
    assert poll["simulated"] and len(poll["devices"]) == 8 and len(poll["processes"]) == 8
    assert {d["name"] for d in poll["devices"]} == {GPU_NAME}
    assert len({d["uuid"] for d in poll["devices"]}) == 8
