"""A process's id in the sample tables (migration 0025): the first 8 bytes of MD5(comm NUL container_id NUL
identity), little-endian, as the migration computes it in SQL for the rows it copies. The strings are stored once,
in process_names; the sample rows carry the id."""

from __future__ import annotations

from functools import lru_cache
from hashlib import md5

# process_names (migration 0025): a process's strings, written before the first sample rows that carry its id
PROCESS_NAME_COLUMNS = ["proc_id", "comm", "container_id", "identity", "last_seen"]
# the SQL the migration copies existing rows with; tests/test_process_ids.py checks both agree
PROCESS_ID_SQL = "reinterpretAsUInt64(MD5(concat(comm, '\\0', container_id, '\\0', identity)))"


@lru_cache(maxsize=1 << 16)  # a node's window repeats a few dozen processes on its hundreds of rows
def process_id(comm: str, container_id: str, identity: str) -> int:
    """The id of a process's (comm, container_id, identity)."""
    return int.from_bytes(md5(f"{comm}\0{container_id}\0{identity}".encode()).digest()[:8], "little")


def process_ids(comms: list[str], container_ids: list[str],
                identities: list[str]) -> tuple[list[int], list[list]]:
    """The ids of rows given as columns, and the names of each id once: [proc_id, comm, container_id, identity]."""
    ids = list(map(process_id, comms, container_ids, identities))
    first = dict(zip(ids, zip(comms, container_ids, identities, strict=True), strict=True))
    return ids, [[i, *names] for i, names in first.items()]


# the tables that store proc_id in place of the strings, which they read back as ALIAS columns
NAMED_TABLES = frozenset({"cpu_samples", "gpu_kernel_samples", "cpu_samples_1h", "gpu_kernel_samples_1h"})
NAME_COLUMNS = ("comm", "container_id", "identity")


def rows_with_process_ids(rows: list, columns: list[str],
                          column_oriented: bool = False) -> tuple[list, list[str], list[list]]:
    """Rows of a NAMED_TABLES table given with their process's strings (any of NAME_COLUMNS; one not given is ''),
    as the table stores them: proc_id in place of the strings. Returns the rows, their columns and the names rows
    (proc_id, comm, container_id, identity) of their ids."""
    at = {c: columns.index(c) for c in NAME_COLUMNS if c in columns}
    kept = [i for i, c in enumerate(columns) if c not in at]
    by_column = [list(c) for c in rows] if column_oriented else [list(c) for c in zip(*rows, strict=True)]
    if not by_column:
        by_column = [[] for _ in columns]
    n = len(by_column[0])
    ids, names = process_ids(*(by_column[at[c]] if c in at else [""] * n for c in NAME_COLUMNS))
    out = [*(by_column[i] for i in kept), ids]
    stored = out if column_oriented else [list(r) for r in zip(*out, strict=True)]
    return stored, [*(columns[i] for i in kept), "proc_id"], names
