"""The simulated GPU (native/sim/gpu/, libfleetprof_gpusim.so): its gcc build, and a ctypes handle on it.

It fires the same USDT probes as the CUPTI shim (native/include/fleetprof_probes.h), so the agent's GPU collector runs
against it exactly as against a real CUDA process.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from producers.native_build import NativeBuildError, NativeLibrary, build

GPU_SIM = NativeLibrary(
    name="gpu_sim",
    sources=("sim/gpu/fleetprof_gpusim.c", "sim/gpu/memory_graphs.c", "sim/gpu/ranges.c", "sim/gpu/native_paths.c"),
    output="libfleetprof_gpusim.so",
    # the native launch paths keep every frame: frame pointers (the builder's default) and no sibling calls
    cflags=("-fvisibility=hidden", "-D_GNU_SOURCE", "-pthread", "-fno-optimize-sibling-calls"),
    ldflags=("-pthread",),
    soname="libfleetprof_gpusim.so",
)


def build_gpusim(force: bool = False) -> Path:
    """libfleetprof_gpusim.so, built now if missing or stale."""
    return build(GPU_SIM, force=force)


def build_gpusim_python(sim: Path) -> Path:
    """The gpusim_python extension for this interpreter, linked to the simulator at `sim` (built now if needed)."""
    include = Path(sysconfig.get_paths()["include"])
    if not (include / "Python.h").is_file():
        raise NativeBuildError(f"cannot build gpusim_python: no Python.h in {include}")
    ext = NativeLibrary(
        name=f"gpusim_python-{sys.implementation.cache_tag}",
        sources=("sim/gpu/gpusim_python.c",),
        output="gpusim_python" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"),
        cflags=("-fno-optimize-sibling-calls",),
        ldflags=(f"-L{sim.parent}", f"-l:{sim.name}", f"-Wl,-rpath,{sim.parent}"),
        include_dirs=lambda: [include],
    )
    return build(ext)


def _load_extension(path: Path) -> Any:
    loader = importlib.machinery.ExtensionFileLoader("gpusim_python", str(path))
    spec = importlib.util.spec_from_file_location("gpusim_python", str(path), loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


# ---- the simulator through ctypes (structs mirror native/sim/gpu/gpusim.h; sizes are checked at load) ----

NAME_MAX = 256
RANGE_MAX = 512
STATES = {0: "unseen", 1: "skipped", 2: "sampled"}
ACTIVITIES = {0: "KERNEL", 1: "MEMCPY", 2: "MEMSET"}
APIS = {0: "kernel", 1: "memcpy", 2: "memset", 3: "graph"}
GRAPH_API_NAME = "gpusimGraphLaunch (simulated)"
# CUPTI's CUpti_ActivityMemcpyKind and CUpti_ActivityMemoryKind, by name
COPY_KINDS = {"HtoD": 1, "DtoH": 2, "HtoA": 3, "AtoH": 4, "AtoA": 5, "AtoD": 6, "DtoA": 7, "DtoD": 8, "HtoH": 9,
              "PtoP": 10}
MEMORY_KINDS = {"unknown": 0, "pageable": 1, "pinned": 2, "device": 3, "array": 4, "managed": 5}


def memory_kind(copy: str | None, src: str = "unknown", dst: str = "device") -> int:
    """FLEETPROF_MEMORY_KIND of a copy (`copy` one of COPY_KINDS) or, with copy None, a set of `dst` memory."""
    if copy is None:
        return 0x100 | MEMORY_KINDS[dst] << 24
    return COPY_KINDS[copy] | MEMORY_KINDS[src] << 16 | MEMORY_KINDS[dst] << 24


class _Executed(ctypes.Structure):
    _fields_ = [("start_ns", ctypes.c_uint64), ("end_ns", ctypes.c_uint64), ("duration_ns", ctypes.c_uint64),
                ("correlation_id", ctypes.c_uint32), ("device_id", ctypes.c_uint32), ("stream_id", ctypes.c_uint32),
                ("state", ctypes.c_uint32), ("weight", ctypes.c_uint32), ("activity", ctypes.c_uint32),
                ("name", ctypes.c_char * NAME_MAX), ("bytes", ctypes.c_uint64), ("graph_node_id", ctypes.c_uint64),
                ("graph_id", ctypes.c_uint32), ("memory_kind", ctypes.c_uint32), ("in_range", ctypes.c_uint32),
                ("api", ctypes.c_uint32), ("range", ctypes.c_char * RANGE_MAX)]


STAT_FIELDS = ("launches", "launches_decided", "launches_sampled", "weight_sum", "kernels_executed", "kernels_fired",
               "queue_dropped", "log_dropped", "names_truncated", "copies_executed", "copies_fired", "graph_launches",
               "graph_launches_decided", "graph_launches_sampled", "graph_weight_sum", "graph_nodes_executed",
               "graph_nodes_fired", "ranges_fired", "range_paths_cut", "ranges_too_deep", "range_pops_unmatched")


class _Stats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in STAT_FIELDS]


class _GraphNode(ctypes.Structure):
    _fields_ = [("kernel_name", ctypes.c_char_p), ("duration_ns", ctypes.c_uint64), ("bytes", ctypes.c_uint64),
                ("memory_kind", ctypes.c_uint32), ("reserved", ctypes.c_uint32)]


@dataclass(frozen=True)
class GraphNode:
    """A node of a simulated CUDA graph: a kernel (memory_kind 0) or a copy or set (see memory_kind())."""

    kernel_name: str
    duration_ns: int
    bytes: int = 0
    memory_kind: int = 0


class _KernelSpec(ctypes.Structure):
    _fields_ = [("path", ctypes.c_char_p), ("kernel_name", ctypes.c_char_p), ("duration_ns", ctypes.c_uint64),
                ("stream_id", ctypes.c_uint32)]


@dataclass(frozen=True)
class ExecutedKernel:
    """One kernel, copy or set the simulated device ran (times are CLOCK_REALTIME ns)."""

    name: str
    correlation_id: int
    device_id: int
    stream_id: int
    start_ns: int
    end_ns: int
    duration_ns: int  # as requested
    state: str  # what the agent decided at launch: unseen (none attached), skipped, sampled
    weight: int
    activity: str = "KERNEL"  # KERNEL, MEMCPY, MEMSET; a copy's or set's name is its label ("[memcpy HtoD]")
    bytes: int = 0
    memory_kind: int = 0
    graph_id: int = 0
    graph_node_id: int = 0
    api: str = "kernel"  # how it was launched: kernel, memcpy, memset, graph
    range: str | None = None  # the launching thread's NVTX range path as launch_range sends it; None: in no range


@dataclass(frozen=True)
class NativeKernel:
    """A kernel of the simulator's native launch paths: its C call path (root first, ';'-separated)."""

    path: str
    name: str
    duration_ns: int
    stream_id: int


class GpuSimError(RuntimeError):
    """The simulator library does not match this module (rebuild it)."""


class GpuSim:
    """The simulated GPU (libfleetprof_gpusim.so) loaded into this process."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or build_gpusim()
        lib = ctypes.CDLL(str(self.path))
        lib.gpusim_launch.argtypes = [ctypes.c_char_p, ctypes.c_uint64, ctypes.c_uint32]
        lib.gpusim_launch.restype = ctypes.c_uint32
        lib.gpusim_synchronize.argtypes = []
        lib.gpusim_synchronize.restype = None
        lib.gpusim_set_device.argtypes = [ctypes.c_uint32]
        lib.gpusim_set_device.restype = ctypes.c_int
        for name in ("gpusim_device_count", "gpusim_launch_rate", "gpusim_attached"):
            getattr(lib, name).argtypes = []
            getattr(lib, name).restype = ctypes.c_uint32
        lib.gpusim_stats.argtypes = [ctypes.POINTER(_Stats)]
        lib.gpusim_stats.restype = None
        lib.gpusim_sizeof.argtypes = [ctypes.c_uint32]
        lib.gpusim_sizeof.restype = ctypes.c_uint32
        lib.gpusim_log_start.argtypes = [ctypes.c_uint32]
        lib.gpusim_log_start.restype = ctypes.c_int
        lib.gpusim_log_drain.argtypes = [ctypes.POINTER(_Executed), ctypes.c_uint32]
        lib.gpusim_log_drain.restype = ctypes.c_uint32
        lib.gpusim_native_train_step.argtypes = [ctypes.c_int]
        lib.gpusim_native_train_step.restype = None
        lib.gpusim_native_kernels.argtypes = [ctypes.POINTER(ctypes.POINTER(_KernelSpec))]
        lib.gpusim_native_kernels.restype = ctypes.c_uint32
        lib.gpusim_graph_launch_rate.argtypes = []
        lib.gpusim_graph_launch_rate.restype = ctypes.c_uint32
        lib.gpusim_memcpy.argtypes = [ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32,
                                      ctypes.c_uint64, ctypes.c_uint32]
        lib.gpusim_memcpy.restype = ctypes.c_uint32
        lib.gpusim_memset.argtypes = [ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_uint32]
        lib.gpusim_memset.restype = ctypes.c_uint32
        lib.gpusim_graph_create.argtypes = [ctypes.POINTER(_GraphNode), ctypes.c_uint32]
        lib.gpusim_graph_create.restype = ctypes.c_uint32
        lib.gpusim_graph_launch.argtypes = [ctypes.c_uint32, ctypes.c_uint32]
        lib.gpusim_graph_launch.restype = ctypes.c_uint32
        lib.gpusim_range_push.argtypes = [ctypes.c_char_p]
        lib.gpusim_range_push.restype = None
        lib.gpusim_range_push_domain.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        lib.gpusim_range_push_domain.restype = None
        lib.gpusim_range_pop.argtypes = []
        lib.gpusim_range_pop.restype = ctypes.c_int
        for which, struct in enumerate((_Executed, _Stats, _KernelSpec, _GraphNode)):
            if lib.gpusim_sizeof(which) != ctypes.sizeof(struct):
                raise GpuSimError(f"{self.path}: struct {struct.__name__} is {lib.gpusim_sizeof(which)} bytes in C, "
                                  f"{ctypes.sizeof(struct)} here: rebuild the simulator")
        self._lib = lib
        self._drain_buffer = (_Executed * 1024)()
        # Launch through a C extension when one builds for this interpreter (the launching Python functions then
        # show in launch stacks: see native/sim/gpu/gpusim_python.c), else through ctypes.
        try:
            ext = _load_extension(build_gpusim_python(self.path))
            self._launch, self._memcpy, self._memset = ext.launch, ext.memcpy, ext.memset
            self._graph_launch = ext.graph_launch
            self.launch_path = "extension"
        except (NativeBuildError, ImportError, OSError):
            self._launch, self._memcpy, self._memset = lib.gpusim_launch, lib.gpusim_memcpy, lib.gpusim_memset
            self._graph_launch = lib.gpusim_graph_launch
            self.launch_path = "ctypes"

    def launch(self, kernel_name: str, duration_ns: int, stream: int = 0) -> int:
        """Queue a kernel; its correlation id, or 0 when the device queue was full (counted as dropped)."""
        return self._launch(kernel_name.encode(), duration_ns, stream)

    def memcpy(self, nbytes: int, copy: str, src: str, dst: str, duration_ns: int, stream: int = 0) -> int:
        """Queue a copy (`copy` one of COPY_KINDS, memory kinds of MEMORY_KINDS); its correlation id, or 0 when the
        device queue was full."""
        return self._memcpy(nbytes, COPY_KINDS[copy], MEMORY_KINDS[src], MEMORY_KINDS[dst], duration_ns, stream)

    def memset(self, nbytes: int, dst: str, duration_ns: int, stream: int = 0) -> int:
        """Queue a set of `dst` memory; its correlation id, or 0 when the device queue was full."""
        return self._memset(nbytes, MEMORY_KINDS[dst], duration_ns, stream)

    def graph_create(self, nodes: list[GraphNode]) -> int:
        """A graph of these nodes (node ids graph_id << 32 | index + 1); its id."""
        keep = [n.kernel_name.encode() for n in nodes]  # alive until the simulator copied them
        table = (_GraphNode * len(nodes))(*(_GraphNode(k, n.duration_ns, n.bytes, n.memory_kind, 0)
                                            for k, n in zip(keep, nodes, strict=True)))
        graph = self._lib.gpusim_graph_create(table, len(nodes))
        if graph == 0:
            raise ValueError(f"the simulator refused a graph of {len(nodes)} nodes (too many graphs or nodes)")
        return graph

    def graph_launch(self, graph: int, stream: int = 0) -> int:
        """Replay a graph: one correlation id for all its nodes, or 0 when the device queue cannot take them."""
        return self._graph_launch(graph, stream)

    def graph_launch_rate(self) -> int:
        """The per-thread graph launch rate limit in force (FLEETPROF_GRAPH_LAUNCH_RATE; 0: every launch)."""
        return self._lib.gpusim_graph_launch_rate()

    def range_push(self, name: str, domain: str | None = None) -> None:
        """Enter an NVTX range on this thread (nvtxRangePushA, or nvtxDomainRangePushEx with a domain)."""
        if domain is None:
            self._lib.gpusim_range_push(name.encode())
        else:
            self._lib.gpusim_range_push_domain(domain.encode(), name.encode())

    def range_pop(self) -> int:
        """Leave the innermost range: the depth left, -1 when there was none (counted)."""
        return self._lib.gpusim_range_pop()

    def synchronize(self) -> None:
        """Wait until every kernel queued so far has run (the GIL is released meanwhile)."""
        self._lib.gpusim_synchronize()

    def set_device(self, device: int) -> None:
        if self._lib.gpusim_set_device(device) != 0:
            raise ValueError(f"no simulated device {device} (FLEETPROF_GPUSIM_DEVICES={self.device_count()})")

    def device_count(self) -> int:
        return self._lib.gpusim_device_count()

    def launch_rate(self) -> int:
        """The per-thread rate limit in force (sampled launches per second; 0: every launch)."""
        return self._lib.gpusim_launch_rate()

    def attached(self) -> int:
        """Bit per probe an agent enabled: 1 kernel_launch, 2 kernel_executed, 4 launch_weight, 8 launch_range,
        16 graph_kernel_executed, 32 memory_executed."""
        return self._lib.gpusim_attached()

    def stats(self) -> dict[str, int]:
        out = _Stats()
        self._lib.gpusim_stats(ctypes.byref(out))
        return {name: int(getattr(out, name)) for name in STAT_FIELDS}

    def native_train_step(self, steps: int = 1) -> None:
        """Launch through the C call chains of the native paths (see native_kernels)."""
        self._lib.gpusim_native_train_step(steps)

    def native_kernels(self) -> list[NativeKernel]:
        table = ctypes.POINTER(_KernelSpec)()
        count = self._lib.gpusim_native_kernels(ctypes.byref(table))
        return [NativeKernel(table[i].path.decode(), table[i].kernel_name.decode(), int(table[i].duration_ns),
                             int(table[i].stream_id)) for i in range(count)]

    def log_start(self, capacity: int) -> None:
        """Keep up to `capacity` executed kernels for drain(); 0 turns the log off."""
        if self._lib.gpusim_log_start(capacity) != 0:
            raise MemoryError(f"cannot allocate a simulator log of {capacity} kernels")

    def drain(self) -> list[ExecutedKernel]:
        """The executed kernels logged since the last drain, in completion order."""
        out: list[ExecutedKernel] = []
        while True:
            n = self._lib.gpusim_log_drain(self._drain_buffer, len(self._drain_buffer))
            for e in self._drain_buffer[:n]:
                out.append(ExecutedKernel(e.name.decode(errors="replace"), e.correlation_id, e.device_id, e.stream_id,
                                          e.start_ns, e.end_ns, e.duration_ns, STATES.get(e.state, "?"), e.weight,
                                          ACTIVITIES.get(e.activity, "?"), e.bytes, e.memory_kind, e.graph_id,
                                          e.graph_node_id, APIS.get(e.api, "?"),
                                          e.range.decode(errors="replace") if e.in_range else None))
            if n < len(self._drain_buffer):
                return out
