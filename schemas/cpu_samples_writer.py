"""A fast writer of CpuSamples records (the symbolize stage's output), byte for byte what fastavro writes: the
stacks' frame ids as one vectorized varint pass, each process's sample fields (pid, comm, container, identity)
encoded once and kept, the small fields by hand. Anything it does not expect (a missing or extra field, a value
of another type, an int outside 32 bits) makes it give up, and `single_object.encode_as` uses fastavro instead.

Importing this module registers it with `single_object`.
"""

from __future__ import annotations

import numpy as np

from schemas import single_object
from schemas.cpu_batch_writer import long_bytes, varints

_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1
_FIELDS = ("node", "window_start_ns", "window_ns", "frames", "stacks", "samples", "simulated", "frequency_hz")
_FRAME = ("frame_id", "function", "binary", "kind", "build_id")
_STACK = ("stack_id", "frame_ids")
_SAMPLE = ("pid", "comm", "container_id", "identity_id", "stack_id", "count")
_KINDS = {k: long_bytes(i) for i, k in enumerate(("NATIVE", "KERNEL", "INTERPRETED", "UNKNOWN"))}
_SMALL = [long_bytes(i) for i in range(64)]  # most counts
_MAX_KEPT = 100_000
_heads: dict[tuple, bytes] = {}  # (pid, comm, container_id, identity_id) -> their bytes
_longs: dict[int, bytes] = {}  # stack id -> its bytes


class _Unexpected(Exception):
    pass


def _string(s: str) -> bytes:
    if type(s) is not str:
        raise _Unexpected
    b = s.encode()
    return long_bytes(len(b)) + b


def _long(v: int) -> bytes:
    if type(v) is not int or not -(1 << 63) <= v < 1 << 63:
        raise _Unexpected
    return _SMALL[v] if 0 <= v < 64 else long_bytes(v)


def _array(items: list, encode) -> bytes:
    if type(items) is not list:
        raise _Unexpected
    if not items:
        return b"\0"
    return long_bytes(len(items)) + encode(items) + b"\0"


def _frames(frames: list[dict]) -> bytes:
    out = []
    for f in frames:
        if tuple(f) != _FRAME or f["kind"] not in _KINDS:
            raise _Unexpected
        out += [_long(f["frame_id"]), _string(f["function"]), _string(f["binary"]), _KINDS[f["kind"]],
                _string(f["build_id"])]
    return b"".join(out)


def _stacks(stacks: list[dict]) -> bytes:
    vals: list[int] = []
    for s in stacks:
        ids = s["frame_ids"]
        if tuple(s) != _STACK or type(ids) is not list:
            raise _Unexpected
        vals.append(s["stack_id"])
        vals.append(len(ids))
        if ids:
            vals += ids
            vals.append(0)
    if any(type(v) is not int or not -(1 << 63) <= v < 1 << 63 for v in vals):
        raise _Unexpected
    data, _ = varints(np.array(vals, dtype=np.int64))
    return data.tobytes()


def _samples(samples: list[dict]) -> bytes:
    heads, longs = _heads, _longs
    if len(heads) > _MAX_KEPT or len(longs) > _MAX_KEPT:
        heads.clear()
        longs.clear()
    out = []
    for s in samples:
        if tuple(s) != _SAMPLE:
            raise _Unexpected
        key = (s["pid"], s["comm"], s["container_id"], s["identity_id"])
        head = heads.get(key)
        if head is None:
            pid = s["pid"]
            if type(pid) is not int or not _INT_MIN <= pid <= _INT_MAX or type(key[3]) is not int:
                raise _Unexpected
            head = heads[key] = _long(pid) + _string(key[1]) + _string(key[2]) + _long(key[3])
        sid = s["stack_id"]
        sb = longs.get(sid)
        if sb is None:
            sb = longs[sid] = _long(sid)
        out += [head, sb, _long(s["count"])]
    return b"".join(out)


def encode_cpu_samples(record: dict) -> bytes | None:
    """The Avro body of a CpuSamples record as fastavro writes it, or None when the record is not as expected."""
    try:
        if tuple(record) != _FIELDS and tuple(sorted(record)) != tuple(sorted(_FIELDS)):
            return None
        freq, simulated = record["frequency_hz"], record["simulated"]
        if type(freq) is not int or not _INT_MIN <= freq <= _INT_MAX or type(simulated) is not bool:
            return None
        return b"".join((_string(record["node"]), _long(record["window_start_ns"]), _long(record["window_ns"]),
                         _array(record["frames"], _frames), _array(record["stacks"], _stacks),
                         _array(record["samples"], _samples), b"\1" if simulated else b"\0", _long(freq)))
    except (_Unexpected, KeyError, TypeError, ValueError):
        return None


single_object.register_fast_writer("fleetprof.CpuSamples", encode_cpu_samples)
