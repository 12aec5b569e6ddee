"""The correlator's inputs decoded a batch at a time: GpuLaunch and GpuKernel messages written with the newest
schema, read by the compiled codec (schemas/avro_read.c) in one call per batch where it is built; otherwise their
leading fields read for every message of the batch at once with numpy. Either way a launch's tail (user_addrs,
mappings, code_objects, simulated: it repeats with the launching path) is decoded once per distinct bytes and
cached (only tails of at most MAX_TAIL_BYTES; the compiled path also a kernel's name and the fields after it):
the records that repeat it share its objects, so there are no addresses to allocate and free for them, and equal
stacks compare by identity in the join's stack numbers.

fastavro reads a 280-byte launch in ~35 µs on the project's VM (it reads its input a byte at a time through the file
object), more than the join, symbolization and aggregation of the record together. The records here are the dicts
`single_object.decode` returns (same keys, values and types; a cached tail's lists are shared between the records
that have it: the stage only reads them). Anything this path does not handle exactly as the codec does (an older
writer, a truncated or corrupt body, a varint past 64 bits, an int outside 32 bits, bad UTF-8, an enum index or a
boolean byte out of range, a multi-block array in a tail) goes through `decode_message` one by one, which gives the
record or the dead letter it always gave.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import fastavro
import numpy as np

from processors.messages import Message, Produced, decode_message
from schemas import avro_fast, single_object
from schemas.single_object import HEADER_LEN, MARKER, SchemaVersion

LONG, INT, BOOL, ENUM, STRING = range(5)
_KINDS = {"long": LONG, "int": INT, "boolean": BOOL, "string": STRING}
_SHIFTS = np.arange(0, 70, 7, dtype=np.uint64)
_COLS = np.arange(10)
# where the compiled reader's cached tail begins: a launch's stack and mappings, a kernel's name and what follows it
# (its kind, bytes, graph ids: equal for most kernels of a name), which repeat, unlike the times and ids before them
CACHED_TAIL = {"GpuLaunch": "user_addrs", "GpuKernel": "kernel_name"}
MAX_TAILS = 20_000  # distinct tails kept
# A launch's tail is its stack (~200 bytes; more with Python frames' code objects) unless it carries its process's
# mappings: then kilobytes, seldom the same twice, and tens of KB of objects: those are read every time, not kept,
# so a full cache holds ~20,000 stacks (~30 MB) rather than 20,000 processes' mapping lists
MAX_TAIL_BYTES = 1024


class _Layout:
    """A record's leading primitive fields (read here) and the rest (its tail, read by the compiled reader or fastavro,
    and cached)."""

    def __init__(self, sv: SchemaVersion) -> None:
        self.name = sv.name
        self.header = MARKER + sv.fingerprint
        fields = sv.parsed["fields"]
        self.fields: list[tuple[str, int, tuple]] = []
        for f in fields:
            t = f["type"]
            if isinstance(t, str) and t in _KINDS:
                self.fields.append((f["name"], _KINDS[t], ()))
            elif isinstance(t, dict) and t.get("type") == "enum":
                self.fields.append((f["name"], ENUM, tuple(t["symbols"])))
            else:
                break
        rest = fields[len(self.fields):]
        self.tail = fastavro.parse_schema({"type": "record", "name": f"{sv.name}Tail", "fields": rest},
                                          named_schemas={}) if rest else None
        self.tail_fields = [f["name"] for f in rest]
        # the whole body in one compiled call per batch where the codec is built; else numpy heads and cached tails
        names = [f["name"] for f in fields]
        cached = CACHED_TAIL.get(sv.name.rsplit(".", 1)[-1])
        tail_from = names.index(cached) if cached in names else None
        self.read_each = avro_fast.batch_reader_for(sv.parsed, tail_from, MAX_TAILS, MAX_TAIL_BYTES)
        # None: fastavro reads every new tail
        self.read_tail = avro_fast.reader_for(self.tail) if self.tail is not None else None
        # a new tail's ints are checked once, in a record whose head (checked for every message) is zeros
        self.ints_fit = sv.ints_fit
        self.zero_head = {name: (symbols[0] if kind == ENUM else "" if kind == STRING else 0)
                          for name, kind, symbols in self.fields}
        self.tails: dict[bytes, dict] = {}
        # the record as one dict display (the fastest way to build a dict of known keys), from the head's values
        # and the tail's dict
        args = ", ".join(f"f{i}" for i in range(len(self.fields)))
        items = ", ".join(f"{name!r}: f{i}" for i, (name, _, _) in enumerate(self.fields))
        self.build = eval(f"lambda {args}, tail: {{{items}, **tail}}")  # noqa: S307 - built from the schema's names


def _varints(rows: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The zigzag varints at `pos` (int64), their lengths, and which are valid (ended within 10 bytes, fit 64 bits).
    `rows`: the buffer's sliding window of 10 bytes, so row `pos` is the 10 bytes from there."""
    b = rows[pos]
    ends = b < 0x80
    length = ends.argmax(axis=1) + 1
    ok = ends.any(axis=1)
    width = int(length.max()) if len(length) else 1
    if width == 10:
        ok &= (length < 10) | (b[:, 9] <= 1)
    b = b[:, :width]
    keep = _COLS[:width] < length[:, None]
    u = (((b & 0x7F).astype(np.uint64) << _SHIFTS[:width]) * keep).sum(axis=1, dtype=np.uint64)
    value = ((u >> np.uint64(1)) ^ (np.uint64(0) - (u & np.uint64(1)))).view(np.int64)
    return value, length, ok


class BatchDecoder:
    """Decodes a batch's gpu.launches and gpu.kernels messages (a stage's `decode_batch`)."""

    def __init__(self, compiled: bool = True) -> None:
        """compiled=False: the numpy path even where the compiled codec is built (for tests of that path)."""
        reg = single_object.default_registry()
        self.layouts = {name: _Layout(reg.latest(name)) for name in ("GpuLaunch", "GpuKernel")}
        if not compiled:
            for lay in self.layouts.values():
                lay.read_each = None
        self.strings: dict[bytes, str] = {}

    def decode(self, stage: str, raws: Sequence, expect: dict[str, str], max_bytes: int) -> list[Message | Produced]:
        """Every raw message decoded (or its dead letter), in order."""
        out: list[Message | Produced | None] = [None] * len(raws)
        groups: dict[str, list[int]] = {}
        layouts = self.layouts
        for i, raw in enumerate(raws):
            value = raw.value()
            want = expect.get(raw.topic())
            lay = layouts.get(want) if want else None
            if lay is None or value is None or len(value) > max_bytes or not value.startswith(lay.header):
                out[i] = decode_message(stage, raw, expect, max_bytes)
            else:
                groups.setdefault(want, []).append(i)
        for name, idx in groups.items():
            lay = layouts[name]
            if lay.read_each is not None:
                self._compiled(stage, lay, [raws[i] for i in idx], idx, out, expect, max_bytes)
            else:
                self._group(stage, lay, [raws[i] for i in idx], idx, out, expect, max_bytes)
        return out  # type: ignore[return-value]

    @staticmethod
    def _compiled(stage: str, lay: _Layout, raws: list, idx: list[int], out: list, expect: dict[str, str],
                  max_bytes: int) -> None:
        """The group's bodies read by the compiled reader in one call; what it is unsure of goes one by one."""
        values = [r.value() for r in raws]
        name = lay.name
        for k, record in enumerate(lay.read_each(values, HEADER_LEN)):
            raw = raws[k]
            if record is None:
                out[idx[k]] = decode_message(stage, raw, expect, max_bytes)
            else:
                out[idx[k]] = Message(raw.topic(), raw.partition(), raw.offset(), raw.key(), name, record, values[k])

    def _group(self, stage: str, lay: _Layout, raws: list, idx: list[int], out: list, expect: dict[str, str],
               max_bytes: int) -> None:
        values = [r.value() for r in raws]
        n = len(values)
        sizes = np.fromiter(map(len, values), dtype=np.int64, count=n)
        starts = np.zeros(n, dtype=np.int64)
        np.cumsum(sizes[:-1], out=starts[1:])
        ends = starts + sizes
        buf = np.frombuffer(b"".join(values) + bytes(16), dtype=np.uint8)
        rows = np.lib.stride_tricks.sliding_window_view(buf, 10)
        pos = starts + HEADER_LEN
        ok = np.ones(n, dtype=bool)
        cols: list[list] = []
        strings: list[tuple[int, np.ndarray, np.ndarray]] = []  # (column, start, length)
        for _, kind, symbols in lay.fields:
            pos = np.minimum(pos, ends)  # a message already past its end reads its own padding: flagged below
            if kind == BOOL:
                v = buf[pos]
                ok &= v <= 1
                cols.append((v == 1).tolist())
                pos = pos + 1
                continue
            v, length, good = _varints(rows, pos)
            ok &= good
            pos = pos + length
            if kind == INT:
                ok &= (v >= -(1 << 31)) & (v < (1 << 31))
                cols.append(v.tolist())
            elif kind == LONG:
                cols.append(v.tolist())
            elif kind == ENUM:
                ok &= (v >= 0) & (v < len(symbols))
                cols.append([symbols[k] if 0 <= k < len(symbols) else "" for k in v.tolist()])
            else:
                ok &= (v >= 0) & (pos + v <= ends)
                strings.append((len(cols), pos.copy(), v))
                cols.append([])
                pos = pos + np.maximum(v, 0)
        ok &= pos <= ends
        if lay.tail is None:
            ok &= pos == ends
        data = bytes(buf)  # one bytes object to slice the strings and tails from
        memo = self.strings
        good = ok.tolist()
        for c, s, length in strings:
            col = cols[c]
            if not length.any():  # an empty string throughout (no NVTX range, a kernel's copy kinds): no loop
                cols[c] = [""] * n
                continue
            for k, (a, m) in enumerate(zip(s.tolist(), length.tolist(), strict=True)):
                if not good[k]:
                    col.append("")
                    continue
                raw = data[a:a + m]
                text = memo.get(raw)
                if text is None:
                    try:
                        text = raw.decode()
                    except UnicodeDecodeError:
                        good[k] = False
                        col.append("")
                        continue
                    if len(memo) > MAX_TAILS:
                        memo.clear()
                    memo[raw] = text
                col.append(text)
        tails = self._tails(lay, data, pos.tolist(), ends.tolist(), good) if lay.tail is not None else [{}] * n
        build, name = lay.build, lay.name
        items = zip(raws, values, good, tails, zip(*cols, strict=True), strict=True)
        for k, (raw, value, ok_k, tail, fields) in enumerate(items):
            if ok_k:
                out[idx[k]] = Message(raw.topic(), raw.partition(), raw.offset(), raw.key(), name,
                                      build(*fields, tail), value)
            else:
                out[idx[k]] = decode_message(stage, raw, expect, max_bytes)

    def _tails(self, lay: _Layout, data: bytes, pos: list[int], ends: list[int], good: list[bool]) -> list:
        """Each message's tail fields, decoded once per distinct bytes; a bad one marks its message for the slow
        path."""
        cache = lay.tails
        out: list = []
        for k, (a, b) in enumerate(zip(pos, ends, strict=True)):
            if not good[k]:
                out.append(None)
                continue
            raw = data[a:b]
            tail = cache.get(raw)
            if tail is None:
                tail = self._tail(lay, raw)
                if tail is None or (
                        lay.ints_fit is not None and not lay.ints_fit({**lay.zero_head, **tail})):
                    good[k] = False
                    out.append(None)
                    continue
                if len(raw) <= MAX_TAIL_BYTES:  # as the compiled path: a launch carrying mappings seldom repeats
                    if len(cache) >= MAX_TAILS:
                        cache.clear()
                    cache[raw] = tail
            out.append(tail)
        return out

    @staticmethod
    def _tail(lay: _Layout, raw: bytes) -> dict | None:
        """The tail record filling `raw` exactly, None where it does not."""
        if lay.read_tail is not None:
            try:
                return lay.read_tail(raw, 0)
            except ValueError:
                pass  # the compiled reader decides nothing: fastavro reads it
        fo = io.BytesIO(raw)
        try:
            tail = fastavro.schemaless_reader(fo, lay.tail, None)
        except Exception:  # noqa: BLE001 - the slow path says what is wrong with it
            return None
        return tail if fo.tell() == len(raw) else None


__all__ = ["BatchDecoder"]
