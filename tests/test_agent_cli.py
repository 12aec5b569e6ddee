"""`fleetprof agent` without BPF or a broker: its arguments, its one-line errors, and what it sends per window."""

from __future__ import annotations

import subprocess
import sys
import time

from producers.agent_sender import AgentSender
from producers.elf_symbols import ElfError
from producers.kallsyms import KernelSymbols
from schemas import single_object

NODE = "n1"


class FakePublisher:
    def __init__(self) -> None:
        self.messages: list[tuple[str, str, bytes]] = []
        self.flushes = 0
        self.failed = 0

    def publish(self, topic: str, key: str, value: bytes) -> None:
        self.messages.append((topic, key, value))

    def flush(self, timeout: float = 60.0) -> int:
        self.flushes += 1
        return 0


def _chunk(build_id: str, path: str) -> dict:
    return {"build_id": build_id, "binary": path.rsplit("/", 1)[-1], "kind": "ELF", "chunk_index": 0,
            "chunk_count": 1, "load_segments": [], "addrs": [0x1000], "sizes": [0x10], "names": ["f"]}


def _batch(mappings: list[tuple[str, str]]) -> dict:
    return {"node": NODE, "window_start_ns": 1, "window_ns": 1, "frequency_hz": 19, "kernel_build_id": "kernel-x",
            "simulated": False, "processes": [{
                "pid": 7, "comm": "a", "exe": "/a", "cgroup": "", "container_id": "",
                "mappings": [{"start": 0x1000, "limit": 0x2000, "file_offset": 0, "path": p, "build_id": b}
                             for p, b in mappings],
                "stacks": [{"tid": 7, "user_addrs": [0x1010], "kernel_addrs": [], "count": 3}]}]}


def test_sender_publishes_each_table_once_before_the_batch_and_counts_unreadable_files() -> None:
    reads: list[str] = []

    def read(path: str) -> list[dict]:
        reads.append(path)
        if path.endswith("/gone"):
            raise ElfError(f"{path}: cannot read: No such file or directory")
        return [_chunk("b1", path)]

    pub = FakePublisher()
    kernel = KernelSymbols("kernel-x", [0xFFFFFFFF81000000], ["_stext"])
    sender = AgentSender(pub, kernel, read_chunks=read)
    first = sender.send_window(_batch([("/a", "b1"), ("/gone", "b2"), ("[vdso]", "")]))
    assert reads == ["/proc/7/root/a", "/proc/7/root/gone"]
    assert [(t, k) for t, k, _ in pub.messages] == [("symbols", "kernel-x/0"), ("symbols", "b1/0"),
                                                    ("cpu.stacks", NODE)]
    assert single_object.decode(pub.messages[0][2], "SymbolChunk")[1]["kind"] == "KERNEL"
    assert (first.samples, first.symbol_chunks, first.new_build_ids, first.batches) == (3, 2, 2, 1)
    assert sender.unreadable == 1 and pub.flushes == 2  # tables flushed before the batch, then the batch

    second = sender.send_window(_batch([("/a", "b1"), ("/gone", "b2")]))
    assert reads == ["/proc/7/root/a", "/proc/7/root/gone"]  # nothing read again, nothing retried
    assert (second.symbol_chunks, second.batches) == (0, 1) and pub.messages[-1][0] == "cpu.stacks"
    assert sender.samples == 6


def test_unreachable_broker_is_one_line_within_ten_seconds() -> None:
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "fleetprof", "--kafka", "127.0.0.1:1", "agent", "--once"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert out.stderr.startswith("Error: Kafka at 127.0.0.1:1 not reachable") and out.stderr.count("\n") == 1
    assert time.monotonic() - t0 < 12


def test_dry_run_needs_once() -> None:
    out = subprocess.run([sys.executable, "-m", "fleetprof", "agent", "--dry-run"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "--dry-run needs --once" in out.stderr
