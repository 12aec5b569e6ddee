"""Small C programs that fire the fleetprof USDT probes (native/include/fleetprof_probes.h), built here with gcc (a
shared library called from a PIE executable, and an -O0 non-PIE executable whose probe arguments live in memory),
the processes that run them, a GPU simulator of a test's own with a collector attached to it, and what the GPU probe
tests expect of their records."""

from __future__ import annotations

import ctypes as ct
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from processors.symbol_tables import table_from_chunks
from processors.symbolize import symbolize_batch
from producers.elf_symbols import symbol_chunks
from producers.gpu_probes import (
    GpuProbeCollector,
)
from producers.native_build import PROBES_INCLUDE
from producers.probe_finder import ProbeFinder
from producers.process_info import ProcessCache
from tests.elf_helpers import need, unavailable

ROOT = Path(__file__).resolve().parent.parent

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

# Commands on stdin, "ok" after each: launch N BASE, kernel N BASE, name LEN, deep D CORR, bad, sem, untouched (a
# name in a page this process never touched), gone (a name pointer into nothing), times START END. What each
# fires is what _launches() and _kernels() below expect.
MAIN_C = r"""
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
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
#define T0 1700000000000000000ull /* the kernels' Unix ns */
int main(void) {
    unsigned long long a, b;
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
            emit_kernel(T0, T0 + 2, n, 0, 0, name);
        } else if (sscanf(line, "deep %u %u", &n, &base) == 2) {
            deep(n, base);
        } else if (strncmp(line, "bad", 3) == 0) {
            emit_launch(1, 2, NULL, 0);  /* no api name, and weight 0 */
            emit_kernel(T0 + 3, T0 + 4, 5, 6, 7, NULL);
        } else if (strncmp(line, "untouched", 9) == 0) {
            /* written through the file, mapped here and never read by this process: not in its page tables */
            static const char text[] = "kernel_in_an_untouched_page";
            int fd = memfd_create("names", 0);
            if (fd < 0 || write(fd, text, sizeof text) != (ssize_t)sizeof text) return 1;
            const char *page = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
            if (page == MAP_FAILED) return 1;
            emit_kernel(T0 + 10, T0 + 20, 41, 0, 0, page);
        } else if (strncmp(line, "gone", 4) == 0) {
            char *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            munmap(page, 4096);
            emit_kernel(T0 + 30, T0 + 40, 42, 0, 0, page);
        } else if (sscanf(line, "times %llu %llu", &a, &b) == 2) {
            emit_kernel(a, b, 43, 0, 0, "kernel_with_these_times");
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


def build_emitters(d: Path) -> dict[str, Path]:
    """libfpemit.so + emitter (PIE, -O2), emitter_o0 (non-PIE, -O0, probes in the executable), other (probes of
    another provider), built in `d`."""
    need("gcc")
    if not any(Path(p, "sys", "sdt.h").exists() for p in ("/usr/include", "/usr/include/x86_64-linux-gnu")):
        unavailable("no <sys/sdt.h> (Debian systemtap-sdt-dev; bash infra/setup.sh installs it)")
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


def _collector(procs: Procs, node: str = "n1", **kw: object) -> GpuProbeCollector:
    c = GpuProbeCollector(node, ProcessCache(), finder=ProbeFinder(proc=str(procs.view)), **kw)
    c.start()
    return c


def fresh(c: GpuProbeCollector, procs: Procs, node: str = "n1", **kw: object) -> GpuProbeCollector:
    """`c` as `_collector(procs, node, **kw)` would start it, without compiling the program again (~12 s a compile):
    every object detached, the rings drained, the kernel-side counters and pending weights cleared, and the user side
    built anew by the collector's own __init__. `kw` may lower max_sites (the slots are handed out in user space) but
    not change ring_pages, which the program was compiled with."""
    compiled = getattr(c, "compiled_sites", c.max_sites)
    assert kw.get("max_sites", compiled) <= compiled and "ring_pages" not in kw
    for key in list(c._objects):
        c._detach(key)
    while any(c.poll(0)):
        pass
    loaded = c._bpf, c._bcc, c._attach, c.unwinding
    c.__init__(node, ProcessCache(), finder=ProbeFinder(proc=str(procs.view)), ring_pages=c.ring_pages,
               **{"max_sites": compiled, **kw})
    c._bpf, c._bcc, c._attach, c.unwinding = loaded
    c.compiled_sites = compiled
    counters = c._bpf[b"counters"]
    for i in range(len(counters)):
        counters[ct.c_int(i)] = counters.Leaf(0)
    c._bpf[b"weights"].clear()
    assert set(c.counters().values()) == {0} and c.attached() == {} and not c._dead_letters
    return c


def own_gpusim(build: Path) -> Path:
    """A build of the GPU simulator of the test's own (FLEETPROF_NATIVE_BUILD=build): another file than the one other
    tests load, so attaching to it turns on no probes in their processes. Skips the test where it does not build."""
    done = subprocess.run([sys.executable, "-c", "from simulate.gpu import build_gpusim; print(build_gpusim())"],
                          env=dict(os.environ, FLEETPROF_NATIVE_BUILD=str(build)), capture_output=True, text=True,
                          cwd=ROOT)
    if done.returncode != 0:
        unavailable(f"the GPU simulator does not build: {done.stderr.strip().splitlines()[-1:]}")
    return Path(done.stdout.strip())


@contextmanager
def attached_to(procs: Procs, lib: Path, node: str = "sim",
                shared: GpuProbeCollector | None = None) -> Iterator[GpuProbeCollector]:
    """A collector attached to the simulator `lib` before any of the test's processes maps it (a process that holds
    the library is there for the block's time), so every launch they make is decided with all the probes on.
    `shared`: a started collector to use, made fresh (see fresh()) and left open; else one of its own, closed."""
    c = _collector(procs, node) if shared is None else fresh(shared, procs, node)
    holder = subprocess.Popen([sys.executable, "-c", f"import ctypes, sys; ctypes.CDLL({str(lib)!r}); "
                               "print('ready', flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        procs.add(holder.pid)
        assert c.rescan() == [str(lib)]
        yield c
    finally:
        holder.stdin.close()
        holder.wait(10)
        if shared is None:
            c.close()


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
