"""A small C program that fires the GPU-depth probes of native/include/fleetprof_probes.h (launch_range,
graph_kernel_executed, memory_executed) with values the tests know, built here with gcc: what tests/test_gpu_depth.py
runs the agent's collector against. The range paths it sends are given whole by the test (their format is the
emitters' concern: the simulator's and the shim's tests check it); here, which launch each is joined to."""

from __future__ import annotations

from pathlib import Path

from producers.native_build import PROBES_INCLUDE
from tests.elf_helpers import need, unavailable
from tests.probe_emitters import _gcc

T0 = 1_700_000_000_000_000_000  # the records' Unix ns

# Commands on stdin, "ok" after each (the values each fires are what the expected_* functions below say):
#   copy N BASE          memory_executed for correlation ids BASE.., cycling HtoD pinned>device, DtoH
#                        device>pageable, a memset of device memory, PtoP device>device on device 1
#   graph G CORR N API   kernel_launch(CORR, API), then N graph_kernel_executed of graph G and one copy of it
#   launch CORR          kernel_launch alone
#   rlaunch CORR PATH    launch_range(CORR, PATH) then kernel_launch(CORR)
#   threads N BASE       two threads, each N launches: thread k's i-th is BASE + 2 i + k, in range
#                        "thread<k> > step<i>" except every third (i % 3 == 2), which has none
#   rgone CORR           launch_range with a path pointer into nothing, then kernel_launch
#   runtouched CORR      launch_range with a path in a page this process never touched, then kernel_launch
#   ctimes START END     a copy (correlation id 43) with these times
DEPTH_C = r"""
#define _GNU_SOURCE
#define FLEETPROF_DEFINE_PROBE_SEMAPHORES
#include "fleetprof_probes.h"
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#define T0 1700000000000000000ull
volatile unsigned long calls;
__attribute__((noinline)) void note(void) { calls++; }
__attribute__((noinline)) void launch(uint32_t corr, const char *api, const char *range) {
    note();
    if (range) FLEETPROF_LAUNCH_RANGE(corr, range);
    FLEETPROF_KERNEL_LAUNCH(corr, 13, api);
    note();
}
__attribute__((noinline)) void memory(uint64_t start, uint64_t end, uint32_t corr, uint32_t device, uint32_t stream,
                                      uint64_t bytes, uint32_t kind, uint32_t graph, uint64_t node) {
    FLEETPROF_MEMORY_EXECUTED(start, end, corr, device, stream, bytes, kind, graph, node);
    note();
}
__attribute__((noinline)) void graph_kernel(uint64_t start, uint64_t end, uint32_t corr, const char *name,
                                            uint32_t graph, uint64_t node) {
    FLEETPROF_GRAPH_KERNEL_EXECUTED(start, end, corr, 0, 3, name, graph, node);
    note();
}
static unsigned per_thread;
static unsigned thread_base;
static void *thread_main(void *arg) {
    unsigned k = (unsigned)(uintptr_t)arg;
    char path[64];
    for (unsigned i = 0; i < per_thread; i++) {
        snprintf(path, sizeof path, "thread%u > step%u", k, i);
        launch(thread_base + 2 * i + k, "cudaLaunchKernel", i % 3 == 2 ? NULL : path);
        usleep(50);
    }
    return NULL;
}
int main(void) {
    char line[1024], text[1024], name[64];
    unsigned n, base, g;
    unsigned long long a, b;
    alarm(300);
    printf("ready\n"); fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = 0;
        if (sscanf(line, "copy %u %u", &n, &base) == 2) {
            for (uint32_t c = base; c < base + n; c++) {
                uint64_t start = T0 + 1000ull * c;
                uint32_t kinds[4] = {FLEETPROF_MEMORY_KIND(1, 0, 2, 3), FLEETPROF_MEMORY_KIND(2, 0, 3, 1),
                                     FLEETPROF_MEMORY_KIND(0, 1, 0, 3), FLEETPROF_MEMORY_KIND(10, 0, 3, 3)};
                memory(start, start + 100 + c, c, c % 4 == 3, 5, 4096ull * c, kinds[c % 4], 0, 0);
            }
        } else if (sscanf(line, "graph %u %u %u %63s", &g, &base, &n, text) == 4) {
            launch(base, text, NULL);
            for (uint32_t i = 0; i < n; i++) {
                snprintf(name, sizeof name, "graph_kernel_%u", i);
                graph_kernel(T0 + 10000ull * i, T0 + 10000ull * i + 500 + i, base, name, g, 100 + i);
            }
            memory(T0 + 10000ull * n, T0 + 10000ull * n + 7, base, 0, 3, 65536, FLEETPROF_MEMORY_KIND(8, 0, 3, 3),
                   g, 100 + n);
        } else if (sscanf(line, "rlaunch %u %n", &base, &n) == 1) {
            launch(base, "cudaLaunchKernel", line + n);
        } else if (sscanf(line, "launch %u", &base) == 1) {
            launch(base, "cudaLaunchKernel", NULL);
        } else if (sscanf(line, "threads %u %u", &n, &base) == 2) {
            pthread_t t[2];
            per_thread = n;
            thread_base = base;
            for (uintptr_t k = 0; k < 2; k++) pthread_create(&t[k], NULL, thread_main, (void *)k);
            for (int k = 0; k < 2; k++) pthread_join(t[k], NULL);
        } else if (sscanf(line, "rgone %u", &base) == 1) {
            char *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            munmap(page, 4096);
            launch(base, "cudaLaunchKernel", page);
        } else if (sscanf(line, "runtouched %u", &base) == 1) {
            static const char path[] = "train_step > in an untouched page";
            int fd = memfd_create("ranges", 0);
            if (fd < 0 || write(fd, path, sizeof path) != (ssize_t)sizeof path) return 1;
            const char *page = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
            if (page == MAP_FAILED) return 1;
            launch(base, "cudaLaunchKernel", page);
        } else if (sscanf(line, "ctimes %llu %llu", &a, &b) == 2) {
            memory(a, b, 43, 0, 0, 8, FLEETPROF_MEMORY_KIND(1, 0, 1, 3), 0, 0);
        }
        printf("ok\n"); fflush(stdout);
    }
    return 0;
}
"""

COPY_KINDS = [("MEMCPY", "[memcpy HtoD]", "HtoD", "pinned>device"),
              ("MEMCPY", "[memcpy DtoH]", "DtoH", "device>pageable"),
              ("MEMSET", "[memset]", "", "device"), ("MEMCPY", "[memcpy PtoP]", "PtoP", "device>device")]


def build_depth_emitter(d: Path) -> Path:
    """The program above, built in `d`."""
    need("gcc")
    if not any(Path(p, "sys", "sdt.h").exists() for p in ("/usr/include", "/usr/include/x86_64-linux-gnu")):
        unavailable("no <sys/sdt.h> (Debian systemtap-sdt-dev; bash infra/setup.sh installs it)")
    (d / "depth.c").write_text(DEPTH_C)
    _gcc("-O2", "-g", "-fno-omit-frame-pointer", "-pthread", f"-I{PROBES_INCLUDE}", str(d / "depth.c"), "-o",
         str(d / "depth_emitter"))
    return d / "depth_emitter"


def expected_copies(n: int, base: int) -> list[tuple]:
    """(correlation id, start, end, device, stream, bytes, activity, name, copy kind, memory kinds) of `copy n base`."""
    return [(c, T0 + 1000 * c, T0 + 1000 * c + 100 + c, int(c % 4 == 3), 5, 4096 * c, *COPY_KINDS[c % 4])
            for c in range(base, base + n)]


def expected_graph(graph: int, corr: int, n: int) -> list[tuple]:
    """(correlation id, graph id, node id, activity, name, start, end, bytes) of `graph graph corr n API`."""
    kernels = [(corr, graph, 100 + i, "KERNEL", f"graph_kernel_{i}", T0 + 10000 * i, T0 + 10000 * i + 500 + i, 0)
               for i in range(n)]
    return [*kernels, (corr, graph, 100 + n, "MEMCPY", "[memcpy DtoD]", T0 + 10000 * n, T0 + 10000 * n + 7, 65536)]


def expected_thread_ranges(n: int, base: int) -> dict[int, str]:
    """Correlation id -> range path of `threads n base`."""
    return {base + 2 * i + k: ("" if i % 3 == 2 else f"thread{k} > step{i}") for k in range(2) for i in range(n)}
