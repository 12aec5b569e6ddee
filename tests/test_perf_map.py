"""Perf maps (/tmp/perf-PID.map): parsing, the PERFMAP table and its identity lookup, the batch's JIT mappings, the
sender, and end to end with BPF: machine code a C program generated at run time, and CPython 3.12+ under -X perf
(needs root, bcc, kernel headers, gcc, and for CPython an interpreter built with frame pointers: skipped with the
reason without them, a failure on CI)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from processors.symbol_tables import SymbolTables, table_from_chunks
from processors.symbolize import symbolize_batch
from producers.cpu import build_cpu_batch
from producers.outbox_encoder import OutboxEncoder
from producers.perf_map import (
    JIT_BINARY,
    PerfMapCache,
    is_anonymous,
    ns_pid,
    parse_perf_map,
    perf_map_chunks,
    perf_map_path,
    read_perf_map,
)
from producers.process_info import Mapping, ProcessCache, ProcessInfo
from schemas import single_object
from tests.elf_helpers import unavailable

BASE = 0x7F0000000000


class Queued:
    """The messages of the units the agent's encoder makes, in order."""

    def __init__(self, encoder: OutboxEncoder) -> None:
        self.encoder = encoder
        self.messages: list[tuple[str, str, bytes]] = []

    def window(self, batch: dict) -> None:
        self.messages += [(t, k, v) for u in self.encoder.cpu(batch) for t, k, v, _ in u.messages]


def _symbolized(pub: Queued) -> dict:
    """What the processors make of what the encoder queued: tables from the symbols messages, then the batches."""
    tables = SymbolTables()
    for topic, _, value in pub.messages:
        if topic == "symbols":
            tables.add_chunk(single_object.decode(value, "SymbolChunk")[1])
    batches = [single_object.decode(v, "CpuStackBatch")[1] for t, _, v in pub.messages if t == "cpu.stacks"]
    assert len(batches) == 1
    return symbolize_batch(batches[0], tables.get)


def _user_chains(out: dict) -> list[tuple[list[tuple[str, str]], int]]:
    """Each sample's user frames, leaf first, as (function, binary), with its count."""
    frames = {f["frame_id"]: (f["function"], f["binary"], f["kind"]) for f in out["frames"]}
    stacks = {s["stack_id"]: s["frame_ids"] for s in out["stacks"]}
    chains = []
    for s in out["samples"]:
        user = [frames[i] for i in stacks[s["stack_id"]] if frames[i][1] != "[kernel.kallsyms]"]
        chains.append(([(f, b) for f, b, _ in reversed(user)], s["count"]))
    return chains


# --- parsing ---


def test_parse_hex_with_and_without_0x_names_with_spaces_and_malformed_lines() -> None:
    text = (b"7f0000001000 20 py::f:/srv/a b.py\n"
            b"0x7f0000002000 0x10 LazyCompile:~foo bar.js:1\n"
            b"\n"
            b"not a perf map line\n"
            b"7f0000003000 zz bad size\n"
            b"7f0000004000 10\n"  # no name
            b"1ffff0000000000000 1 too wide\n"  # more than 64 bits
            b"  7f0000000800\t8\tstub  \r\n"
            b"7f0000001000 30 py::g:/srv/a.py\n")  # the same start again: the later line wins
    pm = parse_perf_map(text)
    assert pm.addrs == [0x7F0000000800, 0x7F0000001000, 0x7F0000002000]
    assert pm.sizes == [8, 0x30, 0x10]
    assert pm.names == ["stub", "py::g:/srv/a.py", "LazyCompile:~foo bar.js:1"]
    assert pm.malformed == 4 and not pm.truncated
    assert pm.covers(0x7F0000001000, 0x7F0000001001) and pm.covers(0x7F0000000000, 0x7F0000001000)
    assert not pm.covers(0x7F0000002001, 0x7F0000010000)
    assert parse_perf_map(b"").names == [] and parse_perf_map(b"\xff\xfe garbage\n").malformed == 1


def test_the_id_is_content_addressed() -> None:
    one = parse_perf_map(b"1000 10 a\n2000 10 b\n")
    assert one.build_id.startswith("perfmap:") and len(one.build_id) == len("perfmap:") + 32
    assert parse_perf_map(b"0x2000 0x10 b\n0x1000   10 a\n").build_id == one.build_id  # same symbols
    assert parse_perf_map(b"1000 10 a\n2000 10 b\n3000 10 c\n").build_id != one.build_id  # grown
    assert parse_perf_map(b"1000 10 a\n2000 10 c\n").build_id != one.build_id  # renamed


def test_reading_is_bounded_and_waits_for_a_line_being_written(tmp_path: Path) -> None:
    path = tmp_path / "perf-1.map"
    lines = b"".join(b"%x 10 fn_%d\n" % (0x1000 + 0x10 * i, i) for i in range(1000))
    path.write_bytes(lines + b"ffff00 10 half_writ")
    whole = read_perf_map(str(path))
    assert len(whole) == 1000 and not whole.truncated and whole.malformed == 0  # the unterminated line waits
    capped = read_perf_map(str(path), max_bytes=len(lines) // 2)
    assert capped.truncated and 0 < len(capped) < 1000 and capped.malformed == 0  # only whole lines
    assert capped.names == [f"fn_{i}" for i in range(len(capped))]
    few = read_perf_map(str(path), max_entries=10)
    assert few.truncated and few.names == [f"fn_{i}" for i in range(10)]


def test_only_regular_files_are_read(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        read_perf_map(str(tmp_path / "missing.map"))
    fifo = tmp_path / "fifo.map"
    os.mkfifo(fifo)  # nobody writes: a blocking open or read would hang the agent
    with pytest.raises(OSError):
        read_perf_map(str(fifo))
    (tmp_path / "real.map").write_bytes(b"1000 10 f\n")
    (tmp_path / "link.map").symlink_to(tmp_path / "real.map")
    with pytest.raises(OSError):
        read_perf_map(str(tmp_path / "link.map"))
    with pytest.raises(OSError):
        read_perf_map(str(tmp_path))


def test_chunks_round_trip_to_an_identity_lookup_table() -> None:
    high = 0xFFFFFFFFFF600000  # above 2**63: carried in Avro longs with the same bits
    text = b"".join(b"%x %x f%d\n" % (BASE + 0x100 * i, 0x40 if i % 2 else 0, i) for i in range(5))
    pm = parse_perf_map(text + b"%x 10 vsyscall_jit\n" % high)
    limit = len(single_object.encode("SymbolChunk", perf_map_chunks(pm, None)[0])) - 40  # too small for all six
    chunks = perf_map_chunks(pm, max_bytes=limit)
    n = len(chunks)
    assert n > 1 and [c["chunk_index"] for c in chunks] == list(range(n)) and {c["chunk_count"] for c in chunks} == {n}
    assert all(len(single_object.encode("SymbolChunk", c)) <= limit for c in chunks)
    assert {(c["kind"], c["binary"], c["build_id"]) for c in chunks} == {("PERFMAP", JIT_BINARY, pm.build_id)}
    decoded = [single_object.decode(single_object.encode("SymbolChunk", c), "SymbolChunk")[1] for c in reversed(chunks)]
    table = table_from_chunks(decoded)
    assert table.kind == "PERFMAP" and len(table.seg_offsets) == 0
    addrs = np.array([BASE, BASE + 0xFF, BASE + 0x13F, BASE + 0x140, BASE + 0x2FF, high + 4], dtype=np.uint64)
    assert (table.to_vaddr(addrs) == addrs).all()
    found = table.lookup(addrs).tolist()
    # f0 and f2 have no size: each runs to the next symbol; f1 is 0x40 long; the high one round-trips
    assert [table.names[i] if i >= 0 else None for i in found] == ["f0", "f0", "f1", None, "f2", "vsyscall_jit"]
    assert perf_map_chunks(parse_perf_map(b""))[0]["names"] == []


def test_paths_are_the_process_view_of_its_tmp() -> None:
    me = os.getpid()
    assert ns_pid(me) == me or os.path.exists("/.dockerenv")  # the test itself may run in a container
    assert perf_map_path(me) == f"/proc/{me}/root/tmp/perf-{ns_pid(me)}.map"
    assert ns_pid(2**22 + 12345) == 2**22 + 12345  # no such process: its own number
    assert all(map(is_anonymous, ["", "[anon:v8 code]", "/memfd:jit (deleted)", "//anon"]))
    assert not any(map(is_anonymous, ["/usr/bin/python3", "[vdso]", "[stack]", "[heap]"]))


def test_ns_pid_is_the_pid_inside_a_pid_namespace() -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        unavailable("needs root and unshare(1) to make a pid namespace")
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "sleep", "30"])
    try:
        child = None
        for _ in range(100):
            kids = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
            if kids:
                child = int(kids[0])
                break
            time.sleep(0.02)
        if child is None:
            unavailable("unshare made no child (no pid namespaces here?)")
        assert ns_pid(child) == 1
        assert perf_map_path(child) == f"/proc/{child}/root/tmp/perf-1.map"
    finally:
        proc.kill()
        proc.wait()


# --- the cache, the batch and the sender ---


def _cache_in(folder: Path) -> PerfMapCache:
    return PerfMapCache(path_of=lambda pid: str(folder / f"perf-{pid}.map"))


def test_cache_rereads_a_changed_map_and_releases_old_versions(tmp_path: Path) -> None:
    cache = _cache_in(tmp_path)
    path = tmp_path / "perf-7.map"
    assert cache.get(7) is None
    path.write_text("1000 10 a\n")
    first = cache.get(7)
    assert first is not None and cache.get(7) is first  # unchanged: not read again
    with path.open("a") as f:
        f.write("2000 10 b\n")
    grown = cache.get(7)
    assert grown.names == ["a", "b"] and grown.build_id != first.build_id
    assert cache.chunks(first.build_id) is None and cache.chunks(grown.build_id)[0]["names"] == ["a", "b"]
    path.unlink()  # removed (or the process gone): the last map read still describes its code
    assert cache.get(7) is grown
    cache.forget(7)
    assert cache.chunks(grown.build_id) is None and len(cache) == 0 and cache.ids() == set()


def test_cache_keeps_at_most_max_symbols(tmp_path: Path) -> None:
    cache = PerfMapCache(max_symbols=3, path_of=lambda pid: str(tmp_path / f"perf-{pid}.map"))
    (tmp_path / "perf-1.map").write_text("1000 10 a\n2000 10 b\n")
    (tmp_path / "perf-2.map").write_text("1000 10 a\n2000 10 b\n")  # the same map: held once
    (tmp_path / "perf-3.map").write_text("1000 10 c\n2000 10 d\n")
    assert cache.get(1) is cache.get(2) is not None
    assert cache.get(3) is None and cache.over_budget == 1
    (tmp_path / "perf-4.map").symlink_to(tmp_path / "perf-1.map")  # not followed; tried once while unchanged
    assert cache.get(4) is None and cache.get(4) is None and cache.unreadable == 1
    cache.forget(1)
    assert cache.get(2) is not None and len(cache.ids()) == 1  # still referred to by pid 2


def _info(pid: int, *extra: Mapping) -> ProcessInfo:
    app = Mapping(0x400000, 0x401000, 0x1000, "/srv/app", "ab" * 20)
    return ProcessInfo(pid, "app", "/srv/app", "/", "", [app, *extra])


JIT = Mapping(BASE, BASE + 0x10000, 0, "", "")


def test_batch_points_the_anonymous_mappings_holding_symbols_at_the_perf_map(tmp_path: Path) -> None:
    (tmp_path / "perf-7.map").write_text(f"{BASE + 0x40:x} 40 jit_fn\n{BASE + 0x20040:x} 10 other space\n")
    info = _info(7, JIT,
                 Mapping(BASE + 0x10000, BASE + 0x20000, 0, "", ""),  # anonymous, no symbol inside
                 Mapping(BASE + 0x20000, BASE + 0x21000, 0, "[anon:jit]", ""),
                 Mapping(BASE + 0x30000, BASE + 0x31000, 0, "/usr/lib/libc.so.6", "cd" * 20))
    processes = ProcessCache({7: info}.get, perf_maps=_cache_in(tmp_path))
    samples = [(7, 7, [BASE + 0x50, 0x400123], [], 5), (7, 8, [0x400100], [], 1)]
    batch = build_cpu_batch(samples, processes, "n", 0, 1, 99)
    pm = processes.perf_maps.get(7)
    maps = {m["start"]: m for m in batch["processes"][0]["mappings"]}
    assert maps[BASE] == {"start": BASE, "limit": BASE + 0x10000, "file_offset": BASE, "path": JIT_BINARY,
                          "build_id": pm.build_id}
    assert maps[BASE + 0x20000]["build_id"] == pm.build_id and maps[BASE + 0x20000]["file_offset"] == BASE + 0x20000
    assert maps[BASE + 0x10000]["build_id"] == "" and maps[BASE + 0x10000]["path"] == ""
    assert maps[BASE + 0x30000]["build_id"] == "cd" * 20 and maps[0x400000]["build_id"] == "ab" * 20

    # through the encoder and the symbolizer: the JIT leaf by its perf-map name, its caller from the ELF table
    app_chunk = {"build_id": "ab" * 20, "binary": "app", "kind": "ELF", "chunk_index": 0, "chunk_count": 1,
                 "load_segments": [], "addrs": [0x1100], "sizes": [0x100], "names": ["main"]}
    pub = Queued(OutboxEncoder(read_chunks=lambda path, limit: [app_chunk] if path.endswith("/srv/app") else [],
                               perf_maps=processes.perf_maps))
    pub.window(batch)
    chains = _user_chains(_symbolized(pub))
    assert sorted(chains) == [([("jit_fn", JIT_BINARY), ("main", "app")], 5), ([("main", "app")], 1)]


def test_mappings_are_read_again_when_samples_fall_outside_them() -> None:
    reads: list[int] = []
    state = {"info": _info(7)}

    def lookup(pid: int) -> ProcessInfo | None:
        reads.append(pid)
        return state["info"]

    processes = ProcessCache(lookup, perf_maps=PerfMapCache(path_of=lambda pid: "/nonexistent/perf.map"))
    processes.get(7)  # first sight, before the JIT made its code
    state["info"] = _info(7, JIT)
    jit_sample = [(7, 7, [BASE + 0x50, 0x400123], [], 1)]
    batch = build_cpu_batch(jit_sample, processes, "n", 0, 1, 99)
    assert reads == [7, 7] and any(m["start"] == BASE for m in batch["processes"][0]["mappings"])
    build_cpu_batch(jit_sample, processes, "n", 0, 1, 99)
    assert reads == [7, 7]  # covered now: not read again

    junk = [(7, 7, [0x400123, 0x1234], [], 1)]  # a broken frame-pointer chain: in no mapping, ever
    build_cpu_batch(junk + [(7, 7, [0x5678], [], 1)], processes, "n", 0, 1, 99)
    assert reads == [7, 7, 7]  # at most once a window, whatever the number of addresses outside
    build_cpu_batch(junk, processes, "n", 0, 1, 99)
    assert reads == [7, 7, 7]  # still outside after the re-read: no reason to read again
    state["info"] = None  # gone: what was read before stays
    batch = build_cpu_batch([(7, 7, [0x9999], [], 1)], processes, "n", 0, 1, 99)
    assert reads == [7, 7, 7, 7] and any(m["start"] == BASE for m in batch["processes"][0]["mappings"])
    assert processes.rereads == 3


def test_encoder_queues_each_perf_map_version_once_without_reading_a_file(tmp_path: Path) -> None:
    path = tmp_path / "perf-7.map"
    path.write_text(f"{BASE + 0x40:x} 40 jit_fn\n")
    processes = ProcessCache({7: _info(7, JIT)}.get, perf_maps=_cache_in(tmp_path))
    reads: list[str] = []
    encoder = OutboxEncoder(read_chunks=lambda p, limit: reads.append(p) or [], perf_maps=processes.perf_maps)
    pub = Queued(encoder)
    samples = [(7, 7, [BASE + 0x50, 0x400123], [], 1)]  # the JIT code, called from /srv/app

    def published() -> list[str]:
        return [k for t, k, _ in pub.messages if t == "symbols" and k.startswith("perfmap:")]

    pub.window(build_cpu_batch(samples, processes, "n", 0, 1, 99))
    assert encoder.new_build_ids == 2  # the perf map and /srv/app
    pub.window(build_cpu_batch(samples, processes, "n", 0, 1, 99))
    assert len(published()) == 1
    assert reads == ["/proc/7/root/srv/app"]  # the ELF file only
    with path.open("a") as f:
        f.write(f"{BASE + 0x80:x} 40 jit_fn2\n")
    pub.window(build_cpu_batch(samples, processes, "n", 0, 1, 99))
    assert len(published()) == 2 and published()[1] == processes.perf_maps.get(7).build_id + "/0"
    assert len(encoder._sent_perf_ids) == 1  # the old version's id is not kept


# --- end to end with BPF ---

FREQUENCY = 99
SECONDS = 2.5

# Machine code made at run time in an anonymous mapping, named only by the perf map. It keeps a frame
# (push rbp; mov rbp,rsp ... pop rbp) as JITs do for profilers, so the frame-pointer unwinder finds main above it:
#   push rbp; mov rbp,rsp; mov ecx,1000000; 1: dec ecx; jnz 1b; pop rbp; ret
JIT_C = r"""
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
static const unsigned char CODE[] = {0x55, 0x48, 0x89, 0xe5, 0xb9, 0x40, 0x42, 0x0f, 0x00,
                                     0xff, 0xc9, 0x75, 0xfc, 0x5d, 0xc3};
volatile unsigned long calls;
int main(void) {
    alarm(60);  /* never outlive the test run, whatever happens to the test */
    char go;
    if (read(0, &go, 1) != 1) return 1;  /* the test reads the mappings first: the code comes later */
    unsigned char *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED) return 2;
    memcpy(page + 64, CODE, sizeof CODE);  /* not at the mapping's start: offsets must not matter */
    if (mprotect(page, 4096, PROT_READ | PROT_EXEC)) return 3;
    char path[64];
    snprintf(path, sizeof path, "/tmp/perf-%d.map", getpid());
    FILE *f = fopen(path, "w");
    if (!f) return 4;
    fprintf(f, "%lx %zx jit_hot_loop\n0x%lx 0x20 jit stub with spaces\n", (unsigned long)(page + 64), sizeof CODE,
            (unsigned long)(page + 1024));
    fclose(f);
    printf("ready\n");
    fflush(stdout);
    void (*fn)(void) = (void (*)(void))(page + 64);
    for (;;) {
        fn();
        calls++;
    }
}
"""


def _need_bpf() -> None:
    from producers.cpu_sampler import BpfUnavailable, check_bpf

    try:
        check_bpf()
    except BpfUnavailable as exc:
        unavailable(f"BPF unavailable: {exc}")


@pytest.fixture(scope="module")
def jit_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _need_bpf()
    if shutil.which("gcc") is None:
        unavailable("BPF unavailable: no gcc to build the workload")
    folder = tmp_path_factory.mktemp("jit_workload")
    (folder / "jit_workload.c").write_text(JIT_C)
    subprocess.run(["gcc", "-O1", "-fno-omit-frame-pointer", "-o", str(folder / "jit_workload"),
                    str(folder / "jit_workload.c")], check=True)
    return folder / "jit_workload"


@pytest.fixture
def running() -> Iterator[list[subprocess.Popen]]:
    """Processes a test starts; killed, and their perf maps removed, afterwards."""
    procs: list[subprocess.Popen] = []
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()
        Path(f"/tmp/perf-{proc.pid}.map").unlink(missing_ok=True)


def _sample(pid: int, processes: ProcessCache) -> dict:
    """A window of the real sampler on `pid`, sent by the agent's sender and symbolized by the processor."""
    from producers.cpu_sampler import CpuSampler

    sampler = CpuSampler(frequency_hz=FREQUENCY, pid_filter=pid)
    sampler.start()
    try:
        sampler.drain()  # the window starts now: compiling took a while
        time.sleep(SECONDS)
        samples = sampler.drain()
    finally:
        sampler.close()
    assert samples, f"no samples of pid {pid}"
    batch = build_cpu_batch(samples, processes, "n", time.time_ns(), 1, FREQUENCY)
    pub = Queued(OutboxEncoder(perf_maps=processes.perf_maps))
    pub.window(batch)
    return _symbolized(pub)


def test_jit_code_symbolizes_by_the_perf_map_under_its_caller(jit_binary: Path,
                                                               running: list[subprocess.Popen]) -> None:
    proc = subprocess.Popen([str(jit_binary)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    running.append(proc)
    processes = ProcessCache(perf_maps=PerfMapCache())
    assert processes.get(proc.pid).mappings  # first sight: no JIT code yet
    proc.stdin.write(b"g")
    proc.stdin.flush()
    assert proc.stdout.readline() == b"ready\n"
    assert Path(f"/tmp/perf-{proc.pid}.map").exists()

    chains = _user_chains(_sample(proc.pid, processes))
    total = sum(n for _, n in chains)
    good = sum(n for chain, n in chains if chain[:2] == [("jit_hot_loop", JIT_BINARY), ("main", jit_binary.name)])
    assert good >= 0.7 * total, f"only {good} of {total} samples are jit_hot_loop <- main: {chains[:5]}"
    assert processes.rereads >= 1  # the mapping appeared after first sight


PY_WORKLOAD = """
import signal

signal.alarm(60)  # never outlive the test run, whatever happens to the test

def py_hot_leaf():
    total = 0
    for i in range(20000):
        total += i * i
    return total

def py_caller():
    while True:
        py_hot_leaf()

print("ready", flush=True)
py_caller()
"""

# True when the interpreter runs the perf trampoline and was built with frame pointers (without them the
# frame-pointer unwinder loses the chain inside the interpreter loop).
_PROBE = ("import os, sys, sysconfig; print(os.getpid(), flush=True); "
          "assert sys.version_info >= (3, 12) and sys.is_stack_trampoline_active(); "
          "assert '-fno-omit-frame-pointer' in (sysconfig.get_config_var('CONFIGURE_CFLAGS') or '')")


def _perf_python() -> str:
    """An interpreter that supports -X perf with frame pointers, or skip (fail on CI) saying what is missing."""
    repo = Path(__file__).resolve().parent.parent
    candidates = [os.environ.get("FLEETPROF_PERF_PYTHON", ""), str(repo / ".venv" / "bin" / "python-perf"),
                  shutil.which("python3.13") or "", shutil.which("python3.12") or ""]
    tried = []
    for exe in filter(None, candidates):
        if not os.path.exists(exe):
            continue
        try:
            out = subprocess.run([exe, "-X", "perf", "-c", _PROBE], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            out = None
        if out is not None and out.stdout.strip().isdigit():
            Path(f"/tmp/perf-{out.stdout.strip()}.map").unlink(missing_ok=True)  # the probe's own
        if out is not None and out.returncode == 0:
            return exe
        tried.append(exe)
    unavailable("no CPython 3.12+ with -X perf and frame pointers (bash infra/perf_python.sh builds one at "
                f".venv/bin/python-perf, or set FLEETPROF_PERF_PYTHON); tried: {', '.join(tried) or 'none'}")
    raise AssertionError("unreachable")


def test_cpython_frames_symbolize_by_the_perf_map(tmp_path: Path, running: list[subprocess.Popen]) -> None:
    _need_bpf()
    python = _perf_python()
    script = tmp_path / "py_workload.py"
    script.write_text(PY_WORKLOAD)
    proc = subprocess.Popen([python, "-X", "perf", str(script)], stdout=subprocess.PIPE)
    running.append(proc)
    assert proc.stdout.readline() == b"ready\n"
    assert Path(f"/tmp/perf-{proc.pid}.map").exists()
    processes = ProcessCache(perf_maps=PerfMapCache())
    processes.get(proc.pid)

    chains = _user_chains(_sample(proc.pid, processes))
    total = sum(n for _, n in chains)
    leaf, caller = f"py::py_hot_leaf:{script}", f"py::py_caller:{script}"
    good = 0
    for chain, n in chains:
        names = [f for f, _ in chain]
        if leaf in names and caller in names[names.index(leaf):]:
            good += n
    assert good >= 0.6 * total, f"only {good} of {total} samples show {caller} above {leaf}: {chains[:3]}"
    assert all(b == JIT_BINARY for chain, _ in chains for f, b in chain if f.startswith("py::"))
