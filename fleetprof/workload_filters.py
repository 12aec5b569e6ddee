"""The workload filters and groupings that the CLI, the API, the web UI and the cost report share.

Filters: namespace, pod, job, container ('' = no filter), the named queries' parameters of the same names
(sql/parts/workload_match.sql holds what each takes). Groupings: the `by` of the per-workload queries
(sql/parts/workload_keys.sql)."""

from __future__ import annotations

WORKLOAD_FILTERS = ("namespace", "pod", "job", "container")
WORKLOAD_BY = ("namespace", "pod", "job", "team", "container")
UNATTRIBUTED = "unattributed"  # how a workload '' reads: no identity (an older agent), or none with that field


def workload_text(workload: dict[str, str]) -> str:
    """The given filters as words for messages: "pod 'ml/train-0' and job '4242'" ('' when none)."""
    return " and ".join(f"{name} {value!r}" for name, value in workload.items() if value)
