"""The agent through a Kafka outage, for real: `fleetprof agent` samples a C workload with BPF while the test stops
its own broker and starts it again. The windows wait in the agent's outage buffer and drain in order once Kafka is
back; with a tiny buffer the oldest windows are dropped and counted. Either way the store then holds exactly what
the agent reports it sent: nothing lost beyond what it counted, nothing twice (needs root, bcc, kernel headers and
Java: skipped with the reason without them, a failure on CI)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from fleetprof.broker import BrokerError, LocalBroker, create_topics, ensure_jars, find_java
from producers.outage_buffer import HeldWindow, OutageBuffer
from producers.publisher import Publisher
from schemas.topics import Topic
from tests.conftest import free_ports
from tests.elf_helpers import unavailable
from tests.pipeline_helpers import read_topic, sink, symbolizer, wait_for
from tests.test_agent_pipeline import _stored
from tests.test_cpu_sampler import workload, workload_binary  # noqa: F401 - fixtures


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    """A broker of this module's own: the tests stop and start it."""
    try:
        find_java()
        ensure_jars()
    except BrokerError as exc:
        unavailable(f"local Kafka broker unavailable: {exc}")
    port, controller_port = free_ports(2)
    b = LocalBroker(tmp_path_factory.mktemp("outage-kafka"), port=port, controller_port=controller_port)
    try:
        b.start()
        create_topics(b.bootstrap)
        yield b
    finally:
        b.stop()


class Agent:
    """`fleetprof agent` in a subprocess, its stderr lines collected as they come."""

    def __init__(self, bootstrap: str, pid: int, node: str, *extra: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "fleetprof", "agent", "--window", "1s", "--frequency",
                                      "99", "--pid", str(pid), "--node", node, "--format", "json", *extra],
                                     env=dict(os.environ, FLEETPROF_KAFKA=bootstrap), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)

    def saw(self, text: str) -> bool:
        return any(text in line for line in list(self.lines))

    def wait_for(self, text: str, timeout: float) -> float:
        """Seconds until a stderr line contains `text`."""
        t0 = time.monotonic()
        while not self.saw(text):
            assert self.proc.poll() is None, "the agent exited:\n" + "".join(self.lines)
            assert time.monotonic() - t0 < timeout, f"no {text!r} from the agent:\n" + "".join(self.lines)
            time.sleep(0.1)
        return time.monotonic() - t0

    def stop(self) -> dict:
        """SIGTERM, then its JSON summary."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            out = self.proc.stdout.read()
            self.proc.wait(timeout=90)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(10)
        assert self.proc.returncode == 0, "".join(self.lines)
        return json.loads(out.splitlines()[-1])


def _outage(broker: LocalBroker, agent: Agent, seconds: float) -> float:
    """Stop the broker for `seconds` while the agent samples; seconds from Kafka back to the buffer drained."""
    agent.wait_for("window 2:", 60)  # Kafka up: the workload's and the kernel's tables are delivered
    broker.stop()
    down = time.monotonic()
    agent.wait_for("holding windows in the outage buffer", 30)
    time.sleep(max(0.0, seconds - (time.monotonic() - down)))
    broker.start()
    return agent.wait_for("outage buffer drained", 60)


def _store_equals(store, bootstrap: str, node: str, pid: int, want: int) -> None:
    run = uuid.uuid4().hex[:8]
    with symbolizer(bootstrap, f"sym-{run}") as sym, sink(store, bootstrap, f"sink-{run}") as snk:
        wait_for(lambda: _stored(store, node, pid) >= want, timeout=60, what="the agent's samples in the store",
                 running=[sym, snk])
        time.sleep(1.0)  # nothing more may arrive
    assert _stored(store, node, pid) == want


def test_agent_holds_windows_through_a_60s_outage_and_stores_exactly_what_it_sent(
        broker, store, workload) -> None:  # noqa: F811
    node = f"outage-{uuid.uuid4().hex[:8]}"
    agent = Agent(broker.bootstrap, workload.pid, node)
    drain_s = _outage(broker, agent, 60)
    summary = agent.stop()

    held = [int(m.group(1)) for line in agent.lines if (m := re.search(r"; (\d+) bytes waiting for Kafka", line))]
    print(f"\n60 s outage: peak {summary['buffer_peak_bytes']} bytes buffered (max per window line {max(held)}), "
          f"drained {drain_s:.1f} s after Kafka was back; {summary['windows']} windows, {summary['samples']} samples")
    assert summary["dropped_windows"] == summary["dropped_samples"] == 0
    assert summary["samples"] == summary["produced_samples"] > 0
    assert max(held) > 0 and summary["buffer_peak_bytes"] >= max(held)
    assert summary["windows"] >= 55  # sampling went on: the outage did not stretch the 1 s windows
    _store_equals(store, broker.bootstrap, node, workload.pid, summary["samples"])


def test_agent_drops_oldest_windows_beyond_a_tiny_buffer_and_counts_them(broker, store, workload) -> None:  # noqa: F811
    node = f"outage-{uuid.uuid4().hex[:8]}"
    agent = Agent(broker.bootstrap, workload.pid, node, "--buffer-mb", "0.004")  # a few windows' batches
    _outage(broker, agent, 12)
    summary = agent.stop()

    print(f"\n12 s outage, 4 KiB buffer: {summary['dropped_windows']} windows ({summary['dropped_samples']} of "
          f"{summary['produced_samples']} samples) dropped, peak {summary['buffer_peak_bytes']} bytes buffered")
    assert agent.saw("outage buffer full")
    assert summary["dropped_windows"] > 0 and summary["dropped_samples"] > 0
    assert summary["dropped_messages"] >= summary["dropped_windows"] and summary["dropped_bytes"] > 0
    # the bound holds (checked after each drop), but for the newest window, which always stays
    window_bytes = [int(m.group(1)) for line in agent.lines
                    if (m := re.search(r"batches, 0 symbol chunks \(0 new build ids\), (\d+) bytes", line))]
    assert 0 < summary["buffer_peak_bytes"] <= 0.004 * 2**20 + max(window_bytes)
    assert summary["samples"] == summary["produced_samples"] - summary["dropped_samples"]
    _store_equals(store, broker.bootstrap, node, workload.pid, summary["produced_samples"] - summary["dropped_samples"])


def test_a_dropped_windows_tables_go_out_before_the_later_batches_that_need_them(broker) -> None:
    """OutageBuffer on its own, through a real producer and the broker stopped: window 1 carries new tables and is
    dropped; its tables must then go out with window 2, before window 2's batch; nothing else twice or lost."""
    run = uuid.uuid4().hex[:8]
    tables, stacks = Topic(f"t-{run}", "SymbolChunk", 1, -1), Topic(f"s-{run}", "CpuStackBatch", 1, -1)
    create_topics(broker.bootstrap, [tables, stacks])
    publisher = Publisher({"bootstrap.servers": broker.bootstrap})
    buffer = OutageBuffer(publisher, max_bytes=250)
    batch = lambda n: (stacks.name, "n", bytes([n]) * 100)  # noqa: E731
    buffer.add(HeldWindow([], [batch(0)], 10))
    assert buffer.drain(idle_s=10) and buffer.sent_samples == 10  # Kafka up: delivered

    broker.stop()
    buffer.add(HeldWindow([], [batch(1)], 11))
    assert not buffer.drain(idle_s=0.5)  # window 1 is with librdkafka now: never dropped, delivered later
    buffer.add(HeldWindow([(tables.name, "bid/0", b"T" * 50)], [batch(2)], 12))
    buffer.add(HeldWindow([], [batch(3)], 13))  # over 250 bytes: window 2 goes, its table moves to window 3
    assert (buffer.dropped_windows, buffer.dropped_samples, buffer.dropped_messages, buffer.dropped_bytes) == \
        (1, 12, 1, 100)
    assert buffer.held[0].symbols == [(tables.name, "bid/0", b"T" * 50)]
    broker.start()
    assert buffer.drain(idle_s=30)
    assert (buffer.sent_windows, buffer.sent_samples) == (3, 10 + 11 + 13)

    got = read_topic(broker.bootstrap, stacks.name, lambda m: True, want=3, timeout=30)
    assert [m.value()[0] for m in got] == [0, 1, 3]
    table = read_topic(broker.bootstrap, tables.name, lambda m: True, want=1, timeout=30)
    assert [m.value() for m in table] == [b"T" * 50]
    assert table[0].timestamp()[1] <= got[2].timestamp()[1]  # the table was in Kafka before the batch needing it
