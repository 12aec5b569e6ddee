"""GPU cost over a time range: GPU-hours split into busy and idle, priced per GPU-hour, by node, GPU, process,
container or kernel, plus the CPU stacks that launched the most GPU time.

GPU-hours come from sql/queries/gpu_idle_time.sql itself, so the report and the query cannot disagree on what a
reading covers; kernel time from cost_kernels.sql and cost_launch_stacks.sql. The SQL does the per-reading work;
this module only groups a few hundred rows and multiplies by the price.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fleetprof.query_client import QueryTarget
from fleetprof.simulated_sources import simulated_sources
from fleetprof.workload_filters import UNATTRIBUTED
from processors.demangle import demangle

BY_CHOICES = ("node", "gpu", "process", "container", "kernel", "namespace", "pod", "job", "team")
# --by groupings by workload identity: GPU-hours from sql/queries/gpu_utilization_by_workload.sql, whose GPU-level
# sums are gpu_idle_time's; a GPU's hours go to the pod that holds it, else to its processes' workloads, else nobody
WORKLOAD_BY = ("namespace", "pod", "job", "team")

# The group columns each --by shows, and what identifies a group in a gpu_idle_time row.
KEY_COLUMNS = {"node": ["node"], "gpu": ["node", "gpu"], "process": ["node", "pid", "comm"],
               "container": ["container"], "kernel": ["kernel"], **{by: [by] for by in WORKLOAD_BY}}
_KEYS: dict[str, Callable[[dict[str, Any]], tuple]] = {
    "node": lambda r: (r["node"],),
    "gpu": lambda r: (r["node"], r["gpu_index"]),
    "process": lambda r: (r["node"], r["pid"], r["comm"]),
    "container": lambda r: (r["container_id"],),
}
_LEVEL = {"node": "gpu", "gpu": "gpu", "process": "process", "container": "process"}
SECONDS_PER_HOUR = 3600
NS_PER_HOUR = 3_600_000_000_000


class CostReportError(ValueError):
    """Bad report input, with a one-line reason for people."""


def parse_price(text: str) -> float:
    """The --price-per-gpu-hour text as a finite number >= 0."""
    try:
        price = float(text)
    except ValueError:
        raise CostReportError(f"--price-per-gpu-hour wants a number, got {text!r}") from None
    if not math.isfinite(price) or price < 0:
        raise CostReportError(f"--price-per-gpu-hour wants a finite number >= 0, got {text!r}")
    return price


def parse_by(text: str) -> str:
    """The --by text, checked against BY_CHOICES."""
    if text not in BY_CHOICES:
        raise CostReportError(f"--by wants one of {', '.join(BY_CHOICES)}, got {text!r}")
    return text


@dataclass(frozen=True)
class Hours:
    """One group's GPU-hours: busy + idle = gpu (hours with a utilization reading)."""

    key: tuple
    gpu: float
    busy: float
    idle: float


@dataclass(frozen=True)
class KernelTime:
    """GPU time of one kernel, or of one launching stack (name is then the folded stack)."""

    name: str
    hours: float
    launches: int


@dataclass
class CostReport:
    """Everything a rendering needs: the inputs, the groups and totals in GPU-hours, and the price to apply."""

    since: datetime
    until: datetime
    price: float
    by: str
    node: str
    max_gap_s: float
    top: int  # rows in the top kernels and top launching stacks sections
    groups: list[Hours]  # --by node|gpu|process|container, most GPU-hours first; empty for --by kernel
    total: Hours  # of the groups (for kernel: of the GPUs)
    gpus: Hours  # every GPU's hours, whatever --by
    unknown_hours: float  # GPU time whose readings carried no utilization (not in any of the above)
    kernels: list[KernelTime]  # every kernel, most GPU time first
    stacks: list[KernelTime]  # the top launching stacks
    key_columns: list[str]  # the group columns of --by
    simulated: dict[str, list[str]]  # kind ('gpu', 'nvml') -> nodes whose data of that kind was simulated
    full_stacks: bool = False  # launching stacks whole, not folded to their top frames

    def cost(self, hours: float) -> float:
        """What `hours` GPU-hours cost at the report's price."""
        return hours * self.price

    @property
    def kernel_hours(self) -> float:
        """GPU-hours of kernel time, all kernels."""
        return sum(k.hours for k in self.kernels)


def _records(columns: list[str], rows: list[list[Any]]) -> list[dict[str, Any]]:
    return [dict(zip(columns, row, strict=True)) for row in rows]


def group_hours(records: list[dict[str, Any]], by: str) -> list[Hours]:
    """gpu_idle_time rows summed per --by group (seconds to hours), most GPU-hours first, then by key."""
    level, key_of = _LEVEL[by], _KEYS[by]
    sums: dict[tuple, list[float]] = {}
    for rec in records:
        if rec["level"] != level:
            continue
        acc = sums.setdefault(key_of(rec), [0.0, 0.0, 0.0])
        acc[0] += rec["covered_s"]
        acc[1] += rec["busy_s"]
        acc[2] += rec["idle_s"]
    groups = [Hours(key, *(s / SECONDS_PER_HOUR for s in acc)) for key, acc in sums.items()]
    return sorted(groups, key=lambda h: (-h.gpu, h.key))  # within one --by, keys are tuples of the same types


def workload_hours(target: QueryTarget, params: dict[str, Any]) -> list[Hours]:
    """gpu_utilization_by_workload's rows as groups (seconds to hours), most GPU-hours first, then by key; the hours
    of no workload keyed UNATTRIBUTED."""
    sums: dict[tuple, list[float]] = {}
    for rec in _records(*target.named("gpu_utilization_by_workload", params)):
        acc = sums.setdefault((rec["workload"] or UNATTRIBUTED,), [0.0, 0.0, 0.0])
        acc[0] += rec["covered_s"]
        acc[1] += rec["busy_s"]
        acc[2] += rec["idle_s"]
    groups = [Hours(key, *(s / SECONDS_PER_HOUR for s in acc)) for key, acc in sums.items()]
    return sorted(groups, key=lambda h: (-h.gpu, h.key))


def total_of(groups: list[Hours]) -> Hours:
    """The sum of the groups, keyed ("total",)."""
    return Hours(("total",), sum(g.gpu for g in groups), sum(g.busy for g in groups), sum(g.idle for g in groups))


def build_report(target: QueryTarget, *, since: datetime, until: datetime, price: float, by: str, node: str = "",
                 top: int = 10, max_gap_s: float = 60.0, full_stacks: bool = False) -> CostReport:
    """Run the report's queries on `target` and put the results together; kernel names demangled, as every other
    view shows them (a kernel stored under its mangled and its demangled name adds up under one)."""
    window = {"since": since, "until": until, "node": node}
    idle = _records(*target.named("gpu_idle_time", {**window, "max_gap_s": max_gap_s}))
    kernels = _records(*target.named("cost_kernels", window))
    stacks = _records(*target.named("cost_launch_stacks", {**window, "limit": top}))
    simulated = simulated_sources(target, since, until, node)
    simulated.pop("cpu", None)  # the report holds no CPU samples
    names: dict[str, KernelTime] = {}
    for k in kernels:
        name = demangle(k["kernel"])
        old = names.get(name, KernelTime(name, 0.0, 0))
        names[name] = KernelTime(name, old.hours + int(k["gpu_ns"]) / NS_PER_HOUR, old.launches + int(k["launches"]))
    gpus = total_of(group_hours(idle, "gpu"))
    if by in WORKLOAD_BY:
        groups = workload_hours(target, {**window, "max_gap_s": max_gap_s, "by": by})
    else:
        groups = [] if by == "kernel" else group_hours(idle, by)
    unknown_s = sum(r["unknown_s"] for r in idle if r["level"] == "gpu")
    return CostReport(
        since=since, until=until, price=price, by=by, node=node, max_gap_s=max_gap_s, top=top,
        groups=groups, total=gpus if by == "kernel" else total_of(groups), gpus=gpus,
        unknown_hours=unknown_s / SECONDS_PER_HOUR,
        kernels=sorted(names.values(), key=lambda k: (-k.hours, k.name)),
        stacks=[KernelTime(s["stack"], int(s["gpu_ns"]) / NS_PER_HOUR, int(s["launches"])) for s in stacks],
        key_columns=KEY_COLUMNS[by], simulated=simulated, full_stacks=full_stacks,
    )
