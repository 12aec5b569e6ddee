"""The eBPF CPU sampler against a real C workload built here with frame pointers (needs root, bcc and kernel
headers: skipped with the reason without them, a failure on CI)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from processors.symbol_tables import table_from_chunks
from producers.cpu_sampler import KEY_FIELDS, BpfUnavailable, CpuSampler, check_bpf
from producers.elf_symbols import read_build_id, symbol_chunks
from producers.process_info import process_info
from tests.elf_helpers import need, unavailable

FREQUENCY = 99
SECONDS = 2.0

# gcc gives a function that calls nothing no frame, and the frame-pointer unwinder then skips its caller: leaf()
# calls tick() first so it gets one. `extra++` after leaf() keeps -O1 from making outer's call a tail call.
WORKLOAD_C = r"""
#include <unistd.h>
volatile unsigned long sink, extra;
__attribute__((noinline)) void tick(void) { extra++; }
__attribute__((noinline)) void leaf(void) { tick(); for (int i = 0; i < 100000; i++) sink += i; }
__attribute__((noinline)) void outer(void) { leaf(); extra++; }
int main(void) {
    alarm(30);  /* never outlive the test run, whatever happens to the test */
    for (;;) outer();
}
"""


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


def test_a_process_that_exits_mid_window_keeps_its_metadata(workload_binary: Path) -> None:
    from producers.agent_loop import AgentCollectors, AgentLoop
    from producers.cpu import ProcessCache, ProcessFilter, build_cpu_batch

    sampler = CpuSampler(frequency_hz=FREQUENCY)  # system-wide: the process does not exist yet
    sampler.start()
    proc = None
    try:
        sampler.drain()
        proc = subprocess.Popen([str(workload_binary)])
        killer = threading.Timer(1.8, proc.kill)  # gone well before the 3.5 s window ends
        killer.start()
        processes = ProcessCache()
        loop = AgentLoop(AgentCollectors(sampler=sampler), processes, on_gpu=lambda *_: None,
                         on_metrics=lambda _: None)
        start_ns = time.time_ns()
        samples = loop.window(3.5)  # the agent's own window: new processes read within a second
        batch = build_cpu_batch(samples, processes, "n", start_ns, time.time_ns() - start_ns, FREQUENCY,
                                keep=ProcessFilter(comm="busy"))
    finally:
        sampler.close()
        if proc is not None:
            proc.kill()
            proc.wait()
    assert proc.returncode is not None
    mine = [p for p in batch["processes"] if p["pid"] == proc.pid]
    assert mine, f"no samples of pid {proc.pid}: {[p['pid'] for p in batch['processes']]}"
    assert mine[0]["comm"] == "busy" and mine[0]["exe"] == str(workload_binary)
    assert any(m["path"] == str(workload_binary) and m["build_id"] == read_build_id(workload_binary)
               for m in mine[0]["mappings"])
