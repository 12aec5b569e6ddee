"""An embedded store's insert cut in half: the newest deduplication record of a table naming a part that is not there.

A MergeTree table with non_replicated_deduplication_window writes each inserted block's id to its
deduplication_logs/ and then renames the block's part into place. chDB runs inside the sink's process, so a sink
killed between the two leaves a record without its part; the same token inserted again is then dropped as a
duplicate of nothing, and the rows are lost (tests/test_faults_kill.py caught it, 1 run in a few). A server finishes
or cancels an insert whatever happens to its client, so only an embedded store can be left so.

Only the newest record of a table matters: the sink writes an interrupted batch again before anything after it, so
if that batch's insert into the table had left a part, its record would be the newest and its part there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

ADD = "1"  # MergeTreeDeduplicationOp: 1 a part added, 2 a part dropped
LOG_DIR = "deduplication_logs"


class StoreQueries(Protocol):
    database: str

    def query_store(self, name: str, params: dict) -> tuple[list[str], list[tuple]]: ...


def newest_record(log_dir: Path) -> tuple[str, str] | None:
    """(operation, part name) of the last record in the newest non-empty log file of `log_dir`, or None."""
    files = sorted(log_dir.glob("deduplication_log_*.txt"), key=lambda p: int(p.stem.rsplit("_", 1)[1]))
    for path in reversed(files):
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        if lines:
            operation, part, *_ = lines[-1].split("\t")
            return operation, part
    return None


def lost_part(store: StoreQueries, table: str) -> str | None:
    """The part `table`'s newest deduplication record adds when no active part holds its block; None otherwise."""
    _, rows = store.query_store("table_data_paths", {"database": store.database, "table": table})
    if not rows:
        return None
    for path in rows[0][0]:
        record = newest_record(Path(path) / LOG_DIR)
        if record is None or record[0] != ADD:
            continue
        part = record[1]
        partition, block = part.split("_")[:2]  # partition_minblock_maxblock_level[_mutation]
        _, held = store.query_store("parts_holding_block", {"database": store.database, "table": table,
                                                            "partition": partition, "block": int(block)})
        if not held[0][0]:
            return part
    return None
