"""The columnar CpuStackBatch reader: the record `single_object.decode` gives, with each process's stacks left
columnar (`PackedStacks`). It reads messages written with the schema the layout comes from
(schemas/cpu_batch_layout.py); `decode_columnar` sends every other message through fastavro.

It finds every byte < 0x80 once (the last byte of each varint), decodes all the message's varints in one compiled
pass (schemas/avro_varints.c; a few vectorized numpy passes where it is unavailable), and walks the stacks arrays by
varint index; the other fields are read by a small Python cursor, field by field as the layout lists them.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_left
from collections.abc import Callable
from functools import cache, partial
from typing import Any

import numpy as np

from schemas import avro_fast
from schemas.cpu_batch_layout import LAYOUT, CpuBatchLayout, Record
from schemas.packed_stacks import PackedStacks, concat_ranges, lengths_to_offsets
from schemas.single_object import (
    HEADER_LEN,
    MARKER,
    DecodeError,
    SchemaRegistry,
    read_body,
    writer_and_reader,
)

_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1
_COLUMNS = [f.name for f in dataclasses.fields(PackedStacks)]
_HEAD_KEY = 48  # bytes of a process head that find the heads read before (pid, comm, ...)
_MAX_HEADS = 100_000  # heads kept (a few hundred bytes each); all forgotten when full
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
        compiled = _compiled()[0]
        if compiled is not None:  # the same values in one pass over the bytes
            values, ends, bad = (np.frombuffer(b, dtype=np.int64) for b in compiled(data))
        else:
            values, ends, bad = _numpy_varints(data)
        self.values = values
        self.bad = bad  # sorted
        self.ends = ends
        self.n = len(ends)
        self.vals, self.end_at = memoryview(values), memoryview(ends)  # fast scalar reads for the walks


@cache
def _compiled() -> tuple[Callable[[bytes], tuple[bytes, bytes, bytes]] | None, Callable[..., tuple[int, bytes]] | None]:
    """The compiled varint pass and fast walk (built on first use, as the rest of the compiled codec), or Nones."""
    return avro_fast.varints_reader(), avro_fast.walk_stacks_reader()


def _numpy_varints(data: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """_Varints's (values, ends, bad) by numpy passes, where the compiled codec is unavailable."""
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
    return values, ends, np.concatenate(bad) if bad else np.zeros(0, dtype=np.int64)


def _fail(reason: str) -> DecodeError:
    return DecodeError(f"truncated or corrupt Avro body for {LAYOUT.schema.name}: {reason}")


class _Cursor:
    """A cursor over one message: the small fields read byte by byte, the stacks arrays through `_Varints`. The
    fast walk takes single-block user/kernel arrays only (what every fleetprof writer emits) and gives up on
    anything else; `fast=False` walks any valid Avro (blocks, negative counts with sizes) and says what is wrong."""

    def __init__(self, data: bytes, fast: bool, reader: CpuBatchReader) -> None:
        self.data, self.p, self.fast, self.reader, self.stack = data, HEADER_LEN, fast, reader, reader.layout.stack
        self.vt = vt = _Varints(data)
        self.nseg, self.vals, self.end_at, self.bad = vt.n, vt.vals, vt.end_at, set(vt.bad.tolist())
        # the varint starting at p while p follows a varint or an ASCII string (-1: read bytes until it does)
        k = int(np.searchsorted(vt.ends, self.p))
        self.k = k if k < vt.n and vt.end_at[k - 1] == self.p - 1 else -1
        self.regions: list[tuple[int, int]] = []  # each stacks array's varints [first, after)
        self.nstacks: list[int] = []  # stacks per process
        self.at: list[int] = []  # varint index of each stack (its first field)
        # slow walk only, per stack field: a number's position per stack; an address array's (start, length) per
        # block and total length per stack
        self.where: list[tuple[list[int], ...]] = [([], [], []) if f.kind == "addresses" else ([],)
                                                   for f in self.stack]

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

    def array(self, item: _Plan, min_bytes: int, heads: bool = False) -> list:
        """Avro array blocks of records; a negative count is followed by the block's size in bytes, which must
        match. heads: the items are processes (see `process`)."""
        read = self.process if heads else self.record
        out = []
        while count := self.long():
            end = None
            if count < 0:
                count, size = -count, self.long()
                end = self.p + size
            if count > (len(self.data) - self.p) // min_bytes:
                raise _fail(f"array count {count} exceeds the remaining bytes at byte {self.p}")
            out += [read(item) for _ in range(count)]
            if end is not None and self.p != end:
                raise _fail(f"array block size does not match its items, ending at byte {self.p}")
        return out

    def record(self, plan: _Plan) -> dict:
        """One record, field by field; its leading longs at once while in step with the varints (mappings)."""
        lead, rest = plan
        rec = {}
        if lead:
            k, n = self.k, len(lead)
            if 0 <= k < self.nseg - n and not self.bad:
                self.p, self.k = self.end_at[k + n - 1] + 1, k + n
                vals = self.vals
                for i, name in lead:  # a loop, not dict(zip(...)) over a slice: a third of the time
                    rec[name] = vals[k + i]
            else:
                for _, name in lead:
                    rec[name] = self.long()
        for name, read in rest:
            rec[name] = read(self)
        return rec

    def process(self, plan: _Plan) -> dict:
        """One process: its fields before the stacks (its "head": pid, names, mappings, code objects) are the same
        bytes window after window, so a head read before is not read again. Avro reads a record from its bytes
        alone: the same bytes give the same fields, and the records of one head share them (its lists of mappings
        and code objects: read-only, see decode_columnar)."""
        data, p, heads = self.data, self.p, self.reader.heads
        key = data[p:p + _HEAD_KEY]
        for head, fields, ends in heads.get(key, ()):
            if data.startswith(head, p):
                self.p = p + len(head)
                self.k = self.k + ends if self.k >= 0 else -1
                rec = dict(fields)
                rec[self.reader.stacks_field] = self.stacks()
                return rec
        rec = self.record(plan)
        head = data[p:self.stacks_at]
        if len(head) >= _HEAD_KEY:
            if len(heads) >= _MAX_HEADS:
                heads.clear()
            fields = {name: v for name, v in rec.items() if name != self.reader.stacks_field}
            ends = int(np.count_nonzero(np.frombuffer(head, dtype=np.uint8) < 0x80))  # varints ending inside
            heads[key] = [(head, fields, ends), *heads.get(key, [])[:3]]
        return rec

    def batch(self) -> dict:
        rec = self.record(self.reader.batch_plan)
        if self.p != len(self.data):
            raise DecodeError(f"{len(self.data) - self.p} trailing bytes after {LAYOUT.schema.name} record")
        return rec

    def stacks(self) -> int:
        """Walk one stacks array; returns its index among the message's stacks arrays, whose PackedStacks
        `columns` gathers once the whole message is read (the record holds the index until then)."""
        n, vals, end_at = self.vt.n, self.vt.vals, self.vt.end_at
        self.stacks_at = self.p
        # p - 1 ends a varint (the layout puts no string right before the stacks): in step with the varints
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
            if count > (n - k) // self.reader.min_stack:
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
        walk = _compiled()[1]
        if walk is not None:
            try:
                k, firsts = walk(self.vt.values, k, count, *self.reader.walk_steps)
            except ValueError as exc:
                raise _fail(str(exc)) from None
            self.at += np.frombuffer(firsts, dtype=np.int64).tolist()
            return k
        vals, at = self.vt.vals, self.at
        before, between1, between2, after1, after2 = self.reader.walk_steps
        try:
            for _ in range(count):
                at.append(k)
                k += before
                u = vals[k]  # the first address array: a count, the items and the end marker, or a lone 0
                if u < 0 or (u and vals[k + 1 + u]):
                    raise _fail("not one block")
                k += u + between2 if u else between1
                m = vals[k]  # the second, likewise
                if m < 0 or (m and vals[k + 1 + m]):
                    raise _fail("not one block")
                k += m + after2 if m else after1  # past the numbers after it
        except IndexError:
            raise _fail("truncated stacks array") from None
        return k

    def _walk(self, k: int, count: int) -> int:
        n, vals, end_at = self.vt.n, self.vt.vals, self.vt.end_at
        fields = list(zip(self.stack, self.where, strict=True))
        for _ in range(count):
            self.at.append(k)
            for f, where in fields:
                if k >= n:
                    raise _fail("truncated stack")
                if f.kind != "addresses":
                    where[0].append(k)
                    k += 1
                    continue
                starts, lens, totals = where
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
        first_stacks = lengths_to_offsets(np.array(self.nstacks, dtype=np.int64))  # of each process, and the end
        per_stack = first_stacks.tolist()
        columns: dict[str, tuple[np.ndarray, list[int]]] = {}  # column -> (values, where each process's begin)
        at = np.array(self.at, dtype=np.int64)
        for f, where in zip(self.stack, self.where, strict=True):
            if self.fast:  # the walk checked that every address array is one block (or empty): their layout follows
                if f.kind == "addresses":
                    lens = values[at]
                    starts, totals = at + 1, lens
                    at = starts + np.where(lens > 0, lens + 1, 0)
                else:
                    number = values[at]
                    at = at + 1
            elif f.kind == "addresses":
                starts, lens, totals = (np.array(x, dtype=np.int64) for x in where)
            else:
                number = values[np.array(where[0], dtype=np.int64)]
            if f.kind == "addresses":
                cuts = lengths_to_offsets(totals)[first_stacks].tolist()
                columns[f.column] = values[concat_ranges(starts, lens)], cuts
                columns[f.lens_column] = totals, per_stack
            else:
                if f.kind == "int" and len(number) and (number.min() < _INT_MIN or number.max() > _INT_MAX):
                    raise _fail(f"{f.name} out of int range")
                columns[f.column] = number, per_stack
        per_column = [[column[a:b] for a, b in zip(cuts, cuts[1:], strict=False)]
                      for column, cuts in (columns[c] for c in _COLUMNS)]
        return [PackedStacks(*parts) for parts in zip(*per_column, strict=True)]


# (position and name of each leading long, then name and reader of every other field) of a record
_Plan = tuple[tuple[tuple[int, str], ...], tuple[tuple[str, Callable[[_Cursor], Any]], ...]]
_SCALAR_READERS = {"int": _Cursor.int, "long": _Cursor.long, "string": _Cursor.string,
                   "boolean": _Cursor.boolean}


def _plan(record: Record) -> _Plan:
    """How to read a record of the layout: its leading longs, then a reader per field."""
    lead = record.leading_longs()
    rest = []
    for f in record.fields[len(lead):]:
        if f.kind == "array":
            read = partial(_Cursor.array, item=_plan(f.items), min_bytes=f.items.min_bytes,
                           heads=f.items.fields[-1].kind == "stacks")
        elif f.kind == "stacks":
            read = _Cursor.stacks
        else:
            read = _SCALAR_READERS[f.kind]
        rest.append((f.name, read))
    return tuple(enumerate(lead)), tuple(rest)


class CpuBatchReader:
    """The columnar reader for one CpuStackBatch layout; the functions below use the newest schema's."""

    def __init__(self, layout: CpuBatchLayout) -> None:
        self.layout = layout
        self.batch_plan = _plan(layout.batch)
        self.min_stack = len(layout.stack)  # bytes: a stack count above remaining/min is corrupt, not allocated
        # The fast walk is written for PackedStacks's two address arrays: it steps over the numbers of a stack before
        # the first one, after the first (with its end marker), and after the second.
        before, between, after = layout.stack_gaps()
        self.walk_steps = before, between + 1, between + 2, after + 1, after + 2
        self.stacks_field = layout.process.fields[-1].name
        self.heads: dict[bytes, list[tuple[bytes, dict, int]]] = {}  # process heads read: see _Cursor.process

    def read(self, data: bytes) -> dict:
        """A CpuStackBatch message written with the layout's schema, decoded as `single_object.decode` reads it,
        except that each process's stacks are a PackedStacks. Any valid Avro encoding is read; anything else raises
        DecodeError with a one-line reason."""
        schema = self.layout.schema
        if data[:2] != MARKER or bytes(data[2:HEADER_LEN]) != schema.fingerprint:
            raise DecodeError(f"not a {schema.name.rpartition('.')[2]} v{schema.version} single-object message")
        data = bytes(data)
        try:
            return self.walk(data, fast=True)
        except DecodeError:
            return self.walk(data, fast=False)  # multi-block arrays, or corrupt: the general walk says which

    def walk(self, data: bytes, fast: bool) -> dict:
        """read(), by the fast walk alone or by the general one alone."""
        cursor = _Cursor(data, fast, self)
        rec = cursor.batch()
        columns = cursor.columns()
        stacks = self.layout.process.fields[-1].name
        for proc in rec[self.layout.batch.fields[-1].name]:
            proc[stacks] = columns[proc[stacks]]
        return rec


_READER = CpuBatchReader(LAYOUT)


def decode_columnar(data: bytes, expect: str | None = None,
                    registry: SchemaRegistry | None = None) -> tuple[str, dict]:
    """`single_object.decode`, except that a CpuStackBatch written with the newest schema, and read with it, comes
    back with each process's stacks as a PackedStacks, and a process's other fields as those of the last message
    that had the same bytes for them (the lists of mapping and code object dicts shared: never change them). A newer
    reader version would add or drop fields: fastavro resolves those."""
    writer, reader = writer_and_reader(data, expect, registry)
    if writer is reader and writer.fingerprint == _READER.layout.schema.fingerprint:
        return writer.name, _READER.read(data)
    return writer.name, read_body(data, writer, reader)


def decode_cpu_batch_columnar(data: bytes) -> dict:
    """A CpuStackBatch message written with the newest schema, decoded as `single_object.decode` reads it, except
    that each process's stacks are a PackedStacks; DecodeError with a one-line reason for anything else."""
    return _READER.read(data)
