"""An embedded store's insert cut in half: the newest deduplication record of a table naming a part that is not there.

A MergeTree table with non_replicated_deduplication_window writes each inserted block's id to its
deduplication_logs/ and then renames the block's part into place. chDB runs inside the sink's process, so a sink
killed between the two leaves a record without its part; the same token inserted again is then dropped as a
duplicate of nothing, and the rows are lost (tests/test_faults_kill.py caught it, 1 run in a few). A server finishes
or cancels an insert whatever happens to its client, so only an embedded store can be left so.

Only the newest record of a table matters: the sink writes an interrupted batch again before anything after it, so
if that batch's insert into the table had left a part, its record would be the newest and its part there.

A materialized view's target (the hourly rollups, the 10 s NVML aggregates) is written in the same insert, after its
source, record then part, and its block carries a token derived from the source's; the source's own token reaches
the views even where the source drops it. So insert_again writes the batch's own token first, always: views the
first attempt never reached get the rows under the token every later attempt brings again. Cut in the source, the
source then gets the rows with its views detached, under a token of the lost part; cut in a view's target, the rows
go through a copy of that one view reading a Null table, under a token of the target's lost part.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from fleetprof.store_statements import store_sql

log = logging.getLogger("fleetprof.store")
ATTACH_TRIES = 5  # a view detached for a repair is attached again this many times before the sink gives up
ADD = "1"  # MergeTreeDeduplicationOp: 1 a part added, 2 a part dropped
LOG_DIR = "deduplication_logs"


class NotReplayable(ValueError):
    """A view whose SELECT does not read its source as one plain `FROM database.table` (a join, a subquery)."""


class StoreQueries(Protocol):
    database: str

    def query_store(self, name: str, params: dict) -> tuple[list[str], list[tuple]]: ...

    def query_sql(self, sql: str, params: dict | None = None, *, readonly: bool = True) -> tuple[list, list]: ...


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


def views_reading(store: StoreQueries, table: str) -> list[tuple[str, str, str]]:
    """(view, its SELECT, its target) of each materialized view reading `table`."""
    return store.query_store("views_reading_table", {"database": store.database, "table": table})[1]


def views_cut_short(store: StoreQueries, views: list[tuple[str, str, str]]) -> list[tuple[str, str, str, str]]:
    """(view, its SELECT, its target, the lost part) of each of `views` (views_reading's) whose target's newest
    deduplication record names a part that is not there."""
    found = []
    for view, select, target in views:
        part = lost_part(store, target)
        if part is not None:
            found.append((view, select, target, part))
    return found


def through_view(store: StoreQueries, table: str, view: str, select: str, target: str,
                 insert: Callable[[str], None]) -> None:
    """Run insert(replay table) with a copy of `view` the only reader of a Null table shaped as `table`: the rows
    reach the view's target and nothing else. The copy reads the replay table where the view reads `table`."""
    replay, copy = f"{table}_replay", f"{view}_replay"
    source = re.compile(rf"\bFROM {re.escape(store.database)}\.{re.escape(table)}\b")
    if len(source.findall(select)) != 1:
        raise NotReplayable(f"view {view} does not read {table} once as FROM {store.database}.{table}: not replayed")
    with_replay = source.sub(f"FROM {store.database}.{replay}", select)

    _ddl(store, "replay_table_create", {"replay": replay, "source": table})
    try:
        # as_select is the server's own text of a view the migrations made, not a value: it cannot be a parameter
        _ddl(store, "replay_view_create", {"view": copy, "target": target}, "\n" + with_replay)
        insert(replay)
    finally:
        _drop_copies(store, table, [view])


def _drop_copies(store: StoreQueries, table: str, views: list[str]) -> None:
    """The replay table of `table` and the copies of `views` over it, where a repair left them."""
    for view in views:
        _ddl(store, "replay_view_drop", {"view": f"{view}_replay"})
    _ddl(store, "replay_table_drop", {"replay": f"{table}_replay"})


def _ddl(store: StoreQueries, name: str, params: dict[str, str], tail: str = "") -> None:
    store.query_sql(store_sql(name) + tail, params, readonly=False)


def insert_again(store: StoreQueries, table: str, token: str, insert: Callable[[str, str], None]) -> list[str]:
    """Write an interrupted batch's rows of `table` again with insert(table, token), so that they are in `table` and
    in every view's target once, wherever a death cut the attempts before; returns what was repaired. The tokens of
    repairs name the lost part: while its record is the newest they are the same on every attempt, and once a
    repair landed the next attempt's own token is dropped everywhere (by the lost record, or the views' copies)."""
    repaired = []
    views = views_reading(store, table)
    # a repair that a death cut short leaves its replay table and view copies: they go before anything else
    _drop_copies(store, table, [view for view, _, _ in views])
    lost = lost_part(store, table)
    insert(table, token)
    if lost is not None:
        with _views_detached(store, [view for view, _, _ in views]):
            insert(table, f"{token}:after:{lost}")
        repaired.append(f"{table} (part {lost})")
    for view, select, target, part in views_cut_short(store, views):
        try:
            suffix = f":{view}:after:{part}"
            through_view(store, table, view, select, target, lambda replay, s=suffix: insert(replay, token + s))
        except NotReplayable as exc:  # every attempt would fail alike: the batch goes on without these rows there
            log.error("%s: the rows of part %s of %s are lost to it", exc, part, target)
            continue
        repaired.append(f"{target} (part {part}, through {view})")
    return repaired


@contextmanager
def _views_detached(store: StoreQueries, views: list[str]) -> Iterator[None]:
    """`views` detached from their source for the block: a process that dies inside finds them attached again."""
    detached = []
    try:
        for view in views:
            _ddl(store, "view_detach", {"view": view})
            detached.append(view)
        yield
    finally:
        for view in detached:
            for attempt in range(ATTACH_TRIES):  # left detached, the view would miss every later batch
                try:
                    _ddl(store, "view_attach", {"view": view})
                    break
                except Exception:
                    if attempt == ATTACH_TRIES - 1:
                        log.error("view %s could not be attached again: restart the sink to attach it", view)
                        raise
                    time.sleep(0.5)
