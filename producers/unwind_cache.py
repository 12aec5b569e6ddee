"""Unwind tables kept on disk by build id: a binary's table is compiled once per machine, not once per process.

A file is `<folder>/<build_id>.unwind`: a header (magic, format version, row count, CRC-32 of what follows), the
stats as JSON, the packed rows. It is written to a temporary file and renamed over the old one, so a reader sees a
whole file or none; one that does not check out (another version, cut short, bit rot) is compiled again and
replaced, never used.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import struct
import tempfile
import zlib
from pathlib import Path

from producers.unwind_tables import ROW, UnwindTable, compile_unwind_table

MAGIC = b"FPUNWIND"
VERSION = 2  # raise when the row format, or what the rules mean, changes
_HEADER = struct.Struct("<8sIIQI")  # magic, version, stats length, row count, crc32 of the rest
_SAFE_ID = re.compile(r"[0-9A-Za-z_:-]{1,128}")


class UnwindTableCache:
    """`get(build_id, path)`: the table from disk, else compiled from the file and stored. Counts what it did."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        # rejected: files on disk that did not check out; store_errors: tables that could not be written (still used)
        self.builds = self.disk_hits = self.rejected = self.store_errors = 0

    def path_for(self, build_id: str) -> Path:
        # build ids come from the binaries themselves: one that is not a plain token is hashed, never used as a path
        name = build_id if _SAFE_ID.fullmatch(build_id) else hashlib.sha256(build_id.encode()).hexdigest()
        return self.folder / f"{name}.unwind"

    def get(self, build_id: str, path: str | os.PathLike) -> UnwindTable:
        stored = self.path_for(build_id)
        table = self._load(stored)
        if table is not None:
            self.disk_hits += 1
            return table
        table = compile_unwind_table(path)
        self.builds += 1
        try:
            self._store(stored, table)
        except OSError:
            self.store_errors += 1
        return table

    def _load(self, stored: Path) -> UnwindTable | None:
        try:
            data = stored.read_bytes()
        except OSError:
            return None
        if len(data) < _HEADER.size:
            self.rejected += 1
            return None
        magic, version, stats_len, count, crc = _HEADER.unpack_from(data)
        body = memoryview(data)[_HEADER.size:]
        if magic != MAGIC or version != VERSION or len(body) != stats_len + count * ROW.size \
                or zlib.crc32(body) != crc:
            self.rejected += 1
            return None
        try:
            stats = json.loads(bytes(body[:stats_len]))
        except ValueError:
            stats = None
        if not isinstance(stats, dict):
            self.rejected += 1
            return None
        return UnwindTable(bytes(body[stats_len:]), stats)

    def _store(self, stored: Path, table: UnwindTable) -> None:
        stats = json.dumps(table.stats, sort_keys=True).encode()
        body = stats + table.rows
        header = _HEADER.pack(MAGIC, VERSION, len(stats), table.count, zlib.crc32(body))
        self.folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{stored.name}.", dir=self.folder)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(header)
                f.write(body)
            # no fsync: a file cut short by a crash fails its CRC and is compiled again
            os.replace(tmp, stored)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
