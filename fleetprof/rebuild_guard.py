"""A migration that rebuilds a table (a copy filled from it or given its parts, exchanged for it: 0019-0023) does
not run over an unfinished sink batch. The sink that resumes such a batch writes it again whole, and each table drops
the inserts it has seen by their deduplication tokens; a rebuilt table's deduplication log starts empty, so it would
hold the rows that batch wrote before the stop twice."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

REBUILD_RE = re.compile(r"^\s*EXCHANGE\s+TABLES\b", re.IGNORECASE | re.MULTILINE)
ALLOW_ENV = "FLEETPROF_MIGRATE_DESPITE_UNFINISHED"  # =1: run it anyway, accepting those rows twice


def rebuild_refusal(client: Any, migration: str, statements: list[str], store_sql: Callable[[str], str]) -> str:
    """Why `migration` must not run now (one line), '' when it may: it rebuilds no table, the store has no sink
    state yet, no sink batch is unfinished, or ALLOW_ENV says to go on."""
    if not any(REBUILD_RE.search(st) for st in statements) or os.environ.get(ALLOW_ENV) == "1":
        return ""
    if not client.query(store_sql("table_present"), parameters={"name": "sink_state"}).result_rows[0][0]:
        return ""
    batches = client.query(store_sql("sink_batches"), parameters={"topics": []}).result_rows
    rows = sorted((topic, part, lo, hi) for topic, part, lo, hi, state, _ in batches if state == "BEFORE")
    if not rows:
        return ""
    where = ", ".join(f"{topic} partition {part} offsets {lo}-{hi}" for topic, part, lo, hi in rows[:5])
    more = f" and {len(rows) - 5} more" if len(rows) > 5 else ""
    return (f"migration {migration} rebuilds tables and a sink batch is unfinished ({where}{more}): the rebuilt "
            f"tables would hold its rows twice once a sink writes it again. Start the sink of the version that "
            f"began it (it finishes the batch by itself), stop it, then upgrade; or set {ALLOW_ENV}=1 to accept that")
