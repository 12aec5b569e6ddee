"""The codec's fast decoder for CpuStackBatch v1: the record of `schemas.codec.decode`, with each process's stacks
left columnar (`PackedStacks`).

It finds every byte < 0x80 once (the last byte of each varint), decodes all the message's varints in a few
vectorized passes, and walks the stacks arrays by varint index; the header, process and mapping fields are read by
a small Python cursor. Only the exact v1 writer schema takes this path (`codec.decode(..., columnar=True)`).
"""

from __future__ import annotations

from bisect import bisect_left

import numpy as np

from schemas.codec import HEADER_LEN, MARKER, DecodeError
from schemas.fast_codec import PackedStacks, concat_ranges, lengths_to_offsets

# The one writer schema the decoder below is written for: CRC-64-AVRO of schemas/cpu_stack_batch.v1.avsc (a test
# checks it). A schema file edited in place gets another fingerprint, and its messages go through fastavro.
CPU_BATCH_V1_FINGERPRINT = bytes.fromhex("8d3a5626d511ab41")
_BATCH_NAME = "fleetprof.CpuStackBatch"
_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1
# fewest bytes of one array item: ProcessStacks (pid, four strings, two arrays), Mapping (three longs, two
# strings), StackCount (tid, two empty arrays, count); a count above remaining/min is corrupt, not allocated
_MIN_PROCESS, _MIN_MAPPING, _MIN_STACK = 7, 5, 4
_CHUNK = 8192  # varints per vectorized step: small temporaries are reused by malloc, large ones page-fault anew
_U = np.uint64
# (high groups, low groups, shift) of the three merge steps: 7-bit groups in bytes -> 14 in 16 -> 28 in 32 -> 56
_SWAR = [(_U(h), _U(lo), _U(s)) for h, lo, s in ((0x7F007F007F007F00, 0x007F007F007F007F, 1),
                                                 (0x3FFF00003FFF0000, 0x00003FFF00003FFF, 2),
                                                 (0x0FFFFFFF00000000, 0x000000000FFFFFFF, 4))]


def _long_varints(windows: np.ndarray, padded: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Zigzag-decode the varints starting at `starts`: (values, indexes of the malformed ones). Each varint's first
    8 bytes are read as one little-endian word, the bytes past its last one masked off, and the 7-bit groups packed
    together in three shift-and-merge steps; 9- and 10-byte varints get their tail added apart."""
    w = windows[starts]
    t = ~w & _U(0x8080808080808080)  # high bit of every byte < 0x80
    u = -t
    t &= u  # ... only of the first one: the varint's last byte, if among the 8
    longer = np.flatnonzero(t == 0)
    t <<= _U(1)
    t -= _U(1)  # every bit up to that byte (all 64 when it lies further on)
    w &= t
    for high, low, shift in _SWAR:
        np.bitwise_and(w, high, out=u)
        w &= low
        u >>= shift
        w |= u
    bad = np.zeros(0, dtype=np.int64)
    if len(longer):
        s = starts[longer]
        tail = padded[s[:, None] + np.arange(8, 11)]  # bytes 9 to 11 (zeros past the message)
        nine, ten = tail[:, 0] < 0x80, (tail[:, 0] >= 0x80) & (tail[:, 1] < 0x80)
        w[longer] |= (tail[:, 0] & 0x7F).astype(np.uint64) << _U(56)
        w[longer[ten]] |= tail[ten, 1].astype(np.uint64) << _U(63)
        bad = longer[~(nine | (ten & (tail[:, 1] <= 1)))]  # over 10 bytes, or a 10th byte with more than bit 63
    np.bitwise_and(w, _U(1), out=u)
    w >>= _U(1)
    np.negative(u, out=u)
    w ^= u
    return w.view(np.int64), bad


class _Varints:
    """Every run of bytes that ends in a byte < 0x80, decoded as a zigzag varint. Inside an array of longs these
    runs are exactly its varints (each starts after the previous one's last byte), so one vectorized pass over the
    message decodes every stacks array; runs inside strings are never read."""

    def __init__(self, data: bytes) -> None:
        padded = data + bytes(11)  # every varint's first 11 bytes lie inside the buffer
        b = np.frombuffer(padded, dtype=np.uint8)
        ends = np.flatnonzero(b[:len(data)] < 0x80)
        last = b[ends]
        # one-byte varints (string bytes, counts, lengths) are their last byte; the rest, mostly addresses, are
        # decoded 8 bytes at a time, a chunk at a time
        values = (last >> 1).astype(np.int64)
        values ^= -(last & 1).astype(np.int8)
        multi = np.flatnonzero(np.frombuffer(b"\0" + data, dtype=np.uint8)[ends] >= 0x80)
        windows = np.ndarray((len(data),), dtype="<u8", buffer=padded, strides=(1,))
        bad = []
        for lo in range(0, len(multi), _CHUNK):
            idx = multi[lo:lo + _CHUNK]
            starts = ends[idx - 1] + 1
            starts[idx == 0] = 0
            values[idx], wrong = _long_varints(windows, b, starts)
            bad.append(idx[wrong])
        self.values = values
        self.bad = np.concatenate(bad) if bad else np.zeros(0, dtype=np.int64)  # sorted
        self.ends = ends
        self.n = len(ends)
        self.vals, self.end_at = memoryview(values), memoryview(ends)  # fast scalar reads for the walks


def _fail(reason: str) -> DecodeError:
    return DecodeError(f"truncated or corrupt Avro body for {_BATCH_NAME}: {reason}")


class _BatchReader:
    """A cursor over one message: the small fields read byte by byte, the stacks arrays through `_Varints`. The
    fast walk takes single-block user/kernel arrays only (what every fleetprof writer emits) and gives up on
    anything else; `fast=False` walks any valid Avro (blocks, negative counts with sizes) and says what is wrong."""

    def __init__(self, data: bytes, fast: bool) -> None:
        self.data, self.p, self.fast = data, HEADER_LEN, fast
        self.vt = vt = _Varints(data)
        self.nseg, self.vals, self.end_at, self.bad = vt.n, vt.vals, vt.end_at, set(vt.bad.tolist())
        # the varint starting at p while p follows a varint or an ASCII string (-1: read bytes until it does)
        k = int(np.searchsorted(vt.ends, self.p))
        self.k = k if k < vt.n and vt.end_at[k - 1] == self.p - 1 else -1
        self.regions: list[tuple[int, int]] = []  # each stacks array's varints [first, after)
        self.nstacks: list[int] = []  # stacks per process
        self.at: list[int] = []  # varint index of each stack (its tid)
        # slow walk only: count position per stack, (start, length) per array block, total length per stack
        self.count_at: list[int] = []
        self.ublocks: tuple[list[int], list[int], list[int]] = ([], [], [])
        self.kblocks: tuple[list[int], list[int], list[int]] = ([], [], [])

    def long(self) -> int:
        k = self.k
        if 0 <= k < self.nseg and k not in self.bad:
            self.p, self.k = self.end_at[k] + 1, k + 1
            return self.vals[k]
        data, p = self.data, self.p
        if p >= len(data):
            raise _fail(f"truncated at byte {p}")
        b = data[p]
        z, shift = b & 0x7F, 7
        while b >= 0x80:
            p += 1
            if p >= len(data):
                raise _fail(f"truncated varint at byte {p}")
            if shift > 63:
                raise _fail(f"varint longer than 10 bytes at byte {self.p}")
            b = data[p]
            z |= (b & 0x7F) << shift
            shift += 7
        if z >> 64:
            raise _fail(f"varint over 64 bits at byte {self.p}")
        self.p = p + 1
        self.k = bisect_left(self.end_at, p) + 1  # in step again
        return (z >> 1) ^ -(z & 1)

    def int(self) -> int:
        v = self.long()
        if not _INT_MIN <= v <= _INT_MAX:
            raise _fail(f"int out of range before byte {self.p}")
        return v

    def string(self) -> str:
        k = self.k
        if 0 <= k < self.nseg and k not in self.bad:  # long(), inlined: strings are most of the small fields
            n, p, k = self.vals[k], self.end_at[k] + 1, k + 1
        else:
            n, p, k = self.long(), self.p, self.k
        if not 0 <= n <= len(self.data) - p:
            raise _fail(f"string length {n} at byte {p} exceeds the message")
        self.p = p + n
        if n and k >= 0:  # n one-byte varints end exactly at p + n - 1 when every byte is ASCII
            k += n
            k = k if k <= self.nseg and self.end_at[k - 1] == p + n - 1 else -1
        self.k = k
        try:
            return self.data[p:p + n].decode()
        except UnicodeDecodeError:
            raise _fail(f"invalid UTF-8 in the string at byte {p}") from None

    def boolean(self) -> bool:
        if self.p >= len(self.data) or self.data[self.p] > 1:
            raise _fail(f"bad boolean at byte {self.p}")
        self.p += 1
        if self.k >= 0:  # one byte < 0x80: one varint's worth
            self.k += 1
        return self.data[self.p - 1] == 1

    def array(self, item, min_bytes: int) -> list:
        """Avro array blocks; a negative count is followed by the block's size in bytes, which must match."""
        out = []
        while count := self.long():
            end = None
            if count < 0:
                count, size = -count, self.long()
                end = self.p + size
            if count > (len(self.data) - self.p) // min_bytes:
                raise _fail(f"array count {count} exceeds the remaining bytes at byte {self.p}")
            out += [item() for _ in range(count)]
            if end is not None and self.p != end:
                raise _fail(f"array block size does not match its items, ending at byte {self.p}")
        return out

    def batch(self) -> dict:
        rec = {"node": self.string(), "window_start_ns": self.long(), "window_ns": self.long(),
               "frequency_hz": self.int(), "kernel_build_id": self.string(), "simulated": self.boolean(),
               "processes": self.array(self.process, _MIN_PROCESS)}
        if self.p != len(self.data):
            raise DecodeError(f"{len(self.data) - self.p} trailing bytes after {_BATCH_NAME} record")
        return rec

    def process(self) -> dict:
        # "stacks" holds the array's index until `columns` replaces it with its PackedStacks
        return {"pid": self.int(), "comm": self.string(), "exe": self.string(), "cgroup": self.string(),
                "container_id": self.string(), "mappings": self.array(self.mapping, _MIN_MAPPING),
                "stacks": self.stacks()}

    def mapping(self) -> dict:
        k = self.k
        if 0 <= k < self.nseg - 3 and not self.bad:  # the three longs in step: read them at once
            vals = self.vals
            self.p, self.k = self.end_at[k + 2] + 1, k + 3
            return {"start": vals[k], "limit": vals[k + 1], "file_offset": vals[k + 2], "path": self.string(),
                    "build_id": self.string()}
        return {"start": self.long(), "limit": self.long(), "file_offset": self.long(), "path": self.string(),
                "build_id": self.string()}

    def stacks(self) -> int:
        """Walk one stacks array; returns its index among the message's stacks arrays, whose PackedStacks
        `columns` gathers once the whole message is read."""
        n, vals, end_at = self.vt.n, self.vt.vals, self.vt.end_at
        # p - 1 ends the mappings array: in step with the varints
        first = k = self.k if self.k >= 0 else int(np.searchsorted(self.vt.ends, self.p))
        total = 0
        while True:
            if k >= n:
                raise _fail("truncated stacks array")
            count = vals[k]
            k += 1
            if count == 0:
                break
            size = None
            if count < 0:
                if k >= n:
                    raise _fail("truncated stacks array")
                count, size, block = -count, vals[k], k + 1
                k += 1
            if count > (n - k) // _MIN_STACK:
                raise _fail(f"stack count {count} exceeds the remaining bytes at byte {end_at[k - 1] + 1}")
            k = self._walk_fast(k, count) if self.fast else self._walk(k, count)
            if k > n:
                raise _fail("truncated stacks array")
            if size is not None and end_at[k - 1] - end_at[block - 1] != size:
                raise _fail(f"stacks block size {size} does not match its items, ending at byte {end_at[k - 1] + 1}")
            total += count
        self.regions.append((first, k))
        self.nstacks.append(total)
        self.p, self.k = end_at[k - 1] + 1, k
        return len(self.nstacks) - 1

    def _walk_fast(self, k: int, count: int) -> int:
        vals, at = self.vt.vals, self.at
        try:
            for _ in range(count):
                at.append(k)
                u = vals[k + 1]  # user addresses: a count, the items and the end marker, or a lone 0
                if u < 0 or (u and vals[k + 2 + u]):
                    raise _fail("not one block")
                kk = k + 3 + u if u else k + 2
                m = vals[kk]  # kernel addresses, likewise
                if m < 0 or (m and vals[kk + 1 + m]):
                    raise _fail("not one block")
                k = kk + 3 + m if m else kk + 2  # past the count
        except IndexError:
            raise _fail("truncated stacks array") from None
        return k

    def _walk(self, k: int, count: int) -> int:
        n, vals, end_at = self.vt.n, self.vt.vals, self.vt.end_at
        for _ in range(count):
            self.at.append(k)
            k += 1
            for starts, lens, totals in (self.ublocks, self.kblocks):
                total = 0
                while True:
                    if k >= n:
                        raise _fail("truncated stack")
                    items = vals[k]
                    k += 1
                    if items == 0:
                        break
                    size = None
                    if items < 0:
                        if k >= n:
                            raise _fail("truncated stack")
                        items, size = -items, vals[k]
                        k += 1
                    if items > n - k:
                        raise _fail(f"address count {items} exceeds the remaining bytes")
                    if size is not None and end_at[k + items - 1] - end_at[k - 1] != size:
                        raise _fail(f"address block size {size} does not match its items")
                    starts.append(k)
                    lens.append(items)
                    total += items
                    k += items
                totals.append(total)
            if k >= n:
                raise _fail("truncated stack")
            self.count_at.append(k)
            k += 1
        return k

    def columns(self) -> list[PackedStacks]:
        """Every stacks array's PackedStacks, gathered from the varints in one pass for the whole message."""
        vt = self.vt
        if not self.regions:
            return []
        firsts, afters = np.array(self.regions, dtype=np.int64).reshape(-1, 2).T
        if (np.searchsorted(vt.bad, firsts) != np.searchsorted(vt.bad, afters)).any():
            raise _fail("varint longer than 10 bytes or over 64 bits in a stacks array")
        values = vt.values
        at = np.array(self.at, dtype=np.int64)
        if self.fast:  # the walk checked that both arrays are one block (or empty): their layout follows
            ulen = values[at + 1]
            kstart = at + 3 + np.where(ulen > 0, ulen + 1, 0)
            klen = values[kstart - 1]
            cat = kstart + np.where(klen > 0, klen + 1, 0)
            ustart, utot, ktot = at + 2, ulen, klen
        else:
            cat = np.array(self.count_at, dtype=np.int64)
            ustart, ulen, utot = (np.array(x, dtype=np.int64) for x in self.ublocks)
            kstart, klen, ktot = (np.array(x, dtype=np.int64) for x in self.kblocks)
        tids = values[at]
        if len(tids) and (tids.min() < _INT_MIN or tids.max() > _INT_MAX):
            raise _fail("tid out of int range")
        counts = values[cat]
        uaddrs = values[concat_ranges(ustart, ulen)]
        kaddrs = values[concat_ranges(kstart, klen)]
        sb = lengths_to_offsets(np.array(self.nstacks, dtype=np.int64))
        ub, kb = lengths_to_offsets(utot), lengths_to_offsets(ktot)
        return [PackedStacks(tids[s:e], counts[s:e], uaddrs[ub[s]:ub[e]], utot[s:e], kaddrs[kb[s]:kb[e]],
                             ktot[s:e]) for s, e in zip(sb[:-1].tolist(), sb[1:].tolist(), strict=True)]


def decode_cpu_batch_columnar(data: bytes) -> dict:
    """A CpuStackBatch v1 message decoded as `codec.decode` reads it, except that each process's "stacks" is a
    PackedStacks. Any valid Avro encoding is read; anything else raises DecodeError with a one-line reason."""
    if data[:2] != MARKER or bytes(data[2:HEADER_LEN]) != CPU_BATCH_V1_FINGERPRINT:
        raise DecodeError("not a CpuStackBatch v1 single-object message")
    data = bytes(data)
    try:
        return _read_batch(data, fast=True)
    except DecodeError:
        return _read_batch(data, fast=False)  # multi-block arrays, or corrupt: the general walk says which


def _read_batch(data: bytes, fast: bool) -> dict:
    reader = _BatchReader(data, fast)
    rec = reader.batch()
    columns = reader.columns()
    for proc in rec["processes"]:
        proc["stacks"] = columns[proc["stacks"]]
    return rec
