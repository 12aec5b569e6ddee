"""loadgen: a simulated fleet sending realistic raw data through the real topics.

The data source for end-to-end tests before real collectors exist and for the fleet benchmark. Per window and node:
one CpuStackBatch (split if it would pass the message size limit) with exactly round(rate * window) samples, the
trainers' sampled launches and kernels, and one GpuMetrics per second. Symbol tables and each node's workload
identities (the WorkloadIdentity definitions of every id its records carry, once per run and node, as the agent sends
them before the first record that references them) go out first, durably. The report holds exact totals of what was
sent, so tests can compare stored results with it: for the GPU side, the GPU
time the correlator must attribute (kernel duration x launch weight) per kernel, per launching leaf function and per
function anywhere in the launching stacks.
"""

from __future__ import annotations

import math
import resource
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from producers.publisher import Publisher, PublishError
from schemas import topics
from schemas.cpu_batch_writer import encode_cpu_batches, process_head
from schemas.gpu_launch_writer import LaunchEncoder
from schemas.single_object import encode
from schemas.wire import DEFAULT_MAX_BYTES, identity_key
from simulate.synthetic_fleet import FREQUENCY_HZ, KERNEL_BUILD_ID, SimNode, SyntheticFleet

SECOND_NS = 1_000_000_000
Progress = Callable[[int, int], None]  # (node-windows done, node-windows in all)


@dataclass
class LoadgenReport:
    """Exact totals of what one run sent. Functions are (binary, function) as the symbolizer names them."""

    nodes: list[str]
    windows: int
    window_ns: int
    first_window_start_ns: int
    end_ns: int  # end of the last window
    samples_per_node: dict[str, int]
    samples_by_leaf: dict[tuple[str, str], int]
    samples_by_function: dict[tuple[str, str], int]  # each stack counted once per function in it
    batches: int  # cpu.stacks messages
    build_ids: list[str]
    symbol_chunks: int
    identities: int = 0  # WorkloadIdentity definitions sent (one per node and identity its records reference)
    samples_by_identity: dict[str, int] = field(default_factory=dict)  # identity key (16 hex digits) -> CPU samples
    launches: int = 0
    launch_weight: int = 0  # sum of the launches' weights
    kernels: int = 0
    kernel_ns: int = 0
    kernels_per_node: dict[str, int] = field(default_factory=dict)
    kernel_ns_per_node: dict[str, int] = field(default_factory=dict)
    kernel_ns_by_name: dict[str, int] = field(default_factory=dict)  # kernels' own durations
    # GPU time as the correlator attributes it: duration x weight of every (launch, kernel) pair sent
    gpu_ns: int = 0
    gpu_ns_by_kernel: dict[str, int] = field(default_factory=dict)  # kernel names as CUPTI reports them
    launches_by_kernel: dict[str, int] = field(default_factory=dict)  # weights
    gpu_ns_by_launch_leaf: dict[tuple[str, str], int] = field(default_factory=dict)  # the launching stacks' leaves
    gpu_ns_by_function: dict[tuple[str, str], int] = field(default_factory=dict)  # once per stack per function
    metrics: int = 0
    messages_by_topic: dict[str, int] = field(default_factory=dict)
    bytes_by_topic: dict[str, int] = field(default_factory=dict)
    elapsed_s: float = 0.0
    generate_s: float = 0.0  # producing the windows, without model set-up, pacing and the final flush
    replay_windows: int = 0  # 0: every window encoded as it is sent; k: k windows per node pre-encoded and replayed
    prepare_s: float = 0.0  # set-up before the first window: model, symbols, identities (and the replay's encoding)
    cpu_prepare_s: float = 0.0  # this process's CPU (all threads) until the first window
    cpu_send_s: float = 0.0  # this process's CPU from the first window to the end of the final flush
    simulated: bool = True

    @property
    def total_samples(self) -> int:
        return sum(self.samples_per_node.values())

    @property
    def bytes(self) -> int:
        return sum(self.bytes_by_topic.values())

    def to_json(self) -> dict:
        """JSON-ready: function keys become [binary, function, count] rows, most samples first."""
        out = asdict(self)
        for key in ("samples_by_leaf", "samples_by_function", "gpu_ns_by_launch_leaf", "gpu_ns_by_function"):
            out[key] = [[b, f, n] for (b, f), n in sorted(out[key].items(), key=lambda kv: -kv[1])]
        out.update(total_samples=self.total_samples, bytes=self.bytes)
        return out


class _Run:
    """One loadgen run: the fleet, the publisher, caches, and exact counts of everything sent."""

    def __init__(self, fleet: SyntheticFleet, publisher: Publisher, window_ns: int, max_bytes: int) -> None:
        self.fleet, self.publisher, self.window_ns, self.max_bytes = fleet, publisher, window_ns, max_bytes
        self.messages: Counter[str] = Counter()
        self.bytes: Counter[str] = Counter()
        self.heads: dict[tuple[int, int], bytes] = {}  # a process's metadata and mappings never change: encode once
        self.launch_encoder = LaunchEncoder()
        self.pair_counts = np.zeros(len(fleet.probs), dtype=np.int64)
        self.proc_counts: dict[int, np.ndarray] = {}  # node index -> CPU samples per process
        self.launch_weight = self.kernel_ns = 0
        self.kernels_node: Counter[str] = Counter()
        self.kernel_ns_node: Counter[str] = Counter()
        self.kernel_ns_name: Counter[str] = Counter()
        self.gpu_tally: dict[tuple[int, str], list[int]] = {}  # (launching path, kernel) -> [GPU ns, launches]

    def add(self, other: _Run, times: int) -> None:
        """Add `times` x another run's tallies: a pre-encoded window that is sent `times` times."""
        for mine, theirs in ((self.messages, other.messages), (self.bytes, other.bytes),
                             (self.kernels_node, other.kernels_node), (self.kernel_ns_node, other.kernel_ns_node),
                             (self.kernel_ns_name, other.kernel_ns_name)):
            for k, v in theirs.items():
                mine[k] += v * times
        self.pair_counts += other.pair_counts * times
        for n, c in other.proc_counts.items():
            self.proc_counts[n] = self.proc_counts.get(n, 0) + c * times
        self.launch_weight += other.launch_weight * times
        self.kernel_ns += other.kernel_ns * times
        for key, (ns, weight) in other.gpu_tally.items():
            cell = self.gpu_tally.setdefault(key, [0, 0])
            cell[0] += ns * times
            cell[1] += weight * times

    def send(self, topic: topics.Topic, key: str, value: bytes) -> None:
        self.publisher.publish(topic.name, key, value)
        self.messages[topic.name] += 1
        self.bytes[topic.name] += len(value)

    def symbols(self) -> int:
        chunks = [(b.build_id, c) for b in self.fleet.binaries for c in b.symbol_chunks()]
        for build_id, chunk in chunks:
            self.send(topics.SYMBOLS, f"{build_id}/{chunk['chunk_index']}", encode("SymbolChunk", chunk))
        return len(chunks)

    def identities(self, nodes: list[SimNode], time_ns: int) -> int:
        """Each node's identity definitions, as its agent would send them (the same id from two nodes: twice)."""
        sent = 0
        for node in nodes:
            for identity in node.identities:
                self.send(topics.IDENTITIES, identity_key(identity.identity_id),
                          encode("WorkloadIdentity", identity.record(node.name, time_ns, simulated=True)))
                sent += 1
        return sent

    def samples_by_identity(self, nodes: list[SimNode]) -> dict[str, int]:
        out: Counter[str] = Counter()
        for n, counts in self.proc_counts.items():
            for proc, c in zip(nodes[n].processes, counts.tolist(), strict=True):
                if c:
                    out[identity_key(proc.identity_id)] += c
        return dict(out)

    def cpu(self, n: int, node: SimNode, start: int, samples: int) -> None:
        used, procs, counts = self.fleet.cpu_window(node, samples)
        self.pair_counts += counts
        per_proc = np.bincount(self.fleet.pair_proc, counts, len(node.processes)).astype(np.int64)
        self.proc_counts[n] = self.proc_counts[n] + per_proc if n in self.proc_counts else per_proc
        batch = {"node": node.name, "window_start_ns": start, "window_ns": self.window_ns,
                 "frequency_hz": FREQUENCY_HZ, "kernel_build_id": KERNEL_BUILD_ID, "simulated": True,
                 "processes": procs}
        for p, rec in zip(used, procs, strict=True):
            if (n, p) not in self.heads:
                self.heads[n, p] = process_head(rec)
        for message in encode_cpu_batches(batch, self.max_bytes, [self.heads[n, p] for p in used]):
            self.send(topics.CPU_STACKS, node.name, message)

    def gpu(self, node: SimNode, start: int, launch_rate: float) -> list[dict]:
        """Send one window's launches, kernels and NVML polls, in that order; returns their records, in that order."""
        launches, kernels = self.fleet.gpu_window(node, start, self.window_ns, launch_rate, self.gpu_tally)
        polls = []
        for rec in launches:
            self.send(topics.GPU_LAUNCHES, f"{node.name}/{rec['pid']}", self.launch_encoder.encode(rec))
            self.launch_weight += rec["weight"]
        for rec in kernels:
            self.send(topics.GPU_KERNELS, f"{node.name}/{rec['pid']}", encode("GpuKernel", rec))
            ns = rec["end_ns"] - rec["start_ns"]
            self.kernel_ns += ns
            self.kernel_ns_name[rec["kernel_name"]] += ns
            self.kernel_ns_node[node.name] += ns
        self.kernels_node[node.name] += len(kernels)
        for t in range(-(-start // SECOND_NS) * SECOND_NS, start + self.window_ns, SECOND_NS):  # NVML polls, 1 Hz
            polls.append(self.fleet.metrics(node, t))
            self.send(topics.GPU_METRICS, node.name, encode("GpuMetrics", polls[-1]))
        return launches + kernels + polls


def _check_args(nodes: int, rate: float, duration: float, window: float, launch_rate: float) -> None:
    for name, value, ok, want in (("nodes", nodes, nodes >= 1, ">= 1"), ("rate", rate, rate > 0, "> 0"),
                                  ("duration", duration, duration > 0, "> 0"),
                                  ("window", window, window >= 0.001, ">= 0.001 s"),
                                  ("launch_rate", launch_rate, launch_rate >= 0, ">= 0")):
        if not ok or not math.isfinite(value):
            raise ValueError(f"{name} must be {want}, got {value}")


def start_run(config: dict, nodes: int, window: float, seed: int, node_prefix: str, max_message_bytes: int,
              flush_timeout: float) -> tuple[SyntheticFleet, list[SimNode], _Run, int, int]:
    """The fleet, its nodes and a run whose symbol tables and identities are sent and durable (before any record
    refers to them): (fleet, nodes, run, symbol chunks sent, identities sent)."""
    fleet = SyntheticFleet(seed=seed, node_prefix=node_prefix)
    sim = [fleet.node(i) for i in range(nodes)]
    run = _Run(fleet, Publisher(config), max(1, round(window * SECOND_NS)), max_message_bytes)
    chunks = run.symbols()
    identities = run.identities(sim, time.time_ns())
    if run.publisher.flush(flush_timeout):
        raise PublishError(f"symbol tables and identities not delivered within {flush_timeout:.0f} s")
    return fleet, sim, run, chunks, identities


def run_loadgen(config: dict, nodes: int, rate: float, duration: float, window: float = 10.0, seed: int = 0,
                pace: bool = True, gpu: bool = True, progress: Progress | None = None, node_prefix: str = "sim-node",
                launch_rate: float = 2.0, max_message_bytes: int = DEFAULT_MAX_BYTES,
                flush_timeout: float = 120.0, ready: Callable[[], None] | None = None) -> LoadgenReport:
    """Send `duration` seconds of a `nodes`-node fleet, `rate` CPU samples per second per node.

    pace=True sends each window when it ends in real time; pace=False sends as fast as possible, with windows
    that end at the current aligned window boundary. `launch_rate`: sampled launches per second per GPU.
    Every window is encoded as it is sent; simulate/replay.py's run_loadgen(replay=k) pre-encodes k windows per node
    instead and sends them over and over with their times rewritten.
    `ready()` is called once set-up is done, just before the first window's time is taken.
    Raises PublishError if anything could not be delivered.
    """
    _check_args(nodes, rate, duration, window, launch_rate)
    t0 = time.perf_counter()
    fleet, sim, run, chunks, identities = start_run(config, nodes, window, seed, node_prefix, max_message_bytes,
                                                    flush_timeout)
    window_ns = run.window_ns
    n_windows = max(1, math.ceil(duration / window - 1e-9))
    per_window = round(rate * window)

    if ready is not None:
        ready()
    cpu0 = cpu_time()
    t_windows, waited = time.perf_counter(), 0.0
    first = time.time_ns() // window_ns * window_ns - (0 if pace else n_windows * window_ns)
    for w in range(n_windows):
        start = first + w * window_ns
        pause = (start + window_ns - time.time_ns()) / SECOND_NS if pace else 0.0
        if pause > 0:
            time.sleep(pause)
            waited += pause
        for n, node in enumerate(sim):
            run.cpu(n, node, start, per_window)
            if gpu:
                run.gpu(node, start, launch_rate)
            if progress is not None:
                progress(w * nodes + n + 1, n_windows * nodes)
    generate_s = time.perf_counter() - t_windows - waited
    remaining = run.publisher.flush(flush_timeout)  # raises PublishError if any message failed
    if remaining:
        raise PublishError(f"{remaining} messages still undelivered after {flush_timeout:.0f} s")

    return _report(fleet, sim, run, first, n_windows, per_window, chunks, identities,
                   elapsed_s=time.perf_counter() - t0, generate_s=generate_s, prepare_s=t_windows - t0,
                   cpu_prepare_s=cpu0, cpu_send_s=cpu_time() - cpu0)


def cpu_time() -> float:
    """This process's CPU seconds so far, every thread (librdkafka's included)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _report(fleet: SyntheticFleet, sim: list[SimNode], run: _Run, first: int, n_windows: int, per_window: int,
            chunks: int, identities: int, **timing: float) -> LoadgenReport:
    """The exact totals of a run from its tallies."""
    leaf, inclusive = _function_counts(fleet, run.pair_counts)
    gpu = _gpu_time(fleet, run.gpu_tally)
    names = [node.name for node in sim]
    window_ns = run.window_ns
    return LoadgenReport(
        nodes=names, windows=n_windows, window_ns=window_ns, first_window_start_ns=first,
        end_ns=first + n_windows * window_ns, samples_per_node={name: per_window * n_windows for name in names},
        samples_by_leaf=leaf, samples_by_function=inclusive, batches=run.messages[topics.CPU_STACKS.name],
        build_ids=[b.build_id for b in fleet.binaries], symbol_chunks=chunks, identities=identities,
        samples_by_identity=run.samples_by_identity(sim),
        launches=run.messages[topics.GPU_LAUNCHES.name], launch_weight=run.launch_weight,
        kernels=run.messages[topics.GPU_KERNELS.name], kernel_ns=run.kernel_ns,
        kernels_per_node=dict(run.kernels_node), kernel_ns_per_node=dict(run.kernel_ns_node),
        kernel_ns_by_name=dict(run.kernel_ns_name), **gpu, metrics=run.messages[topics.GPU_METRICS.name],
        messages_by_topic=dict(run.messages), bytes_by_topic=dict(run.bytes), **timing)


def _function_counts(fleet: SyntheticFleet, pair_counts: np.ndarray) -> tuple[dict, dict]:
    """Samples per leaf function and per function anywhere in the stack, from the counts per (process, path)."""
    t = fleet.templates
    per_tpl = np.zeros(len(t.kinds), dtype=np.int64)
    np.add.at(per_tpl, fleet.pair_tpl, pair_counts)
    leaf: Counter[tuple[str, str]] = Counter()
    inclusive: Counter[tuple[str, str]] = Counter()
    for i in np.flatnonzero(per_tpl).tolist():
        count = int(per_tpl[i])
        leaf[t.leaf[i]] += count
        for fn in t.functions[i]:
            inclusive[fn] += count
    return dict(leaf), dict(inclusive)


def _gpu_time(fleet: SyntheticFleet, tally: dict[tuple[int, str], list[int]]) -> dict:
    """The report's GPU-time fields from the tally per (launching path, kernel name)."""
    by_kernel: Counter[str] = Counter()
    launches: Counter[str] = Counter()
    leaf: Counter[tuple[str, str]] = Counter()
    inclusive: Counter[tuple[str, str]] = Counter()
    for (tpl, name), (ns, weight) in tally.items():
        frames = fleet.launch_frames(tpl)
        by_kernel[name] += ns
        launches[name] += weight
        leaf[frames[0]] += ns
        for fn in set(frames):
            inclusive[fn] += ns
    return {"gpu_ns": sum(by_kernel.values()), "gpu_ns_by_kernel": dict(by_kernel),
            "launches_by_kernel": dict(launches), "gpu_ns_by_launch_leaf": dict(leaf),
            "gpu_ns_by_function": dict(inclusive)}
