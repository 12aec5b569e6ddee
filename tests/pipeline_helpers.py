"""Hand-built inputs with known answers, and the threads that run the real stages, for the pipeline tests."""

from __future__ import annotations

import subprocess
import threading
import time
import uuid
from collections.abc import Callable

from confluent_kafka import Consumer, Producer, TopicPartition

from processors.runner import TopicRunner
from processors.store_writer import StoreRunner
from processors.symbolize_stage import build_symbolize
from schemas import single_object

APP_BASE = 0x5600_0000_0000
FUNCS = ["main", "run", "compute", "hash_block", "write_out"]  # each 0x100 bytes from vaddr 0x1000


def build_id_for(tag: str) -> str:
    return uuid.uuid5(uuid.NAMESPACE_URL, tag).hex + "00000000"


def symbol_chunks(build_id: str) -> list[dict]:
    """The app's table in two chunks, so assembly is exercised."""
    addrs = [0x1000 + 0x100 * i for i in range(len(FUNCS))]
    half = 2
    return [
        {"build_id": build_id, "binary": "app", "kind": "ELF", "chunk_index": i, "chunk_count": 2,
         "load_segments": [{"file_offset": 0, "vaddr": 0, "memsz": 0x10000}],
         "addrs": part_addrs, "sizes": [0x100] * len(part_addrs), "names": part_names}
        for i, (part_addrs, part_names) in enumerate(
            [(addrs[:half], FUNCS[:half]), (addrs[half:], FUNCS[half:])])
    ]


def addr(func: str, leaf: bool) -> int:
    start = APP_BASE + 0x1000 + 0x100 * FUNCS.index(func)
    return start + (0x10 if leaf else 0x20)


def stack(path: list[str], count: int, tid: int = 1) -> dict:
    """A stack from a root-first path of functions, addresses leaf first."""
    leaf_first = list(reversed(path))
    return {"tid": tid, "user_addrs": [addr(f, i == 0) for i, f in enumerate(leaf_first)], "kernel_addrs": [],
            "count": count}


def cpu_batch(node: str, build_id: str, window_start_ns: int, stacks: list[dict], pid: int = 100,
              identity_id: int = 0) -> dict:
    return {"node": node, "window_start_ns": window_start_ns, "window_ns": 1_000_000_000, "frequency_hz": 99,
            "kernel_build_id": "", "simulated": True,
            "processes": [{"pid": pid, "comm": "app", "exe": "/opt/app", "cgroup": "", "container_id": "",
                           "identity_id": identity_id,
                           "mappings": [{"start": APP_BASE, "limit": APP_BASE + 0x10000, "file_offset": 0,
                                         "path": "/opt/app", "build_id": build_id}],
                           "stacks": stacks}]}


def produce(bootstrap: str, items: list[tuple[str, str, bytes]]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for topic, key, value in items:
        p.produce(topic, key=key.encode(), value=value)
    assert p.flush(30) == 0


def read_topic(bootstrap: str, topic: str, match: Callable[[object], bool], want: int,
               timeout: float = 60) -> list:
    """Messages of `topic` (from the start) that `match`, once `want` of them are there."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4()}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    found = []
    deadline = time.monotonic() + timeout
    try:
        while len(found) < want and time.monotonic() < deadline:
            for m in c.consume(500, 0.5):
                if m.error() is None and match(m):
                    found.append(m)
    finally:
        c.close()
    return found


def messages_to_end(bootstrap: str, topic: str, since_ms: int | None = None, timeout: float = 60) -> list:
    """Every message of `topic` up to its end as of the call (only those written since `since_ms`, Unix ms, when
    given); an AssertionError when the end is not reached within `timeout` seconds."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"to-end-{uuid.uuid4()}", "enable.auto.commit": False})
    try:
        numbers = c.list_topics(topic, timeout=15).topics[topic].partitions
        parts = [TopicPartition(topic, p, since_ms or 0) for p in numbers]
        if since_ms is not None:
            parts = c.offsets_for_times(parts, timeout=15)  # offset -1: nothing written since
        ends = {tp.partition: c.get_watermark_offsets(tp, timeout=15)[1] for tp in parts}
        todo = [tp for tp in parts if 0 <= tp.offset < ends[tp.partition]]
        c.assign(todo)
        left = {tp.partition for tp in todo}
        found = []
        deadline = time.monotonic() + timeout
        while left:
            assert time.monotonic() < deadline, f"{topic} not read to its end"
            for m in c.consume(500, 0.5):
                if m.error() is None:
                    found.append(m)
                    if m.offset() + 1 >= ends[m.partition()]:
                        left.discard(m.partition())
        return found
    finally:
        c.close()


class Running:
    """A stage running in a thread until stopped."""

    def __init__(self, runner, stop: threading.Event) -> None:
        self.runner = runner
        self.stop = stop
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.runner.run(self.stop)
        except BaseException as exc:  # surfaced by the test, not lost in the thread
            self.error = exc

    def __enter__(self) -> Running:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(30)


def symbolizer(bootstrap: str, group: str) -> Running:
    kafka = {"bootstrap.servers": bootstrap}
    return Running(TopicRunner(build_symbolize(kafka), kafka, group=group, poll_timeout=0.2), threading.Event())


def sink(store, bootstrap: str, group: str, **kw) -> Running:
    stop = threading.Event()
    kw.setdefault("max_delay", 5.0)  # tests wait for alerts and NVML rows: not the production default's 25 s
    return Running(StoreRunner(store, {"bootstrap.servers": bootstrap}, group=group, stop=stop,
                               flush_interval=0.3, **kw), stop)


def agent_started(agent: subprocess.Popen, timeout: float = 120) -> list[str]:
    """The agent's stderr lines up to its `collecting ...` line (read as they come; fewer if it exits first)."""
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not any(line.startswith("collecting") for line in lines):
        line = agent.stderr.readline()
        if not line and agent.poll() is not None:
            break
        lines.append(line)
    return lines


def wait_for(check: Callable[[], bool], timeout: float = 90, what: str = "condition",
             running: list[Running] = ()) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for r in running:
            if r.error is not None:
                raise AssertionError(f"a stage failed: {r.error!r}") from r.error
        if check():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def encode(name: str, record: dict) -> bytes:
    return single_object.encode(name, record)
