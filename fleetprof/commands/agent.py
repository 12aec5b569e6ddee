"""`fleetprof agent`: CPU stacks, CUDA kernel time with launching stacks and NVML metrics per window, published with
the symbol tables they need (or printed: `--dry-run`)."""

from __future__ import annotations

import json
import re
import signal
import socket
import sys
import threading
import time

import click

from fleetprof.settings import Settings
from producers.agent_loop import AgentCollectors, AgentLoop
from producers.agent_sender import AgentSender
from producers.cpu import ProcessCache, ProcessFilter, build_cpu_batch
from producers.cpu_sampler import BpfUnavailable, CpuSampler
from producers.gpu_probes import publish as publish_gpu
from producers.kallsyms import KernelSymbols, kernel_build_id, read_kallsyms
from producers.memory import trim_heap
from producers.outage_buffer import OutageBuffer
from producers.publisher import Publisher, PublishError, check_broker
from schemas import topics
from schemas.single_object import encode

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m)?\s*$")


def parse_duration(text: str) -> float:
    """`500ms`, `2s`, `2` (seconds), `1m` → seconds; ValueError otherwise."""
    m = _DURATION.match(text)
    if not m:
        raise ValueError(f"not a duration: {text!r} (use e.g. 500ms, 2s, 1m)")
    value = float(m.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0}[m.group(2) or "s"]
    if value <= 0:
        raise ValueError(f"duration must be positive: {text!r}")
    return value


def _hex(v: int) -> str:
    return f"0x{v & 0xFFFFFFFFFFFFFFFF:x}"


def _hex_launch(rec: dict) -> dict:
    """A GpuLaunch record with addresses as hex strings, for people reading the dry run."""
    return {**rec, "user_addrs": [_hex(a) for a in rec["user_addrs"]],
            "mappings": [{**m, "start": _hex(m["start"]), "limit": _hex(m["limit"]),
                          "file_offset": _hex(m["file_offset"])} for m in rec["mappings"]]}


def _hex_addrs(batch: dict) -> dict:
    """The record with addresses as hex strings (unsigned), for people reading the dry run."""
    def hx(v: int) -> str:
        return f"0x{v & 0xFFFFFFFFFFFFFFFF:x}"
    out = dict(batch)
    out["processes"] = [{
        **p,
        "mappings": [{**m, "start": hx(m["start"]), "limit": hx(m["limit"]), "file_offset": hx(m["file_offset"])}
                     for m in p["mappings"]],
        "stacks": [{**s, "user_addrs": [hx(a) for a in s["user_addrs"]],
                    "kernel_addrs": [hx(a) for a in s["kernel_addrs"]]} for s in p["stacks"]],
    } for p in batch["processes"]]
    return out


@click.command("agent")
@click.option("--dry-run", is_flag=True,
              help="Print one window's records as JSON lines instead of publishing them (needs --once).")
@click.option("--once", is_flag=True, help="Collect one window, then exit.")
@click.option("--window", default="10s", show_default=True, help="Reporting window: 500ms, 2s, 1m.")
@click.option("--frequency", type=click.IntRange(1, 1000), default=19, show_default=True,
              help="CPU samples per second per CPU.")
@click.option("--pid", type=click.IntRange(1), default=None, help="Sample only this process.")
@click.option("--comm", default=None, help="Keep only processes with this command name (as in /proc/PID/comm).")
@click.option("--cgroup", default=None, help="Keep only processes whose cgroup path starts with this, e.g. "
                                             "/kubepods.slice or /system.slice/docker-<id>.scope.")
@click.option("--node", default=None, help="Node name in the records. [default: this host's name]")
@click.option("--gpu/--no-gpu", default=True, show_default=True,
              help="Also time CUDA kernels with their launching stacks (fleetprof USDT probes) and poll NVML.")
@click.option("--nvml-period", default="1s", show_default=True, help="NVML poll period (at least 1s).")
@click.option("--buffer-mb", type=click.FloatRange(0, min_open=True), envvar="FLEETPROF_AGENT_BUFFER_MB",
              default=256, show_default=True,
              help="Memory for windows waiting while Kafka is unreachable; the oldest whole windows are dropped "
                   "(and counted) beyond it. [env FLEETPROF_AGENT_BUFFER_MB]")
@click.option("--format", "fmt", type=click.Choice(["json", "text"]), default=None,
              help="Dry run: json (the default) prints one CpuStackBatch per line, one process each, addresses as "
                   "hex strings, then any GpuLaunch, GpuKernel and GpuMetrics records, one per line. Publishing: "
                   "json prints a final summary line on stdout; text (the default) none.")
@click.pass_obj
def agent(settings: Settings, dry_run: bool, once: bool, window: str, frequency: int, pid: int | None,
          comm: str | None, cgroup: str | None, node: str | None, gpu: bool, nvml_period: str,
          buffer_mb: float, fmt: str | None) -> None:
    """Run the node agent: CPU stacks (eBPF, needs root), CUDA kernel time with launching stacks (USDT) and NVML
    metrics, published to Kafka with the symbol tables they need sent first. Whatever cannot run here is said in
    one line and the rest keeps running. Stops on SIGTERM/SIGINT after sending what it collected."""
    try:
        window_s = parse_duration(window)
        nvml_s = parse_duration(nvml_period)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    node = node or socket.gethostname()
    keep = ProcessFilter(comm=comm, cgroup=cgroup)
    if dry_run:
        if not once:
            raise click.UsageError("--dry-run needs --once")
        if fmt == "text":
            raise click.UsageError("--dry-run prints JSON only")
    elif fmt is None:
        fmt = "text"
    run = AgentRun(settings, window_s, frequency, pid, node, keep, gpu, nvml_s, int(buffer_mb * 2**20))
    if dry_run:
        run.dry_run()
    else:
        run.publish(once, fmt)


def _open_collectors(frequency: int, pid: int | None, node: str, processes: ProcessCache, gpu: bool,
                     nvml_s: float) -> AgentCollectors:
    """Start what can run here; one line on stderr for each part that cannot, and an error when none can."""
    found = AgentCollectors()
    try:
        sampler = CpuSampler(frequency_hz=frequency, pid_filter=pid)
        sampler.start()
        found.sampler = sampler
    except BpfUnavailable as exc:
        found.notes.append(f"CPU sampling off: BPF unavailable: {exc}")
    if gpu:
        if found.sampler is not None:
            from producers.gpu_probes import GpuProbeCollector

            probes = GpuProbeCollector(node, processes)
            try:
                probes.start()
                found.gpu = probes
            except BpfUnavailable as exc:
                found.notes.append(f"CUDA kernel timing off: {exc}")
        else:
            found.notes.append("CUDA kernel timing off: it needs BPF too")
        try:
            from producers.nvml_collector import NvmlCollector
        except ImportError as exc:  # nvidia-ml-py missing from this install
            found.notes.append(f"GPU metrics off: {exc}")
        else:
            nvml = NvmlCollector(node, period_s=nvml_s)
            if nvml.open():  # when it cannot, it has said why once itself
                found.nvml = nvml
    for note in found.notes:
        click.echo(f"warning: {note}", err=True)
    if found.sampler is None and found.gpu is None and found.nvml is None:
        found.close()
        raise click.ClickException("nothing to collect on this node: " + "; ".join(found.notes or ["no GPU"]))
    return found


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


class AgentRun:
    """One `fleetprof agent` invocation: opens the collectors, runs windows, publishes or prints."""

    def __init__(self, settings: Settings, window_s: float, frequency: int, pid: int | None, node: str,
                 keep: ProcessFilter, gpu: bool, nvml_s: float, buffer_bytes: int = 256 << 20) -> None:
        self.settings = settings
        self.window_s = window_s
        self.frequency = frequency
        self.pid = pid
        self.node = node
        self.keep = keep
        self.gpu = gpu
        self.nvml_s = nvml_s
        self.buffer_bytes = buffer_bytes
        self.processes = ProcessCache()

    def _kept(self, records: list[dict]) -> list[dict]:
        """GPU records of the processes the filters keep."""
        out = []
        for rec in records:
            if self.pid is not None and rec["pid"] != self.pid:
                continue
            if (self.keep.comm is not None or self.keep.cgroup is not None) and \
                    not self.keep.accepts(self.processes.get(rec["pid"])):
                continue
            out.append(rec)
        return out

    def _open(self) -> AgentCollectors:
        collectors = _open_collectors(self.frequency, self.pid, self.node, self.processes, self.gpu, self.nvml_s)
        if self.pid is not None:
            self.processes.get(self.pid)  # mappings now, in case it exits within the window
        return collectors

    def _batch(self, collectors: AgentCollectors, samples: list, start_ns: int, kid: str) -> dict:
        if collectors.sampler is None:
            self.processes.end_window()
        return build_cpu_batch(samples, self.processes, self.node, start_ns, time.time_ns() - start_ns,
                               self.frequency, kid, self.keep)

    def dry_run(self) -> None:
        collectors = self._open()
        gpu_lines: list[str] = []

        def on_gpu(launches: list[dict], kernels: list[dict]) -> None:
            gpu_lines.extend(json.dumps(_hex_launch(r), separators=(",", ":")) for r in self._kept(launches))
            gpu_lines.extend(json.dumps(r, separators=(",", ":")) for r in self._kept(kernels))

        def on_metrics(record: dict) -> None:
            gpu_lines.append(json.dumps(record, separators=(",", ":")))

        loop = AgentLoop(collectors, self.processes, on_gpu, on_metrics)
        try:
            loop.start()
            click.echo(f"sampling at {self.frequency} Hz for {self.window_s:g} s ...", err=True)
            start_ns = time.time_ns()
            batch = self._batch(collectors, loop.window(self.window_s), start_ns, kernel_build_id())
        finally:
            collectors.close()
        total = 0
        for proc in batch["processes"]:
            total += sum(s["count"] for s in proc["stacks"])
            line = _hex_addrs({**batch, "processes": [proc]})
            sys.stdout.write(json.dumps(line, separators=(",", ":")) + "\n")
        for line in gpu_lines:
            sys.stdout.write(line + "\n")
        sampler = collectors.sampler
        lost = f"{sampler.lost_samples} lost stacks, {sampler.dropped_samples} dropped (counts map full)" \
            if sampler is not None else "CPU sampling off"
        click.echo(f"{total} samples, {len(batch['processes'])} processes, {lost}; {loop.launches} launches, "
                   f"{loop.kernels} kernels, {loop.metrics} GPU metric polls", err=True)

    def publish(self, once: bool, fmt: str) -> None:
        config = self.settings.kafka_config()
        try:
            check_broker(config, [topics.CPU_STACKS.name, topics.SYMBOLS.name])
        except PublishError as exc:
            raise click.ClickException(str(exc)) from None
        stop = threading.Event()
        previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
        kernel = _read_kernel()
        kid = kernel.build_id if kernel is not None else ""
        publisher = Publisher(config)
        sender = AgentSender(publisher, kernel)
        outbox = OutageBuffer(publisher, self.buffer_bytes)
        windows = lost = dropped = launches = kernels = metrics = 0
        t0 = time.monotonic()
        collectors = self._open()

        def on_gpu(found_launches: list[dict], found_kernels: list[dict]) -> None:
            nonlocal launches, kernels
            kept_l, kept_k = self._kept(found_launches), self._kept(found_kernels)
            publish_gpu(publisher, kept_l, kept_k, sender)
            launches, kernels = launches + len(kept_l), kernels + len(kept_k)

        def on_metrics(record: dict) -> None:
            nonlocal metrics
            publisher.publish(topics.GPU_METRICS.name, record["node"], encode("GpuMetrics", record))
            metrics += 1

        loop = AgentLoop(collectors, self.processes, on_gpu, on_metrics)
        try:
            loop.start()
            parts = [f"CPU at {self.frequency} Hz" if collectors.sampler is not None else None,
                     "CUDA kernels" if collectors.gpu is not None else None,
                     "NVML" if collectors.nvml is not None else None]
            click.echo(f"collecting {', '.join(p for p in parts if p)}; {self.window_s:g} s windows, sending to "
                       f"{config['bootstrap.servers']}" + (" (one window)" if once else " (until SIGTERM/SIGINT)"),
                       err=True)
            while True:
                start_ns = time.time_ns()
                samples = loop.window(self.window_s, stop)  # a signal ends the window early; its data still goes
                chunks_before = sender.symbol_chunks
                batch = self._batch(collectors, samples, start_ns, kid)
                held = sender.window_messages(batch)
                outbox.add(held)
                # Kafka away: keep sampling (a glance for acks, not a wait), the windows wait in the buffer
                outbox.drain(idle_s=0.05 if outbox.buffering else 2.0, budget_s=max(self.window_s, 30.0))
                trim_heap()  # reading new binaries' symbol tables is bursty: give the peak back, not keep it
                windows += 1
                sampler = collectors.sampler
                if sampler is not None:
                    lost, dropped = lost + sampler.lost_samples, dropped + sampler.dropped_samples
                click.echo(f"window {windows}: {held.samples} samples, {held.processes} processes, "
                           f"{len(held.batches)} batches, {sender.symbol_chunks - chunks_before} symbol chunks "
                           f"({held.new_build_ids} new build ids), {held.bytes} bytes; "
                           f"{outbox.pending_bytes} bytes waiting for Kafka; "
                           f"{sampler.lost_samples if sampler else 0} lost stacks, "
                           f"{sampler.dropped_samples if sampler else 0} dropped; {launches} launches, {kernels} "
                           f"kernels, {metrics} GPU metric polls so far", err=True)
                if once or stop.is_set():
                    break
            # what is still waiting gets one more chance, then counts as dropped
            if not outbox.drain(idle_s=10.0, budget_s=sender.flush_timeout):
                outbox.drop_rest()
            if outbox.unconfirmed:
                raise PublishError(f"{outbox.unconfirmed} messages not confirmed by Kafka at exit")
            if publisher.flush(sender.flush_timeout):
                raise PublishError(f"GPU records not delivered within {sender.flush_timeout:.0f} s")
        except PublishError as exc:
            raise click.ClickException(str(exc)) from None
        finally:
            gpu_counters = collectors.gpu.counters() if collectors.gpu is not None else {}
            collectors.close()
            if not publisher.failed:
                publisher.poll(0)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        summary = {"node": self.node, "windows": windows, "samples": outbox.sent_samples,
                   "produced_samples": sender.samples, "batches": sender.batches,
                   "symbol_chunks": sender.symbol_chunks, "build_ids": len(sender.sent_build_ids),
                   "unreadable_files": sender.unreadable, "lost_stacks": lost, "map_full_samples": dropped,
                   "dropped_windows": outbox.dropped_windows, "dropped_messages": outbox.dropped_messages,
                   "dropped_bytes": outbox.dropped_bytes, "dropped_samples": outbox.dropped_samples,
                   "buffer_peak_bytes": outbox.peak_bytes,
                   "gpu_launches": launches, "gpu_kernels": kernels, "gpu_metric_polls": metrics,
                   "gpu_probe_counters": gpu_counters, "off": collectors.notes,
                   "kernel_build_id": kid, "bytes": publisher.bytes,
                   "elapsed_s": round(time.monotonic() - t0, 3)}
        if fmt == "json":
            sys.stdout.write(json.dumps(summary) + "\n")
        click.echo(f"stopped after {windows} windows: {outbox.sent_samples} samples sent, {outbox.dropped_samples} "
                   f"dropped in {outbox.dropped_windows} windows while Kafka was away, {launches} launches, {kernels} "
                   f"kernels, {metrics} GPU metric polls, {publisher.bytes} bytes sent", err=True)
