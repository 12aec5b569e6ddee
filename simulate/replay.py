"""loadgen's replay mode: a few windows per simulated node encoded before the run, then sent over and over with
their times and correlation ids rewritten in place, so that the load generator costs a small share of the pipeline it
loads (the fleet bench's case).

Every time field the records carry (CpuStackBatch.window_start_ns, GpuLaunch.time_ns, GpuKernel.start_ns/end_ns,
GpuMetrics.time_ns) is nanoseconds since the epoch: a zigzag varint of exactly 9 bytes for any time between 1971 and
2116, so a shift by whole windows leaves the encoding's length alone and is a byte patch at a known offset. The
correlation ids of each trainer start at CORR_BASE in this mode (a 5-byte varint up to 2^34): replay cycle c adds c x
the ids the pre-encoded windows used, so ids keep increasing per process and every launch's weight (the gap since the
previous sampled id) stays what it was. The patch is a few numpy operations per window over every node's fields.

Per window, every node's CpuStackBatch goes out first, then the GPU messages: a node's agent sends its batch at the
window's end whatever the other nodes do, so the batch of the thousandth node must not wait for 999 nodes' launches.
The exact totals (LoadgenReport) are each pre-encoded window's tallies times the number of times it was sent.
Everything sent is labelled simulated, as in the live mode.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from confluent_kafka import KafkaError, KafkaException, Message, Producer

from producers.publisher import PRODUCER_DEFAULTS, PublishError
from schemas import topics
from schemas.wire import DEFAULT_MAX_BYTES
from simulate import loadgen
from simulate.loadgen import SECOND_NS, LoadgenReport, Progress, _check_args, _report, _Run, cpu_time, start_run
from simulate.synthetic_fleet import SyntheticFleet

CORR_BASE = 1 << 28
HEADER = 10  # single-object encoding: C3 01 + the schema's 8-byte fingerprint
TIME_WIDTH, CORR_WIDTH = 9, 5
_TIME_RANGE = (1 << 55, 1 << 62)  # values whose zigzag varint has exactly TIME_WIDTH bytes
_CORR_RANGE = (1 << 27, 1 << 34)


def varint(value: int) -> bytes:
    """The Avro encoding of a long: zigzag, then 7 bits per byte, low first."""
    zz = (value << 1) ^ (value >> 63)
    out = bytearray()
    while zz > 0x7F:
        out.append(zz & 0x7F | 0x80)
        zz >>= 7
    out.append(zz)
    return bytes(out)


def shift_varints(buf: np.ndarray, offsets: np.ndarray, width: int, delta: np.ndarray | int) -> None:
    """Add `delta` to the non-negative longs encoded as `width`-byte varints at `offsets` of `buf` (uint8), in place.
    Raises ValueError if a result would need another width."""
    if not len(offsets):
        return
    idx = offsets[:, None] + np.arange(width)
    shifts = (7 * np.arange(width)).astype(np.int64)
    zz = ((buf[idx].astype(np.int64) & 0x7F) << shifts).sum(axis=1) + 2 * np.asarray(delta, dtype=np.int64)
    if zz.min() < 1 << 7 * (width - 1) or zz.max() >= 1 << min(63, 7 * width):
        raise ValueError(f"a rewritten field no longer fits {width} bytes")
    out = (zz[:, None] >> shifts) & 0x7F
    out[:, :-1] |= 0x80
    buf[idx] = out.astype(np.uint8)


@dataclass
class Template:
    """One pre-encoded window of every node: message values back to back in `blob`, in sending order."""

    start_ns: int  # the window start its bytes carry now
    cycle: int  # the replay cycle its correlation ids carry now
    blob: bytearray
    bounds: list[tuple[int, int]]  # (start, end) of each message in blob
    topics: list[str]
    keys: list[str]
    cpu_messages: int  # the first ones: every node's CpuStackBatch
    time_offsets: np.ndarray
    corr_offsets: np.ndarray
    corr_owner: list[tuple[str, int]]  # (node, pid) per correlation field
    run: _Run  # its exact tallies
    corr_span: np.ndarray = field(init=False)  # per correlation field: the ids its process used over all templates
    view: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.view = np.frombuffer(self.blob, dtype=np.uint8)

    def chunk(self, lo: int, hi: int) -> bytes:
        """Messages lo..hi-1 back to back, as immutable bytes: produce() takes no mutable buffer."""
        return bytes(self.blob[self.bounds[lo][0]:self.bounds[hi - 1][1]]) if hi > lo else b""

    def move(self, start_ns: int, cycle: int) -> None:
        """Rewrite every time field to window `start_ns` and every correlation id to replay cycle `cycle`."""
        shift_varints(self.view, self.time_offsets, TIME_WIDTH, start_ns - self.start_ns)
        shift_varints(self.view, self.corr_offsets, CORR_WIDTH, self.corr_span * (cycle - self.cycle))
        self.start_ns, self.cycle = start_ns, cycle


class _Recorder:
    """Stands in for the Publisher while the templates are encoded: keeps the messages in order."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, str, bytes]] = []

    def publish(self, topic: str, key: str, value: bytes) -> None:
        self.messages.append((topic, key, value))


def _find(value: bytes, encoded: bytes, start: int = 0) -> int:
    at = value.find(encoded, start)
    if at < 0:
        raise RuntimeError("a time field is not where the schema puts it: update simulate/replay.py")
    return at


def _fields(topic: str, value: bytes, rec: dict | None, start_ns: int) -> tuple[list[int], list[int]]:
    """(time offsets, correlation id offsets) within one message; checked against the values written."""
    if topic in (topics.CPU_STACKS.name, topics.GPU_METRICS.name):  # node (string), then the window's / poll's time
        node = rec["node"].encode() if rec is not None else None
        n = value[HEADER]  # the node name's length: one varint byte for any name under 64 bytes
        at = HEADER + 1 + n // 2
        want = varint(start_ns if rec is None else rec["time_ns"])
        if n >= 0x80 or value[at:at + TIME_WIDTH] != want or (node is not None and value[HEADER + 1:at] != node):
            raise RuntimeError(f"{topic}: the time is not where the schema puts it: update simulate/replay.py")
        return [at], []
    assert rec is not None
    if topic == topics.GPU_LAUNCHES.name:  # time_ns, then correlation_id
        at = _find(value, varint(rec["time_ns"]) + varint(rec["correlation_id"]))
        return [at], [at + TIME_WIDTH]
    at = _find(value, varint(rec["correlation_id"]) + varint(rec["start_ns"]) + varint(rec["end_ns"]))  # GpuKernel
    return [at + CORR_WIDTH, at + CORR_WIDTH + TIME_WIDTH], [at]


def _check_ranges(records: list[dict]) -> None:
    """Every field replay rewrites must keep its encoded width whatever shift a run applies."""
    for rec in records:
        for k, (lo, hi) in (("time_ns", _TIME_RANGE), ("start_ns", _TIME_RANGE), ("end_ns", _TIME_RANGE),
                            ("correlation_id", _CORR_RANGE)):
            if k in rec and not lo <= rec[k] < hi:
                raise ValueError(f"{k}={rec[k]} is outside what replay can rewrite in place")


def prepare(fleet: SyntheticFleet, sim: list, windows: int, first_ns: int, window_ns: int, per_window: int,
            gpu: bool, launch_rate: float, max_bytes: int) -> list[Template]:
    """Encode `windows` consecutive windows of every node, the first starting at first_ns."""
    for node in sim:
        for proc in node.processes:
            node.correlation[proc.pid] = CORR_BASE
    prepared = []
    for k in range(windows):
        start = first_ns + k * window_ns
        rec = _Recorder()
        run = _Run(fleet, rec, window_ns, max_bytes)  # type: ignore[arg-type]
        msgs: list[tuple[str, str, bytes, dict | None]] = []
        for n, node in enumerate(sim):
            run.cpu(n, node, start, per_window)
        msgs += [(t, key, v, None) for t, key, v in rec.messages]
        cpu_messages = len(msgs)
        for node in sim if gpu else ():
            rec.messages.clear()
            records = run.gpu(node, start, launch_rate)
            _check_ranges(records)
            msgs += [(t, key, v, r) for (t, key, v), r in zip(rec.messages, records, strict=True)]
        prepared.append(_template(start, msgs, cpu_messages, run))
    spans = {(node.name, pid): c - CORR_BASE for node in sim for pid, c in node.correlation.items()}
    for t in prepared:
        t.corr_span = np.array([spans[owner] for owner in t.corr_owner], dtype=np.int64)
    return prepared


def _template(start: int, msgs: list[tuple[str, str, bytes, dict | None]], cpu_messages: int, run: _Run) -> Template:
    blob = bytearray()
    bounds, names, keys, times, corrs, owners = [], [], [], [], [], []
    for topic, key, value, rec in msgs:
        t_off, c_off = _fields(topic, value, rec, start)
        base = len(blob)
        times += [base + o for o in t_off]
        corrs += [base + o for o in c_off]
        if c_off:
            owners += [(rec["node"], rec["pid"])] * len(c_off)
        blob += value
        bounds.append((base, len(blob)))
        names.append(topic)
        keys.append(key)
    i64 = np.int64
    return Template(start, 0, blob, bounds, names, keys, cpu_messages, np.array(times, i64), np.array(corrs, i64),
                    owners, run)


class _Sender:
    """confluent-kafka's producer, fed slices of the templates; delivery reports only for failures (counted)."""

    def __init__(self, config: dict, block_timeout: float = 60.0) -> None:
        self.failed, self.first_error, self.block_timeout = 0, "", block_timeout
        # room for a whole window of a large simulated fleet: each real agent has a queue of its own, so one
        # process standing for 1,000 agents must not hold their batches back behind a single agent's 64 MiB
        self.producer = Producer({**PRODUCER_DEFAULTS, "queue.buffering.max.messages": 2_000_000,
                                  "queue.buffering.max.kbytes": 1 << 20, **config,
                                  "delivery.report.only.error": True, "on_delivery": self._on_delivery})
        self.sent = 0

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.failed += 1
            self.first_error = self.first_error or f"{msg.topic()}: {err.str()}"

    def send(self, t: Template, lo: int, hi: int, blob: bytes) -> None:
        """Messages lo..hi-1 of a template; `blob`: t.chunk(lo, hi), taken after its last move."""
        produce, base = self.producer.produce, t.bounds[lo][0] if hi > lo else 0
        bounds, names, keys = t.bounds, t.topics, t.keys
        for i in range(lo, hi):
            a, b = bounds[i]
            value = blob[a - base:b - base]
            try:
                produce(names[i], value, keys[i])
            except BufferError:
                self._wait_and_send(names[i], value, keys[i])
        self.sent += hi - lo
        self.producer.poll(0)

    def _wait_and_send(self, topic: str, value: bytes, key: str) -> None:
        deadline = time.monotonic() + self.block_timeout
        while True:
            self.producer.poll(0.05)  # frees the local queue
            try:
                self.producer.produce(topic, value, key)
                return
            except BufferError:
                if time.monotonic() > deadline:
                    raise PublishError(f"local Kafka queue still full after {self.block_timeout:.0f} s") from None
            except KafkaException as exc:
                raise PublishError(f"cannot queue a message for {topic}: {exc.args[0].str()}") from None

    def flush(self, timeout: float) -> int:
        remaining = self.producer.flush(timeout)
        if self.failed:
            raise PublishError(f"{self.failed} of {self.sent} messages failed; first: {self.first_error}")
        return remaining


def run_loadgen(config: dict, *, replay: int = 0, **kw) -> LoadgenReport:
    """loadgen.run_loadgen, or with replay=k (k >= 1) k windows per node pre-encoded before the first one and sent
    over and over with their times and correlation ids rewritten, so that sending costs a small share of encoding."""
    if not replay:
        return loadgen.run_loadgen(config, **kw)
    return run_replay(config, templates=replay, **kw)


def run_replay(config: dict, nodes: int, rate: float, duration: float, window: float = 10.0, seed: int = 0,
               pace: bool = True, gpu: bool = True, progress: Progress | None = None, node_prefix: str = "sim-node",
               launch_rate: float = 2.0, max_message_bytes: int = DEFAULT_MAX_BYTES, flush_timeout: float = 120.0,
               templates: int = 1, ready: Callable[[], None] | None = None) -> LoadgenReport:
    """run_loadgen(replay=templates): the same report, from pre-encoded windows."""
    _check_args(nodes, rate, duration, window, launch_rate)
    if templates < 1:
        raise ValueError(f"replay must be >= 1 window, got {templates}")
    t0 = time.perf_counter()
    fleet, sim, head, chunks, identities = start_run(config, nodes, window, seed, node_prefix, max_message_bytes,
                                                     flush_timeout)
    window_ns = head.window_ns
    n_windows = max(1, math.ceil(duration / window - 1e-9))
    per_window = round(rate * window)
    k = min(templates, n_windows)
    base = time.time_ns() // window_ns * window_ns - 2 * k * window_ns  # any start: every window moves them
    prepared = prepare(fleet, sim, k, base, window_ns, per_window, gpu, launch_rate, max_message_bytes)
    sender = _Sender(config)
    if ready is not None:
        ready()
    cpu0 = cpu_time()
    t_windows, waited = time.perf_counter(), 0.0
    first = time.time_ns() // window_ns * window_ns - (0 if pace else n_windows * window_ns)
    for w in range(n_windows):
        start = first + w * window_ns
        t = prepared[w % k]
        t.move(start, w // k)  # before the window ends: at its end only the sending is left
        cpu_part, gpu_part = t.chunk(0, t.cpu_messages), t.chunk(t.cpu_messages, len(t.bounds))
        pause = (start + window_ns - time.time_ns()) / SECOND_NS if pace else 0.0
        if pause > 0:
            time.sleep(pause)
            waited += pause
        sender.send(t, 0, t.cpu_messages, cpu_part)  # every node's CPU batch first: the latency measure is theirs
        sender.send(t, t.cpu_messages, len(t.bounds), gpu_part)
        del cpu_part, gpu_part
        if progress is not None:
            progress((w + 1) * nodes, n_windows * nodes)
    generate_s = time.perf_counter() - t_windows - waited
    remaining = sender.flush(flush_timeout)
    if remaining:
        raise PublishError(f"{remaining} messages still undelivered after {flush_timeout:.0f} s")
    cpu_send = cpu_time() - cpu0
    for i, t in enumerate(prepared):
        head.add(t.run, len(range(i, n_windows, k)))
    report = _report(fleet, sim, head, first, n_windows, per_window, chunks, identities,
                     elapsed_s=time.perf_counter() - t0, generate_s=generate_s, prepare_s=t_windows - t0,
                     cpu_prepare_s=cpu0, cpu_send_s=cpu_send)
    report.replay_windows = k
    return report
