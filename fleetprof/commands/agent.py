"""`fleetprof agent`: the node agent (producers/agent.py) built from flags, sending to Kafka or printing one window
(`--dry-run`)."""

from __future__ import annotations

import json
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import click

from fleetprof.commands.agent_identity import IdentitySettings, build_resolver, identity_options
from fleetprof.durations import Duration
from fleetprof.settings import Settings
from producers.agent import EXIT_NOTHING_TO_COLLECT, Agent, AgentReport, Records, Window
from producers.agent_lock import AgentLock, AgentRunning
from producers.collectors import CollectorOptions, OpenedCollectors, open_collectors
from producers.cpu_sampler import DEFAULT_MAX_ENTRIES
from producers.identity_resolver import IdentityResolver
from producers.kafka_link import KafkaLink
from producers.kallsyms import KernelSymbols, kernel_build_id, read_kallsyms
from producers.memory import trim_heap
from producers.outbox import RECORD_NAMES, Outbox
from producers.outbox_encoder import OutboxEncoder
from producers.process_info import ProcessCache, ProcessFilter
from producers.publisher import Publisher
from producers.unwind_maps import DEFAULT_ROWS, default_unwind_cache
from schemas import topics
from schemas.wire import hex_u64

EXIT_WAIT_S = 10.0  # at exit, how long to wait for a Kafka that is away before counting what is held as dropped
FLUSH_S = 60.0  # at exit, how long Kafka may take to acknowledge what is held


@click.command("agent")
@click.option("--dry-run", is_flag=True,
              help="Print one window's records as JSON lines instead of publishing them (needs --once).")
@click.option("--once", is_flag=True, help="Collect one window, then exit.")
@click.option("--window", type=Duration(), default="10s", show_default=True, help="Reporting window: 500ms, 2s, 1m.")
@click.option("--frequency", type=click.IntRange(1, 1000), default=19, show_default=True,
              help="CPU samples per second per CPU.")
@click.option("--pid", type=click.IntRange(1), default=None, help="Sample only this process.")
@click.option("--comm", default=None, help="Keep only processes with this command name (as in /proc/PID/comm).")
@click.option("--cgroup", default=None, help="Keep only processes whose cgroup path starts with this, e.g. "
                                             "/kubepods.slice or /system.slice/docker-<id>.scope.")
@click.option("--node", envvar="FLEETPROF_NODE", default=None,
              help="Node name in the records; one agent runs per node and data directory. [env FLEETPROF_NODE; "
                   "default: this host's name]")
@click.option("--gpu/--no-gpu", default=True, show_default=True,
              help="Also time CUDA kernels with their launching stacks (fleetprof USDT probes) and poll NVML.")
@click.option("--nvml-period", type=Duration(), default="1s", show_default=True, help="NVML poll period (at least 1s).")
@click.option("--buffer-mb", type=click.FloatRange(0, min_open=True), envvar="FLEETPROF_AGENT_BUFFER_MB",
              default=256, show_default=True,
              help="Memory for records waiting while Kafka is unreachable (every kind: CPU windows, GPU launches and "
                   "kernels, NVML polls, symbol tables); the oldest are dropped (and counted) beyond it. "
                   "[env FLEETPROF_AGENT_BUFFER_MB]")
@click.option("--stack-entries", type=click.IntRange(1024, 1 << 22), envvar="FLEETPROF_AGENT_STACK_ENTRIES",
              default=None, help="Stack map entries (rounded up to a power of two by the kernel); a stack whose slot "
                                 "is taken is lost, and counted. [env FLEETPROF_AGENT_STACK_ENTRIES; default: 64 per "
                                 "sample per second over all CPUs, 16,384 to 1,048,576]")
@click.option("--count-entries", type=click.IntRange(1024, 1 << 22), envvar="FLEETPROF_AGENT_COUNT_ENTRIES",
              default=DEFAULT_MAX_ENTRIES, show_default=True,
              help="Distinct (thread, stack) pairs counted per second; beyond it samples are dropped, and counted. "
                   "[env FLEETPROF_AGENT_COUNT_ENTRIES]")
@click.option("--unwind", type=click.Choice(["tables", "frame-pointers"]), envvar="FLEETPROF_AGENT_UNWIND",
              default="tables", show_default=True,
              help="How user stacks are walked: from each binary's call-frame tables (.eh_frame, compiled once per "
                   "build id and cached under the data directory; frame pointers where a file has none), or by "
                   "frame pointers only. [env FLEETPROF_AGENT_UNWIND]")
@click.option("--unwind-cache", type=click.Path(file_okay=False, path_type=Path), envvar="FLEETPROF_UNWIND_CACHE",
              default=None, help="Where compiled call-frame tables are kept, per build id, for every agent and run "
                                 "on this machine. [env FLEETPROF_UNWIND_CACHE; default: $XDG_CACHE_HOME/fleetprof/"
                                 "unwind, else ~/.cache/fleetprof/unwind]")
@click.option("--unwind-rows", type=click.IntRange(1024, 1 << 26), envvar="FLEETPROF_AGENT_UNWIND_ROWS",
              default=DEFAULT_ROWS, show_default=True,
              help="Call-frame table rows of all loaded binaries together (8 bytes of kernel memory each; a "
                   "500 MB library has ~6 million); a binary that does not fit is walked by frame pointers, and "
                   "counted. "
                   "[env FLEETPROF_AGENT_UNWIND_ROWS]")
@click.option("--python-frames/--no-python-frames", envvar="FLEETPROF_AGENT_PYTHON_FRAMES", default=True,
              show_default=True,
              help="Read the Python frames of CPython 3.11+ processes from the interpreter itself (stock builds, "
                   "no -X perf needed) and put them in place of its evaluator frames. "
                   "[env FLEETPROF_AGENT_PYTHON_FRAMES]")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="Serve Prometheus /metrics on this port (0: off).")
@click.option("--metrics-host", default="127.0.0.1", show_default=True, help="Address /metrics listens on.")
@click.option("--format", "fmt", type=click.Choice(["json", "text"]), default=None,
              help="Dry run: json (the default) prints one CpuStackBatch per line, one process each, addresses as "
                   "hex strings, then any GpuLaunch, GpuKernel and GpuMetrics records, one per line. Publishing: "
                   "json prints a final summary line on stdout; text (the default) none.")
@identity_options
@click.pass_obj
def agent(settings: Settings, dry_run: bool, once: bool, window: float, frequency: int, pid: int | None,
          comm: str | None, cgroup: str | None, node: str | None, gpu: bool, nvml_period: float, buffer_mb: float,
          stack_entries: int | None, count_entries: int, unwind: str, unwind_cache: Path | None, unwind_rows: int,
          python_frames: bool, metrics_port: int,
          metrics_host: str, fmt: str | None, identity: IdentitySettings) -> None:
    """Run the node agent: CPU stacks (eBPF, needs root), CUDA kernel time with launching stacks (USDT) and NVML
    metrics, published to Kafka with the symbol tables they need sent first. Whatever cannot run here is said in
    one line and the rest keeps running; while Kafka is unreachable (or lacks its topics) records wait in memory and
    go once it is back. Stops on SIGTERM/SIGINT after sending what it collected."""
    if dry_run and not once:
        raise click.UsageError("--dry-run needs --once")
    if dry_run and fmt == "text":
        raise click.UsageError("--dry-run prints JSON only")
    options = CollectorOptions(node or socket.gethostname(), frequency, pid, ProcessFilter(comm=comm, cgroup=cgroup),
                               gpu, nvml_period, stack_entries, count_entries,
                               unwind_dir=(unwind_cache or default_unwind_cache()) if unwind == "tables" else None,
                               unwind_rows=unwind_rows, python_frames=python_frames)
    identities = build_resolver(identity, options.node)
    identities.start()  # its own thread: the kubelet and pod-resources answers, never on the sampling path
    try:
        if dry_run:
            _dry_run(options, window, identities)
        else:
            _publish(settings, options, window, once, fmt or "text", int(buffer_mb * 2**20),
                     (metrics_host, metrics_port), identities)
    finally:
        identities.close()


class NothingToCollect(click.ClickException):
    exit_code = EXIT_NOTHING_TO_COLLECT  # `fleetprof up` then leaves the agent off instead of restarting it


def _open(options: CollectorOptions, processes: ProcessCache, identities: IdentityResolver) -> OpenedCollectors:
    opened = open_collectors(options, processes, identities)
    if not opened.collectors:
        raise NothingToCollect("nothing to collect on this node: " + "; ".join(opened.notes or ["no GPU"]))
    if options.pid is not None:
        processes.get(options.pid)  # mappings now, in case it exits within the window
    return opened


def _parts(opened: OpenedCollectors, options: CollectorOptions) -> str:
    said = {"cpu": f"CPU at {options.frequency_hz} Hz", "gpu": "CUDA kernels", "nvml": "NVML"}
    return ", ".join(said[name] for name in opened.names())


def _read_kernel() -> KernelSymbols | None:
    try:
        kernel = read_kallsyms()
    except OSError as exc:
        click.echo(f"warning: no kernel symbols ({exc.strerror or exc}): kernel frames stay unknown", err=True)
        return None
    if not len(kernel):
        click.echo(f"warning: /proc/kallsyms hides addresses ({kernel.hidden} symbols; kptr_restrict, run as root):"
                   " kernel frames stay unknown", err=True)
    return kernel


# --- publishing ------------------------------------------------------------------------------------------------


def _publish(settings: Settings, options: CollectorOptions, window_s: float, once: bool, fmt: str,
             buffer_bytes: int, metrics: tuple[str, int], identities: IdentityResolver) -> None:
    lock = AgentLock(settings.data_dir, options.node)
    try:
        lock.acquire()
    except AgentRunning as exc:
        raise click.ClickException(str(exc)) from None
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    kernel = _read_kernel()
    options = CollectorOptions(**{**options.__dict__, "kernel_build_id": kernel.build_id if kernel else ""})
    config = settings.kafka_config()
    processes = ProcessCache()
    opened = _open(options, processes, identities)
    if metrics[1]:
        _serve_metrics(opened, *metrics, identities)
    wanted = [topics.SYMBOLS.name, topics.IDENTITIES.name, topics.CPU_STACKS.name]
    if "gpu" in opened.names():
        wanted += [topics.GPU_LAUNCHES.name, topics.GPU_KERNELS.name]
    if "nvml" in opened.names():
        wanted.append(topics.GPU_METRICS.name)
    link = KafkaLink(config, wanted)
    publisher = Publisher({**config, "log_level": 0})  # connection trouble: the link says it, once per change
    encoder = OutboxEncoder(kernel, max_bytes=link.max_bytes, perf_maps=processes.perf_maps, identities=identities)
    outbox = Outbox(publisher, link, encoder, buffer_bytes)
    lines = WindowLines(outbox, opened)
    agent = Agent(opened.collectors, outbox, window_s, on_window=lines.print, align=not once)
    link.start()
    agent.begin()  # the probes are attached before the line that says so: a workload started after it is seen whole
    click.echo(f"collecting {_parts(opened, options)}; {window_s:g} s windows, sending to "
               f"{config['bootstrap.servers']}" + (" (one window)" if once else " (until SIGTERM/SIGINT)"), err=True)
    try:
        report = agent.run(stop, once)
        if not link.ready:
            link.wait_ready(EXIT_WAIT_S)
        if link.ready:
            outbox.drain(FLUSH_S)
        held = sum(u.records for u in outbox.held)
        outbox.drop_held()
    finally:
        counters = {c.name: c.counters() for c in opened.collectors}
        opened.close()
        link.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        lock.release()
    summary = _summary(options, report, outbox, encoder, opened, counters)
    if fmt == "json":
        sys.stdout.write(json.dumps(summary) + "\n")
    click.echo(f"stopped after {report.windows} windows: {_tally(outbox.sent)} sent, {_tally(outbox.dropped)} "
               f"dropped; {publisher.bytes} bytes", err=True)
    if outbox.unconfirmed or held:
        why = f" ({link.reason})" if link.reason else ""
        raise click.ClickException(f"Kafka at {link.where} {link.state}{why} at exit: {held} records dropped, "
                                   f"{outbox.unconfirmed} messages not confirmed")


def _serve_metrics(opened: OpenedCollectors, host: str, port: int, identities: IdentityResolver) -> None:
    from prometheus_client import REGISTRY, start_http_server

    from producers.identity_metrics import IdentityMetrics
    from producers.unwind_metrics import UnwindMetrics

    if host not in ("127.0.0.1", "::1", "localhost"):
        click.echo(f"warning: Prometheus /metrics listens on {host}, beyond this machine", err=True)
    cpu = next((c for c in opened.collectors if c.name == "cpu"), None)
    if cpu is not None and cpu.unwind is not None:
        REGISTRY.register(UnwindMetrics(cpu.unwind))
    REGISTRY.register(IdentityMetrics(identities))
    start_http_server(port, addr=host)


def _tally(tallies: dict) -> str:
    return ", ".join(f"{t.records} {RECORD_NAMES[k]}" for k, t in tallies.items() if t.units) or "nothing"


class WindowLines:
    """One line on stderr per window: what it collected and what waits for Kafka."""

    def __init__(self, outbox: Outbox, opened: OpenedCollectors) -> None:
        self.outbox = outbox
        self.opened = opened
        self._before = {k: t.records for k, t in outbox.put_tally.items()}

    def print(self, window: Window, report: AgentReport) -> None:
        trim_heap()  # reading new binaries' symbol tables is bursty: give the peak back, not keep it
        put = self.outbox.put_tally
        now = {k: t.records - self._before[k] for k, t in put.items()}
        self._before = {k: t.records for k, t in put.items()}
        cpu = next((c for c in self.opened.collectors if c.name == "cpu"), None)
        lost = cpu.sampler.lost_samples if cpu is not None else 0
        dropped = cpu.sampler.dropped_samples if cpu is not None else 0
        click.echo(f"window {window.index}: {now['cpu']} samples, {now['symbols']} symbol chunks, "
                   f"{now['gpu_launches']} launches, {now['gpu_kernels']} kernels, {now['gpu_metrics']} GPU metric "
                   f"polls; {self.outbox.sent['cpu'].records} samples delivered so far, {self.outbox.pending_bytes} "
                   f"bytes waiting for Kafka ({self.outbox.link.state}); {lost} lost stacks, {dropped} dropped (map "
                   "full)", err=True)


def _summary(options: CollectorOptions, report: AgentReport, outbox: Outbox, encoder: OutboxEncoder,
             opened: OpenedCollectors, counters: dict[str, dict[str, int]]) -> dict:
    cpu = counters.get("cpu", {})
    sampler = next((c.sampler for c in opened.collectors if c.name == "cpu"), None)
    sent, dropped, put = outbox.sent, outbox.dropped, outbox.put_tally
    return {"node": options.node, "windows": report.windows,
            "samples": sent["cpu"].records, "produced_samples": put["cpu"].records,
            "batches": put["cpu"].messages, "symbol_chunks": put["symbols"].records,
            "build_ids": encoder.new_build_ids, "unreadable_files": encoder.unreadable,
            "lost_stacks": cpu.get("lost_stacks", 0), "map_full_samples": cpu.get("map_full_samples", 0),
            "user_stacks_by": sampler.unwinding if sampler is not None else "",
            "unwind": {k.removeprefix("unwind_"): v for k, v in cpu.items() if k.startswith("unwind_")},
            "python": {k.removeprefix("python_"): v for k, v in cpu.items() if k.startswith("python_")},
            "dropped_windows": dropped["cpu"].units, "dropped_samples": dropped["cpu"].records,
            "dropped_messages": sum(t.messages for t in dropped.values()),
            "dropped_bytes": sum(t.bytes for t in dropped.values()),
            "buffer_peak_bytes": outbox.peak_bytes,
            "gpu_launches": put["gpu_launches"].records, "gpu_kernels": put["gpu_kernels"].records,
            "gpu_metric_polls": put["gpu_metrics"].records, "dead_letters": put["dead_letters"].records,
            "sent": {k: t.records for k, t in sent.items()}, "sent_bytes": {k: t.bytes for k, t in sent.items()},
            "dropped": {k: t.records for k, t in dropped.items()},
            "unsendable": outbox.unsendable, "counters": counters, "gpu_probe_counters": counters.get("gpu", {}),
            "off": opened.notes, "kafka": outbox.link.state, "kafka_state_changes": outbox.link.changes,
            "kernel_build_id": options.kernel_build_id, "bytes": outbox.publisher.bytes,
            "elapsed_s": round(time.monotonic() - report.started, 3)}


# --- the dry run ------------------------------------------------------------------------------------------------


def _hex_mappings(mappings: list[dict]) -> list[dict]:
    return [{**m, "start": hex_u64(m["start"]), "limit": hex_u64(m["limit"]), "file_offset": hex_u64(m["file_offset"])}
            for m in mappings]


class DryRunOutlet:
    """Holds one window's records and prints them as JSON lines: CPU batches (one process each, addresses as hex
    strings), then GPU launches, kernels and NVML polls."""

    pending = False

    def __init__(self) -> None:
        self.cpu: list[dict] = []
        self.gpu: list[dict] = []

    def put(self, records: Records) -> None:
        (self.cpu if records.kind == "cpu" else self.gpu).extend(
            {**r, "user_addrs": [hex_u64(a) for a in r["user_addrs"]], "mappings": _hex_mappings(r["mappings"])}
            if records.kind == "gpu_launches" else r for r in records.records)

    def pump(self) -> None:
        """Nothing to move: it prints at the end."""

    def write(self) -> int:
        """Print everything; returns the CPU samples printed."""
        total = 0
        for batch in self.cpu:
            for proc in batch["processes"]:
                total += sum(s["count"] for s in proc["stacks"])
                line = {**batch, "processes": [{
                    **proc, "mappings": _hex_mappings(proc["mappings"]),
                    "stacks": [{**s, "user_addrs": [hex_u64(a) for a in s["user_addrs"]],
                                "kernel_addrs": [hex_u64(a) for a in s["kernel_addrs"]]} for s in proc["stacks"]]}]}
                sys.stdout.write(json.dumps(line, separators=(",", ":")) + "\n")
        for rec in self.gpu:
            sys.stdout.write(json.dumps(rec, separators=(",", ":")) + "\n")
        return total


def _dry_run(options: CollectorOptions, window_s: float, identities: IdentityResolver) -> None:
    options = CollectorOptions(**{**options.__dict__, "kernel_build_id": kernel_build_id()})
    processes = ProcessCache()
    opened = _open(options, processes, identities)
    outlet = DryRunOutlet()
    try:
        agent = Agent(opened.collectors, outlet, window_s)
        agent.begin()
        click.echo(f"collecting {_parts(opened, options)} for {window_s:g} s ...", err=True)
        report = agent.run(threading.Event(), once=True)
        counters = {c.name: c.counters() for c in opened.collectors}
    finally:
        opened.close()
    total = outlet.write()
    cpu = counters.get("cpu")
    lost = f"{cpu['lost_stacks']} lost stacks, {cpu['map_full_samples']} dropped (counts map full)" \
        if cpu is not None else "CPU sampling off"
    found = report.records
    click.echo(f"{total} samples, {sum(len(b['processes']) for b in outlet.cpu)} processes, {lost}; "
               f"{found.get('gpu_launches', 0)} launches, {found.get('gpu_kernels', 0)} kernels, "
               f"{found.get('gpu_metrics', 0)} GPU metric polls", err=True)
