"""`fleetprof agent` without a broker: its arguments, its one-line errors, one agent per node, and what it queues per
window."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from producers.agent_lock import AgentLock, AgentRunning
from producers.elf_symbols import ElfError
from producers.kallsyms import KernelSymbols
from producers.outbox_encoder import OutboxEncoder
from schemas import single_object

NODE = "n1"


def _chunk(build_id: str, path: str) -> dict:
    return {"build_id": build_id, "binary": path.rsplit("/", 1)[-1], "kind": "ELF", "chunk_index": 0,
            "chunk_count": 1, "load_segments": [], "addrs": [0x1000], "sizes": [0x10], "names": ["f"]}


def _batch(mappings: list[tuple[str, str]], hits: int = 2) -> dict:
    """Mapping i spans [0x1000 (i+1), 0x1000 (i+2)); the samples hit the first `hits` of them."""
    return {"node": NODE, "window_start_ns": 1, "window_ns": 1, "frequency_hz": 19, "kernel_build_id": "kernel-x",
            "simulated": False, "processes": [{
                "pid": 7, "comm": "a", "exe": "/a", "cgroup": "", "container_id": "",
                "mappings": [{"start": 0x1000 * (i + 1), "limit": 0x1000 * (i + 2), "file_offset": 0, "path": p,
                              "build_id": b} for i, (p, b) in enumerate(mappings)],
                "stacks": [{"tid": 7, "user_addrs": [0x1000 * (i + 1) + 0x10 for i in range(hits)],
                            "kernel_addrs": [-0x7E000000], "count": 3}]}]}


def test_encoder_puts_each_table_once_before_the_batch_and_counts_unreadable_files() -> None:
    reads: list[tuple[str, int]] = []

    def read(path: str, limit: int) -> list[dict]:
        reads.append((path, limit))
        if path.endswith("/gone"):
            raise ElfError(f"{path}: cannot read: No such file or directory")
        return [_chunk("b1", path)]

    kernel = KernelSymbols("kernel-x", [0xFFFFFFFF81000000], ["_stext"])
    encoder = OutboxEncoder(kernel, max_bytes=lambda topic: 50_000 if topic == "symbols" else 900_000,
                            read_chunks=read)
    first = encoder.cpu(_batch([("/a", "b1"), ("/gone", "b2"), ("[vdso]", ""), ("/not-hit", "b3")], hits=3))
    # the tables of the files the samples hit, chunked under the topic's limit (not a count)
    assert reads == [("/proc/7/root/a", 50_000), ("/proc/7/root/gone", 50_000)]
    assert [u.kind for u in first] == ["symbols", "cpu"]
    assert [(t, k) for t, k, _, _ in first[0].messages] == [("symbols", "kernel-x/0"), ("symbols", "b1/0")]
    assert single_object.decode(first[0].messages[0][2], "SymbolChunk")[1]["kind"] == "KERNEL"
    assert first[0].tables == {"kernel-x", "b1"} and first[1].needs == {"kernel-x", "b1", "b2"}
    assert (first[1].records, len(first[1].messages)) == (3, 1) and encoder.unreadable == 1

    second = encoder.cpu(_batch([("/a", "b1"), ("/gone", "b2")]))
    assert len(reads) == 2 and [u.kind for u in second] == ["cpu"]  # nothing read again, nothing retried
    encoder.forget({"b1"})  # its table was dropped before it reached Kafka: it goes again with the next batch
    third = encoder.cpu(_batch([("/a", "b1")]))
    assert [u.kind for u in third] == ["symbols", "cpu"] and third[0].tables == {"b1"}


def test_unreachable_kafka_holds_the_window_then_exits_with_one_line(tmp_path) -> None:
    """The agent does not exit because Kafka is not there: it samples and holds; only at exit (here after its one
    window) is what it holds dropped, said in one line."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # something to sample on an idle machine
    try:
        out = subprocess.run([sys.executable, "-m", "fleetprof", "--kafka", "127.0.0.1:1", "--data-dir", str(tmp_path),
                              "agent", "--once", "--window", "2s", "--no-gpu", "--pid", str(busy.pid)],
                             capture_output=True, text=True, timeout=120)
    finally:
        busy.kill()
        busy.wait()
    assert out.returncode == 1, out.stderr
    lines = out.stderr.splitlines()
    assert any("Kafka at 127.0.0.1:1 not reachable" in ln and "holding records in the outbox" in ln for ln in lines)
    assert any(ln.startswith("window 1: ") for ln in lines)
    assert lines[-1].startswith("Error: Kafka at 127.0.0.1:1 unreachable") and "records dropped" in lines[-1]


def test_a_second_agent_for_the_same_node_and_data_directory_refuses(tmp_path) -> None:
    with AgentLock(tmp_path, "node-a"):
        out = subprocess.run([sys.executable, "-m", "fleetprof", "--kafka", "127.0.0.1:1", "--data-dir",
                              str(tmp_path), "agent", "--node", "node-a"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 1 and out.stderr.count("\n") == 1
        assert out.stderr.startswith(f"Error: another fleetprof agent (pid {os.getpid()}) already runs for node "
                                     f"'node-a' with data directory {tmp_path}")
        with AgentLock(tmp_path, "node-b"):  # told it is a different node: its own lock
            pass
        with pytest.raises(AgentRunning):
            AgentLock(tmp_path, "node-a").acquire()
    AgentLock(tmp_path, "node-a").acquire()  # released with its holder


def test_dry_run_needs_once() -> None:
    out = subprocess.run([sys.executable, "-m", "fleetprof", "agent", "--dry-run"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "--dry-run needs --once" in out.stderr
