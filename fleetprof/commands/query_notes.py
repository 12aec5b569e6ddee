"""The lines on stderr that go with a profile query's rows: why a result is empty (naming the values a filter could
have taken), and which of the data shown comes from a simulated source."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

from fleetprof.query_client import QueryError, QueryTarget
from fleetprof.simulated_sources import simulated_line, simulated_sources
from fleetprof.workload_filters import WORKLOAD_FILTERS, workload_text

KNOWN_SHOWN = 20  # values named at the most, the busiest first
# what each source's data is, in "no ... from <since> to <until>"
WHAT = {"cpu": "CPU samples", "gpu": "GPU kernel time", "nvml": "GPU metrics"}
# a filter's parameter -> its value meaning "no filter", and how a value reads in a message
_UNSET: dict[str, Any] = {"node": "", "pid": 0, "comm": "", "gpu": -1}
_QUOTED = {"node", "comm"}
_NAMES = {"node": "node", "pid": "pid", "comm": "comm", "gpu": "GPU"}


def listed(values: Sequence[str], total: int | None = None) -> str:
    """'a, b, c', and ', …and N more' where `total` (default: len(values)) is more than the names given."""
    total = len(values) if total is None else total
    text = ", ".join(values) if values else "none"
    return f"{text}, …and {total - len(values)} more" if total > len(values) else text


def _shown(field: str, value: Any) -> str:
    return f"{_NAMES[field]} {value!r}" if field in _QUOTED else f"{_NAMES[field]} {value}"


def why_empty(target: QueryTarget, source: str, start: datetime, end: datetime, filters: dict[str, Any],
              what: str | None = None) -> str:
    """Why a query of `source` ('cpu', 'gpu', 'nvml') over [start, end) with these filters (node, pid, comm, gpu;
    unset: None, '', 0, -1; the workload filters, named in the message when given) found nothing, for "0 rows: …":
    the filters that name nothing in the range, with the values they could take (the busiest first, at most
    KNOWN_SHOWN), else that there is no `what` (default: the source's data) in the range with those filters, or none
    at all."""
    given = {k: v for k, v in filters.items() if k in _UNSET and v is not None and v != _UNSET[k]}
    workload = workload_text({k: filters.get(k) or "" for k in WORKLOAD_FILTERS})
    nothing = f"no {what or WHAT[source]} from {start.isoformat()} to {end.isoformat()}"
    if workload:
        nothing = f"{nothing} for {workload}"
    if not given:
        return nothing
    params = {"since": start, "until": end, "source": source, "limit": KNOWN_SHOWN,
              **{k: given.get(k, unset) for k, unset in _UNSET.items()}}
    _, rows = target.named("known_filter_values", params)
    known: dict[str, list[str]] = {}
    counts: dict[str, int] = {}
    for field, value, _busy, count in rows:
        known.setdefault(field, []).append(value)
        counts[field] = int(count)
    if not known.get("node"):
        return nothing
    missing = [f for f in given if str(given[f]) not in known.get(f, [])]
    if "node" in missing:  # the other fields' values are those of the given node: none
        missing = ["node"]
    if not missing:
        return f"{nothing} with {' and '.join(_shown(f, v) for f, v in given.items())}"
    where = f" on node {given['node']}" if "node" in given and missing != ["node"] else ""
    return "; ".join(f"no {_shown(f, given[f])}{where} in this range (known: {listed(known.get(f, []), counts.get(f))})"
                     for f in missing)


def simulated_note(target: QueryTarget, kind: str, start: datetime, end: datetime, node: str | None,
                   shown: Collection[str] | None = None) -> str | None:
    """'SIMULATED: …' where data of `kind` ('cpu', 'gpu', 'nvml') over [start, end) on `node` (None: all) came from a
    simulated source, naming its nodes (only those in `shown`, where the rows say which nodes they show); None where
    none did, or where the store cannot say (no such query there)."""
    try:
        nodes = simulated_sources(target, start, end, node or "").get(kind, [])
    except QueryError:
        return None
    nodes = [n for n in nodes if shown is None or n in shown]
    return simulated_line(kind, nodes) if nodes else None
