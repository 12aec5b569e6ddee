"""The call-frame tables in the BPF maps, and the in-kernel walk over them, against a real program built without
frame pointers (needs root, bcc and kernel headers: skipped with the reason without them, a failure on CI).

The agreement with `perf record --call-graph dwarf` through the whole pipeline is tests/test_unwind_truth.py's; here:
what the loader writes, frees and counts, and what the sampler's stacks hold.
"""

from __future__ import annotations

import ctypes as ct
import logging
import os
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from producers.cpu_sampler import BpfUnavailable, CpuSampler, check_bpf
from producers.elf_symbols import read_elf_symbols
from producers.mapped_files import load_bias
from producers.process_info import Mapping, process_info
from producers.unwind_maps import MAX_MAPPINGS, RowSpace, UnwindLoader
from producers.unwind_metrics import UnwindMetrics
from producers.unwind_tables import compile_unwind_table
from schemas.wire import TRUNCATED_FRAME
from tests.elf_helpers import need, unavailable

# main -> run -> middle -> leaf, each with locals on the stack (a frame the walker must measure from the CFA rules,
# not from RBP), built -O2 -fomit-frame-pointer as distributions build.
NOFP_C = r"""
#include <unistd.h>
volatile unsigned long sink, extra;
__attribute__((noinline)) void leaf(int n) {
    volatile char pad[200];
    for (int i = 0; i < n; i++) { pad[i % 200] = i; sink += pad[(i * 7) % 200]; }
}
__attribute__((noinline)) void middle(int n) { volatile long pad[9]; pad[n % 9] = n; leaf(n); extra += pad[0]; }
__attribute__((noinline)) void run(void) { middle(200000); extra++; }
int main(void) { alarm(60); for (;;) run(); }
"""


# Stack realignment through a DRAP register (stack arguments, a 64-byte aligned local, alloca): the realigned
# function's CFA is *(RBP - 16) and it keeps its caller's RBP at *(RBP + 0); its caller `framed` (alloca: it keeps
# RBP as its frame base even without frame pointers) needs that RBP to find its own CFA.
REALIGNED_C = r"""
#include <alloca.h>
#include <string.h>
#include <unistd.h>
volatile unsigned long sink, extra;
__attribute__((noinline)) long spin(long *p, int n) {
    for (int i = 0; i < 300000; i++) sink += p[i % n];
    return (long)sink;
}
__attribute__((noinline)) long realigned(int n, long a, long b, long c, long d, long e, long g, long h) {
    _Alignas(64) long buf[16];
    long *p = alloca(n * sizeof(long));
    memset(buf, n, sizeof buf);
    p[0] = g + h + a + b + c + d + e;
    buf[2] = spin(p, 1);
    return spin(buf, 16);
}
__attribute__((noinline)) long framed(int n) {
    long *q = alloca(n * sizeof(long));
    q[0] = realigned(n, 1, 2, 3, 4, 5, 6, 7);
    extra += q[0];
    return q[n - 1];
}
int main(int argc, char **argv) { (void)argv; alarm(60); for (;;) framed(argc + 3); }
"""


def test_row_space_takes_first_fit_and_merges_what_is_given_back() -> None:
    space = RowSpace(100)
    a, b, c = space.take(30), space.take(30), space.take(30)
    assert (a, b, c, space.take(20), space.used) == (0, 30, 60, None, 90)
    space.give(b, 30)
    assert space.take(40) is None  # 30 + 10 free, not together
    space.give(a, 30)
    assert space.take(60) == 0  # a and b merged again
    space.give(0, 60)
    space.give(c, 30)
    assert space.used == 0 and space.take(100) == 0


def test_bias_maps_a_pc_to_the_files_virtual_address() -> None:
    text = [(0, 0, 0x1000), (0x1000, 0x1000, 0x5000), (0x6000, 0x7000, 0x100)]  # offset, vaddr, size
    # a PIE's text mapped at 0x5555_0000_1000 from offset 0x1000: pc - bias is its vaddr
    assert load_bias(text, 0x5555_0000_1000, 0x1000) == 0x5555_0000_0000
    # a segment whose vaddr and offset differ (data after a gap)
    assert load_bias(text, 0x7f00_0000_0000, 0x6000) == 0x7f00_0000_0000 - 0x7000
    assert load_bias(text, 0x1000, 0x9000) is None  # an offset in no segment


@pytest.fixture(scope="module")
def nofp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        check_bpf()
    except BpfUnavailable as exc:
        unavailable(f"BPF unavailable: {exc}")
    need("gcc")
    folder = tmp_path_factory.mktemp("unwind_maps")
    (folder / "w.c").write_text(NOFP_C)
    subprocess.run(["gcc", "-O2", "-fomit-frame-pointer", "-o", str(folder / "nofp"), str(folder / "w.c")],
                   check=True)
    return folder / "nofp"


@pytest.fixture
def workload(nofp: Path) -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen([str(nofp)])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _names(binary: Path, mappings: list[Mapping], stack: list[int]) -> list[str]:
    """Root first, names from the program's own symbols; other files by basename, the mark as [truncated]."""
    syms = read_elf_symbols(binary)
    out = []
    for i, addr in enumerate(stack):
        if addr == TRUNCATED_FRAME:
            out.append("[truncated]")
            continue
        m = next((m for m in mappings if m.start <= addr < m.limit), None)
        if m is None or os.path.realpath(m.path) != os.path.realpath(binary):
            out.append(os.path.basename(m.path) if m else "?")
            continue
        vaddr = addr - m.start + m.file_offset - (0 if i == 0 else 1)
        j = int(np.searchsorted(syms.addrs, vaddr, side="right")) - 1
        out.append(syms.names[j] if j >= 0 else "?")
    return out[::-1]


def _sampled_chains(binary: Path, pid: int, cache: Path) -> tuple[Counter[tuple[str, ...]], dict[str, int]]:
    """Three seconds of `pid`'s stacks at 99 Hz once its tables are in, as name chains root first; the loader's
    counters."""
    loader = UnwindLoader(cache)
    sampler = CpuSampler(99, pid_filter=pid, unwind=loader)
    sampler.start()
    try:
        assert sampler.unwinding == "call-frame tables"
        info = process_info(pid)
        loader.load(pid, info.mappings)
        assert loader.wait_idle() and loader.loaded(pid)
        sampler.drain()  # what was walked before the tables were in
        time.sleep(3)  # >= 100 samples even with the other CPU busy
        samples = sampler.drain()
        counters = loader.counters()
        metrics = {(m.name, tuple(s.labels.values())): s.value for m in UnwindMetrics(loader).collect()
                   for s in m.samples if s.name.endswith("_total")}
    finally:
        sampler.close()
        loader.close()
    chains: Counter[tuple[str, ...]] = Counter()
    for _, _, user, _, n in samples:
        chains[tuple(_names(binary, info.mappings, user))] += n
    # what Prometheus is told is what the loader counts (the kernel's counters moved on by at most the last look)
    assert metrics[("fleetprof_agent_unwind_stacks", ("root",))] >= counters["stacks_reached_root"] > 0
    assert metrics[("fleetprof_agent_unwind_frames", ("table",))] >= counters["frames_by_table"] > 0
    return chains, counters


def test_loaded_tables_walk_code_without_frame_pointers_to_the_root(nofp: Path, workload: subprocess.Popen,
                                                                   tmp_path: Path) -> None:
    chains, counters = _sampled_chains(nofp, workload.pid, tmp_path / "cache")
    total = sum(chains.values())
    whole = sum(n for chain, n in chains.items()
                if chain[-4:] == ("main", "run", "middle", "leaf") and chain[0] == "_start")
    assert total >= 100 and whole >= 0.95 * total, chains.most_common(5)
    # from _start through libc's start code (frames named by their file above) to main
    assert chains.most_common(1)[0][0][1].startswith("libc"), chains.most_common(1)
    assert counters["stacks_reached_root"] >= 0.95 * total and counters["frames_by_table"] > 0, counters
    assert counters["files"] >= 2 and counters["processes"] == 1


@contextmanager
def _sampled(program: Path, tmp_path: Path) -> Iterator[tuple[subprocess.Popen, CpuSampler, UnwindLoader]]:
    """`program` running, sampled at 99 Hz with an unwind loader of its own; all stopped afterwards."""
    proc = subprocess.Popen([str(program)])
    loader = UnwindLoader(tmp_path / "cache")
    sampler = CpuSampler(99, pid_filter=proc.pid, unwind=loader)
    sampler.start()
    try:
        yield proc, sampler, loader
    finally:
        proc.kill()
        proc.wait()
        sampler.close()
        loader.close()


def test_rows_are_written_as_compiled_and_freed_when_the_process_exits(nofp: Path, tmp_path: Path) -> None:
    with _sampled(nofp, tmp_path) as (proc, sampler, loader):
        info = process_info(proc.pid)
        loader.load(proc.pid, info.mappings)
        assert loader.wait_idle()
        entry = sampler._bpf[b"unwind_procs"][ct.c_uint32(proc.pid)]
        maps = [(m.start, m.end, m.bias, m.rows_start, m.rows_len) for m in entry.maps[:entry.count]]
        assert [m[0] for m in maps] == sorted(m.start for m in info.mappings)
        own = next(m for m in info.mappings if os.path.realpath(m.path) == str(nofp.resolve()))
        start, _, bias, rows_start, rows_len = next(m for m in maps if m[0] == own.start)
        table = compile_unwind_table(nofp)
        assert rows_len == table.count
        rows, rules = sampler._bpf[b"unwind_rows"], sampler._bpf[b"unwind_rules"]
        got = []
        for i in range(rows_len):
            row = rows[ct.c_int(rows_start + i)]
            rule = rules[ct.c_int(row.rule)]
            got.append((row.pc, rule.cfa_kind, rule.cfa_offset, rule.rbp_kind, rule.rbp_offset))
        assert got == [tuple(int(r[f]) for f in ("pc", "cfa_kind", "cfa_offset", "rbp_kind", "rbp_offset"))
                       for r in table.array()]
        assert loader.counters()["rules"] < loader.counters()["rows_used"] / 10  # each distinct rule stored once
        main = read_elf_symbols(nofp)
        assert start - bias <= int(main.addrs[list(main.names).index("main")]) < own.limit - bias
        used = loader.counters()["rows_used"]
        assert used >= rows_len
        proc.kill()
        proc.wait()
        assert loader.forget_exited() == 1
        assert loader.counters()["rows_used"] == 0 and loader.counters()["files"] == 0
        with pytest.raises(KeyError):
            sampler._bpf[b"unwind_procs"][ct.c_uint32(proc.pid)]


def test_rows_read_for_a_process_that_exits_meanwhile_are_freed(nofp: Path, tmp_path: Path) -> None:
    # CI once found a short-lived process's file left loaded with no process: its rows were stored, then the
    # process exited before its entry was written, so no exit ever freed them.
    with _sampled(nofp, tmp_path) as (proc, sampler, loader):
        read = loader.tables.get

        def read_then_exit(key: str, path: str):  # noqa: ANN202 - the cache's own return type
            table = read(key, path)
            proc.kill()
            proc.wait()
            return table

        info = process_info(proc.pid)
        loader.tables.get = read_then_exit  # type: ignore[method-assign]
        loader.load(proc.pid, info.mappings)
        assert loader.wait_idle()
        counters = loader.counters()
        assert proc.returncode is not None and not loader.loaded(proc.pid)
        assert counters["files_loaded"] >= 1 and counters["files_freed"] == counters["files_loaded"], counters
        assert counters["files"] == 0 and counters["rows_used"] == 0 and counters["processes"] == 0, counters
        with pytest.raises(KeyError):
            sampler._bpf[b"unwind_procs"][ct.c_uint32(proc.pid)]


def test_a_table_that_does_not_fit_is_walked_by_frame_pointers_and_counted(nofp: Path, workload: subprocess.Popen,
                                                                         tmp_path: Path) -> None:
    loader = UnwindLoader(tmp_path / "cache", rows=1024)  # libc's table alone is bigger
    sampler = CpuSampler(19, pid_filter=workload.pid, unwind=loader)
    sampler.start()
    try:
        info = process_info(workload.pid)
        many = info.mappings + [Mapping((1 << 40) + i * 4096, (1 << 40) + i * 4096 + 4096, 0, "", "")
                                for i in range(MAX_MAPPINGS)]
        loader.load(workload.pid, many)
        assert loader.wait_idle()
        counters = loader.counters()
        entry = sampler._bpf[b"unwind_procs"][ct.c_uint32(workload.pid)]
    finally:
        sampler.close()
        loader.close()
    assert counters["rows_exhausted"] >= 1 and counters["mappings_over_limit"] == len(many) - MAX_MAPPINGS
    assert entry.count == MAX_MAPPINGS
    libc = next(m for m in info.mappings if "libc" in os.path.basename(m.path))
    assert all(m.rows_len == 0 for m in entry.maps[:entry.count] if m.start == libc.start)


def test_a_realigned_stack_is_walked_through_its_saved_frame_base(nofp: Path, tmp_path: Path) -> None:
    (tmp_path / "r.c").write_text(REALIGNED_C)
    binary = tmp_path / "realigned"
    subprocess.run(["gcc", "-O2", "-fomit-frame-pointer", "-o", str(binary), str(tmp_path / "r.c")], check=True)
    proc = subprocess.Popen([str(binary)])
    try:
        chains, _ = _sampled_chains(binary, proc.pid, tmp_path / "cache")
    finally:
        proc.kill()
        proc.wait()
    total = sum(chains.values())
    whole = sum(n for chain, n in chains.items()
                if chain[0] == "_start" and chain[-4:] == ("main", "framed", "realigned", "spin"))
    assert total >= 100 and whole >= 0.95 * total, chains.most_common(5)


class _RefusedLoader(UnwindLoader):
    def cflags(self) -> list[str]:
        return [*super().cflags(), "-DUNWIND_ROWS=0"]  # a map of no entries: the kernel refuses to create it


def test_a_refused_unwinder_falls_back_to_frame_pointers_in_one_line(nofp: Path, tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "fleetprof.unwind")
    sampler = CpuSampler(19, pid_filter=os.getpid(), unwind=_RefusedLoader(tmp_path / "cache"))
    sampler.start()
    try:
        assert sampler.unwinding == "frame pointers"
    finally:
        sampler.close()
    said = [r.getMessage() for r in caplog.records if "table unwinder did not load" in r.getMessage()]
    assert len(said) == 1 and "\n" not in said[0], said
