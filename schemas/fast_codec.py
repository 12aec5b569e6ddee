"""The codec's fast encoders for the hot messages: CpuStackBatch (vectorized, kept under Kafka's message size limit)
and GpuLaunch (cached stack tails). Both write exactly the bytes of `schemas.codec.encode`. The matching columnar
decoder is schemas/columnar_decode.py.

Stacks are held columnar (`PackedStacks`: numpy arrays, no dict per stack) and written with a vectorized Avro
varint encoder; the rest of the record (node fields, process metadata, mappings) goes through the codec's fastavro
schema, so the bytes are exactly what `schemas.codec.encode("CpuStackBatch", ...)` writes (a test checks that).
A batch over the limit is split by processes, and one huge process by its stacks with its mappings repeated.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import fastavro
import numpy as np

from schemas.codec import MARKER, default_registry, encode

DEFAULT_MAX_BYTES = 900 * 1024  # under Kafka's default message.max.bytes (1 MiB) with room for the batch framing
_SLACK = 11  # bytes reserved per array for its item count (a varint of up to 10 bytes) and its end marker
_LIMITS = np.array([1 << (7 * k) for k in range(1, 10)], dtype=np.uint64)  # smallest value needing k+1 bytes
_KEEP = np.arange(10) < np.arange(11)[:, None]  # row n: which of the 10 groups a value of n bytes writes
_CONTINUE = np.where(np.arange(10) < np.arange(11)[:, None] - 1, 0x80, 0).astype(np.uint8)  # all but the last


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


def concat_ranges(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Concatenation of arange(s, s + n) for each (s, n), without a Python loop."""
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(lens)
    return np.arange(total, dtype=np.int64) + np.repeat(starts - (ends - lens), lens)


def lengths_to_offsets(lens: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=out[1:])
    return out


@dataclass
class PackedStacks:
    """The StackCount items of one process, columnar. Addresses are Avro longs, leaf first per stack."""

    tids: np.ndarray  # int64 [n]
    counts: np.ndarray  # int64 [n]
    user_addrs: np.ndarray  # int64, all stacks' user addresses one after another
    user_lens: np.ndarray  # int64 [n]
    kernel_addrs: np.ndarray
    kernel_lens: np.ndarray

    def __len__(self) -> int:
        return len(self.tids)

    @classmethod
    def from_records(cls, stacks: list[dict]) -> PackedStacks:
        ints = [np.array([s[k] for s in stacks], dtype=np.int64) for k in ("tid", "count")]
        users = [np.asarray(s["user_addrs"], dtype=np.int64) for s in stacks]
        kerns = [np.asarray(s["kernel_addrs"], dtype=np.int64) for s in stacks]
        flat = [np.concatenate(a) if a else np.zeros(0, np.int64) for a in (users, kerns)]
        lens = [np.array([len(a) for a in arrs], dtype=np.int64) for arrs in (users, kerns)]
        return cls(ints[0], ints[1], flat[0], lens[0], flat[1], lens[1])

    def records(self) -> list[dict]:
        uo, ko = lengths_to_offsets(self.user_lens), lengths_to_offsets(self.kernel_lens)
        u, k = self.user_addrs.tolist(), self.kernel_addrs.tolist()
        return [{"tid": t, "user_addrs": u[uo[i]:uo[i + 1]], "kernel_addrs": k[ko[i]:ko[i + 1]], "count": c}
                for i, (t, c) in enumerate(zip(self.tids.tolist(), self.counts.tolist(), strict=True))]

    def take(self, lo: int, hi: int) -> PackedStacks:
        """Stacks lo..hi-1."""
        uo, ko = lengths_to_offsets(self.user_lens), lengths_to_offsets(self.kernel_lens)
        return PackedStacks(self.tids[lo:hi], self.counts[lo:hi], self.user_addrs[uo[lo]:uo[hi]],
                            self.user_lens[lo:hi], self.kernel_addrs[ko[lo]:ko[hi]], self.kernel_lens[lo:hi])


def encode_stacks(stacks: PackedStacks) -> tuple[np.ndarray, np.ndarray]:
    """The stacks' Avro bytes one after another, and each stack's end offset in them."""
    n = len(stacks)
    ul, kl = stacks.user_lens, stacks.kernel_lens
    # longs per stack: tid, user array (count, items, 0 -- or a lone 0), kernel array likewise, count
    u_span = np.where(ul > 0, ul + 2, 1)
    k_span = np.where(kl > 0, kl + 2, 1)
    per = 2 + u_span + k_span
    start = lengths_to_offsets(per)[:-1]
    seq = np.zeros(int(per.sum()), dtype=np.int64)
    seq[start] = stacks.tids
    seq[start + 1] = ul
    seq[concat_ranges(start + 2, ul)] = stacks.user_addrs
    kpos = start + 1 + u_span
    seq[kpos] = kl
    seq[concat_ranges(kpos + 1, kl)] = stacks.kernel_addrs
    seq[start + per - 1] = stacks.counts
    data, nbytes = varints(seq)
    ends = np.cumsum(nbytes)[start + per - 1] if n else np.zeros(0, dtype=np.int64)
    return data, ends


class _Layout:
    """The codec's schema, split at the two arrays this module writes itself."""

    def __init__(self) -> None:
        batch = default_registry().latest("CpuStackBatch").parsed
        proc = batch["fields"][-1]["type"]["items"]
        stack_fields = [f["name"] for f in proc["fields"][-1]["type"]["items"]["fields"]]
        if (batch["fields"][-1]["name"], proc["fields"][-1]["name"]) != ("processes", "stacks") or \
                stack_fields != ["tid", "user_addrs", "kernel_addrs", "count"]:
            raise RuntimeError("CpuStackBatch layout changed: update schemas/fast_codec.py")
        self.process = fastavro.parse_schema(proc)


_layout: _Layout | None = None


def process_head(proc: dict) -> bytes:
    """A ProcessStacks record up to its stacks array (metadata and mappings): cache it for a long-lived process."""
    global _layout
    _layout = _layout or _Layout()
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, _layout.process, {**proc, "stacks": []})
    return buf.getvalue()[:-1]  # drop the empty stacks array


def batch_header(batch: dict) -> bytes:
    """Marker, fingerprint and the batch fields before its processes array."""
    return encode("CpuStackBatch", {**batch, "processes": []})[:-1]


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


def _encode_all(procs: list[dict]) -> tuple[np.ndarray, np.ndarray, list[int], list[np.ndarray]]:
    """Every process's stacks in one vectorized pass: bytes, end offset per stack (in the whole batch), first stack
    per process, and each process's stack sizes."""
    stacks = [_packed(p["stacks"]) for p in procs]
    bounds = np.cumsum([0] + [len(s) for s in stacks]).tolist()
    cols = ("tids", "counts", "user_addrs", "user_lens", "kernel_addrs", "kernel_lens")
    if len(stacks) == 1:
        merged = stacks[0]
    else:
        merged = PackedStacks(*(np.concatenate([getattr(s, c) for s in stacks]) if stacks else
                                np.zeros(0, dtype=np.int64) for c in cols))
    data, ends = encode_stacks(merged)
    sizes = np.diff(ends, prepend=0)
    return data, ends, bounds, [sizes[lo:hi] for lo, hi in zip(bounds, bounds[1:], strict=False)]


def split_cpu_batch(batch: dict, max_bytes: int = DEFAULT_MAX_BYTES) -> list[dict]:
    """The batch as one or more batches whose encodings stay within max_bytes; every stack and count kept once."""
    procs = batch["processes"]
    sizes = _encode_all(procs)[3]
    out = []
    for part in plan_split(len(batch_header(batch)), [len(process_head(p)) for p in procs], sizes, max_bytes):
        parts = []
        for p, lo, hi in part:
            stacks = procs[p]["stacks"]
            parts.append({**procs[p], "stacks": stacks.take(lo, hi) if isinstance(stacks, PackedStacks)
                          else stacks[lo:hi]})
        out.append({**batch, "processes": parts})
    return out


def encode_cpu_batches(batch: dict, max_bytes: int = DEFAULT_MAX_BYTES,
                       heads: list[bytes] | None = None) -> list[bytes]:
    """Encode the batch, split so that no message exceeds max_bytes. `heads`: cached process_head() per process."""
    procs = batch["processes"]
    heads = heads if heads is not None else [process_head(p) for p in procs]
    header = batch_header(batch)
    data, ends, bounds, sizes = _encode_all(procs)
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


def encode_cpu_batch(batch: dict) -> bytes:
    """The whole batch as one message (no size limit)."""
    return encode_cpu_batches(batch, max_bytes=1 << 62)[0]


class LaunchEncoder:
    """GpuLaunch bytes, as codec.encode writes them, with the tail (user_addrs, mappings, simulated) cached per
    launching path: a launch's stack repeats, only the fields before it change."""

    def __init__(self) -> None:
        sv = default_registry().latest("GpuLaunch")
        names = [f["name"] for f in sv.parsed["fields"]]
        cut = names.index("user_addrs")
        if names[cut:] != ["user_addrs", "mappings", "simulated"]:
            raise RuntimeError("GpuLaunch layout changed: update schemas/fast_codec.py")
        self.header = MARKER + sv.fingerprint
        self.head = fastavro.parse_schema({"type": "record", "name": "fleetprof.GpuLaunchHead",
                                           "fields": sv.parsed["fields"][:cut]}, named_schemas={})
        self.tail = fastavro.parse_schema({"type": "record", "name": "fleetprof.GpuLaunchTail",
                                           "fields": sv.parsed["fields"][cut:]}, named_schemas={})
        self.tails: dict[tuple, bytes] = {}

    def encode(self, record: dict) -> bytes:
        buf = io.BytesIO()
        buf.write(self.header)
        fastavro.schemaless_writer(buf, self.head, record)
        if record["mappings"]:  # the first launch of a process in a window carries its mappings: not cached
            fastavro.schemaless_writer(buf, self.tail, record)
            return buf.getvalue()
        key = (tuple(record["user_addrs"]), record["simulated"])
        tail = self.tails.get(key)
        if tail is None:
            part = io.BytesIO()
            fastavro.schemaless_writer(part, self.tail, record)
            tail = self.tails[key] = part.getvalue()
        return buf.getvalue() + tail
