"""TopicRunner's gathering (gather_s): a burst that takes several polls to arrive is one batch, one transaction and
one GpuSamples record per node, on a real broker; without it the same burst is several."""

from __future__ import annotations

import threading
import time
import uuid

from processors.correlate_stage import build_correlate
from processors.runner import TopicRunner
from schemas import single_object, topics
from tests.test_correlate_scale_out import INPUTS, committed_since, kernel, launch, send
from tests.test_gpu_pipeline import start_at_end
from tests.test_runner import NOWHERE, Echo

SECOND = 1_000_000_000


class _Polls:
    """A consumer whose polls bring the given lists in turn (nothing once they run out), recording each poll."""

    def __init__(self, *polls: list, pause: float = 0.0) -> None:
        self.polls, self.pause = list(polls), pause
        self.asked: list[tuple[int, float]] = []

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list:
        self.asked.append((num_messages, timeout))
        time.sleep(self.pause)
        return list(self.polls.pop(0)) if self.polls else []

    def close(self) -> None:
        pass


def _gathered(consumer: _Polls, first: list, **kwargs) -> list:
    runner = TopicRunner(Echo(), NOWHERE, **kwargs)
    runner.consumer = consumer
    try:
        return runner._gather(first)
    finally:
        runner.producer.flush(0)


def test_gathering_polls_until_a_quiet_poll_then_leaves_the_rest_for_the_next_batch():
    polls = _Polls(["c", "d"], ["e"], [], ["f"])
    assert _gathered(polls, ["a", "b"], batch_size=100, gather_s=10, gather_quiet_s=0.3) == list("abcde")
    assert polls.asked == [(98, 0.3), (96, 0.3), (95, 0.3)]  # what the batch still has room for, quiet-long polls
    assert polls.polls == [["f"]]


def test_gathering_stops_at_the_batch_size_and_at_gather_s():
    polls = _Polls(["c", "d"], ["e"])
    assert _gathered(polls, ["a", "b"], batch_size=4, gather_s=10) == list("abcd")
    assert polls.polls == [["e"]]  # full: not asked again
    endless = _Polls(*[["x"]] * 1000, pause=0.05)
    started = time.monotonic()
    assert 4 <= len(_gathered(endless, ["a"], batch_size=1000, gather_s=0.3)) <= 10
    assert time.monotonic() - started < 1.0


def test_without_gathering_a_batch_is_one_poll():
    polls = _Polls(["c"])
    assert _gathered(polls, ["a", "b"], gather_s=0) == ["a", "b"]
    assert _gathered(polls, [], gather_s=5) == []
    assert polls.asked == []


def _burst(bootstrap: str, gather_s: float) -> tuple[list[int], list[dict]]:
    """Launches and kernels of 3 nodes sent in 5 chunks 0.15 s apart to a correlator runner polling 0.1 s at a time;
    the runner's batch sizes and the GpuSamples records it committed."""
    tag = uuid.uuid4().hex[:8]
    group, kafka = f"corr-gather-{tag}", {"bootstrap.servers": bootstrap}
    start_at_end(bootstrap, group, INPUTS)
    runner = TopicRunner(build_correlate(kafka, group=group), kafka, group=group, slot=int(tag, 16) % 1_000_000,
                         batch_size=50_000, poll_timeout=0.1, gather_s=gather_s, gather_quiet_s=1.0)
    t0 = time.time_ns() - 60 * SECOND
    chunks = [[r for i in range(20) for node in range(3)
               for r in (launch(f"gather-{tag}-{node}", 100, c * 20 + i, t0 + (c * 20 + i) * 1000),
                         kernel(f"gather-{tag}-{node}", 100, c * 20 + i, t0 + (c * 20 + i) * 1000, 5000))]
              for c in range(5)]
    since_ms = int(time.time() * 1000)
    runner.start()
    try:
        deadline = time.monotonic() + 60
        while not runner.consumer.assignment():  # assigned before the burst, which must then take several polls
            runner.run_once()
            assert time.monotonic() < deadline, "no partitions assigned"
        def send_chunks() -> None:
            for chunk in chunks:
                send(bootstrap, chunk)
                time.sleep(0.15)

        sender = threading.Thread(target=send_chunks)
        sender.start()
        sizes, total = [], sum(map(len, chunks))
        while sum(sizes) < total:
            n = runner.run_once()
            if n:
                sizes.append(n)
            assert time.monotonic() < deadline, f"only {sum(sizes)} of {total} messages consumed"
        sender.join()
    finally:
        runner.close()
    records = [single_object.decode(v)[1] for v in committed_since(bootstrap, topics.GPU_SAMPLES.name, since_ms)]
    return sizes, [r for r in records if r["node"].startswith(f"gather-{tag}-")]


def test_a_burst_over_several_polls_is_one_transaction_and_one_record_per_node(kafka_bootstrap):
    sizes, records = _burst(kafka_bootstrap, gather_s=10)
    assert sizes == [600]
    assert sorted(r["node"][-1] for r in records) == ["0", "1", "2"]
    per_node = sum((1 + c % 7) * 5000 for c in range(100))  # each kernel's 5 us times its launch's weight
    assert [sum(s["duration_ns"] for s in r["samples"]) for r in records] == [per_node] * 3
    # the control: the same burst, one poll per batch
    sizes, records = _burst(kafka_bootstrap, gather_s=0)
    assert len(sizes) > 1 and sum(sizes) == 600
    assert len(records) > 3
    assert sum(s["duration_ns"] for r in records for s in r["samples"]) == 3 * per_node
