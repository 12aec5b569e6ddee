"""A synthetic GPU training fleet: the model behind `fleetprof loadgen` (labelled simulated everywhere).

Binaries with stable build ids, symbol tables and PT_LOAD segments (simulate/synthetic_binaries.py); per node
torchrun-style trainers (one per GPU), their DataLoader workers and a Rust log shipper, with realistic mappings;
call paths whose popularity is Zipf-distributed; sampled CUDA launches with their kernels; NVML-like metrics; the
Kubernetes pods and Slurm jobs the processes and GPUs belong to (simulate/synthetic_identity.py), whose ids every
record carries.

The symbolization contract the symbolize processor relies on: a user address `a` of process P lies in exactly one
mapping m of P; file_off = a - m.start + m.file_offset; the PT_LOAD segment s of m.build_id with s.file_offset <=
file_off < s.file_offset + s.memsz gives vaddr = file_off - s.file_offset + s.vaddr, and start < vaddr < start + size
for the intended function (so vaddr - 1, what a symbolizer looks up for a return address, is inside it too).
Kernel addresses are absolute, in the table named by the batch's kernel_build_id.
"""

from __future__ import annotations

import hashlib
import random
import uuid
from dataclasses import dataclass, field

import numpy as np

from producers.workload_identity import Identity
from schemas.packed_stacks import PackedStacks, concat_ranges
from schemas.wire import KERNEL_BINARY, u64_to_long
from simulate.synthetic_binaries import KERNEL_BUILD_ID, PAGE, Binary, catalogue
from simulate.synthetic_identity import NodeWorkloads, Placement, node_workloads
from simulate.synthetic_workload import KIND_BINARIES, MEM_PAGE, build_paths, gpu_window, metrics

FREQUENCY_HZ = 19
ZIPF_S = 1.1
KIND_WEIGHT = {"trainer": 1.0, "worker": 0.25, "shipper": 0.05}  # how often each kind ranks among the hot stacks


@dataclass
class Templates:
    """Every call path of the model, columnar. Frames are leaf first; user frames as (binary, vaddr)."""

    kinds: list[str]
    thread: np.ndarray  # tid - pid of the thread that runs the path
    user_off: np.ndarray
    user_len: np.ndarray
    user_bin: np.ndarray  # binary index per user frame
    user_vaddr: np.ndarray  # int64
    kern_off: np.ndarray
    kern_len: np.ndarray
    kern_addr: np.ndarray  # int64 (Avro long bits of the u64 address)
    frames: list[list[tuple[str, str]]]  # (binary, symbol) as a symbolizer names them: user leaf first, then kernel
    leaf: list[tuple[str, str]]  # (binary, function) of the leaf (kernel leaf if any)
    functions: list[frozenset[tuple[str, str]]]  # distinct (binary, function) anywhere in the path
    ops: list[str]  # CUDA op whose kernel the path launches, or ""
    launch_depth: np.ndarray  # user frames from cudaLaunchKernel up to the root (0: no launch)


@dataclass
class SimProcess:
    pid: int
    comm: str
    exe: str
    kind: str
    cgroup: str
    container_id: str
    mappings: list[dict]
    bias: np.ndarray  # load bias per binary index (0 where unmapped)
    device: int = -1  # GPU index of a trainer
    start_ns: int = 0  # boot-relative start time (/proc/PID/stat starttime): tells a reused pid apart
    identity_id: int = 0  # the process's workload identity id, as records carry it (a long)

    def record(self) -> dict:
        """ProcessStacks fields other than stacks."""
        return {"pid": self.pid, "comm": self.comm, "exe": self.exe, "cgroup": self.cgroup,
                "container_id": self.container_id, "identity_id": self.identity_id, "mappings": self.mappings}


@dataclass
class SimNode:
    name: str
    index: int
    rng: np.random.Generator
    processes: list[SimProcess]
    bias: np.ndarray  # [process, binary]
    pids: np.ndarray
    util: float  # baseline GPU utilization, %
    mem_used: np.ndarray  # bytes per GPU
    correlation: dict[int, int] = field(default_factory=dict)  # last correlation id per pid
    gpu_uuids: list[str] = field(default_factory=list)
    launch_stacks: dict[tuple[int, int], list[int]] = field(default_factory=dict)  # (process, path) -> addresses
    workloads: NodeWorkloads | None = None  # who its processes and GPUs belong to
    gpu_owner_ids: list[int] = field(default_factory=list)  # per GPU: the holding pod's identity id (a long; 0: none)

    @property
    def identities(self) -> list[Identity]:
        """Every identity the node's records reference, each once."""
        return self.workloads.identities() if self.workloads is not None else []


def node_name(index: int, prefix: str = "sim-node") -> str:
    return f"{prefix}-{index + 1:04d}"


def _stable_seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha1("/".join(map(str, parts)).encode()).digest()[:8], "little")


class SyntheticFleet:
    """The fleet model; deterministic given the seed. Nodes are built on demand and are cheap."""

    def __init__(self, seed: int = 0, gpus_per_node: int = 8, workers_per_gpu: int = 2, zipf_s: float = ZIPF_S,
                 node_prefix: str = "sim-node") -> None:
        self.seed, self.gpus, self.workers, self.node_prefix = seed, gpus_per_node, workers_per_gpu, node_prefix
        self.binaries: list[Binary] = catalogue()
        self.by_name = {b.name: i for i, b in enumerate(self.binaries)}
        self.kernel = self.binaries[self.by_name[KERNEL_BINARY]]
        self.templates = self._compile(build_paths(random.Random(seed)), random.Random(seed + 1))
        kinds = ["trainer"] * self.gpus + ["worker"] * (self.gpus * self.workers) + ["shipper"]
        self.process_kinds = kinds
        by_kind: dict[str, list[int]] = {}
        for t, k in enumerate(self.templates.kinds):
            by_kind.setdefault(k, []).append(t)
        self.pair_proc = np.concatenate([np.full(len(by_kind[k]), p) for p, k in enumerate(kinds)])
        self.pair_tpl = np.concatenate([by_kind[k] for k in kinds])
        self.zipf_s = zipf_s
        self.probs = self._zipf(np.random.default_rng(seed), kinds)
        self.launch_paths = self._launch_paths(by_kind["trainer"])

    # --- model construction -------------------------------------------------------------------------------
    def _compile(self, paths: list[tuple[str, int, list[tuple[str, str]], str]], r: random.Random) -> Templates:
        user_bin, user_vaddr, kern, ulen, klen, named, depth = [], [], [], [], [], [], []
        for _kind, _thread, frames, _op in paths:
            user = [f for f in frames if f[0] != KERNEL_BINARY][::-1]
            kframes = [f for f in frames if f[0] == KERNEL_BINARY][::-1]
            for b, fn in user:
                binary = self.binaries[self.by_name[b]]
                i = binary.index[fn]
                user_bin.append(self.by_name[b])
                user_vaddr.append(int(binary.addrs[i]) + r.randrange(1, int(binary.sizes[i])))
            for _, fn in kframes:
                i = self.kernel.index[fn]
                kern.append(int(self.kernel.addrs[i]) + r.randrange(1, int(self.kernel.sizes[i])))
            ulen.append(len(user))
            klen.append(len(kframes))
            named.append([(b, self._symbol(b, fn)) for b, fn in user + kframes])
            names = [fn for _, fn in user]
            depth.append(len(user) - names.index("cudaLaunchKernel") if "cudaLaunchKernel" in names else 0)
        i64 = np.int64
        return Templates(
            kinds=[p[0] for p in paths], thread=np.array([p[1] for p in paths], i64),
            user_off=np.cumsum([0] + ulen[:-1]).astype(i64), user_len=np.array(ulen, i64),
            user_bin=np.array(user_bin, i64), user_vaddr=np.array(user_vaddr, i64),
            kern_off=np.cumsum([0] + klen[:-1]).astype(i64), kern_len=np.array(klen, i64),
            kern_addr=np.array(kern, dtype=np.uint64).view(i64), frames=named,
            leaf=[f[ulen[i]] if klen[i] else f[0] for i, f in enumerate(named)],
            functions=[frozenset(f) for f in named],
            ops=[p[3] for p in paths], launch_depth=np.array(depth, i64))

    def _symbol(self, binary: str, key: str) -> str:
        b = self.binaries[self.by_name[binary]]
        return b.names[b.index[key]]

    def _zipf(self, rng: np.random.Generator, kinds: list[str]) -> np.ndarray:
        """Zipf(s) over a node's (process, path) pairs; a weighted shuffle decides the ranks, so trainers lead."""
        weight = np.array([KIND_WEIGHT[kinds[p]] for p in self.pair_proc])
        order = np.argsort(-(rng.random(len(weight)) ** (1.0 / weight)))
        rank = np.empty(len(order), dtype=np.float64)
        rank[order] = np.arange(1, len(order) + 1)
        p = rank ** -self.zipf_s
        return p / p.sum()

    def _launch_paths(self, trainer_tpls: list[int]) -> list[int]:
        """A few distinct launching call paths, one per CUDA op; launches pick them Zipf-weighted in this order."""
        seen: dict[str, int] = {}
        for t in trainer_tpls:
            op = self.templates.ops[t]
            if op and self.templates.launch_depth[t] and op not in seen:
                seen[op] = t
        return list(seen.values())[:12]

    def node(self, index: int) -> SimNode:
        """Node `index` (0-based): processes, pids, ASLR layout, GPU profile."""
        name = node_name(index, self.node_prefix)
        rng = np.random.default_rng([self.seed, index])
        work = node_workloads(self.seed, self.node_prefix, name, index, self.gpus)
        pids = np.unique(rng.integers(1000, 4_000_000, len(self.process_kinds)))
        while len(pids) < len(self.process_kinds):  # sorted, so forked workers come after their parents
            pids = np.unique(np.append(pids, rng.integers(1000, 4_000_000)))
        procs: list[SimProcess] = []
        boot = _stable_seed(self.seed, name, "boot") % (7 * 86_400 * 10**9)  # the trainers started this long after boot
        for p, kind in enumerate(self.process_kinds):
            pid = int(pids[p])
            if kind == "shipper":
                procs.append(self._process(rng, pid, "vector", "/usr/bin/vector", kind, work.shipper))
                continue
            exe = "/opt/conda/bin/python3.11"
            if kind == "trainer":
                trainer = self._process(rng, pid, "pt_main_thread", exe, kind, work.trainers[p])
                trainer.device = p
                trainer.start_ns = boot + p * 1_000_000  # torchrun starts one per GPU, a millisecond apart
                procs.append(trainer)
            else:  # a forked DataLoader worker keeps its parent's address space layout, cgroup and identity
                owner = procs[(p - self.gpus) // self.workers]
                procs.append(SimProcess(pid, "pt_data_worker", exe, kind, owner.cgroup, owner.container_id,
                                        owner.mappings, owner.bias, start_ns=owner.start_ns + 5 * 10**9,
                                        identity_id=owner.identity_id))
        starved = index % 10 == 9  # every tenth node is input-bound: the alerting demo has something to find
        util = float(rng.uniform(25, 45) if starved else rng.uniform(82, 97))
        return SimNode(name, index, rng, procs, np.stack([p.bias for p in procs]),
                       np.array([p.pid for p in procs], dtype=np.int64), util,
                       rng.uniform(55e9, 78e9, self.gpus).astype(np.int64) // MEM_PAGE * MEM_PAGE,
                       gpu_uuids=[f"GPU-{uuid.UUID(int=_stable_seed(name, g) << 64 | g)}" for g in range(self.gpus)],
                       workloads=work, gpu_owner_ids=[0 if o is None else u64_to_long(o.identity_id)
                                                      for o in work.gpu_owners])

    def _process(self, rng: np.random.Generator, pid: int, comm: str, exe: str, kind: str,
                 where: Placement) -> SimProcess:
        """A process with its executable mappings: the PIE executable at 0x55…/0x56…, libraries below 0x7f…."""
        names = KIND_BINARIES[kind]
        bias = np.zeros(len(self.binaries), dtype=np.int64)
        mappings = []
        lib_top = 0x7F0000000000 + int(rng.integers(0x10000, 0xFFFF000)) * PAGE  # mmap base; libraries go below
        for i, name in enumerate(names):
            b = self.binaries[self.by_name[name]]
            if i == 0:
                base = (0x555555554000 if rng.random() < 0.5 else 0x560000000000) + int(rng.integers(0, 1 << 20)) * PAGE
            else:
                lib_top -= b.span + int(rng.integers(1, 64)) * PAGE
                base = lib_top
            bias[self.by_name[name]] = base
            off, vaddr, memsz = b.text
            start = base + vaddr // PAGE * PAGE
            mappings.append({"start": start, "limit": base + -(-(vaddr + memsz) // PAGE) * PAGE,
                             "file_offset": off // PAGE * PAGE, "path": b.path, "build_id": b.build_id})
        mappings.sort(key=lambda m: m["start"])
        return SimProcess(pid, comm, exe, kind, where.cgroup, where.container_id, mappings, bias,
                          identity_id=u64_to_long(where.identity.identity_id))

    # --- per window -----------------------------------------------------------------------------------------
    def cpu_window(self, node: SimNode, samples: int) -> tuple[list[int], list[dict], np.ndarray]:
        """`samples` CPU samples drawn over the node's stacks: (process indexes, ProcessStacks records with
        PackedStacks, counts per (process, path) pair)."""
        t = self.templates
        counts = node.rng.multinomial(samples, self.probs)
        nz = np.flatnonzero(counts)
        procs, tpl, c = self.pair_proc[nz], self.pair_tpl[nz], counts[nz].astype(np.int64)
        ulen, klen = t.user_len[tpl], t.kern_len[tpl]
        ui = concat_ranges(t.user_off[tpl], ulen)
        user = t.user_vaddr[ui] + node.bias[np.repeat(procs, ulen), t.user_bin[ui]]
        kern = t.kern_addr[concat_ranges(t.kern_off[tpl], klen)]
        stacks = PackedStacks(node.pids[procs] + t.thread[tpl], c, user, ulen, kern, klen)
        bounds = np.searchsorted(procs, np.arange(len(node.processes) + 1))
        used = [p for p in range(len(node.processes)) if bounds[p] < bounds[p + 1]]
        records = [{**node.processes[p].record(), "stacks": stacks.take(bounds[p], bounds[p + 1])} for p in used]
        return used, records, counts

    def launch_stack(self, node: SimNode, proc: int, tpl: int) -> list[int]:
        """User addresses (leaf first, from cudaLaunchKernel) of a launching path in one process (shared list)."""
        hit = node.launch_stacks.get((proc, tpl))
        if hit is None:
            t = self.templates
            depth = int(t.launch_depth[tpl])
            lo = int(t.user_off[tpl] + t.user_len[tpl] - depth)
            idx = np.arange(lo, lo + depth)
            hit = node.launch_stacks[proc, tpl] = (t.user_vaddr[idx] + node.bias[proc, t.user_bin[idx]]).tolist()
        return hit

    def gpu_window(self, node: SimNode, start_ns: int, window_ns: int, launch_rate: float,
                   tally: dict[tuple[int, str], list[int]] | None = None) -> tuple[list[dict], list[dict]]:
        """Sampled launches (GpuLaunch) and their kernels (GpuKernel) of every trainer in one window; `tally` gets
        [GPU ns (duration x weight), launches (weights)] added per (launching path, kernel name)."""
        return gpu_window(self, node, start_ns, window_ns, launch_rate, tally)

    def launch_frames(self, tpl: int) -> list[tuple[str, str]]:
        """(binary, symbol) of a launching path's stack as its launches carry it: leaf (cudaLaunchKernel) first."""
        t = self.templates
        ulen, depth = int(t.user_len[tpl]), int(t.launch_depth[tpl])
        return t.frames[tpl][ulen - depth:ulen]

    def metrics(self, node: SimNode, time_ns: int) -> dict:
        """One NVML poll of the node (GpuMetrics)."""
        return metrics(self, node, time_ns)


__all__ = ["FREQUENCY_HZ", "KERNEL_BUILD_ID", "SimNode", "SimProcess", "SyntheticFleet", "node_name"]
