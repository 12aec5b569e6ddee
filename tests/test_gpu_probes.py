"""The GPU probe collector against real processes that fire the fleetprof USDT probes: small C emitters built here
with gcc from native/include/fleetprof_probes.h (a shared library called from a PIE executable, and an -O0 non-PIE
executable whose probe arguments live in memory). BPF tests need root, bcc and kernel headers: skipped with the
reason without them, a failure on CI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from processors.symbol_tables import table_from_chunks
from processors.symbolize import symbolize_batch
from producers.agent import Records
from producers.cpu_sampler import BpfUnavailable, check_bpf
from producers.elf_symbols import read_build_id, symbol_chunks
from producers.gpu_probes import (
    COUNTERS,
    KERNEL_FIELDS,
    KERNEL_HEADER,
    KERNEL_NAME_MAX,
    LAUNCH_FIELDS,
    LAUNCH_HEADER,
    MAX_STACK,
    GpuProbeCollector,
)
from producers.kafka_link import KafkaLink
from producers.native_build import PROBES_INCLUDE
from producers.outbox import Outbox
from producers.outbox_encoder import OutboxEncoder
from producers.probe_finder import ProbeFinder
from producers.process_info import ProcessCache
from producers.publisher import Publisher
from producers.usdt_notes import ARG_CONST, ARG_MEM, ARG_REG, NO_REG, ArgSpec, NoteError, parse_arg, read_probe_sites
from schemas.single_object import decode
from tests.elf_helpers import libc_path, need, readelf_loads, run, unavailable
from tests.pipeline_helpers import read_topic

# The probes, and the semaphores the kernel counts, live in the library; a call gives emit_launch a frame of its
# own, so the frame-pointer unwinder sees its caller.
EMIT_C = r"""
#define FLEETPROF_DEFINE_PROBE_SEMAPHORES
#include "fleetprof_probes.h"
#include <stdio.h>
volatile unsigned long emit_calls;
__attribute__((noinline)) void emit_note(void) { emit_calls++; }
__attribute__((noinline)) void emit_launch(uint32_t corr, int32_t cb, const char *api, uint32_t weight) {
    emit_note();
    if (weight != 1) FLEETPROF_LAUNCH_WEIGHT(corr, weight);
    FLEETPROF_KERNEL_LAUNCH(corr, cb, api);
    emit_note();
}
__attribute__((noinline)) void emit_kernel(uint64_t start, uint64_t end, uint32_t corr, uint32_t device,
                                           uint32_t stream, const char *name) {
    FLEETPROF_KERNEL_EXECUTED(start, end, corr, device, stream, name);
    emit_note();
}
void emit_semaphores(void) {
    printf("sem %u %u %u\n", fleetprof_kernel_launch_semaphore, fleetprof_kernel_executed_semaphore,
           fleetprof_launch_weight_semaphore);
}
"""

# Commands on stdin, "ok" after each: launch N BASE, kernel N BASE, name LEN, deep D CORR, bad, sem. What each
# fires is what _launches() and _kernels() below expect.
MAIN_C = r"""
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
void emit_launch(uint32_t, int32_t, const char *, uint32_t);
void emit_kernel(uint64_t, uint64_t, uint32_t, uint32_t, uint32_t, const char *);
void emit_semaphores(void);
volatile unsigned long main_calls;
__attribute__((noinline)) void launch_path_a(uint32_t corr, uint32_t w) {
    emit_launch(corr, 13, "cudaLaunchKernel", w); main_calls++;
}
__attribute__((noinline)) void launch_path_b(uint32_t corr, uint32_t w) {
    emit_launch(corr, 211, "cuLaunchKernel_ptsz", w); main_calls++;
}
/* D+1 frames of 200-odd bytes each under the launch: a stack across many pages */
__attribute__((noinline)) void deep(unsigned d, uint32_t corr) {
    volatile char pad[200];
    pad[0] = (char)d;
    if (d) deep(d - 1, corr); else emit_launch(corr, 13, "cudaLaunchKernel", 1);
    main_calls += pad[0];
}
static char name[6000];
int main(void) {
    alarm(120);  /* never outlive the test run */
    char line[64];
    unsigned n, base;
    printf("ready\n"); fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {
        if (sscanf(line, "launch %u %u", &n, &base) == 2) {
            for (uint32_t c = base; c < base + n; c++) {
                if (c % 2) launch_path_b(c, c % 4 == 1 ? 8 : 1); else launch_path_a(c, 1);
            }
        } else if (sscanf(line, "kernel %u %u", &n, &base) == 2) {
            for (uint32_t c = base; c < base + n; c++) {
                uint64_t start = 1700000000000000000ull + 1000ull * c;
                snprintf(name, sizeof name, "kernel_%u", c);
                emit_kernel(start, start + 500 + c, c, c % 2, 7 + c % 3, name);
            }
        } else if (sscanf(line, "name %u", &n) == 1 && n < sizeof name) {
            memset(name, 'k', n); name[n] = 0;
            emit_kernel(1, 2, n, 0, 0, name);
        } else if (sscanf(line, "deep %u %u", &n, &base) == 2) {
            deep(n, base);
        } else if (strncmp(line, "bad", 3) == 0) {
            emit_launch(1, 2, NULL, 0);  /* no api name, and weight 0 */
            emit_kernel(3, 4, 5, 6, 7, NULL);
        } else if (strncmp(line, "sem", 3) == 0) {
            emit_semaphores();
        }
        printf("ok\n"); fflush(stdout);
    }
    return 0;
}
"""

OTHER_C = r"""
#include <sys/sdt.h>
#include <stdio.h>
#include <unistd.h>
int main(void) {
    alarm(120);
    printf("ready\n"); fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        STAP_PROBE1(other, kernel_launch, line[0]);  /* a probe of another provider, named like ours */
        printf("ok\n"); fflush(stdout);
    }
    return 0;
}
"""


def _gcc(*args: str) -> None:
    done = subprocess.run(["gcc", *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """libfpemit.so + emitter (PIE, -O2), emitter_o0 (non-PIE, -O0, probes in the executable), other (probes of
    another provider)."""
    need("gcc")
    if not any(Path(p, "sys", "sdt.h").exists() for p in ("/usr/include", "/usr/include/x86_64-linux-gnu")):
        unavailable("no <sys/sdt.h> (Debian systemtap-sdt-dev; bash infra/setup.sh installs it)")
    d = tmp_path_factory.mktemp("gpu_emitters")
    for name, text in (("emit.c", EMIT_C), ("main.c", MAIN_C), ("other.c", OTHER_C)):
        (d / name).write_text(text)
    flags = ["-g", "-fno-omit-frame-pointer", f"-I{PROBES_INCLUDE}"]
    _gcc("-O2", "-fPIC", "-shared", *flags, str(d / "emit.c"), "-o", str(d / "libfpemit.so"))
    _gcc("-O2", *flags, str(d / "main.c"), f"-L{d}", "-lfpemit", "-Wl,-rpath,$ORIGIN", "-o", str(d / "emitter"))
    _gcc("-O0", "-no-pie", *flags, str(d / "emit.c"), str(d / "main.c"), "-o", str(d / "emitter_o0"))
    _gcc("-O2", *flags, str(d / "other.c"), "-o", str(d / "other"))
    return {p.name: p for p in d.iterdir() if not p.name.endswith(".c")}


class Emitter:
    """One running emitter, driven line by line."""

    def __init__(self, binary: Path) -> None:
        self.proc = subprocess.Popen([str(binary)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.pid = self.proc.pid
        assert self.proc.stdout.readline().strip() == "ready"

    def cmd(self, line: str) -> list[str]:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        out = []
        while (got := self.proc.stdout.readline().strip()) != "ok":
            assert got, f"emitter {self.pid} ended during {line!r}"
            out.append(got)
        return out

    def semaphores(self) -> tuple[int, ...]:
        return tuple(int(x) for x in self.cmd("sem")[0].split()[1:])

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Procs:
    """The processes a test starts, and the view of /proc its collectors scan: only these processes, so objects
    that other programs on this machine map (another run's simulator) neither attach nor add events here. The
    unfiltered /proc is the finder test's."""

    def __init__(self, view: Path) -> None:
        self.view = view
        self.started: list[Emitter] = []

    def add(self, pid: int) -> None:
        (self.view / str(pid)).symlink_to(f"/proc/{pid}")

    def start(self, binary: Path) -> Emitter:
        e = Emitter(binary)
        self.started.append(e)
        self.add(e.pid)
        return e


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    """Emitters started by a test, closed after it."""
    view = tmp_path / "proc"
    view.mkdir()
    started = Procs(view)
    yield started
    for e in started.started:
        e.close()


@pytest.fixture
def bpf_ok() -> None:
    try:
        check_bpf()
    except BpfUnavailable as exc:
        unavailable(f"BPF unavailable: {exc}")


def _collector(procs: Procs, node: str = "n1", **kw: object) -> GpuProbeCollector:
    c = GpuProbeCollector(node, ProcessCache(), finder=ProbeFinder(proc=str(procs.view)), **kw)
    c.start()
    return c


def _launches(n: int, base: int) -> list[tuple]:
    """(correlation id, callback id, api name, weight, caller) of what `launch n base` fires."""
    return [(c, 211, "cuLaunchKernel_ptsz", 8 if c % 4 == 1 else 1, "launch_path_b") if c % 2 else
            (c, 13, "cudaLaunchKernel", 1, "launch_path_a") for c in range(base, base + n)]


def _kernels(n: int, base: int) -> list[tuple]:
    """(start, end, correlation id, device, stream, name) of what `kernel n base` fires."""
    start = 1_700_000_000_000_000_000
    return [(start + 1000 * c, start + 1000 * c + 500 + c, c, c % 2, 7 + c % 3, f"kernel_{c}")
            for c in range(base, base + n)]


def _drain(c: GpuProbeCollector, pids: set[int], launches: int, kernels: int,
           timeout: float = 10) -> tuple[list, list]:
    """Poll until the expected numbers arrived from `pids`, then once more: what comes after would be a duplicate.
    Records of other processes (anything else on this machine that maps an attached object) are left out."""
    got_l, got_k = [], []
    deadline = time.monotonic() + timeout
    while (len(got_l) < launches or len(got_k) < kernels) and time.monotonic() < deadline:
        more_l, more_k = c.poll(100)
        got_l += [r for r in more_l if r["pid"] in pids]
        got_k += [r for r in more_k if r["pid"] in pids]
    more_l, more_k = c.poll(200)
    return got_l + [r for r in more_l if r["pid"] in pids], got_k + [r for r in more_k if r["pid"] in pids]


def _tables(mappings: list[dict]) -> dict:
    """Symbol tables of the mapped files, by build id."""
    out = {}
    for m in mappings:
        if m["build_id"] and m["path"].startswith("/") and m["build_id"] not in out:
            out[m["build_id"]] = table_from_chunks(symbol_chunks(m["path"]))
    return out


def _chain(launch: dict, mappings: list[dict], tables: dict) -> list[str]:
    """The launch's stack as function names, root first (the symbolizer's own path)."""
    batch = {"node": "n", "window_start_ns": 0, "window_ns": 0, "kernel_build_id": "",
             "processes": [{"pid": launch["pid"], "comm": "", "container_id": "", "mappings": mappings,
                            "stacks": [{"tid": launch["tid"], "user_addrs": launch["user_addrs"],
                                        "kernel_addrs": [], "count": 1}]}]}
    out = symbolize_batch(batch, tables.get)
    names = {f["frame_id"]: f["function"] for f in out["frames"]}
    return [names[f] for f in out["stacks"][0]["frame_ids"]]


def _boot_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


def _check_launches(launches: list[dict], emitter: Emitter, expected: list[tuple]) -> None:
    """Exactly the expected launches, once each, from the emitter's thread, each with its call chain."""
    assert sorted((r["correlation_id"], r["callback_id"], r["api_name"], r["weight"]) for r in launches) == \
        [e[:4] for e in expected]
    assert {(r["pid"], r["tid"]) for r in launches} == {(emitter.pid, emitter.pid)}
    mappings = next(r["mappings"] for r in launches if r["mappings"])
    assert [r["mappings"] != [] for r in launches].count(True) == 1  # the first of the process this window
    tables = _tables(mappings)
    callers = {e[0]: e[4] for e in expected}
    for r in launches:
        assert _chain(r, mappings, tables)[-3:] == ["main", callers[r["correlation_id"]], "emit_launch"]


# --- no BPF needed ---


@pytest.mark.parametrize(("text", "arch", "spec"), [
    ("-4@%esi", "x86_64", ArgSpec(ARG_REG, 4, 13)),
    ("8@%r9", "x86_64", ArgSpec(ARG_REG, 8, 8)),
    ("4@$-5", "x86_64", ArgSpec(ARG_CONST, 4, disp=-5)),
    ("8@-40(%rbp)", "x86_64", ArgSpec(ARG_MEM, 8, 4, disp=-40)),
    ("4@(%rax)", "x86_64", ArgSpec(ARG_MEM, 4, 10)),
    ("2@0x10(%rsp,%rcx,4)", "x86_64", ArgSpec(ARG_MEM, 2, 19, 11, 4, 16)),
    ("8@counter+8(%rip)", "x86_64", ArgSpec(ARG_MEM, 8, 16, NO_REG, 1, 0x4000 + 8 - 0x1100)),
    ("8@x1", "aarch64", ArgSpec(ARG_REG, 8, 1)),
    ("-4@[sp, 12]", "aarch64", ArgSpec(ARG_MEM, 4, 31, disp=12)),
    ("8@[x29]", "aarch64", ArgSpec(ARG_MEM, 8, 29)),
    ("4@#3", "aarch64", ArgSpec(ARG_CONST, 4, disp=3)),
])
def test_probe_arguments_decode(text: str, arch: str, spec: ArgSpec) -> None:
    assert parse_arg(text, arch, pc=0x1100, symbols={"counter": 0x4000}) == spec


@pytest.mark.parametrize("text", ["1@%ah", "8@%xmm0", "8@nosuch(%rip)", "8@8(%rip)", "3@%eax", "8@[q3]"])
def test_undecodable_probe_arguments_are_refused(text: str) -> None:
    with pytest.raises(NoteError):
        parse_arg(text, "aarch64" if "[" in text else "x86_64", pc=0, symbols={})


def _readelf_probes(path: Path) -> dict[str, tuple[int, int]]:
    """probe name -> (location, semaphore) as file offsets, from readelf -n and readelf -l."""
    loads = readelf_loads(str(path))
    out, name = {}, None
    for line in run("readelf", "-n", str(path)).splitlines():
        line = line.strip()
        if line.startswith("Name:"):
            name = line.split()[1]
        elif line.startswith("Location:"):
            parts = line.replace(",", "").split()
            loc, sem = int(parts[1], 16), int(parts[5], 16)
            out[name] = tuple(next(a - v + o for o, v, size in loads if v <= a < v + size) for a in (loc, sem))
    return out


def test_probe_sites_match_readelf(built: dict[str, Path]) -> None:
    need("readelf")
    for binary in ("libfpemit.so", "emitter_o0"):
        sites, unsupported = read_probe_sites(str(built[binary]))
        assert unsupported == 0
        assert {s.probe: (s.offset, s.ref_ctr_offset) for s in sites} == _readelf_probes(built[binary])
        assert len(sites) == 3
    o0 = {s.probe: s for s in read_probe_sites(str(built["emitter_o0"]))[0]}
    assert all(a.kind == ARG_MEM and a.base == 4 for a in o0["kernel_executed"].args)  # -O0: all in its frame
    for other in (built["emitter"], built["other"], libc_path()):
        assert read_probe_sites(str(other)) == ([], 0)


def test_finder_finds_only_objects_with_fleetprof_probes_and_parses_each_once(
        built: dict[str, Path], procs: Procs) -> None:
    for name in ("emitter", "emitter_o0", "other"):
        procs.start(built[name])
    # all of this machine's processes
    paths = {o.path for o in ProbeFinder().scan().values()}
    assert {str(built["libfpemit.so"]), str(built["emitter_o0"])} <= paths
    assert not paths & {str(built["emitter"]), str(built["other"]), libc_path()}
    # only the test's: each file is read once, however many processes map it
    finder = ProbeFinder(proc=str(procs.view))
    found = finder.scan()
    assert {o.path for o in found.values()} == {str(built["libfpemit.so"]), str(built["emitter_o0"])}
    assert finder.pids == 3
    parsed = finder.parsed
    procs.start(built["emitter"])  # maps the same files again
    assert finder.scan().keys() == found.keys() and finder.pids == 4
    assert finder.parsed == parsed


# --- BPF ---


def test_record_layouts_match_the_bpf_structs(procs: Procs, bpf_ok: None) -> None:
    c = _collector(procs)
    try:
        for table, header, names in ((b"launch_scratch", LAUNCH_HEADER, LAUNCH_FIELDS),
                                     (b"kernel_scratch", KERNEL_HEADER, KERNEL_FIELDS)):
            leaf = c._bpf[table].Leaf._type_  # per-CPU: an array of the struct
            fields = [f[0] for f in leaf._fields_][:len(names)]
            assert fields == list(names)
            offsets = [getattr(leaf, n).offset for n in names]
            sizes = [getattr(leaf, n).size for n in names]
            assert [o + s for o, s in zip(offsets, sizes, strict=True)][-1] == header.size
            assert offsets == [header.size - sum(sizes[i:]) for i in range(len(names))]  # packed in this order
        launch, kernel = (dict(c._bpf[t].Leaf._type_._fields_) for t in (b"launch_scratch", b"kernel_scratch"))
        assert launch["stack"]._length_ == MAX_STACK
        assert kernel["name"]._length_ == KERNEL_NAME_MAX + 2  # one more than kept, and the NUL
        assert len(c._bpf[b"counters"]) == len(COUNTERS)
    finally:
        c.close()


def test_launches_and_kernels_are_seen_once_with_exact_values(built: dict[str, Path], procs: Procs,
                                                              bpf_ok: None) -> None:
    c = _collector(procs)
    try:
        before_boot = _boot_ns()
        e = procs.start(built["emitter"])  # started after the collector
        assert e.semaphores() == (0, 0, 0)
        assert c.rescan() == [str(built["libfpemit.so"])]
        assert c.attached() == {str(built["libfpemit.so"]): ["kernel_executed", "kernel_launch", "launch_weight"]}
        assert e.semaphores() == (1, 1, 1)  # raised by the kernel: nothing wrote to the process
        t0 = time.time_ns()
        e.cmd("launch 20 100")
        e.cmd("kernel 10 100")
        t1 = time.time_ns()
        launches, kernels = _drain(c, {e.pid}, 20, 10)
        _check_launches(launches, e, _launches(20, 100))
        assert all(t0 <= r["time_ns"] <= t1 for r in launches)
        assert len({r["process_start_ns"] for r in launches + kernels}) == 1
        start = launches[0]["process_start_ns"]
        tick = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
        assert before_boot - tick <= start <= _boot_ns()
        assert sorted((k["start_ns"], k["end_ns"], k["correlation_id"], k["device_id"], k["stream_id"],
                       k["kernel_name"]) for k in kernels) == _kernels(10, 100)
        assert {k["pid"] for k in kernels} == {e.pid} and not any(k["simulated"] for k in kernels)

        e.cmd("launch 2 200")  # same window: no mappings again
        more, _ = _drain(c, {e.pid}, 2, 0)
        assert [r["mappings"] for r in more] == [[], []]
        c.end_window(None)
        e.cmd("launch 2 300")
        more, _ = _drain(c, {e.pid}, 2, 0)
        assert [r["mappings"] != [] for r in sorted(more, key=lambda r: r["correlation_id"])] == [True, False]
        counts = c.counters()
        assert counts["lost_launches"] == counts["lost_kernels"] == counts["weights_unused"] == 0
        assert counts["stacks_missing"] == counts["names_truncated"] == counts["records_malformed"] == 0
    finally:
        c.close()
    assert e.semaphores() == (0, 0, 0)  # detached: the kernel lowered them again


def test_later_processes_are_covered_and_memory_arguments_read(built: dict[str, Path], procs: Procs,
                                                              bpf_ok: None) -> None:
    c = _collector(procs)
    try:
        procs.start(built["emitter"])
        assert c.rescan() == [str(built["libfpemit.so"])]
        o0 = procs.start(built["emitter_o0"])  # not attached until the next rescan: its probes stay off
        second = procs.start(built["emitter"])  # maps the attached library: covered without a rescan
        assert o0.semaphores() == (0, 0, 0) and second.semaphores() == (1, 1, 1)
        o0.cmd("launch 3 10")
        second.cmd("launch 3 20")
        second.cmd("kernel 2 20")
        launches, kernels = _drain(c, {second.pid, o0.pid}, 3, 2)  # o0 fired too: unseen
        _check_launches(launches, second, _launches(3, 20))
        assert len(kernels) == 2 and {k["pid"] for k in kernels} == {second.pid}

        assert c.rescan() == [str(built["emitter_o0"])]  # within one rescan
        o0.cmd("launch 6 30")
        o0.cmd("kernel 3 30")
        launches, kernels = _drain(c, {o0.pid}, 6, 3)
        _check_launches(launches, o0, _launches(6, 30))
        assert sorted((k["start_ns"], k["end_ns"], k["correlation_id"], k["device_id"], k["stream_id"],
                       k["kernel_name"]) for k in kernels) == _kernels(3, 30)
    finally:
        c.close()


def test_deep_stacks_are_walked_whole_up_to_the_bound(built: dict[str, Path], procs: Procs, bpf_ok: None) -> None:
    c = _collector(procs)
    try:
        e = procs.start(built["emitter"])
        c.rescan()
        e.cmd("deep 60 1")  # 61 frames of ~230 bytes: the walk crosses several stack pages
        e.cmd("deep 200 2")  # more frames than the bound
        launches, _ = _drain(c, {e.pid}, 2, 0)
    finally:
        c.close()
    by_corr = {r["correlation_id"]: r for r in launches}
    assert sorted(by_corr) == [1, 2]
    mappings = next(r["mappings"] for r in launches if r["mappings"])
    tables = _tables(mappings)
    chain = _chain(by_corr[1], mappings, tables)
    assert chain[-63:] == ["main"] + ["deep"] * 61 + ["emit_launch"]
    assert len(by_corr[2]["user_addrs"]) == MAX_STACK  # the innermost frames, leaf first
    assert _chain(by_corr[2], mappings, tables) == ["deep"] * (MAX_STACK - 1) + ["emit_launch"]
    assert c.counters()["stacks_missing"] == 0


def test_kernel_names_are_bounded_and_cuts_counted(built: dict[str, Path], procs: Procs,
                                                   bpf_ok: None) -> None:
    c = _collector(procs)
    try:
        e = procs.start(built["emitter"])
        c.rescan()
        for n in (KERNEL_NAME_MAX - 1, KERNEL_NAME_MAX, KERNEL_NAME_MAX + 1, 5000):
            e.cmd(f"name {n}")
        _, kernels = _drain(c, {e.pid}, 0, 4)
        assert sorted((k["correlation_id"], len(k["kernel_name"])) for k in kernels) == [
            (KERNEL_NAME_MAX - 1, KERNEL_NAME_MAX - 1), (KERNEL_NAME_MAX, KERNEL_NAME_MAX),
            (KERNEL_NAME_MAX + 1, KERNEL_NAME_MAX), (5000, KERNEL_NAME_MAX)]
        assert all(set(k["kernel_name"]) == {"k"} for k in kernels)
        assert c.counters()["names_truncated"] == 2
    finally:
        c.close()


def test_bad_probe_arguments_are_counted_not_fatal(built: dict[str, Path], procs: Procs,
                                                   bpf_ok: None) -> None:
    c = _collector(procs)
    try:
        e = procs.start(built["emitter"])
        c.rescan()
        e.cmd("bad")
        launches, kernels = _drain(c, {e.pid}, 1, 1)
        assert [(r["api_name"], r["weight"]) for r in launches] == [("", 1)]
        assert [(k["kernel_name"], k["correlation_id"], k["stream_id"]) for k in kernels] == [("", 5, 7)]
        counts = c.counters()
        assert (counts["api_names_unreadable"], counts["weights_invalid"], counts["names_unreadable"]) == (1, 1, 1)
    finally:
        c.close()


def test_ring_buffer_overflow_is_counted_exactly(built: dict[str, Path], procs: Procs,
                                                 bpf_ok: None) -> None:
    c = _collector(procs, ring_pages=1)  # one page: a few dozen launch records
    try:
        e = procs.start(built["emitter"])
        c.rescan()
        e.cmd("launch 500 0")
        launches, _ = _drain(c, {e.pid}, 500, 0, timeout=1)
        lost = c.counters()["lost_launches"]
        assert lost > 0 and len(launches) + lost == 500
        assert len({r["correlation_id"] for r in launches}) == len(launches)
    finally:
        c.close()


def test_a_poll_reads_at_most_its_budget_and_leaves_the_rest(built: dict[str, Path], procs: Procs,
                                                              bpf_ok: None) -> None:
    c = _collector(procs, max_pending=5)
    try:
        e = procs.start(built["emitter"])
        c.rescan()
        e.cmd("launch 12 0")
        sizes = [len(c.poll(0)[0]) for _ in range(4)]
        assert sizes == [5, 5, 2, 0]
        assert c.counters()["polls_cut"] == 2 and c.counters()["lost_launches"] == 0
    finally:
        c.close()


def test_objects_without_slots_and_unmapped_objects(built: dict[str, Path], procs: Procs,
                                                    bpf_ok: None) -> None:
    small = _collector(procs, max_sites=2)  # the library has three probe sites
    try:
        lib_user = procs.start(built["emitter"])
        assert small.rescan() == [] and small.attached() == {}
        assert small.counters()["objects_without_slots"] == 1
        assert small.rescan() == [] and small.counters()["objects_without_slots"] == 1  # not tried every second
    finally:
        small.close()
    lib_user.close()
    c = _collector(procs, idle_scans=1, full_scan_every=1)
    try:
        o0 = procs.start(built["emitter_o0"])
        assert c.rescan() == [str(built["emitter_o0"])]
        o0.close()  # the object is mapped nowhere now
        c.rescan()
        assert list(c.attached()) == [str(built["emitter_o0"])]  # one idle rescan is allowed
        c.rescan()
        assert c.attached() == {} and c.counters()["objects_detached"] == 1
        again = procs.start(built["emitter_o0"])  # its slots were freed: it attaches again
        assert c.rescan() == [str(built["emitter_o0"])]
        again.cmd("launch 2 40")
        launches, _ = _drain(c, {again.pid}, 2, 0)
        assert sorted(r["correlation_id"] for r in launches) == [40, 41]
    finally:
        c.close()


def test_records_reach_the_broker_keyed_node_and_pid_after_their_symbols(
        kafka_bootstrap: str, built: dict[str, Path], procs: Procs, bpf_ok: None) -> None:
    node = f"gpu-{uuid.uuid4().hex[:8]}"
    c = _collector(procs, node)
    try:
        e = procs.start(built["emitter"])
        c.rescan()
        e.cmd("launch 6 50")
        e.cmd("kernel 4 50")
        launches, kernels = _drain(c, {e.pid}, 6, 4)
    finally:
        c.close()
    assert len(launches) == 6 and len(kernels) == 4
    config = {"bootstrap.servers": kafka_bootstrap}
    link = KafkaLink(config, ["symbols", "gpu.launches", "gpu.kernels"])
    link.start()
    try:
        assert link.wait_ready(30), link.reason
        box = Outbox(Publisher(config), link, OutboxEncoder(), 64 << 20)
        box.put(Records("gpu_launches", launches))
        box.put(Records("gpu_kernels", kernels))
        assert [u.kind for u in box.held] == ["symbols", "gpu_launches", "gpu_kernels"]  # tables first
        assert box.drain(30) and box.sent["gpu_launches"].records == 6 and box.sent["gpu_kernels"].records == 4
    finally:
        link.stop()
    key = f"{node}/{e.pid}".encode()
    got_l = read_topic(kafka_bootstrap, "gpu.launches", lambda m: m.key() == key, 6)
    got_k = read_topic(kafka_bootstrap, "gpu.kernels", lambda m: m.key() == key, 4)
    dec_l = sorted((decode(m.value(), "GpuLaunch")[1] for m in got_l), key=lambda r: r["correlation_id"])
    dec_k = sorted((decode(m.value(), "GpuKernel")[1] for m in got_k), key=lambda r: r["correlation_id"])
    assert dec_l == sorted(launches, key=lambda r: r["correlation_id"])
    assert dec_k == sorted(kernels, key=lambda r: r["correlation_id"])
    assert len({m.partition() for m in got_l + got_k}) == 1  # one process: one partition, in order

    # the tables the symbolizer needs were published, and they name the call chains
    mappings = next(r["mappings"] for r in dec_l if r["mappings"])
    lib_id, exe_id = read_build_id(built["libfpemit.so"]), read_build_id(built["emitter"])
    assert {lib_id, exe_id} <= {m["build_id"] for m in mappings}
    tables = {}
    for bid in (lib_id, exe_id):
        chunks = read_topic(kafka_bootstrap, "symbols", lambda m, b=bid: m.key().decode().startswith(b + "/"), 1)
        tables[bid] = table_from_chunks([decode(m.value(), "SymbolChunk")[1] for m in chunks])
    callers = {x[0]: x[4] for x in _launches(6, 50)}
    for r in dec_l:
        assert _chain(r, mappings, tables)[-3:] == ["main", callers[r["correlation_id"]], "emit_launch"]


def test_simulated_workload_every_sampled_launch_and_fired_kernel_once(procs: Procs, tmp_path: Path,
                                                                         bpf_ok: None) -> None:
    """The GPU simulator and its workload (simulate/gpu_workload.py): the records match the simulator's
    own counts exactly, weights add up to the launches they stand for, and native launches symbolize to the C path
    the simulator names."""
    # A build of the simulator of this test's own (FLEETPROF_NATIVE_BUILD): another file than the one other tests
    # load, so attaching here turns on no probes in their processes.
    env = dict(os.environ, FLEETPROF_NATIVE_BUILD=str(tmp_path / "native"), FLEETPROF_LAUNCH_RATE="40")
    built_lib = subprocess.run([sys.executable, "-c", "from simulate.gpu import build_gpusim; "
                                "print(build_gpusim())"], env=env, capture_output=True, text=True)
    if built_lib.returncode != 0:
        unavailable(f"the GPU simulator does not build: {built_lib.stderr.strip().splitlines()[-1:]}")
    lib = Path(built_lib.stdout.strip())
    c = _collector(procs, "sim")
    holder = subprocess.Popen([sys.executable, "-c", f"import ctypes, sys; ctypes.CDLL({str(lib)!r}); "
                               "print('ready', flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        procs.add(holder.pid)
        # attached before the workload starts: every launch it makes is decided with all three probes on
        assert c.rescan() == [str(lib)]
        work = subprocess.Popen([sys.executable, "-m", "simulate.gpu_workload", "--seconds", "3",
                                 "--launches-per-s", "400"], stdout=subprocess.PIPE, text=True, env=env)
        launches, kernels = [], []
        while work.poll() is None:
            more_l, more_k = c.poll(100)
            launches += [r for r in more_l if r["pid"] == work.pid]
            kernels += [r for r in more_k if r["pid"] == work.pid]
        report = json.loads(work.stdout.read())
        launches2, kernels2 = _drain(c, {work.pid}, 0, 0)
        launches += launches2
        kernels += kernels2
        counts = c.counters()
    finally:
        holder.stdin.close()
        holder.wait(10)
        c.close()
    stats = report["simulator"]
    assert stats["launches_decided"] == stats["launches"]  # nothing was launched before the probes were on
    assert len(launches) == stats["launches_sampled"] > 0
    assert sum(r["weight"] for r in launches) == stats["weight_sum"]  # less skips pending at exit
    assert len(kernels) == stats["kernels_fired"]
    assert counts["lost_launches"] == counts["lost_kernels"] == counts["stacks_missing"] == 0
    assert all(r["simulated"] for r in launches + kernels)
    assert {(r["api_name"], r["callback_id"]) for r in launches} == {("gpusimLaunchKernel (simulated)", 211)}
    assert {k["kernel_name"] for k in kernels} <= set(report["by_kernel"])
    name_of = {k["correlation_id"]: k["kernel_name"] for k in kernels}
    assert len(name_of) == len(kernels) and {r["correlation_id"] for r in launches} <= set(name_of)

    native = {x["kernel"]: x["path"].split(";")[-3:] for x in report["launched"] if "gpusim_native" in x["path"]}
    mappings = next(r["mappings"] for r in launches if r["mappings"])
    tables = _tables(mappings)
    checked = 0
    for r in launches:
        path = native.get(name_of[r["correlation_id"]])
        if path is not None:
            chain = _chain(r, mappings, tables)
            at = chain.index(path[0])
            assert chain[at:at + 3] == path, chain
            checked += 1
    assert checked > 0


def test_stale_uprobe_events_of_dead_agents_are_removed_and_live_ones_kept(tmp_path) -> None:
    from producers.gpu_probes import remove_stale_events

    dead = 2**22 + 12345  # above any pid_max default: never a live process
    events = tmp_path / "uprobe_events"
    events.write_text(f"p:uprobes/fleetprof_{dead}_3_182e_bcc_{dead} /lib/x.so:0x182e\n"
                      f"p:uprobes/fleetprof_{os.getpid()}_0_1c47_bcc_1 /lib/x.so:0x1c47\n"
                      "p:uprobes/other_tool_1 /lib/y.so:0x10\n")
    assert remove_stale_events((events,)) == 1
    assert events.read_text().splitlines()[-1] == f"-:uprobes/fleetprof_{dead}_3_182e_bcc_{dead}"
