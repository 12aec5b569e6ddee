"""Evidence for GPU alerts: the top CPU stacks of the GPU's processes during the drop, read from the store.

The alerter gets these through a query callable (a fleetprof.query_client target's `named`), the way the symbolizer
gets symbol tables from debuginfod: a side input that must never stop the stream. A failed look-up gives an alert
without evidence and says why in its message.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

log = logging.getLogger("fleetprof.alerts")
QUERY = "alert_evidence"
Query = Callable[[str, dict[str, Any]], tuple[list[str], list[list[Any]]]]


def _time(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC)


def _folded(functions: list[str]) -> str:
    return ";".join(f.replace(";", ":").replace("\n", " ") for f in functions)


class AlertEvidence:
    """Top CPU stacks of given processes of a node over a time range, as Alert.evidence entries."""

    def __init__(self, query: Query, limit: int = 10, window_s: int = 10) -> None:
        self.query = query
        self.limit = limit
        self.window_s = window_s  # the agents' reporting window: cpu_samples rows are stamped with its start

    def top_stacks(self, node: str, pids: list[int], since_ns: int, until_ns: int) -> tuple[list[dict], str]:
        """(evidence entries, '' or a one-line reason there is none)."""
        if not pids:
            return [], "NVML listed no processes on this GPU"
        params = {"node": node, "pids": json.dumps(sorted(pids)), "since": _time(since_ns),
                  "until": _time(until_ns), "limit": self.limit, "window_s": self.window_s}
        try:
            columns, rows = self.query(QUERY, params)
        except Exception as exc:  # noqa: BLE001 - any failure of the side input leaves the alert without evidence
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            log.warning("no evidence for %s pids %s: %s", node, pids, reason)
            return [], f"evidence unavailable: {reason}"
        if not rows:
            return [], "no CPU samples of the GPU's processes in the store for this time yet"
        at = {name: i for i, name in enumerate(columns)}
        return [{"pid": int(r[at["pid"]]), "comm": str(r[at["comm"]]), "folded_stack": _folded(r[at["functions"]]),
                 "count": int(r[at["count"]])} for r in rows], ""
