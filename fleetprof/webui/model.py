"""The JSON shapes the web UI reads, built from named query rows: interned flame graphs, diffs, metric series.

A flame graph is sent compact, since a range can hold 100k distinct stacks: every distinct (function, binary) frame
once in `frames` / `frame_binary` (an index into `binaries`), and each stack as a list of frame indices, root first,
with its value in `counts` at the same position. The page builds the call tree itself.

The server builds it from frame ids (flamegraph_ids_* and flamegraph_names_*: integers per stack, names once per
frame) with numpy, rather than from per-stack lists of names, which cost ClickHouse and Python seconds at 100k stacks.
It gives exactly what `GROUP BY functions, binaries ORDER BY value DESC, functions, binaries` over the stack_names
view gives: stacks whose (function, binary) lists are equal merge and their values add up, ordered by value, then
functions, then binaries, compared as ClickHouse compares arrays of strings (element by element, bytewise, a prefix
first).

Each stack is rooted at a frame of its process ("python3 (pid 1234)", as the per-process exports name it, language
"process", binary ''), so the graph of a machine has one root per process, as py-spy's and Parca's have; stacks merge
only within a process. The page can merge the processes again by skipping that first frame.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import chain, pairwise
from typing import Any

import numpy as np
import pandas as pd

from fleetprof.profile_kinds import process_frame

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
    """The compact flame graph of (functions, binaries, value) rows, merged and ordered already (what
    flamegraph_of_ids gives for stacks with those names, but with lists for stacks)."""
    interned = _Interner()
    stacks, counts = [], []
    for functions, binaries, value in rows:
        stacks.append(interned.stack(functions, binaries))
        counts.append(int(value))
    return {**interned.tables(), "stacks": stacks, "counts": counts, "total": sum(counts)}


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


# --- from frame ids -------------------------------------------------------------------------------------------------

UNKNOWN_FRAME = "[unknown 0x{}]"  # stack_frame_names' name for a frame id without a definition (0009)
UNKNOWN_STACK = "[unknown stack 0x{}]"  # flamegraph_cpu's for a sampled stack id without one
PROCESS_LANGUAGE = "process"  # the language of the frames that root each process's stacks


def ch_hex(value: int) -> str:
    """ClickHouse's lower(hex(UInt64)): whole bytes, leading zero bytes dropped ('05', '0100', '00' for 0)."""
    text = f"{value:x}"
    return "0" + text if len(text) % 2 else text


@dataclass(frozen=True)
class StackIds:
    """flamegraph_ids_* rows as arrays: per sampled stack its id and value, and its frame ids, root first, in
    frame_id[offsets[i]:offsets[i + 1]] (none for a stack without a definition); with the processes columns (node,
    pid, comm), per stack the index of its process in `processes`."""

    stack_id: np.ndarray  # uint64
    value: np.ndarray  # uint64
    offsets: np.ndarray  # int64, one more than stacks
    frame_id: np.ndarray  # uint64
    process: np.ndarray | None = None  # int64 per stack, an index into processes; None: no process columns
    processes: tuple[tuple[str, int, str], ...] = ()  # (node, pid, comm)

    @classmethod
    def from_arrow(cls, table: Any) -> StackIds:
        """From the query's Arrow table (Store.query_named_arrow): no Python object per frame."""
        frames = table.column("frame_ids").combine_chunks()
        offsets = frames.offsets.to_numpy().astype(np.int64) if len(frames) else np.zeros(1, np.int64)
        process, processes = (_processes(*(table.column(c).to_numpy(zero_copy_only=False)
                                           for c in ("node", "pid", "comm")))
                              if "pid" in table.column_names else (None, ()))
        return cls(table.column("stack_id").to_numpy().astype(np.uint64),
                   table.column("value").to_numpy().astype(np.uint64),
                   offsets - offsets[0], frames.flatten().to_numpy().astype(np.uint64), process, processes)

    @classmethod
    def from_rows(cls, rows: Sequence[Sequence[Any]]) -> StackIds:
        """From (stack_id, frame_ids, value[, node, pid, comm]) rows, as the API's JSON gives them."""
        n = len(rows)
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(np.fromiter((len(r[1]) for r in rows), np.int64, n), out=offsets[1:])
        process, processes = (_processes(*(np.array([r[c] for r in rows], object) for c in (3, 4, 5)))
                              if rows and len(rows[0]) > 3 else (None, ()))
        return cls(np.fromiter((r[0] for r in rows), np.uint64, n), np.fromiter((r[2] for r in rows), np.uint64, n),
                   offsets, np.fromiter(chain.from_iterable(r[1] for r in rows), np.uint64, int(offsets[-1])),
                   process, processes)


def _processes(nodes: np.ndarray, pids: np.ndarray, comms: np.ndarray) -> tuple[np.ndarray, tuple]:
    """Per row the index of its (node, pid, comm) among the distinct ones, and those, in order of appearance."""
    process = np.zeros(len(pids), np.int64)
    for column in (nodes, pids, comms):
        codes, uniques = pd.factorize(column)
        # renumbered after each column, so the combined key stays below the number of rows
        process = pd.factorize(process * len(uniques) + codes)[0]
    first = np.unique(process, return_index=True)[1].tolist()
    return process.astype(np.int64), tuple((str(nodes[i]), int(pids[i]), str(comms[i])) for i in first)


def flamegraph_of_ids(stacks: StackIds, names: Iterable[Sequence[Any]], one_node: bool = False) -> dict[str, Any]:
    """The compact flame graph of flamegraph_ids_* arrays and flamegraph_names_* rows (frame_id, function, binary,
    language):
    what flamegraph() gives for the rows of grouping them by names in SQL, except that each stack is a numpy array
    of frame indices (routes.py writes them with orjson, without a Python int per frame). With processes, each stack
    starts with its process's frame (named without the node when `one_node`: the answer is one node's)."""
    frames = _FrameNames(names)
    merged = frames.merge([frames.tokens(stacks, one_node)])
    counts = merged.values[:, 0].tolist()
    return {**merged.compact(frames.language), "counts": counts, "total": sum(counts)}


def stack_frames(stacks: StackIds, names: Iterable[Sequence[Any]]) -> tuple[list[str], list[np.ndarray]]:
    """The flame graph's names for stacks (the GPU timeline's hover): the distinct frame names, and per stack its
    frames as indices into them, root first, named as flamegraph_of_ids names them (an undefined frame
    "[unknown 0x…]", a stack without frames "[unknown stack 0x…]"); no process frames."""
    frames = _FrameNames(names)
    tokens = frames.tokens(StackIds(stacks.stack_id, stacks.value, stacks.offsets, stacks.frame_id))
    bounds = tokens.offsets.tolist()
    return [function for function, _ in frames.pairs], [tokens.pair[a:b] for a, b in pairwise(bounds)]


def flamegraph_diff_of_ids(stacks: StackIds, base: StackIds, names: Iterable[Sequence[Any]],
                           one_node: bool = False) -> dict[str, Any]:
    """Two ranges' flame graphs over one frame table, stacks as in flamegraph_of_ids: every stack of either, with
    `counts` (the range shown) and `base_counts` (the baseline it is compared with); a stack missing from one range
    has 0 there. `names` holds the rows of both ranges' flamegraph_names_* queries."""
    frames = _FrameNames(names)
    merged = frames.merge([frames.tokens(stacks, one_node), frames.tokens(base, one_node)])
    counts, base_counts = merged.values[:, 0].tolist(), merged.values[:, 1].tolist()
    return {**merged.compact(frames.language), "counts": counts, "total": sum(counts), "base_counts": base_counts,
            "base_total": sum(base_counts)}


@dataclass(frozen=True)
class _Tokens:
    """Stacks as indices of distinct (function, binary) pairs: pair[offsets[i]:offsets[i + 1]] for stack i."""

    pair: np.ndarray
    offsets: np.ndarray
    value: np.ndarray


@dataclass(frozen=True)
class _Merged:
    """Distinct stacks in answer order: stack i is the pairs of stack `stack[i]` of `tokens`, and values[i] its
    value in each range (one column per range)."""

    pairs: list[tuple[str, str]]
    tokens: _Tokens
    stack: np.ndarray
    values: np.ndarray

    def compact(self, language: dict[int, str] | None = None) -> dict[str, list]:
        """The frame tables and index arrays of the answer: frames, binaries and languages numbered in order of first
        appearance, as _Interner numbers them (a frame without a known language: "unknown")."""
        offsets = self.tokens.offsets
        lengths = np.diff(offsets)[self.stack]
        ends = np.cumsum(lengths)
        at = np.repeat(offsets[self.stack] - (ends - lengths), lengths) + np.arange(int(lengths.sum()))
        indices, appearance = pd.factorize(self.tokens.pair[at])  # indices by first appearance, and their pairs
        binaries: dict[str, int] = {}
        frame_binary = [binaries.setdefault(self.pairs[p][1], len(binaries)) for p in appearance.tolist()]
        languages: dict[str, int] = {}
        frame_language = [languages.setdefault((language or {}).get(p) or "unknown", len(languages))
                          for p in appearance.tolist()]
        bounds = [0, *ends.tolist()]
        return {"frames": [self.pairs[p][0] for p in appearance.tolist()], "binaries": list(binaries),
                "frame_binary": frame_binary, "languages": list(languages), "frame_language": frame_language,
                "stacks": [indices[a:b] for a, b in pairwise(bounds)]}


class _FrameNames:
    """Frame ids to distinct (function, binary) pairs, one index each; the names of undefined ids are made up here
    as the SQL makes them up."""

    def __init__(self, names: Iterable[Sequence[Any]]):
        self.pairs: dict[tuple[str, str], int] = {}
        self.language: dict[int, str] = {}  # pair -> the language of its first frame (frame_names' 4th column)
        ids, pair_of = [], []
        for row in names:
            frame_id, function, binary = row[0], row[1], row[2]
            ids.append(frame_id)
            pair_of.append(self._pair(function, binary))
            self.language.setdefault(pair_of[-1], row[3] if len(row) > 3 else "")
        # the first row of a frame id wins: a diff's two name queries can both hold it
        self.ids, first = np.unique(np.array(ids, np.uint64), return_index=True)
        self.pair_of = np.array(pair_of, np.int64)[first]

    def _pair(self, function: str, binary: str) -> int:
        return self.pairs.setdefault((function, binary), len(self.pairs))

    def tokens(self, stacks: StackIds, one_node: bool = False) -> _Tokens:
        """Every frame as its pair; a stack without frames as the one frame "[unknown stack 0x…]" (binary ''); with
        processes, its process's frame first."""
        codes, distinct = pd.factorize(stacks.frame_id)  # a hash table: 2.5M frames, a few 10k distinct ids
        at = np.searchsorted(self.ids, distinct)
        known = at < len(self.ids)
        known[known] = self.ids[at[known]] == distinct[known]
        pair_of = np.empty(len(distinct), np.int64)
        pair_of[known] = self.pair_of[at[known]]
        for i in np.flatnonzero(~known).tolist():
            pair_of[i] = self._pair(UNKNOWN_FRAME.format(ch_hex(int(distinct[i]))), "")
        pair, offsets = pair_of[codes], stacks.offsets
        lengths = np.diff(offsets)
        empty = lengths == 0
        if empty.any():
            spread_offsets = np.zeros(len(lengths) + 1, np.int64)
            np.cumsum(np.where(empty, 1, lengths), out=spread_offsets[1:])
            spread = np.empty(int(spread_offsets[-1]), np.int64)
            spread[np.repeat(spread_offsets[:-1] - offsets[:-1], lengths) + np.arange(len(pair))] = pair
            spread[spread_offsets[:-1][empty]] = [self._pair(UNKNOWN_STACK.format(ch_hex(i)), "")
                                                  for i in stacks.stack_id[empty].tolist()]
            pair, offsets = spread, spread_offsets
        if stacks.process is None:
            return _Tokens(pair, offsets, stacks.value)
        return self._rooted(pair, offsets, stacks, one_node)

    def _rooted(self, pair: np.ndarray, offsets: np.ndarray, stacks: StackIds, one_node: bool) -> _Tokens:
        """The stacks with their process's frame put first."""
        roots = np.array([self._process_pair(p, one_node) for p in stacks.processes], np.int64)
        starts = offsets[:-1] + np.arange(len(offsets) - 1)  # where each stack starts, one more frame per stack
        rooted = np.empty(len(pair) + len(starts), np.int64)
        leading = np.zeros(len(rooted), bool)
        leading[starts] = True
        rooted[starts] = roots[stacks.process]
        rooted[~leading] = pair
        return _Tokens(rooted, offsets + np.arange(len(offsets)), stacks.value)

    def _process_pair(self, process: tuple[str, int, str], one_node: bool) -> int:
        node, pid, comm = process
        pair = self._pair(process_frame(comm, pid, None if one_node else node), "")
        self.language[pair] = PROCESS_LANGUAGE
        return pair

    def merge(self, ranges: Sequence[_Tokens]) -> _Merged:
        """The stacks of one or more ranges with equal (function, binary) lists merged, their values summed per range,
        ordered by value (descending), then functions, then binaries: the first range's stacks, then the next
        range's that the first lacks, and so on. Call after tokens() for every range: it ranks every name."""
        sizes = [len(r.offsets) - 1 for r in ranges]
        shifts = np.cumsum([0, *(len(r.pair) for r in ranges)])[:-1]
        tokens = _Tokens(np.concatenate([r.pair for r in ranges]),
                         np.concatenate([[0], *(r.offsets[1:] + s for r, s in zip(ranges, shifts, strict=True))]),
                         np.concatenate([r.value for r in ranges]))
        side = np.repeat(np.arange(len(ranges)), sizes)
        keys = self._keys(tokens)
        groups: dict[bytes, int] = {}
        group = np.fromiter((groups.setdefault(k, len(groups)) for k in keys), np.int64, len(keys))
        values = np.zeros((len(groups), len(ranges)), np.uint64)
        np.add.at(values, (group, side), tokens.value)  # uint64 and wrapping, like ClickHouse's sum
        present = np.zeros((len(groups), len(ranges)), bool)
        present[group, side] = True
        _, first = np.unique(group, return_index=True)  # the first stack of each group stands for it
        ordered = list(groups)
        by_key = np.array(sorted(range(len(ordered)), key=ordered.__getitem__), np.int64)
        order, taken = [], np.zeros(len(groups), bool)
        for r in range(len(ranges)):
            mine = by_key[present[by_key, r] & ~taken[by_key]]
            # ~ reverses uint64 order exactly; stable keeps equal values in key order
            order.append(mine[np.argsort(~values[mine, r], kind="stable")])
            taken[mine] = True
        picked = np.concatenate(order)
        return _Merged(list(self.pairs), tokens, first[picked], values[picked])

    def _keys(self, tokens: _Tokens) -> list[bytes]:
        """Per stack, bytes that compare as ClickHouse compares (functions, binaries) and are equal exactly when
        both lists are: the functions' ranks, a 0, the binaries' ranks, as big-endian 4-byte words of rank + 1, so a
        list that is a prefix of another sorts first and 0 ends the functions before anything else."""
        function_rank, binary_rank = self._ranks()
        offsets, n = tokens.offsets, len(tokens.offsets) - 1
        lengths = np.diff(offsets)
        words = np.zeros(2 * int(offsets[-1]) + n, ">u4")  # stack i's key: words 2 * offsets[i] + i onwards
        at = np.repeat(offsets[:-1] + np.arange(n), lengths) + np.arange(len(tokens.pair))
        words[at] = function_rank[tokens.pair] + 1
        words[at + np.repeat(lengths, lengths) + 1] = binary_rank[tokens.pair] + 1
        data = words.tobytes()
        bounds = (4 * (2 * offsets + np.arange(n + 1))).tolist()
        return [data[a:b] for a, b in pairwise(bounds)]

    def _ranks(self) -> tuple[np.ndarray, np.ndarray]:
        """Per pair, the rank of its function among all functions and of its binary among all binaries (Python
        orders str by code point, as ClickHouse orders UTF-8 by byte)."""
        ranks = []
        for part in (0, 1):
            values = [p[part] for p in self.pairs]
            rank = {v: i for i, v in enumerate(sorted(set(values)))}
            ranks.append(np.fromiter(map(rank.__getitem__, values), np.int64, len(values)))
        return ranks[0], ranks[1]


def series(columns: list[str], rows: list[list[Any]], key: Sequence[str], fields: Sequence[str]) -> list[dict]:
    """Rows ordered by `key` then t_ms, as one series per key: the key's columns, `t` (epoch ms) and one array per
    field."""
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
            entry.update({"t": [], **{f: [] for f in fields}})
            out.append(entry)
        entry["t"].append(int(row[at["t_ms"]]))
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
