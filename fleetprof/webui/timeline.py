"""The GPU timeline's answer (GET /api/timeline): the sampled kernels, copies and sets of a short range, one bar each,
in compact columns for static/timeline.js.

A range holds up to a few 100k records, so nothing is sent per bar but numbers: the bars are columns (`bars`), their
names, NVTX ranges, processes and launching stacks are tables the columns index into, each distinct value once.
Times are ns from the range's start (`since_ns`, sent as text: Unix ns are past 2^53, which JSON numbers in a browser
do not hold exactly); a bar that began before the range has a negative start. Lanes are (node, device, stream),
ordered so; the page groups them by (node, device). Names read as the flame graph reads them: kernels demangled and
NCCL's labelled with their collective (fleetprof/collectives.py), copies and sets by their labels; a stack's frames
named by the flame graph's machinery (model.stack_frames), its process frame by profile_kinds.process_frame, so a
bar's path is the flame graph's path of its stack.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from fleetprof.collectives import nccl_collective, nccl_label
from fleetprof.profile_kinds import process_frame
from fleetprof.webui import model
from processors.demangle import demangle
from schemas.wire import GPU_BINARY

MAX_RANGE_S = 300  # a timeline is read bar by bar: minutes, not hours
DETAIL_KEEP_S = 6 * 3600  # gpu_timeline's TTL (migration 0021): older records are gone, their sums stay 30 days
BAR_LIMIT = 100_000  # bars per answer: ~3 MB of JSON, drawn in well under a second (bench/timeline_render.py)
KINDS = ("kernel", "copy", "set", "collective")  # `bars.kind` indexes this
COLUMNS = ("node", "device", "stream", "pid", "comm", "start_ns", "end_ns", "activity", "name", "stack_id", "weight",
           "bytes", "nvtx_range", "graph_id", "graph_node_id")  # timeline_bars's
_ACTIVITY_KIND = {"KERNEL": 0, "MEMCPY": 1, "MEMSET": 2}


def expired_note(since_ns: int, now_ns: int) -> str:
    """What the page says when a range starts before the timeline's TTL ('' when it does not): its records may be
    partly or wholly deleted, and where the same GPU time still is."""
    if since_ns >= now_ns - DETAIL_KEEP_S * 10**9:
        return ""
    return (f"The timeline keeps sampled records for {DETAIL_KEEP_S // 3600} hours and this range starts before "
            "that: its bars are deleted or being deleted. Its GPU time stays in the flame graph (30 days).")


def display_name(name: str) -> str:
    """A record's name as the page shows it: demangled, an NCCL kernel labelled with its collective."""
    return nccl_label(demangle(name))


def kind_of(activity: str, name: str) -> int:
    kind = _ACTIVITY_KIND[activity]
    return KINDS.index("collective") if kind == 0 and nccl_collective(name) is not None else kind


def _codes(values: Sequence[Any]) -> tuple[np.ndarray, list[Any]]:
    """Per value its index among the distinct values, numbered in order of first appearance, and those values."""
    codes, uniques = pd.factorize(pd.Series(values, dtype=object), sort=False)
    return codes.astype(np.int64), list(uniques)


def timeline(columns: list[str], rows: Sequence[Sequence[Any]], stack_rows: Sequence[Sequence[Any]],
             name_rows: Sequence[Sequence[Any]], since_ns: int, until_ns: int, limit: int,
             one_node: bool = False) -> dict[str, Any]:
    """The answer from timeline_bars rows (at most limit + 1: one more says the range holds more), timeline_stacks
    rows (stack_id, frame_ids) and timeline_frames rows (frame_id, function, binary, language)."""
    capped = len(rows) > limit
    rows = rows[:limit]
    at = {c: i for i, c in enumerate(columns)}
    col = {c: [r[at[c]] for r in rows] if rows else [] for c in COLUMNS}  # an empty answer may name no columns
    lane_keys = list(zip(col["node"], col["device"], col["stream"], strict=True))
    lanes = sorted(set(lane_keys))
    lane_index = {key: i for i, key in enumerate(lanes)}
    process, processes = _codes(list(zip(col["node"], col["pid"], col["comm"], strict=True)))
    raw_name, raw_names = _codes(col["name"])
    cache: dict[tuple[str, int], int] = {}  # NCCL names are matched once per distinct name
    kind = np.fromiter((cache.setdefault((a, n), kind_of(a, raw_names[n])) if (a, n) not in cache else cache[(a, n)]
                        for a, n in zip(col["activity"], raw_name.tolist(), strict=True)), np.int64, len(rows))
    nvtx, ranges = _codes(col["nvtx_range"])
    stack, stack_ids = _codes(col["stack_id"])
    frames, stacks = _stacks(stack_ids, stack_rows, name_rows)
    return {
        "since_ns": str(since_ns), "until_ns": str(until_ns), "span_ns": until_ns - since_ns, "limit": limit,
        "capped": capped, "count": len(rows), "kinds": list(KINDS),
        "lanes": [{"node": n, "device": d, "stream": s} for n, d, s in lanes],
        "processes": [process_frame(comm, pid, None if one_node else node) for node, pid, comm in processes],
        "names": [display_name(n) for n in raw_names], "ranges": ranges,
        "stack_ids": [str(s) for s in stack_ids], "frames": frames, "stacks": stacks,
        "bars": {
            "lane": np.fromiter((lane_index[k] for k in lane_keys), np.int64, len(rows)),
            "start": np.array(col["start_ns"], np.int64) - since_ns if rows else [],
            "end": np.array(col["end_ns"], np.int64) - since_ns if rows else [],
            "kind": kind, "name": raw_name, "stack": stack, "process": process, "range": nvtx,
            "weight": col["weight"], "bytes": col["bytes"], "graph": col["graph_id"],
            "graph_node": col["graph_node_id"],
        },
    }


def _stacks(stack_ids: list[int], stack_rows: Sequence[Sequence[Any]],
            name_rows: Sequence[Sequence[Any]]) -> tuple[list[str], list[np.ndarray]]:
    """The frame names and, per stack of `stack_ids` (in that order), its frames as indices into them, root first;
    GPU frames named as the flame graph names them (an NCCL kernel with its collective)."""
    defined = {int(s): list(f) for s, f in stack_rows}
    rows = [(s, defined.get(int(s), []), 0) for s in stack_ids]
    names = [(frame_id, nccl_label(function) if binary == GPU_BINARY else function, binary, *rest)
             for frame_id, function, binary, *rest in name_rows]
    frames, stacks = model.stack_frames(model.StackIds.from_rows(rows), names)
    if not stacks:
        return [], []
    # only the frames these stacks use, numbered in order of appearance
    codes, used = pd.factorize(np.concatenate(stacks))
    bounds = np.cumsum([0, *(len(s) for s in stacks)]).tolist()
    return [frames[u] for u in used.tolist()], [codes[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
