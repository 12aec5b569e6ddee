"""`fleetprof agent`: sample CPU stacks per window and publish them with their symbol tables (or `--dry-run`)."""

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
from producers.agent_sender import AgentSender
from producers.cpu import ProcessCache, ProcessFilter, build_cpu_batch, collect_window, wait_window
from producers.cpu_sampler import BpfUnavailable, CpuSampler
from producers.kallsyms import KernelSymbols, kernel_build_id, read_kallsyms
from producers.memory import trim_heap
from producers.publisher import Publisher, PublishError, check_broker
from schemas import topics

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
@click.option("--format", "fmt", type=click.Choice(["json", "text"]), default=None,
              help="Dry run: json (the default) prints one CpuStackBatch per line, one process each, addresses as "
                   "hex strings. Publishing: json prints a final summary line on stdout; text (the default) none.")
@click.pass_obj
def agent(settings: Settings, dry_run: bool, once: bool, window: str, frequency: int, pid: int | None,
          comm: str | None, cgroup: str | None, node: str | None, fmt: str | None) -> None:
    """Run the node agent's CPU sampler (eBPF, needs root) and publish each window's stacks to Kafka, with the
    symbol tables they need sent first. Stops on SIGTERM/SIGINT after sending what it collected."""
    try:
        window_s = parse_duration(window)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    node = node or socket.gethostname()
    keep = ProcessFilter(comm=comm, cgroup=cgroup)
    if dry_run:
        if not once:
            raise click.UsageError("--dry-run needs --once")
        if fmt == "text":
            raise click.UsageError("--dry-run prints JSON only")
        _dry_run(window_s, frequency, pid, node, keep)
        return
    _publish(settings, window_s, frequency, pid, node, once, fmt or "text", keep)


def _start_sampler(frequency: int, pid: int | None) -> CpuSampler:
    sampler = CpuSampler(frequency_hz=frequency, pid_filter=pid)
    try:
        sampler.start()
    except BpfUnavailable as exc:
        raise click.ClickException(f"BPF unavailable: {exc}") from None
    return sampler


def _dry_run(window_s: float, frequency: int, pid: int | None, node: str, keep: ProcessFilter) -> None:
    processes = ProcessCache()
    sampler = _start_sampler(frequency, pid)
    try:
        if pid is not None:
            processes.get(pid)  # mappings now, in case it exits within the window
        click.echo(f"sampling at {frequency} Hz for {window_s:g} s ...", err=True)
        batch = collect_window(sampler, window_s, processes, node, keep)
    finally:
        sampler.close()
    batch["kernel_build_id"] = kernel_build_id()
    total = 0
    for proc in batch["processes"]:
        total += sum(s["count"] for s in proc["stacks"])
        line = _hex_addrs({**batch, "processes": [proc]})
        sys.stdout.write(json.dumps(line, separators=(",", ":")) + "\n")
    click.echo(f"{total} samples, {len(batch['processes'])} processes, {sampler.lost_samples} lost stacks, "
               f"{sampler.dropped_samples} dropped (counts map full)", err=True)


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


def _publish(settings: Settings, window_s: float, frequency: int, pid: int | None, node: str, once: bool,
             fmt: str, keep: ProcessFilter) -> None:
    config = settings.kafka_config()
    try:
        check_broker(config, [topics.CPU_STACKS.name, topics.SYMBOLS.name])
    except PublishError as exc:
        raise click.ClickException(str(exc)) from None
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    kernel = _read_kernel()
    kid = kernel.build_id if kernel is not None else ""
    processes = ProcessCache()
    publisher = Publisher(config)
    sender = AgentSender(publisher, kernel)
    sampler = _start_sampler(frequency, pid)
    windows = lost = dropped = 0
    t0 = time.monotonic()
    try:
        if pid is not None:
            processes.get(pid)  # mappings now, in case it exits within the window
        sampler.drain()  # the window starts now: compiling the BPF program took a while
        click.echo(f"sampling at {frequency} Hz, {window_s:g} s windows, sending to {config['bootstrap.servers']}"
                   + (" (one window)" if once else " (until SIGTERM/SIGINT)"), err=True)
        while True:
            start_ns = time.time_ns()
            wait_window(sampler, window_s, processes, stop)  # a signal ends the window early; its samples still go
            samples = sampler.drain()
            batch = build_cpu_batch(samples, processes, node, start_ns, time.time_ns() - start_ns, frequency, kid,
                                    keep)
            sent = sender.send_window(batch)
            trim_heap()  # reading new binaries' symbol tables is bursty: give the peak back, not keep it
            windows += 1
            lost, dropped = lost + sampler.lost_samples, dropped + sampler.dropped_samples
            click.echo(f"window {windows}: {sent.samples} samples, {sent.processes} processes, {sent.batches} "
                       f"batches, {sent.symbol_chunks} symbol chunks ({sent.new_build_ids} new build ids), "
                       f"{sent.bytes} bytes sent; {sampler.lost_samples} lost stacks, {sampler.dropped_samples} "
                       "dropped", err=True)
            if once or stop.is_set():
                break
    except PublishError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        sampler.close()
        if not publisher.failed:
            publisher.poll(0)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    summary = {"node": node, "windows": windows, "samples": sender.samples, "batches": sender.batches,
               "symbol_chunks": sender.symbol_chunks, "build_ids": len(sender.sent_build_ids),
               "unreadable_files": sender.unreadable, "lost_stacks": lost, "dropped_samples": dropped,
               "kernel_build_id": kid, "bytes": publisher.bytes,
               "elapsed_s": round(time.monotonic() - t0, 3)}
    if fmt == "json":
        sys.stdout.write(json.dumps(summary) + "\n")
    click.echo(f"stopped after {windows} windows: {sender.samples} samples, {publisher.bytes} bytes sent", err=True)
