"""A processor process collects garbage less often than CPython's default and not while a batch is in hand, unless
FLEETPROF_GC=default; the runners set it when they start."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
from pathlib import Path

from processors.gc_policy import THRESHOLDS, batch_in_hand, tune_collector


def test_thresholds_are_raised_unless_told_to_keep_the_default() -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        assert tune_collector({"FLEETPROF_GC": "default"}) == (700, 10, 10)
        assert tune_collector({}) == THRESHOLDS == gc.get_threshold()
        assert THRESHOLDS[0] > 50 * 700
    finally:
        gc.set_threshold(*before)


def test_a_topic_runner_and_the_sink_set_them_when_they_start() -> None:
    code = """
import gc
from processors.runner import TopicRunner
from processors.store_writer import StoreRunner
class Raise(Exception):
    pass
def stop(*a, **k):
    raise Raise
for runner in (TopicRunner, StoreRunner):
    gc.set_threshold(700, 10, 10)
    fake = runner.__new__(runner)
    fake.producer = type("P", (), {"init_transactions": stop})()
    fake.consumer = type("C", (), {"subscribe": stop})()
    fake.inputs, fake.txn_timeout = (), 1.0
    try:
        runner.start(fake)
    except Raise:
        pass
    print(gc.get_threshold())
"""
    # in a process of its own: the thresholds are the process's; the runners' clients stand in for Kafka's
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parent.parent)
    assert out.returncode == 0 and out.stdout.split("\n")[:2] == [str(THRESHOLDS)] * 2, out.stdout + out.stderr


def test_no_collection_runs_while_a_batch_is_in_hand_and_collections_resume_after() -> None:
    before, enabled = gc.get_threshold(), gc.isenabled()
    collections: list[int] = []

    def seen(phase: str, info: dict) -> None:
        if phase == "start":
            collections.append(info["generation"])

    gc.callbacks.append(seen)
    try:
        tune_collector({})
        gc.set_threshold(100, 10, 10)  # a young collection every 100 net allocations
        with batch_in_hand():
            collections.clear()
            assert not gc.isenabled()
            alive = [[i] for i in range(10_000)]  # a batch's records, alive until it is done
            assert collections == []
        assert gc.isenabled()
        del alive
        cycle: list = []
        cycle.append(cycle)  # garbage only a collection frees
        for i in range(1_000):
            _ = [i]
        assert collections, "collections did not resume"
        tune_collector({"FLEETPROF_GC": "default"})
        with batch_in_hand():
            assert gc.isenabled()  # kept as CPython has it, for A/B runs
    finally:
        gc.callbacks.remove(seen)
        gc.set_threshold(*before)
        if enabled:
            gc.enable()


def test_runners_sharing_a_process_resume_collections_when_the_last_batch_ends() -> None:
    before = gc.get_threshold()
    tune_collector({})
    a_in, b_in, checked = (threading.Event() for _ in range(3))
    seen: list[tuple[str, bool]] = []

    def runner(name: str, entered: threading.Event, wait_for: threading.Event) -> None:
        with batch_in_hand():
            entered.set()
            wait_for.wait(10)
            seen.append((name, gc.isenabled()))

    a = threading.Thread(target=runner, args=("a", a_in, b_in))
    b = threading.Thread(target=runner, args=("b", b_in, checked))
    try:
        a.start()
        a_in.wait(10)
        b.start()
        a.join(10)  # a's batch ended while b's is in hand
        paused = not gc.isenabled()
        checked.set()
        b.join(10)
        assert paused and seen == [("a", False), ("b", False)] and gc.isenabled()
    finally:
        checked.set()
        gc.set_threshold(*before)
