"""The JSON shapes the web UI reads, built from named query rows: interned flame graphs, diffs, metric series.

A flame graph is sent compact, since a range can hold 100k distinct stacks: every distinct (function, binary) frame
once in `frames` / `frame_binary` (an index into `binaries`), and each stack as a list of frame indices, root first,
with its value in `counts` at the same position. The page builds the call tree itself.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

# Chart bucket widths, seconds: the smallest that keeps a range under MAX_POINTS buckets.
STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
MAX_POINTS = 600
# Profile rows are stamped per reporting window (10 s by default): finer buckets would show gaps between windows.
MIN_ACTIVITY_STEP_MS = 10_000

DEVICE_FIELDS = ("gpu_util_pct", "mem_util_pct", "mem_used_bytes", "mem_total_bytes", "sm_clock_mhz", "mem_clock_mhz",
                 "power_mw", "power_limit_mw", "temperature_c", "pcie_tx_kbps", "pcie_rx_kbps")
PROCESS_FIELDS = ("sm_util_pct", "mem_util_pct", "used_memory_bytes")


def step_ms(since: datetime, until: datetime, max_points: int = MAX_POINTS) -> int:
    """The chart bucket width for [since, until): a round number of seconds, at most `max_points` buckets."""
    span = (until - since).total_seconds()
    for step in STEPS_S:
        if span / step <= max_points:
            return step * 1000
    return math.ceil(span / max_points / STEPS_S[-1]) * STEPS_S[-1] * 1000


def flamegraph(rows: Iterable[Sequence[Any]]) -> dict[str, Any]:
    """The compact flame graph of flamegraph_frames_* rows (functions, binaries, value)."""
    interned = _Interner()
    stacks, counts = [], []
    for functions, binaries, value in rows:
        stacks.append(interned.stack(functions, binaries))
        counts.append(int(value))
    return {**interned.tables(), "stacks": stacks, "counts": counts, "total": sum(counts)}


def flamegraph_diff(rows: Iterable[Sequence[Any]], base_rows: Iterable[Sequence[Any]]) -> dict[str, Any]:
    """Two ranges' flame graphs over one frame table: every stack of either, with `counts` (the range shown) and
    `base_counts` (the baseline it is compared with); a stack missing from one range has 0 there."""
    interned = _Interner()
    values: dict[tuple[int, ...], list[int]] = {}
    for side, source in ((0, rows), (1, base_rows)):
        for functions, binaries, value in source:
            values.setdefault(tuple(interned.stack(functions, binaries)), [0, 0])[side] += int(value)
    counts = [v[0] for v in values.values()]
    base_counts = [v[1] for v in values.values()]
    return {**interned.tables(), "stacks": [list(s) for s in values], "counts": counts, "total": sum(counts),
            "base_counts": base_counts, "base_total": sum(base_counts)}


class _Interner:
    """Frame and binary indices in order of first appearance (the page sorts frames by name itself)."""

    def __init__(self) -> None:
        self.frames: dict[tuple[str, str], int] = {}
        self.binaries: dict[str, int] = {}

    def stack(self, functions: Sequence[str], binaries: Sequence[str]) -> list[int]:
        frames = self.frames
        try:
            # most stacks of a range only reuse frames seen before: one C-level pass (100k stacks: 2x faster)
            return list(map(frames.__getitem__, zip(functions, binaries, strict=True)))
        except KeyError:
            for frame in zip(functions, binaries, strict=True):
                if frame not in frames:
                    frames[frame] = len(frames)
            return list(map(frames.__getitem__, zip(functions, binaries, strict=True)))

    def tables(self) -> dict[str, list]:
        binaries = self.binaries
        frame_binary = [binaries.setdefault(b, len(binaries)) for _, b in self.frames]
        return {"frames": [f for f, _ in self.frames], "binaries": list(binaries), "frame_binary": frame_binary}


def series(columns: list[str], rows: list[list[Any]], key: Sequence[str], fields: Sequence[str]) -> list[dict]:
    """Rows ordered by `key` then t_ms, as one series per key: the key's columns, `t` (epoch ms) and one array per
    field, plus whether any row of it was simulated."""
    at = {c: i for i, c in enumerate(columns)}
    out: list[dict] = []
    current: tuple | None = None
    for row in rows:
        ident = tuple(row[at[k]] for k in key)
        if ident != current:
            current = ident
            entry: dict[str, Any] = dict(zip(key, ident, strict=True))
            for extra in ("name", "parent_uuid", "comm"):
                if extra in at and extra not in key:
                    entry[extra] = row[at[extra]]
            entry.update({"t": [], "simulated": False, **{f: [] for f in fields}})
            out.append(entry)
        entry["t"].append(int(row[at["t_ms"]]))
        entry["simulated"] = entry["simulated"] or bool(row[at["simulated"]])
        for f in fields:
            entry[f].append(row[at[f]])
    return out


def activity(rows: list[list[Any]]) -> dict[str, dict[str, list]]:
    """ui_profile_activity rows (kind, t_ms, value) as {"cpu": {"t", "v"}, "gpu": {"t", "v"}}."""
    out: dict[str, dict[str, list]] = {"cpu": {"t": [], "v": []}, "gpu": {"t": [], "v": []}}
    for kind, t_ms, value in rows:
        out[kind]["t"].append(int(t_ms))
        out[kind]["v"].append(int(value))
    return out
