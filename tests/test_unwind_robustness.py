"""The table unwinder on the processes a fleet actually runs, each a real program built without frame pointers and
sampled by the real BPF walker (needs root, bcc, kernel headers, gcc and unshare: skipped with the reason without
them, a failure on CI): a signal handler's stack continued through the kernel's signal frame, a binary deleted or
replaced while it runs, one that only exists in another mount namespace, a process that runs exec, thousands of
short-lived processes around a long-running one, and a corrupt file in the on-disk table cache."""

from __future__ import annotations

import ctypes as ct
import logging
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from producers.agent import Agent, Records
from producers.cpu import CpuCollector
from producers.cpu_sampler import BpfUnavailable, CpuSampler, Sample, check_bpf
from producers.elf_symbols import ElfSymbols, read_build_id, read_elf_symbols, read_load_segments
from producers.mapped_files import load_bias
from producers.process_info import DELETED, KEEP_ALL, Mapping, ProcessCache, ProcessFilter, process_info
from producers.unwind_cache import UnwindTableCache
from producers.unwind_maps import UnwindLoader
from producers.unwind_tables import CFA_SIGNAL, compile_unwind_table
from schemas.wire import TRUNCATED_FRAME
from tests.elf_helpers import need, unavailable

# main -> run -> middle -> leaf with locals on the stack; SIGUSR1 makes it exec argv[1] (the exec test), argument
# "-" makes it live a few milliseconds, "--" about 200 (the storm test). TAG gives each copy its own build id, so
# the copies of one test never share a table.
NOFP_C = r"""
#include <signal.h>
#include <unistd.h>
volatile unsigned long sink, extra;
volatile sig_atomic_t go;
const char *volatile tag = TAG;
static void on_usr1(int sig) { go = sig; }
__attribute__((noinline)) void leaf(int n) {
    volatile char pad[200];
    for (int i = 0; i < n; i++) { pad[i % 200] = i; sink += pad[(i * 7) % 200]; }
}
__attribute__((noinline)) void middle(int n) { volatile long pad[9]; pad[n % 9] = n; leaf(n); extra += pad[0]; }
__attribute__((noinline)) void run(void) { middle(200000); extra++; }
int main(int argc, char **argv) {
    if (argc > 1 && argv[1][0] == '-') { leaf(argv[1][1] == '-' ? 30000000 : 150000); return 0; }
    signal(SIGUSR1, on_usr1);
    alarm(60);
    for (;;) {
        run();
        if (go && argc > 1) execv(argv[1], argv + 1);
    }
}
"""
NOFP_CHAIN = ("main", "run", "middle", "leaf")

# Another program, other names: what the exec test's process becomes, what the replace test renames over the file.
OTHER_C = r"""
#include <unistd.h>
volatile unsigned long sink, extra;
__attribute__((noinline)) void gamma_(int n) {
    volatile int pad[50];
    for (int i = 0; i < n; i++) { pad[i % 50] = i; sink += pad[(i * 3) % 50]; }
}
__attribute__((noinline)) void beta(int n) { volatile long pad[5]; pad[n % 5] = n; gamma_(n); extra += pad[1]; }
__attribute__((noinline)) void alpha(void) { beta(300000); extra++; }
int main(void) { alarm(60); for (;;) alpha(); }
"""
OTHER_CHAIN = ("main", "alpha", "beta", "gamma_")

# Most of its time in a SIGPROF handler (spin) that interrupts main -> work -> inner; prints glibc's signal
# trampoline (__restore_rt, the sa_restorer the kernel returns through) first.
SIGNAL_C = r"""
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>
volatile unsigned long sink, ticks;
__attribute__((noinline)) void spin(int n) {
    volatile char pad[64];
    for (int i = 0; i < n; i++) { pad[i % 64] = i; sink += pad[(i * 7) % 64]; }
}
__attribute__((noinline)) void handler(int sig) { spin(2000000); ticks += sig; }
__attribute__((noinline)) void inner(int n) {
    volatile long pad[9];
    for (int i = 0; i < n; i++) { pad[i % 9] = i; sink += pad[(i * 5) % 9]; }
}
__attribute__((noinline)) void work(void) { inner(1000000); ticks++; }
int main(void) {
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sigaction(SIGPROF, &sa, 0);
    sigaction(SIGPROF, 0, &old);
    printf("%lx\n", (unsigned long)old.sa_restorer);
    fflush(stdout);
    struct itimerval every = {{0, 5000}, {0, 5000}};
    setitimer(ITIMER_PROF, &every, 0);
    alarm(60);
    for (;;) work();
}
"""


def _gcc(folder: Path, name: str, source: str, tag: str = "") -> Path:
    src = folder / f"{name}.c"
    src.write_text(source)
    out = folder / name
    subprocess.run(["gcc", "-O2", "-fomit-frame-pointer", f'-DTAG="{tag or name}"', "-o", str(out), str(src)],
                   check=True)
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder the programs are built in (each test copies what it changes)."""
    try:
        check_bpf()
    except BpfUnavailable as exc:
        unavailable(f"BPF unavailable: {exc}")
    need("gcc")
    folder = tmp_path_factory.mktemp("unwind_robustness")
    for name, source in (("nofp", NOFP_C), ("other", OTHER_C), ("sig", SIGNAL_C)):
        _gcc(folder, name, source)
    return folder


@contextmanager
def _running(*args: str | Path, **kw: object) -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen([str(a) for a in args], **kw)  # type: ignore[call-overload]
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


@contextmanager
def _sampling(cache: Path, pid: int | None) -> Iterator[tuple[CpuSampler, UnwindLoader]]:
    loader = UnwindLoader(cache)
    sampler = CpuSampler(99, pid_filter=pid, unwind=loader)
    sampler.start()
    try:
        assert sampler.unwinding == "call-frame tables"
        yield sampler, loader
    finally:
        sampler.close()
        loader.close()


def _load(loader: UnwindLoader, pid: int, mappings: list[Mapping] | None = None) -> list[Mapping]:
    if mappings is None:
        info = process_info(pid)
        assert info is not None
        mappings = info.mappings
    loader.load(pid, mappings)
    assert loader.wait_idle() and loader.loaded(pid)
    return mappings


def _symbols(*binaries: Path) -> dict[str, ElfSymbols]:
    return {read_build_id(b): read_elf_symbols(b) for b in binaries}


def _names(symbols: dict[str, ElfSymbols], mappings: list[Mapping], stack: list[int]) -> tuple[str, ...]:
    """Root first: frames in a file of `symbols` (by build id) by their function, others by the file's basename,
    the truncation mark as [truncated]."""
    out = []
    for i, addr in enumerate(stack):
        m = next((m for m in mappings if m.start <= addr < m.limit), None)
        if addr == TRUNCATED_FRAME:
            out.append("[truncated]")
        elif m is None or m.build_id not in symbols:
            out.append(os.path.basename(m.path.removesuffix(DELETED)) if m else "?")
        else:
            syms = symbols[m.build_id]
            vaddr = addr - m.start + m.file_offset - (0 if i == 0 else 1)
            j = int(np.searchsorted(syms.addrs, vaddr, side="right")) - 1
            out.append(syms.names[j] if j >= 0 else "?")
    return tuple(out[::-1])


def _place(mappings: list[Mapping], addr: int) -> str:
    """An address as file+offset, for a failure message."""
    m = next((m for m in mappings if m.start <= addr < m.limit), None)
    return f"{os.path.basename(m.path)}+{addr - m.start + m.file_offset:#x}" if m else f"{addr:#x}"


def _whole(chain: tuple[str, ...], tail: tuple[str, ...]) -> bool:
    """_start, then libc's start code, then exactly `tail` (main first)."""
    n = len(tail)
    return (len(chain) > n + 1 and chain[0] == "_start" and chain[-n:] == tail
            and all(c.startswith("libc") for c in chain[1:-n]))


def _chains(samples: list[Sample], pid: int, symbols: dict[str, ElfSymbols],
            mappings: list[Mapping]) -> Counter[tuple[str, ...]]:
    chains: Counter[tuple[str, ...]] = Counter()
    for p, _, user, _, n in samples:
        if p == pid:
            chains[_names(symbols, mappings, user)] += n
    return chains


def _assert_whole(chains: Counter[tuple[str, ...]], tail: tuple[str, ...], least: int = 25) -> None:
    total = sum(chains.values())
    whole = sum(n for chain, n in chains.items() if _whole(chain, tail))
    assert total >= least and whole >= 0.95 * total, (total, chains.most_common(5))


def test_a_signal_handlers_stack_continues_through_the_signal_frame(built: Path, tmp_path: Path) -> None:
    with _running(built / "sig", stdout=subprocess.PIPE, text=True) as proc, \
            _sampling(tmp_path / "cache", proc.pid) as (sampler, loader):
        restorer = int(proc.stdout.readline(), 16)
        mappings = _load(loader, proc.pid)
        sampler.drain()
        time.sleep(2)
        samples = sampler.drain()
        counters = loader.counters()
    libc = next(m for m in mappings if m.start <= restorer < m.limit)
    assert os.path.basename(libc.path).startswith("libc")
    # the trampoline's rule in libc's table: its FDE is a signal frame ('S'), from the byte before __restore_rt
    bias = load_bias(read_load_segments(libc.path), libc.start, libc.file_offset)
    rows = compile_unwind_table(libc.path).array()
    at = int(np.searchsorted(rows["pc"], restorer - bias - 1, side="right")) - 1
    assert rows["cfa_kind"][at] == CFA_SIGNAL

    symbols = _symbols(built / "sig")
    in_handler, whole = 0, 0
    odd: Counter[tuple] = Counter()  # a chain that is not whole, with the place of the frame the signal interrupted
    for pid, _, user, _, n in samples:
        chain = _names(symbols, mappings, user)
        if pid != proc.pid or chain[-1] not in ("handler", "spin"):
            continue
        in_handler += n
        # leaf first: spin, handler, then the return address the handler was given, __restore_rt itself
        at = chain[::-1].index("handler") + 1
        through = user[at] == restorer
        tail = chain[chain.index("main"):] if "main" in chain else ()
        if through and _whole(chain, tail) and tail[:4] == ("main", "work", "inner", os.path.basename(libc.path)) \
                and tail[4:] in (("handler",), ("handler", "spin")):
            whole += n
        else:
            odd[(chain, _place(mappings, user[at + 1]) if at + 1 < len(user) else "none")] += n
    total = sum(n for pid, _, _, _, n in samples if pid == proc.pid)
    assert in_handler >= 0.5 * total and total >= 25, (in_handler, total)
    assert whole == in_handler, (whole, in_handler, odd.most_common(5))
    assert counters["frames_signal"] >= whole and counters["stacks_reached_root"] >= 0.95 * total, counters


def _started(proc: subprocess.Popen, exe: Path) -> None:
    """Wait until `proc` runs `exe` (past the exec of a wrapper: unshare, sh) and is in its loop."""
    deadline = time.monotonic() + 10
    while not os.readlink(f"/proc/{proc.pid}/exe").startswith(str(exe)):
        assert proc.poll() is None and time.monotonic() < deadline, f"{proc.args} did not start"
        time.sleep(0.01)
    time.sleep(0.05)


def test_binaries_deleted_or_replaced_while_they_run_load_from_the_mapped_inode(built: Path, tmp_path: Path) -> None:
    bins = tmp_path / "bin"
    bins.mkdir()
    deleted, replaced, raced = (_gcc(bins, name, NOFP_C) for name in ("deleted", "replaced", "raced"))
    kept = tmp_path / "kept"  # the same files, for the names
    kept.mkdir()
    symbols = {}
    for b in (deleted, replaced, raced):
        (kept / b.name).write_bytes(b.read_bytes())
        symbols.update(_symbols(kept / b.name))
    with _running(deleted) as d, _running(replaced) as r, _running(raced) as x, \
            _sampling(tmp_path / "cache", None) as (sampler, loader):
        for proc, exe in ((d, deleted), (r, replaced), (x, raced)):
            _started(proc, exe)
        read_before = process_info(x.pid)  # what the agent read before the file changed under it
        deleted.unlink()
        for b in (replaced, raced):  # an upgrade: the new file written beside, renamed over the old
            new = b.with_name(b.name + ".new")
            new.write_bytes((built / "other").read_bytes())
            os.rename(new, b)
        loaded = {p.pid: _load(loader, p.pid) for p in (d, r)}
        loaded[x.pid] = _load(loader, x.pid, read_before.mappings)
        sampler.drain()
        time.sleep(2)
        samples = sampler.drain()
        counters = loader.counters()
    for proc, exe in ((d, deleted), (r, replaced)):
        own = [m for m in loaded[proc.pid] if m.path.startswith(str(exe))]
        assert own and all(m.path == f"{exe}{DELETED}" and m.build_id in symbols for m in own), own
    assert any(m.path == str(raced) for m in read_before.mappings)
    for proc in (d, r, x):
        _assert_whole(_chains(samples, proc.pid, symbols, loaded[proc.pid]), NOFP_CHAIN)
    assert counters["tables_failed"] == 0, counters
    # the table kept on disk under the raced file's build id is that file's, not the one now at its path
    on_disk = UnwindTableCache(tmp_path / "cache").get(read_build_id(kept / "raced"), "/nonexistent")
    assert on_disk.rows == compile_unwind_table(kept / "raced").rows


def test_a_binary_seen_only_in_its_own_mount_namespace_is_read_through_its_root(built: Path, tmp_path: Path) -> None:
    need("unshare")
    real, decoy = tmp_path / "real", tmp_path / "bin"
    real.mkdir()
    decoy.mkdir()
    program = _gcc(real, "w", NOFP_C, tag="namespaced")
    (decoy / "w").write_bytes((built / "other").read_bytes())  # the agent's view of that path: another program
    script = f"mount -t tmpfs fleetprof-test {decoy} && cp {program} {decoy}/w && exec {decoy}/w"
    with _running("unshare", "--mount", "--propagation", "private", "sh", "-c", script) as proc, \
            _sampling(tmp_path / "cache", proc.pid) as (sampler, loader):
        _started(proc, decoy / "w")
        mappings = _load(loader, proc.pid)
        sampler.drain()
        time.sleep(2)
        samples = sampler.drain()
    own = [m for m in mappings if m.path == str(decoy / "w")]
    assert own and {m.build_id for m in own} == {read_build_id(program)} != {read_build_id(decoy / "w")}
    _assert_whole(_chains(samples, proc.pid, _symbols(program), mappings), NOFP_CHAIN)


class _Kept:
    """The agent's outbox, kept in memory: every CpuStackBatch it was given."""

    pending = False

    def __init__(self) -> None:
        self.batches: list[dict] = []

    def put(self, records: Records) -> None:
        self.batches.extend(records.records)

    def pump(self) -> None:
        pass


@contextmanager
def _agent(tmp_path: Path, pid: int | None, window_s: float,
           keep: ProcessFilter = KEEP_ALL) -> Iterator[tuple[CpuCollector, _Kept]]:
    """The agent's loop on a thread over a CpuCollector with the table unwinder, its windows kept; begun (the
    running processes' tables preloaded) when this enters. What the loop raised fails the test."""
    loader = UnwindLoader(tmp_path / "cache")
    sampler = CpuSampler(99, pid_filter=pid, unwind=loader)
    sampler.start()
    collector = CpuCollector(sampler, ProcessCache(), "node", keep, unwind=loader)
    kept, stop, raised = _Kept(), threading.Event(), []
    agent = Agent([collector], kept, window_s=window_s, look_every_s=window_s / 2)

    def run() -> None:
        try:
            agent.run(stop)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            raised.append(exc)

    thread = threading.Thread(target=run, name="agent-loop")
    try:
        assert sampler.unwinding == "call-frame tables"
        agent.begin()
        thread.start()
        yield collector, kept
        stop.set()
        thread.join(30)
        assert not thread.is_alive() and not raised, raised
    finally:
        stop.set()
        thread.join(30)
        collector.close()


def _unsigned(value: int) -> int:
    return value & ((1 << 64) - 1)


def _batch_chains(batches: list[dict], pid: int, symbols: dict[str, ElfSymbols]) -> Counter[tuple[str, ...]]:
    """Root-first names of `pid`'s stacks in `batches`, each batch named with the mappings it carries."""
    chains: Counter[tuple[str, ...]] = Counter()
    for batch in batches:
        for proc in batch["processes"]:
            if proc["pid"] != pid:
                continue
            mappings = [Mapping(_unsigned(m["start"]), _unsigned(m["limit"]), m["file_offset"], m["path"],
                                m["build_id"]) for m in proc["mappings"]]
            for stack in proc["stacks"]:
                chains[_names(symbols, mappings, [_unsigned(a) for a in stack["user_addrs"]])] += stack["count"]
    return chains


def _entry_starts(sampler: CpuSampler, pid: int) -> list[int]:
    """The starts of the mappings in `pid`'s entry in the kernel's table ([] without one)."""
    try:
        entry = sampler._bpf[b"unwind_procs"][ct.c_uint32(pid)]
    except KeyError:
        return []
    return [m.start for m in entry.maps[:entry.count]]


def test_after_exec_the_new_programs_code_is_walked_to_its_root(built: Path, tmp_path: Path) -> None:
    with _running(built / "nofp", built / "other") as proc:
        _started(proc, built / "nofp")
        with _agent(tmp_path, proc.pid, 0.5) as (collector, kept):
            time.sleep(1.5)
            before = len(kept.batches)
            proc.send_signal(signal.SIGUSR1)  # it runs exec at the end of its current run()
            _started(proc, built / "other")
            info = process_info(proc.pid)
            assert info is not None
            starts = sorted(m.start for m in info.mappings)
            deadline = time.monotonic() + 10
            while _entry_starts(collector.sampler, proc.pid) != starts:  # announced, read again, loaded
                assert time.monotonic() < deadline, "the tables of the program run by exec were not loaded"
                time.sleep(0.02)
            after = len(kept.batches) + 1  # the window in progress may hold stacks walked before the reload
            time.sleep(2)
            counters = collector.unwind.counters()
            batches = list(kept.batches)
    symbols = _symbols(built / "nofp", built / "other")
    _assert_whole(_batch_chains(batches[:before], proc.pid, symbols), NOFP_CHAIN)
    _assert_whole(_batch_chains(batches[after:], proc.pid, symbols), OTHER_CHAIN)
    # the first program's table was freed when the process's entry was replaced; libc's is the same file
    assert counters["files_freed"] >= 1 and counters["processes"] == 1, counters


def test_thousands_of_short_lived_processes_leave_nothing_behind(built: Path, tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "fleetprof")
    # Every process is sampled, announced and read; the tables of those named nofp are loaded: the workload, and
    # the two thousand the shell runs, of another build (a table only they hold): each a few milliseconds, but one
    # in 80 lives ~200 ms, so that 25 of them are surely loaded however slow the machine is today.
    (tmp_path / "short").mkdir()
    short = _gcc(tmp_path / "short", "nofp", NOFP_C, tag="short-lived")
    with _running(built / "nofp") as workload:
        _started(workload, built / "nofp")
        with _agent(tmp_path, None, 1.0, ProcessFilter(comm="nofp")) as (collector, kept):
            loader = collector.unwind
            assert loader.wait_idle() and set(loader._pids) == {workload.pid}
            baseline = loader.counters()
            held = {key: set(file.pids) for key, file in loader._files.items()}
            began, began_ns = time.monotonic(), time.time_ns()
            storm = subprocess.run(["sh", "-c", "i=0; while [ $i -lt 2000 ]; do "
                                    "if [ $((i % 80)) -eq 0 ]; then ./nofp --; else ./nofp -; fi; i=$((i+1)); done"],
                                   cwd=short.parent, timeout=120)
            storm_s = time.monotonic() - began
            assert storm.returncode == 0
            time.sleep(1.5)  # a window after the last one exited
            idle = loader.wait_idle()
            loader.forget_exited()
            counters = loader.counters()
            files = {key: set(file.pids) for key, file in loader._files.items()}
            batches = list(kept.batches)
    assert idle, "the loader's queue did not drain"
    errors = [r.getMessage() for r in caplog.records
              if r.levelno >= logging.ERROR or (r.levelno >= logging.WARNING and r.name == "fleetprof.unwind")]
    assert not errors, errors[:3]
    # the loop kept collecting: every window has the long-running workload's stacks, whole
    windows = [b for b in batches if any(p["pid"] == workload.pid for p in b["processes"])]
    assert len(windows) == len(batches) > 0, (len(windows), len(batches))
    # and never stalled: each window starts where the one before ended (what the sampler counted while a batch was
    # built is the next window's), and is at most 1.5 s long (1 s asked: a window grows only when the work before
    # it, reading the storm's new processes, took longer than a window; ~15-40 ms measured, 506 ms once on a loaded
    # VM), covering the storm. (A count of windows against the storm's seconds called ~10% longer windows a stall
    # when another test worker shared the 2 cores.)
    spans = sorted((b["window_start_ns"], b["window_start_ns"] + b["window_ns"]) for b in batches)
    assert all(end - start <= 1_500_000_000 for start, end in spans), spans
    assert all(nxt == end for (_, end), (nxt, _) in zip(spans, spans[1:], strict=False)), spans
    # from the first window (it may begin as the storm does) to past the storm's end
    assert spans[0][0] <= began_ns + 1e9 and spans[-1][1] >= began_ns + storm_s * 1e9, (spans, began_ns, storm_s)
    _assert_whole(_batch_chains(batches, workload.pid, _symbols(built / "nofp")), NOFP_CHAIN)
    # the short-lived ones were sampled, read and loaded...
    seen = {p["pid"] for b in batches for p in b["processes"] if p["comm"] == "nofp"} - {workload.pid}
    loads = counters["processes_loaded"] - baseline["processes_loaded"]
    assert len(seen) >= 20 and loads >= 20, (len(seen), loads)
    assert counters["files_loaded"] > baseline["files_loaded"] and counters["files_freed"] >= 1, counters
    # ...and what they held is free again: the loader is back where it was before them
    assert files == held and counters["processes"] == 1, files
    assert counters["rows_used"] == baseline["rows_used"] and counters["files"] == baseline["files"]
    # a process that exits while its file is read is no table that failed
    failed = [r.getMessage() for r in caplog.records if r.getMessage().startswith("no unwind table")]
    assert counters["rows_exhausted"] == 0 and counters["tables_failed"] == 0, failed[:3]


def test_a_corrupt_table_in_the_disk_cache_is_compiled_again(built: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    program = _gcc(tmp_path, "cached", NOFP_C)
    with _running(program) as proc:
        _started(proc, program)
        mappings = process_info(proc.pid).mappings
        files = {m.build_id: m.path for m in mappings if m.build_id}
        tables = UnwindTableCache(cache)
        for build_id, path in files.items():
            tables.get(build_id, f"/proc/{proc.pid}/root{path}")
        libc = next(m.build_id for m in mappings if os.path.basename(m.path).startswith("libc"))
        own = tables.path_for(read_build_id(program))
        own.write_bytes(os.urandom(own.stat().st_size))  # garbage
        spoilt = bytearray(tables.path_for(libc).read_bytes())
        spoilt[len(spoilt) // 2] ^= 0x40  # one bit of a row: the header still checks out, the CRC does not
        tables.path_for(libc).write_bytes(bytes(spoilt))
        with _sampling(cache, proc.pid) as (sampler, loader):
            _load(loader, proc.pid, mappings)
            sampler.drain()
            time.sleep(2)
            samples = sampler.drain()
            counters = loader.counters()
            rejected = loader.tables.rejected
    assert rejected == 2 and counters["tables_failed"] == 0, counters
    assert counters["table_cache_builds"] == 2 and counters["table_cache_hits"] == len(files) - 2, counters
    _assert_whole(_chains(samples, proc.pid, _symbols(program), mappings), NOFP_CHAIN)
    # both were written again, whole: read back from disk, they are what the files compile to
    again = UnwindTableCache(cache)
    assert again.get(read_build_id(program), "/nonexistent").rows == compile_unwind_table(program).rows
    assert again.get(libc, "/nonexistent").rows == compile_unwind_table(files[libc]).rows
    assert again.disk_hits == 2 and again.rejected == 0 and again.builds == 0
