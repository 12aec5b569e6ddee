"""The fast CpuStackBatch writer: a batch whose stacks are PackedStacks (or StackCount dicts) as the bytes
`single_object.encode("CpuStackBatch", ...)` writes (a test checks that), split to stay under Kafka's message size
limit.

The stacks are written with a vectorized Avro varint encoder, field by field in the order the schema gives
(schemas/cpu_batch_layout.py); the rest of the record (batch fields, process metadata, mappings) goes through
fastavro. A batch over the limit is split by processes, and one huge process by its stacks with its mappings
repeated. The matching reader is schemas/cpu_batch_reader.py.
"""

from __future__ import annotations

import dataclasses
import io
from typing import Any

import fastavro
import numpy as np

from schemas.cpu_batch_layout import LAYOUT, CpuBatchLayout
from schemas.packed_stacks import PackedStacks, concat_ranges, lengths_to_offsets
from schemas.single_object import encode_as
from schemas.wire import DEFAULT_MAX_BYTES

_SLACK = 11  # bytes reserved per array for its item count (a varint of up to 10 bytes) and its end marker
_LIMITS = np.array([1 << (7 * k) for k in range(1, 10)], dtype=np.uint64)  # smallest value needing k+1 bytes
_KEEP = np.arange(10) < np.arange(11)[:, None]  # row n: which of the 10 groups a value of n bytes writes
_CONTINUE = np.where(np.arange(10) < np.arange(11)[:, None] - 1, 0x80, 0).astype(np.uint8)  # all but the last
_COLUMNS = tuple(f.name for f in dataclasses.fields(PackedStacks))


def varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Avro longs (zigzag varints) of an int64 array: (all bytes as uint8, bytes per value)."""
    v = np.asarray(values, dtype=np.int64)
    z = ((v << 1) ^ (v >> 63)).view(np.uint64)
    nbytes = np.searchsorted(_LIMITS, z, side="right") + 1
    groups = np.empty((len(z), 10), dtype=np.uint8)  # 7-bit groups, low first, one row per value
    for j in range(10):
        groups[:, j] = z >> np.uint64(7 * j)
    groups &= 0x7F
    groups |= np.take(_CONTINUE, nbytes, axis=0)
    return groups[np.take(_KEEP, nbytes, axis=0)], nbytes


def long_bytes(value: int) -> bytes:
    """One Avro long."""
    z = ((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def _packed(stacks: Any) -> PackedStacks:
    return stacks if isinstance(stacks, PackedStacks) else PackedStacks.from_records(stacks)


def plan_split(header_len: int, head_lens: list[int], stack_sizes: list[np.ndarray],
               max_bytes: int) -> list[list[tuple[int, int, int]]]:
    """Parts of (process index, first stack, end stack), each part's encoding at most max_bytes."""
    base = header_len + _SLACK
    parts: list[list[tuple[int, int, int]]] = []
    cur: list[tuple[int, int, int]] = []
    used = base
    for p, (head, sizes) in enumerate(zip(head_lens, stack_sizes, strict=True)):
        fixed, n = head + _SLACK, len(sizes)
        cums = np.cumsum(sizes)
        total = fixed + (int(cums[-1]) if n else 0)
        if used + total <= max_bytes:
            cur.append((p, 0, n))
            used += total
            continue
        if cur and base + total <= max_bytes:  # the whole process fits in a fresh part
            parts.append(cur)
            cur, used = [(p, 0, n)], base + total
            continue
        lo = 0
        while lo < n:  # a process too big for one message: fill parts with runs of its stacks
            before = int(cums[lo - 1]) if lo else 0
            hi = int(np.searchsorted(cums, before + max_bytes - used - fixed, side="right"))
            if hi <= lo:
                if not cur:
                    raise ValueError(f"one stack of process {p} does not fit in {max_bytes} bytes with its mappings")
                parts.append(cur)
                cur, used = [], base
                continue
            cur.append((p, lo, hi))
            used += fixed + int(cums[hi - 1]) - before
            lo = hi
    if cur or not parts:
        parts.append(cur)
    return parts


class CpuBatchWriter:
    """The fast writer for one CpuStackBatch layout; the functions below use the newest schema's."""

    def __init__(self, layout: CpuBatchLayout) -> None:
        self.layout = layout
        self.processes, self.stacks = layout.batch.fields[-1].name, layout.process.fields[-1].name
        self.process_schema = fastavro.parse_schema(layout.process_schema)

    def encode_stacks(self, stacks: PackedStacks) -> tuple[np.ndarray, np.ndarray]:
        """The stacks' Avro bytes one after another, and each stack's end offset in them."""
        # longs per stack, field by field: a number is one; an address array its count, the items and 0 (a lone 0
        # when empty). The zeros the sequence starts with are the arrays' end markers.
        spans = [1 if f.kind != "addresses" else np.where(getattr(stacks, f.lens_column) > 0,
                                                         getattr(stacks, f.lens_column) + 2, 1)
                 for f in self.layout.stack]
        per = sum(spans, np.zeros(len(stacks), dtype=np.int64))
        start = lengths_to_offsets(per)[:-1]
        seq = np.zeros(int(per.sum()), dtype=np.int64)
        at = start
        for f, span in zip(self.layout.stack, spans, strict=True):
            if f.kind == "addresses":
                lens = getattr(stacks, f.lens_column)
                seq[at] = lens
                seq[concat_ranges(at + 1, lens)] = getattr(stacks, f.column)
            else:
                seq[at] = getattr(stacks, f.column)
            at = at + span
        data, nbytes = varints(seq)
        ends = np.cumsum(nbytes)[start + per - 1] if len(stacks) else np.zeros(0, dtype=np.int64)
        return data, ends

    def process_head(self, proc: dict) -> bytes:
        """A ProcessStacks record up to its stacks array (metadata and mappings): cache it for a long-lived
        process."""
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, self.process_schema, {**proc, self.stacks: []})
        return buf.getvalue()[:-1]  # drop the empty stacks array

    def batch_header(self, batch: dict) -> bytes:
        """Marker, fingerprint and the batch fields before its processes array."""
        return encode_as(self.layout.schema, {**batch, self.processes: []})[:-1]

    def _encode_all(self, procs: list[dict]) -> tuple[np.ndarray, np.ndarray, list[int], list[np.ndarray]]:
        """Every process's stacks in one vectorized pass: bytes, end offset per stack (in the whole batch), first
        stack per process, and each process's stack sizes."""
        stacks = [_packed(p[self.stacks]) for p in procs]
        bounds = np.cumsum([0] + [len(s) for s in stacks]).tolist()
        if len(stacks) == 1:
            merged = stacks[0]
        else:
            merged = PackedStacks(*(np.concatenate([getattr(s, c) for s in stacks]) if stacks else
                                    np.zeros(0, dtype=np.int64) for c in _COLUMNS))
        data, ends = self.encode_stacks(merged)
        sizes = np.diff(ends, prepend=0)
        return data, ends, bounds, [sizes[lo:hi] for lo, hi in zip(bounds, bounds[1:], strict=False)]

    def split(self, batch: dict, max_bytes: int = DEFAULT_MAX_BYTES) -> list[dict]:
        """The batch as one or more batches whose encodings stay within max_bytes; every stack and count kept
        once."""
        procs = batch[self.processes]
        sizes = self._encode_all(procs)[3]
        out = []
        heads = [len(self.process_head(p)) for p in procs]
        for part in plan_split(len(self.batch_header(batch)), heads, sizes, max_bytes):
            parts = []
            for p, lo, hi in part:
                stacks = procs[p][self.stacks]
                parts.append({**procs[p], self.stacks: stacks.take(lo, hi) if isinstance(stacks, PackedStacks)
                              else stacks[lo:hi]})
            out.append({**batch, self.processes: parts})
        return out

    def encode(self, batch: dict, max_bytes: int = DEFAULT_MAX_BYTES,
               heads: list[bytes] | None = None) -> list[bytes]:
        """Encode the batch, split so that no message exceeds max_bytes. `heads`: cached process_head() per
        process."""
        procs = batch[self.processes]
        heads = heads if heads is not None else [self.process_head(p) for p in procs]
        header = self.batch_header(batch)
        data, ends, bounds, sizes = self._encode_all(procs)
        messages = []
        for part in plan_split(len(header), [len(h) for h in heads], sizes, max_bytes):
            chunks = [header, long_bytes(len(part))] if part else [header]
            for p, lo, hi in part:
                chunks += [heads[p], long_bytes(hi - lo)]
                if hi > lo:
                    first, last = bounds[p] + lo, bounds[p] + hi  # stack indexes in the whole batch
                    chunks += [data[(ends[first - 1] if first else 0):ends[last - 1]].tobytes(), b"\x00"]
            chunks.append(b"\x00")
            message = b"".join(chunks)
            if len(message) > max_bytes:  # the plan reserves slack, so this would be a bug, not bad input
                raise AssertionError(f"encoded CpuStackBatch of {len(message)} bytes exceeds {max_bytes}")
            messages.append(message)
        return messages


_WRITER = CpuBatchWriter(LAYOUT)


def process_head(proc: dict) -> bytes:
    """A ProcessStacks record up to its stacks array (metadata and mappings): cache it for a long-lived process."""
    return _WRITER.process_head(proc)


def split_cpu_batch(batch: dict, max_bytes: int = DEFAULT_MAX_BYTES) -> list[dict]:
    """The batch as one or more batches whose encodings stay within max_bytes; every stack and count kept once."""
    return _WRITER.split(batch, max_bytes)


def encode_cpu_batches(batch: dict, max_bytes: int = DEFAULT_MAX_BYTES,
                       heads: list[bytes] | None = None) -> list[bytes]:
    """Encode the batch, split so that no message exceeds max_bytes. `heads`: cached process_head() per process."""
    return _WRITER.encode(batch, max_bytes, heads)


def encode_cpu_batch(batch: dict) -> bytes:
    """The whole batch as one message (no size limit)."""
    return _WRITER.encode(batch, max_bytes=1 << 62)[0]
