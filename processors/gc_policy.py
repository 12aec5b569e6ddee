"""The garbage collector's thresholds in a processor process.

A processor keeps a large, long-lived heap (symbol tables, the join state, caches) and makes hundreds of thousands
of short-lived objects a batch, nearly all freed by reference counting. With CPython's thresholds (a young
collection every 700 net allocations, an older one every 10 of those) the correlator spent ~22% of its CPU in
collections that found almost nothing (bench/RESULTS.md). Here they run ~70x less often; cycles are still
collected. And while a runner has a batch in hand no collection runs at all: the batch's decoded records are alive
until it is done, so every young collection in it walked tens of thousands of live objects to free nothing (~9% of the
correlator's CPU through Kafka, bench/RESULTS.md); the records are freed by reference counting when the batch ends,
and the next collection walks what outlived it. FLEETPROF_GC=default keeps CPython's thresholds and collections (for
A/B benches).
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

THRESHOLDS = (50_000, 20, 100)
_pause_in_batches = False  # set by tune_collector
_lock = threading.Lock()
_batches = 0  # batches in hand in this process
_resume = False  # whether the collector was on when the first of them began


def tune_collector(env: dict[str, str] | None = None) -> tuple[int, int, int]:
    """Set the processor thresholds (unless FLEETPROF_GC=default); returns the thresholds in force."""
    global _pause_in_batches
    env = os.environ if env is None else env
    _pause_in_batches = env.get("FLEETPROF_GC", "").strip().lower() != "default"
    if _pause_in_batches:
        gc.set_threshold(*THRESHOLDS)
    return gc.get_threshold()


@contextmanager
def batch_in_hand() -> Iterator[None]:
    """No automatic collection inside (after tune_collector, unless FLEETPROF_GC=default). Runners that share a
    process (the sink is a thread of the store process) pause it together: the collector resumes when the last of
    their batches ends."""
    global _batches, _resume
    if not _pause_in_batches:
        yield
        return
    with _lock:
        if _batches == 0:
            _resume = gc.isenabled()
            gc.disable()
        _batches += 1
    try:
        yield
    finally:
        with _lock:
            _batches -= 1
            if _batches == 0 and _resume:
                gc.enable()
