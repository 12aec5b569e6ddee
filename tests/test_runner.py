"""TopicStage's hooks as TopicRunner calls them: a stage overrides only those it needs."""

from __future__ import annotations

import pytest

from processors.messages import Message, Produced
from processors.runner import TopicRunner, TopicStage
from schemas import topics

NOWHERE = {"bootstrap.servers": "127.0.0.1:9", "log_level": 0}  # the clients are made, never used


class Echo(TopicStage):
    """Only `process`: every hook is the base's no-op."""

    name = "echo"
    inputs = (topics.GPU_METRICS.name,)

    def process(self, messages: list[Message]) -> list[Produced]:
        return [Produced(topics.ALERTS.name, m.key, "fleetprof.Alert", m.record, m) for m in messages]


class FailsOnBad(Echo):
    """Fails any batch holding a record marked bad, and records which hooks the runner called."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def process(self, messages: list[Message]) -> list[Produced]:
        self.calls.append(f"process {len(messages)}")
        if any(m.record.get("bad") for m in messages):
            raise ValueError("bad record")
        return super().process(messages)

    def after_abort(self) -> None:
        self.calls.append("after_abort")

    def close(self) -> None:
        self.calls.append("close")


def _msg(offset: int, **record: object) -> Message:
    return Message(topics.GPU_METRICS.name, 0, offset, b"n1", "fleetprof.GpuMetrics", dict(record))


def test_a_stage_with_only_process_runs_on_the_base_hooks():
    runner = TopicRunner(Echo(), NOWHERE)
    try:
        assert runner.columnar is False
        out = runner._process([_msg(0, n=1), _msg(1, n=2)])
        assert [(p.topic, p.record) for p in out] == [("alerts", {"n": 1}), ("alerts", {"n": 2})]
        runner.stage.before_batch([_msg(2)])
        runner.stage.idle()
        runner.stage.after_commit()
        runner.stage.after_abort()
    finally:
        runner.close()


def test_a_failed_batch_is_aborted_then_retried_one_by_one():
    stage = FailsOnBad()
    runner = TopicRunner(stage, NOWHERE)
    try:
        out = runner._process([_msg(0, n=1), _msg(1, bad=True), _msg(2, n=3)])
    finally:
        runner.close()
    assert stage.calls == ["process 3", "after_abort", "process 1", "process 1", "process 1", "close"]
    assert [p.topic for p in out] == ["alerts", "deadletter", "alerts"]
    assert out[1].record["source_offset"] == 1
    assert out[1].record["reason"] == "processing failed: ValueError('bad record')"


def test_a_stage_without_process_says_so():
    class Nameless(TopicStage):
        name, inputs = "nameless", ()

    with pytest.raises(NotImplementedError, match="Nameless has no process"):
        Nameless().process([])


def test_a_stateful_stage_runs_only_in_the_group_its_state_is_kept_under():
    # the correlator keys its changelog by group: run in another group, it would read back another group's state
    class Stateful(Echo):
        group = "fleetprof-echo"

    TopicRunner(Stateful(), NOWHERE).close()  # the default group, fleetprof-<name>
    TopicRunner(Stateful(), NOWHERE, group="fleetprof-echo").close()
    with pytest.raises(ValueError, match="keeps its state under group 'fleetprof-echo' but would run in group 'x'"):
        TopicRunner(Stateful(), NOWHERE, group="x")


class CountsIdle(Echo):
    def __init__(self) -> None:
        self.idle_calls = 0

    def idle(self) -> None:
        self.idle_calls += 1


class _EmptyPolls:
    """A consumer whose polls bring nothing (no broker here)."""

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list:
        return []

    def close(self) -> None:
        pass


def test_a_poll_that_brings_nothing_gives_the_stage_its_idle_hook():
    stage = CountsIdle()
    runner = TopicRunner(stage, NOWHERE)
    runner.consumer = _EmptyPolls()
    try:
        assert runner.run_once() == 0
        assert runner.run_once() == 0
    finally:
        runner.producer.flush(0)
    assert stage.idle_calls == 2
