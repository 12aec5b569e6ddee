"""The simulated libnvidia-ml.so.1 (native/sim/nvml/nvml_sim.c): how it is built, and its scenario files.

The real nvidia-ml-py finds the simulated library through LD_LIBRARY_PATH, so the NVML collector runs unchanged on a
machine without a GPU. Values follow a scenario over time: devices (and MIG devices), then per device a timeline of
segments, each holding from its start time until the device's next one. `write_scenario` writes the file;
`sim_env` gives the environment a process needs to load the library with it. Everything the library reports is
labelled simulated: its device names and its driver version.

    python -m simulate.nvml         # builds the library and prints the directory for LD_LIBRARY_PATH
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from producers.native_build import NativeBuildError, NativeLibrary, build

SCENARIO_ENV = "FLEETPROF_NVML_SIM_SCENARIO"
# Only the nvml* entry points are exported (-fvisibility=hidden), as from the real library.
LIBRARY = NativeLibrary("nvml_sim", ("sim/nvml/nvml_sim.c", "sim/nvml/nvml_sim_scenario.c"), "libnvidia-ml.so.1",
                        cflags=("-fvisibility=hidden",), ldflags=("-lm",), soname="libnvidia-ml.so.1")

# Segment values, by the names the scenario format uses (see the top of nvml_sim.c)
FIELDS = ("gpu_util", "mem_util", "mem_used", "sm_clock", "mem_clock", "power", "power_limit", "temp", "pcie_tx",
          "pcie_rx", "clock_events")


@dataclass(frozen=True)
class SimDevice:
    """A GPU, or with `parent` (another device's key) a MIG device of that GPU; GPUs are numbered in list order."""

    key: str
    uuid: str
    name: str = "fleetprof simulated H100"
    memory_total: int = 80 * 1024**3
    power_limit_mw: int | None = 700_000
    parent: str = ""
    gpu_instance_id: int | None = None  # MIG only; default: position under the parent, from 1


@dataclass(frozen=True)
class SimProcess:
    """A running compute process; sm/mem utilization None: no utilization samples, used None: not available."""

    pid: int
    sm_util: int | None = None
    mem_util: int | None = None
    used_memory: int | None = None


@dataclass(frozen=True)
class Segment:
    """From scenario second `t` on, `device` reports `values` (FIELDS; None = not supported). Values not named keep
    the device's previous segment's; `processes` None keeps the previous list; `xids` are raised once at `t`;
    `lost` and `hang` (calls block until the device's next segment) hold until a later segment changes them."""

    t: float
    device: str
    values: Mapping[str, int | None] = field(default_factory=dict)
    processes: Sequence[SimProcess] | None = None
    xids: Sequence[int] = ()
    lost: bool | None = None
    hang: bool | None = None


def _value(v: int | None) -> str:
    return "na" if v is None else str(int(v))


def _segment_line(seg: Segment) -> str:
    parts = [f"at {seg.t!r} {seg.device}"]
    for name, value in seg.values.items():
        if name not in FIELDS:
            raise ValueError(f"unknown scenario field {name!r} (known: {', '.join(FIELDS)})")
        parts.append(f"{name}={_value(value)}")
    if seg.processes is not None:
        procs = ",".join(f"{p.pid}:{_value(p.sm_util)}:{_value(p.mem_util)}:{_value(p.used_memory)}"
                         for p in seg.processes)
        parts.append(f"procs={procs or 'none'}")
    if seg.xids:
        parts.append("xid=" + ",".join(str(int(x)) for x in seg.xids))
    if seg.lost is not None:
        parts.append(f"lost={int(seg.lost)}")
    if seg.hang is not None:
        parts.append(f"hang={int(seg.hang)}")
    return " ".join(parts)


def _device_line(dev: SimDevice) -> str:
    for text in (dev.key, dev.uuid, dev.parent):
        if any(c.isspace() for c in text) or "=" in text:
            raise ValueError(f"device keys and uuids take no blanks or '=': {text!r}")
    parts = [f"device {dev.key} uuid={dev.uuid} memory_total={int(dev.memory_total)}",
             f"power_limit={_value(dev.power_limit_mw)}"]
    if dev.parent:
        parts.append(f"parent={dev.parent}")
    if dev.gpu_instance_id is not None:
        parts.append(f"gi={int(dev.gpu_instance_id)}")
    if "\n" in dev.name:
        raise ValueError("a device name is one line")
    parts.append(f"name={dev.name}")
    return " ".join(parts)


def write_scenario(path: str | os.PathLike, devices: Sequence[SimDevice], timeline: Sequence[Segment] = (), *,
                   start_ns: int | None = None, driver: str = "fleetprof simulated driver",
                   proc_sample_ms: int = 1000, init_error: int | None = None) -> Path:
    """Write a scenario file for the simulated library and return its path.

    Scenario time 0 is `start_ns` (nanoseconds since the epoch) when given, else the first nvmlInit. Per-process
    utilization is sampled every `proc_sample_ms` of scenario time. `init_error` makes nvmlInit fail with that NVML
    return code (e.g. 9, driver not loaded). The format is documented at the top of native/sim/nvml/nvml_sim.c.
    """
    lines = ["# fleetprof simulated NVML scenario (format: native/sim/nvml/nvml_sim.c)", f"driver {driver}",
             f"proc_sample_ms {int(proc_sample_ms)}"]
    if start_ns is not None:
        lines.append(f"start_ns {int(start_ns)}")
    if init_error is not None:
        lines.append(f"init_error {int(init_error)}")
    lines += [_device_line(d) for d in devices]
    # The library wants each device's segments in ascending time; a stable sort keeps same-time ones in order.
    lines += [_segment_line(s) for s in sorted(timeline, key=lambda s: s.t)]
    out = Path(path)
    out.write_text("\n".join(lines) + "\n")
    return out


def library_dir() -> Path:
    """The directory holding the built libnvidia-ml.so.1 (built now if needed); raises NativeBuildError."""
    return build(LIBRARY).parent


def sim_env(scenario: str | os.PathLike, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """An environment in which nvidia-ml-py loads the simulated library with `scenario`."""
    env = dict(os.environ if base is None else base)
    previous = env.get("LD_LIBRARY_PATH", "")
    env["LD_LIBRARY_PATH"] = str(library_dir()) + (os.pathsep + previous if previous else "")
    env[SCENARIO_ENV] = str(Path(scenario).resolve())
    return env


def main() -> int:
    """Build the library and print its directory, for LD_LIBRARY_PATH."""
    try:
        print(library_dir())
    except NativeBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
