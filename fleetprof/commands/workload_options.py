"""--namespace, --pod, --job, --container: the workload filters shared by `fleetprof query` and `report cost`.

They become the named queries' parameters of the same names ('' = no filter); sql/parts/workload_match.sql holds the
rule each follows."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click

from fleetprof.workload_filters import WORKLOAD_FILTERS

_HELP = {
    "namespace": "Only workloads in this Kubernetes namespace.",
    "pod": "Only this pod: its name, or NAMESPACE/POD.",
    "job": "Only this job: a Slurm job id (an array's id: all its tasks; JOB_TASK: one task), or a Kubernetes Job's "
           "name (NAMESPACE/NAME too).",
    "container": "Only this container: its name, or a prefix of its id.",
}


def workload_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Add the four options; the command receives them together as `workload` (name -> value, '' when not given)."""

    @functools.wraps(func)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        kwargs["workload"] = {name: kwargs.pop(name) or "" for name in WORKLOAD_FILTERS}
        return func(*args, **kwargs)

    for name in reversed(WORKLOAD_FILTERS):
        wrapped = click.option(f"--{name}", default=None, metavar=name.upper(), help=_HELP[name])(wrapped)
    return wrapped

