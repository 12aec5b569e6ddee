"""The two kinds of profile (CPU samples, GPU kernel time): their named queries, units, and file rendering, shared
by `fleetprof query` and the web UI's exports so both give the same bytes."""

from __future__ import annotations

import json
from dataclasses import dataclass

from fleetprof.flamegraph_formats import FORMATS
from fleetprof.pprof import pprof_bytes


@dataclass(frozen=True)
class Kind:
    """What a profile counts, and the named queries that rank it, total it and fold it into stacks."""

    top: str
    totals: str
    flamegraph: str
    unit: str  # what one unit of a value is, for people
    pprof_type: tuple[str, str]  # pprof sample type and unit


KINDS = {
    "cpu": Kind("top_functions_cpu", "totals_cpu", "flamegraph_cpu", "samples", ("samples", "count")),
    # GPU time in ns, by the CPU stack that launched each kernel, the kernel as the leaf frame
    "gpu": Kind("top_kernels_gpu", "totals_gpu", "flamegraph_gpu", "ns", ("gpu_time", "nanoseconds")),
}


def render_profile(fmt: str, stacks: list[tuple[list[str], int]], title: str, kind: Kind) -> bytes:
    """The flame graph file; values in the kind's unit where the format can say so."""
    if fmt == "pprof":
        return pprof_bytes(stacks, sample_type=kind.pprof_type[0], unit=kind.pprof_type[1])
    data = FORMATS[fmt](stacks, title=title)
    if fmt == "speedscope" and kind.unit == "ns":
        doc = json.loads(data)
        for profile in doc["profiles"]:
            profile["unit"] = "nanoseconds"  # speedscope then shows the weights as durations
        data = json.dumps(doc).encode()
    return data
