"""The eBPF CPU sampler against a real C workload built here with frame pointers (needs root, bcc and kernel
headers: skipped with the reason without them, a failure on CI)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from processors.symbol_tables import table_from_chunks
from producers.agent import Agent, Records
from producers.cpu import CpuCollector
from producers.cpu_sampler import KEY_FIELDS, BpfUnavailable, CpuSampler, check_bpf, default_stack_entries
from producers.elf_symbols import read_build_id, symbol_chunks
from producers.outbox_encoder import OutboxEncoder
from producers.process_info import ProcessCache, process_info
from schemas.wire import LOST_STACK_FRAME
from tests.elf_helpers import need, unavailable

FREQUENCY = 99
SECONDS = 2.0

# gcc gives a function that calls nothing no frame, and the frame-pointer unwinder then skips its caller: leaf()
# calls tick() first so it gets one. `extra++` after leaf() keeps -O1 from making outer's call a tail call.
WORKLOAD_C = r"""
#include <time.h>
#include <unistd.h>
volatile unsigned long sink, extra;
__attribute__((noinline)) void tick(void) { extra++; }
__attribute__((noinline)) void leaf(void) { tick(); for (int i = 0; i < 100000; i++) sink += i; }
__attribute__((noinline)) void outer(void) { leaf(); extra++; }
int main(void) {
    alarm(120);  /* never outlive the test run; outlive an agent that compiles under load */
    for (;;) outer();
}
"""


SHORT_LOOP = """struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do { outer(); clock_gettime(CLOCK_MONOTONIC, &t); }
    while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < 500000000L);
    return 0;"""


@pytest.fixture(scope="module")
def workload_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        check_bpf()
    except BpfUnavailable as exc:
        unavailable(f"BPF unavailable: {exc}")
    need("gcc")
    folder = tmp_path_factory.mktemp("cpu_workload")
    (folder / "busy.c").write_text(WORKLOAD_C)
    subprocess.run(["gcc", "-O1", "-fno-omit-frame-pointer", "-o", str(folder / "busy"), str(folder / "busy.c")],
                   check=True)
    return folder / "busy"


@pytest.fixture(scope="module")
def short_binary(workload_binary: Path) -> Path:
    """Busy in leaf() for half a second, then gone."""
    source = workload_binary.parent / "short.c"
    source.write_text(WORKLOAD_C.replace("for (;;) outer();", SHORT_LOOP))
    subprocess.run(["gcc", "-O1", "-fno-omit-frame-pointer", "-o", str(workload_binary.parent / "short"),
                    str(source)], check=True)
    return workload_binary.parent / "short"


@pytest.fixture
def workload(workload_binary: Path) -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen([str(workload_binary)])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _symbolize(binary: Path, mapping: object, addrs: list[int]) -> list[str]:
    """Function names of user addresses inside `binary`'s mapping, "?" for others: file_off = addr - start + offset."""
    table = table_from_chunks(symbol_chunks(binary))
    inside = [mapping.start <= a < mapping.limit for a in addrs]
    # callers' frames are return addresses: step back into the call instruction
    adjusted = [a - (i > 0) for i, a in enumerate(addrs)]
    offs = np.array([a - mapping.start + mapping.file_offset if ok else 0
                     for a, ok in zip(adjusted, inside, strict=True)], dtype=np.uint64)
    found = table.lookup(table.to_vaddr(offs)).tolist()
    return [table.names[i] if ok and i >= 0 else "?" for i, ok in zip(found, inside, strict=True)]


def test_sampler_counts_and_symbolizes_workload(workload: subprocess.Popen, workload_binary: Path) -> None:
    sampler = CpuSampler(frequency_hz=FREQUENCY, pid_filter=workload.pid)
    sampler.start()
    try:
        assert [name for name, _ in sampler._bpf[b"counts0"].Key._fields_] == list(KEY_FIELDS)
        sampler.drain()  # start the window now: compiling took a while
        time.sleep(SECONDS)
        samples = sampler.drain()
    finally:
        sampler.close()
    assert samples and {s[0] for s in samples} == {workload.pid}
    total = sum(s[4] for s in samples)
    expected = FREQUENCY * SECONDS
    assert 0.6 * expected <= total <= 1.4 * expected, f"{total} samples, expected about {expected:.0f}"

    info = process_info(workload.pid)
    assert info is not None
    mapping = next(m for m in info.mappings if m.path == str(workload_binary))
    assert mapping.build_id == read_build_id(workload_binary) and mapping.build_id
    chains = 0
    for _, _, user, _, count in samples:
        names = _symbolize(workload_binary, mapping, user)
        if names[:3] == ["leaf", "outer", "main"]:
            chains += count
    assert chains >= 0.8 * total, f"only {chains} of {total} samples symbolize to leaf <- outer <- main: {names}"


def test_agent_dry_run_once_prints_the_pid(workload: subprocess.Popen, workload_binary: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "fleetprof", "agent", "--dry-run", "--once", "--window", "1s",
                          "--frequency", str(FREQUENCY), "--pid", str(workload.pid), "--format", "json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert [p["pid"] for line in lines for p in line["processes"]] == [workload.pid]
    proc = lines[0]["processes"][0]
    assert proc["comm"] == "busy" and proc["exe"] == str(workload_binary)
    assert any(m["path"] == str(workload_binary) and m["build_id"] for m in proc["mappings"])
    assert sum(s["count"] for s in proc["stacks"]) > 0
    assert lines[0]["frequency_hz"] == FREQUENCY


class Kept:
    """An outlet that keeps what the agent puts."""

    pending = False

    def __init__(self) -> None:
        self.records: list[Records] = []

    def put(self, records: Records) -> None:
        self.records.append(records)

    def pump(self) -> None:
        pass

    def batches(self) -> list[dict]:
        return [b for r in self.records if r.kind == "cpu" for b in r.records]


def _agent_window(seconds: float, during: Callable[[], None]) -> dict:
    """One window of the real agent with only the CPU collector, system-wide; `during` runs in a thread once the
    window has begun. Returns the window's batch."""
    sampler = CpuSampler(frequency_hz=FREQUENCY)  # system-wide: the processes do not exist yet
    sampler.start()
    kept = Kept()
    agent = Agent([CpuCollector(sampler, ProcessCache(), "n")], kept, window_s=seconds)
    thread = threading.Thread(target=during)
    try:
        threading.Timer(0.2, thread.start).start()
        agent.run(threading.Event(), once=True)
    finally:
        sampler.close()
        time.sleep(0.3)
        thread.join(30)
    (batch,) = kept.batches()
    return batch


def _has_its_binary(proc: dict, binary: Path) -> bool:
    return proc["comm"] == binary.name and proc["exe"] == str(binary) and \
        any(m["path"] == str(binary) and m["build_id"] == read_build_id(binary) for m in proc["mappings"])


def test_a_process_that_exits_mid_window_keeps_its_metadata(workload_binary: Path) -> None:
    procs: list[subprocess.Popen] = []

    def run_and_kill() -> None:
        procs.append(subprocess.Popen([str(workload_binary)]))
        time.sleep(1.6)  # gone well before the 3.5 s window ends
        procs[0].kill()
        procs[0].wait()

    batch = _agent_window(3.5, run_and_kill)
    mine = [p for p in batch["processes"] if p["pid"] == procs[0].pid]
    assert mine, f"no samples of pid {procs[0].pid}: {[p['pid'] for p in batch['processes']]}"
    assert _has_its_binary(mine[0], workload_binary)
    # and its table goes out with the window, read through the file the agent sees (the process is gone)
    (table,) = [u for u in OutboxEncoder().cpu({**batch, "processes": mine}) if u.kind == "symbols"]
    assert read_build_id(workload_binary) in table.tables


def test_processes_that_live_half_a_second_are_read_while_they_run(short_binary: Path) -> None:
    """Like a compiler or a test runner: each lives 0.5 s, so the once-a-second look would miss about half of them
    (0.3 s left too little margin on a loaded 2-core CI machine: the agent's threads waited that long to run); the
    first sample announces each, and it is read as soon as the ring wakes the agent."""
    pids: list[int] = []

    def short_lived() -> None:
        for _ in range(4):
            proc = subprocess.Popen([str(short_binary)])
            pids.append(proc.pid)
            proc.wait()
            time.sleep(0.15)

    batch = _agent_window(4.0, short_lived)
    seen = {p["pid"]: p for p in batch["processes"] if p["pid"] in pids}
    assert len(seen) >= 3, f"only {len(seen)} of the 4 short processes were sampled"
    unread = [pid for pid, p in seen.items() if not _has_its_binary(p, short_binary)]
    assert not unread, f"sampled but not read while they ran: {unread} of {sorted(seen)}: " + \
        "; ".join(f"{pid} read as {seen[pid]['comm']!r} {seen[pid]['exe']!r} with {len(seen[pid]['mappings'])} "
                  f"mappings" for pid in unread)


def test_the_stack_map_is_sized_from_cpus_and_frequency() -> None:
    assert default_stack_entries(19, cpus=2) == 16384  # the floor
    assert default_stack_entries(99, cpus=16) == 131072  # 64 x 1,584 samples/s, to a power of two
    assert default_stack_entries(999, cpus=192) == 1 << 20  # the ceiling: ~1 GiB of kernel memory is enough


def test_each_collect_empties_the_stack_map_it_read(workload: subprocess.Popen) -> None:
    """A stack map never emptied fills within minutes, and then most new stacks collide and are lost (bcc's
    StackTrace.clear() does nothing): after each collect the generation just read holds no stack."""
    sampler = CpuSampler(frequency_hz=FREQUENCY)  # system-wide: many distinct stacks
    sampler.start()
    try:
        sampler.drain()
        left = []
        for _ in range(6):
            time.sleep(0.5)
            sampler.collect()
            read = 1 - (int(sampler._bpf[b"generation"][0].value) & 1)  # the pair collect() just read
            left.append(len(list(sampler._bpf[f"stacks{read}".encode()].keys())))
        samples = sampler.drain()
    finally:
        sampler.close()
    assert samples and left == [0] * 6, left


def test_a_full_stack_map_marks_the_samples_it_lost(workload: subprocess.Popen) -> None:
    """With room for 2 stacks, system-wide samples collide in the stack map: each sample that lost its user stack
    carries LOST_STACK_FRAME alone, one that lost its kernel part has it as the user stack's leaf, and lost_samples
    counts exactly the samples so marked (never an empty stack that reads as nothing)."""
    sampler = CpuSampler(frequency_hz=FREQUENCY, stack_entries=2)
    sampler.start()
    try:
        sampler.drain()
        time.sleep(1.5)
        samples = sampler.drain()
    finally:
        sampler.close()
    marked = [(user, kernel, count) for _, _, user, kernel, count in samples if LOST_STACK_FRAME in user]
    assert marked and sampler.lost_samples == sum(count for _, _, count in marked)
    assert all(user.index(LOST_STACK_FRAME) == 0 and not (len(user) > 1 and kernel) for user, kernel, _ in marked)
    assert not any(not user and not kernel for _, _, user, kernel, _ in samples)
