"""`fleetprof agent --dry-run --once`: collect one window of CPU stacks and print what would be sent."""

from __future__ import annotations

import json
import re
import sys

import click

from producers.cpu import ProcessCache, collect_window
from producers.cpu_sampler import BpfUnavailable, CpuSampler

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
@click.option("--dry-run", is_flag=True, required=True,
              help="Print the records instead of publishing them (required: publishing is not built yet).")
@click.option("--once", is_flag=True, required=True, help="Collect one window, then exit (required for now).")
@click.option("--window", default="10s", show_default=True, help="Reporting window: 500ms, 2s, 1m.")
@click.option("--frequency", type=click.IntRange(1, 1000), default=19, show_default=True,
              help="CPU samples per second per CPU.")
@click.option("--pid", type=click.IntRange(1), default=None, help="Sample only this process.")
@click.option("--format", "fmt", type=click.Choice(["json"]), default="json", show_default=True,
              help="json: one CpuStackBatch per line, one process each, addresses as hex strings.")
def agent(dry_run: bool, once: bool, window: str, frequency: int, pid: int | None, fmt: str) -> None:
    """Run the node agent's CPU sampler (eBPF, needs root) and print one window of stacks as JSON lines."""
    try:
        window_s = parse_duration(window)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    processes = ProcessCache()
    sampler = CpuSampler(frequency_hz=frequency, pid_filter=pid)
    try:
        sampler.start()
    except BpfUnavailable as exc:
        raise click.ClickException(f"BPF unavailable: {exc}") from None
    try:
        if pid is not None:
            processes.get(pid)  # mappings now, in case it exits within the window
        click.echo(f"sampling at {frequency} Hz for {window_s:g} s ...", err=True)
        batch = collect_window(sampler, window_s, processes)
    finally:
        sampler.close()
    total = 0
    for proc in batch["processes"]:
        total += sum(s["count"] for s in proc["stacks"])
        line = _hex_addrs({**batch, "processes": [proc]})
        sys.stdout.write(json.dumps(line, separators=(",", ":")) + "\n")
    click.echo(f"{total} samples, {len(batch['processes'])} processes, {sampler.lost_samples} lost stacks, "
               f"{sampler.dropped_samples} dropped (counts map full)", err=True)
