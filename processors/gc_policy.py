"""The garbage collector's thresholds in a processor process.

A processor keeps a large, long-lived heap (symbol tables, the join state, caches) and makes hundreds of thousands
of short-lived objects a batch, nearly all freed by reference counting. With CPython's thresholds (a young
collection every 700 net allocations, an older one every 10 of those) the correlator spent ~22% of its CPU in
collections that found almost nothing (bench/RESULTS.md). Here they run ~70x less often; cycles are still
collected. FLEETPROF_GC=default keeps CPython's thresholds (for A/B benches).
"""

from __future__ import annotations

import gc
import os

THRESHOLDS = (50_000, 20, 100)


def tune_collector(env: dict[str, str] | None = None) -> tuple[int, int, int]:
    """Set the processor thresholds (unless FLEETPROF_GC=default); returns the thresholds in force."""
    env = os.environ if env is None else env
    if env.get("FLEETPROF_GC", "").strip().lower() != "default":
        gc.set_threshold(*THRESHOLDS)
    return gc.get_threshold()
