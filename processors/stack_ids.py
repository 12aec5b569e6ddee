"""Stable 64-bit ids for frames and stacks, so the same code path gets the same id on every processor and day."""

from __future__ import annotations

import hashlib
import struct


def _as_signed(digest: bytes) -> int:
    # Avro longs and ClickHouse UInt64 share bits; keep the signed view inside Python records.
    return struct.unpack("<q", digest)[0]


def frame_id(function: str, binary: str, kind: str) -> int:
    """Id of one symbolized frame (function in binary); signed 64-bit view of the hash."""
    h = hashlib.blake2b(digest_size=8, person=b"fp-frame")
    h.update(kind.encode())
    h.update(b"\0")
    h.update(binary.encode())
    h.update(b"\0")
    h.update(function.encode("utf-8", "surrogatepass"))
    return _as_signed(h.digest())


def stack_id(frame_ids: tuple[int, ...] | list[int]) -> int:
    """Id of a stack from its frame ids, root first."""
    h = hashlib.blake2b(digest_size=8, person=b"fp-stack")
    h.update(struct.pack(f"<{len(frame_ids)}q", *frame_ids))
    return _as_signed(h.digest())
