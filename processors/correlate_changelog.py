"""The correlator's join state as changelog records (CorrelatorState, topic correlate.state) and back. Pure.

Per input partition: SNAPSHOT chunks (keys .../snap/<chunk>) hold the whole state; LOG records (keys
.../log/<position mod log_slots>) hold what each transaction added and removed after it. A snapshot is written
instead of a log record once the log since the last snapshot outweighs the state (at least snapshot_min_bytes), and
always before half the log slots are used, so a slot is never reused while a record in it is still needed. The write
cost stays within about 1.5x what changed, a restore reads at most about three states' worth, and the topic holds
a fixed number of keys per partition.

A pending graph launch changes in place (its match count): a log record carries it again under its own sequence
number, and restore updates the entry where it stands (arrival order, its stack's holders unchanged). Restore reads
CorrelatorState v3 records too (decoded into v4 with its defaults: no graphs, every record a kernel).
"""

from __future__ import annotations

import heapq

from processors.correlate import (
    KERNEL,
    LAUNCH,
    PROCESS,
    STACK,
    Correlator,
    PartitionState,
    kernel_size,
    launch_codes,
    launch_size,
    process_size,
    stack_size,
)
from processors.correlate_graphs import graph_key, index_record

KINDS = (LAUNCH, KERNEL, PROCESS, STACK)


class ChangelogError(RuntimeError):
    """Changelog records that do not make one state (a snapshot missing a chunk, a gap in the log)."""


def state_key(record: dict, log_slots: int) -> str:
    """The record's changelog key: a fixed space per group and partition, so compaction keeps the topic bounded."""
    where = f"snap/{record['chunk']}" if record["kind"] == "SNAPSHOT" else f"log/{record['position'] % log_slots}"
    return f"{record['group']}/{record['partition']}/{where}"


def changelog(corr: Correlator, group: str, partition: int) -> list[dict]:
    """The records that bring the committed changelog of `partition` to its current state: a LOG record (or a few,
    if large), or a SNAPSHOT. Written in the transaction that commits this state; the state then counts as written."""
    st = corr.parts.get(partition)
    if st is None:
        return []
    cfg = corr.config
    diff_bytes = sum(st.table(kind)[key][-1] for kind, key in st.added.values()) + 10 * len(st.removed) + \
        sum(st.launches[key][-1] for key in st.updated.values())
    used = st.position - st.snapshot_position + 1 + diff_bytes // cfg.chunk_bytes
    if st.log_bytes + diff_bytes > max(cfg.snapshot_min_bytes, 2 * st.state_bytes) or used >= cfg.log_slots // 2:
        return _snapshot(corr, group, partition, st)
    items = [_item(seq, kind, key, st) for seq, (kind, key) in st.added.items()]
    items += [_item(seq, LAUNCH, key, st) for seq, key in st.updated.items()]
    chunks = _chunks(items, cfg.chunk_bytes, st.removed)
    out = []
    for i, items in enumerate(chunks):
        out.append(_record(group, partition, "LOG", st.position, 0, i, len(chunks), st, items))
        st.position += 1
    st.log_bytes += diff_bytes
    st.added.clear()
    st.updated.clear()
    st.removed = []
    return out


def _snapshot(corr: Correlator, group: str, partition: int, st: PartitionState) -> list[dict]:
    merged = heapq.merge(*[_in_order(st, kind) for kind in KINDS])
    chunks = _chunks([_item(seq, kind, key, st) for seq, kind, key in merged], corr.config.chunk_bytes, [])
    st.snapshot_id += 1
    st.snapshot_position = st.position
    st.log_bytes = 0
    st.added.clear()
    st.updated.clear()
    st.removed = []
    return [_record(group, partition, "SNAPSHOT", st.position, st.snapshot_id, i, len(chunks), st, items)
            for i, items in enumerate(chunks)]


def _in_order(st: PartitionState, kind: int) -> list[tuple[int, int, tuple | int]]:
    return sorted((e[0], kind, key) for key, e in st.table(kind).items())


def _item(seq: int, kind: int, key: tuple | int, st: PartitionState) -> tuple[int, dict, int]:
    """One entry as its changelog item: (kind, item, estimated size)."""
    e = st.table(kind)[key]
    if kind == LAUNCH:
        return kind, {"seq": seq, "node": key[0], "pid": key[1], "process_start_ns": key[2],
                      "correlation_id": key[3], "time_ns": e[1], "weight": e[2],
                      "stack_seq": st.stacks[e[4]][0], "nvtx_range": e[6], "graph": e[7], "matches": e[8],
                      "identity_id": e[9]}, e[-1]
    if kind == STACK:
        return kind, {"seq": seq, "user_addrs": list(e[1]),
                      "code_objects": [{"qualname": q, "file": f, "first_line": n} for q, f, n in e[3]]}, e[-1]
    if kind == KERNEL:
        return kind, {"seq": seq, "node": key[0], "pid": key[1], "process_start_ns": key[2],
                      "correlation_id": key[3], "start_ns": e[1], "end_ns": e[2], "device_id": e[3],
                      "stream_id": e[4], "kernel_name": e[5], "simulated": e[6], "activity": e[7], "bytes": e[8],
                      "copy_kind": e[9], "memory_kinds": e[10], "graph_id": e[11], "graph_node_id": e[12]}, e[-1]
    return kind, {"seq": seq, "node": key[0], "pid": key[1], "process_start_ns": key[2], "time_ns": e[1],
                  "mappings": e[2]}, e[-1]


def _chunks(items: list[tuple[int, dict, int]], budget: int, removed: list[int]) -> list[tuple[list, ...]]:
    """The removed sequence numbers, then the items, in chunks of at most `budget` estimated bytes (an item larger
    than that alone); always at least one chunk. Removals come first: an entry that replaced a removed one under the
    same key must not be removed with it when the chunks are applied in order."""
    chunks: list[tuple[list, ...]] = [([], [], [], [], [])]  # one list per kind, then the removed seqs
    size = 0
    for seq in removed:
        if size + 10 > budget:
            chunks.append(([], [], [], [], []))
            size = 0
        chunks[-1][4].append(seq)
        size += 10
    for kind, item, cost in items:
        if size + cost > budget and size:
            chunks.append(([], [], [], [], []))
            size = 0
        chunks[-1][kind].append(item)
        size += cost
    return chunks


def _record(group: str, partition: int, kind: str, position: int, snapshot_id: int, chunk: int, chunks: int,
            st: PartitionState, items: tuple[list, ...]) -> dict:
    launches, kernels, procs, stacks, removed = items
    return {"group": group, "partition": partition, "kind": kind, "position": position,
            "snapshot_id": snapshot_id, "chunk": chunk, "chunks": chunks,
            "launches_watermark_ns": st.wm[LAUNCH], "kernels_watermark_ns": st.wm[KERNEL],
            "check_at_ns": st.check_at, "next_seq": st.next_seq, "launches_offset": st.offsets[LAUNCH],
            "kernels_offset": st.offsets[KERNEL], "launches": launches, "kernels": kernels, "processes": procs,
            "stacks": stacks, "removed": removed}


def restore(corr: Correlator, partition: int, records: list[dict]) -> PartitionState:
    """Replace the state of `partition` with the one its changelog describes. `records`: the latest record of every
    key of the group and partition, in any order."""
    st = PartitionState()
    where: dict[int, tuple[int, tuple | int]] = {}  # seq -> (kind, key) while the log is applied
    snaps = {r["chunk"]: r for r in records if r["kind"] == "SNAPSHOT"}
    position = 0
    if snaps:
        head = snaps.get(0)
        if head is None:
            raise ChangelogError(f"partition {partition}: snapshot chunks without chunk 0")
        parts = [snaps.get(i) for i in range(head["chunks"])]
        if any(p is None or p["snapshot_id"] != head["snapshot_id"] for p in parts):
            raise ChangelogError(f"partition {partition}: snapshot {head['snapshot_id']} lacks chunks")
        for p in parts:
            _apply(corr, st, p, where)
        position, st.snapshot_id = head["position"], head["snapshot_id"]
    logs = sorted((r for r in records if r["kind"] == "LOG" and r["position"] >= position),
                  key=lambda r: r["position"])
    if [r["position"] for r in logs] != list(range(position, position + len(logs))):
        raise ChangelogError(f"partition {partition}: log records {[r['position'] for r in logs]} do not follow "
                             f"the snapshot at {position} without a gap")
    for r in logs:
        for seq in r["removed"]:
            if seq not in where:
                raise ChangelogError(f"partition {partition}: log record {r['position']} removes unknown entry {seq}")
            kind, key = where.pop(seq)
            entry = st.table(kind).pop(key)
            if kind == LAUNCH and entry[4] in st.stacks:
                st.stacks[entry[4]][2] -= 1
            elif kind == KERNEL and len(key) > 4:
                st.unindex(key)
        st.log_bytes += _apply(corr, st, r, where) + 10 * len(r["removed"])
    st.snapshot_position = position
    st.position = position + len(logs)
    st.state_bytes = sum(e[-1] for kind in KINDS for e in st.table(kind).values())
    if any(e[2] < 1 for e in st.stacks.values()):
        raise ChangelogError(f"partition {partition}: a stored stack that no waiting launch has")
    corr.parts[partition] = st
    return st


def _apply(corr: Correlator, st: PartitionState, r: dict, where: dict[int, tuple[int, tuple | int]]) -> int:
    """One record's entries (in sequence order: each table keeps arrival order, and a stack comes before the launches
    that have it) and its meta fields; returns the entries' estimated size."""
    items = sorted([(x["seq"], kind, x) for kind, name in ((LAUNCH, "launches"), (KERNEL, "kernels"),
                                                            (PROCESS, "processes"), (STACK, "stacks"))
                    for x in r[name]], key=lambda i: i[0])
    size = 0
    for seq, kind, x in items:
        if kind == STACK:
            addrs, key, codes = corr.stack_no(x["user_addrs"], launch_codes(x))
            entry = [seq, addrs, 0, codes, stack_size(addrs, codes)]
        elif kind == LAUNCH:
            key = (x["node"], x["pid"], x["process_start_ns"], x["correlation_id"])
            if seq in where:  # a graph launch logged again: its match count moved
                if where[seq] != (LAUNCH, key):
                    raise ChangelogError(f"partition {r['partition']}: entry {seq} logged again as another launch")
                st.launches[key][8] = x["matches"]
                size += st.launches[key][-1]
                continue
            held = where.get(x["stack_seq"])
            if held is None or held[0] != STACK:
                raise ChangelogError(f"partition {r['partition']}: launch {seq} names unknown stack "
                                     f"{x['stack_seq']}")
            stack = st.stacks[held[1]]
            stack[2] += 1
            nvtx = x.get("nvtx_range", "")
            entry = [seq, x["time_ns"], x["weight"], stack[1], held[1], stack[3], nvtx, x.get("graph", False),
                     x.get("matches", 0), x.get("identity_id", 0), launch_size(key[0], nvtx)]
        elif kind == KERNEL:
            key = (x["node"], x["pid"], x["process_start_ns"], x["correlation_id"])
            ck, mk = x.get("copy_kind", ""), x.get("memory_kinds", "")
            entry = [seq, x["start_ns"], x["end_ns"], x["device_id"], x["stream_id"], x["kernel_name"],
                     x.get("simulated", False), x.get("activity", "KERNEL"), x.get("bytes", 0), ck, mk,
                     x.get("graph_id", 0), x.get("graph_node_id", 0), kernel_size(key[0], x["kernel_name"], ck + mk)]
            if entry[11]:
                key = graph_key(key, entry)
                index_record(st, key)
        else:
            key = (x["node"], x["pid"], x["process_start_ns"])
            maps = [dict(m) for m in x["mappings"]]
            entry = [seq, x["time_ns"], maps, corr.mapping_id(maps), process_size(key[0], maps)]
        st.table(kind)[key] = entry
        where[seq] = (kind, key)
        size += entry[-1]
    st.wm = [r["launches_watermark_ns"], r["kernels_watermark_ns"]]
    st.check_at, st.next_seq = r["check_at_ns"], r["next_seq"]
    st.offsets = [r["launches_offset"], r["kernels_offset"]]
    return size
