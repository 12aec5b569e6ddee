"""Which data of a range came from a simulated source, per kind and node (sql/queries/simulated_sources.sql), and
the one line people read about it. Labels follow the data: a real eBPF CPU profile on a node whose GPU is simulated
is not called simulated, and simulated GPU readings always are."""

from __future__ import annotations

from datetime import datetime

from fleetprof.query_client import QueryTarget

# what each kind is, and where its simulated rows came from
SOURCES = {
    "cpu": ("CPU samples", "fleetprof loadgen's simulated fleet"),
    "gpu": ("GPU kernel times", "fleetprof's simulated GPU library"),
    "nvml": ("GPU readings", "fleetprof's simulated NVML library"),
}
NODES_NAMED = 5  # a line names this many nodes, then counts the rest


def simulated_sources(target: QueryTarget, since: datetime, until: datetime, node: str = "") -> dict[str, list[str]]:
    """kind ('cpu', 'gpu', 'nvml') -> the nodes whose data of that kind in [since, until) was simulated."""
    _, rows = target.named("simulated_sources", {"since": since, "until": until, "node": node})
    found: dict[str, list[str]] = {}
    for kind, name in rows:
        found.setdefault(str(kind), []).append(str(name))
    return found


def simulated_line(kind: str, nodes: list[str]) -> str:
    """'SIMULATED: GPU kernel times from node sim-node-1 come from fleetprof's simulated GPU library'."""
    what, source = SOURCES[kind]
    named = ", ".join(nodes[:NODES_NAMED]) + (f" and {len(nodes) - NODES_NAMED} more" if len(nodes) > NODES_NAMED
                                              else "")
    return f"SIMULATED: {what} from node{'s' if len(nodes) > 1 else ''} {named} come from {source}"
