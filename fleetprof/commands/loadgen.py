"""`fleetprof loadgen`: a simulated GPU fleet sending realistic raw data through the real Kafka topics."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from fleetprof.durations import Duration
from fleetprof.settings import Settings


@click.command("loadgen")
@click.option("--nodes", type=click.IntRange(min=1), default=10, show_default=True, help="Simulated nodes.")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=152.0, show_default=True,
              help="CPU samples per second per node (19 Hz x 8 busy CPUs).")
@click.option("--duration", type=Duration(), default="60s", show_default=True, help="30s, 5m, 1h or seconds.")
@click.option("--window", type=Duration(), default="10s", show_default=True, help="Reporting window per batch.")
@click.option("--seed", type=int, default=0, show_default=True, help="Same seed, same fleet and data.")
@click.option("--no-pace", is_flag=True, help="Send as fast as possible; timestamps stay consecutive windows.")
@click.option("--no-gpu", is_flag=True, help="CPU stacks only: no launches, kernels or GPU metrics.")
@click.option("--launch-rate", type=click.FloatRange(min=0), default=2.0, show_default=True,
              help="Sampled CUDA launches per second per GPU (8 GPUs per node).")
@click.option("--node-prefix", default="sim-node", show_default=True,
              help="Node names are <prefix>-0001…; another prefix keeps two runs apart.")
@click.option("--replay", type=click.IntRange(min=0), default=0, show_default=True,
              help="Pre-encode this many windows per node and send them over and over with their times and "
                   "correlation ids rewritten (the fleet bench's cheap mode); 0 encodes every window as it is sent.")
@click.option("--ready-file", type=click.Path(dir_okay=False), default=None,
              help="Create this file once set-up is done (symbol tables, identities, the replay's windows).")
@click.option("--go-file", type=click.Path(dir_okay=False), default=None,
              help="After set-up, wait until this file exists before the first window (a bench's start signal).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="Format of the final report.")
@click.pass_obj
def loadgen(settings: Settings, nodes: int, rate: float, duration: float, window: float, seed: int, no_pace: bool,
            no_gpu: bool, launch_rate: float, node_prefix: str, replay: int, ready_file: str | None,
            go_file: str | None, fmt: str) -> None:
    """Send simulated nodes' CPU stacks, CUDA launches/kernels, GPU metrics, symbol tables and workload identities
    (Kubernetes pods, Slurm jobs; all marked simulated) to Kafka, then print exact totals of what was sent."""
    from producers.publisher import PublishError, check_broker
    from schemas import topics
    from simulate.replay import run_loadgen

    kafka = settings.kafka_config()
    wanted = [topics.SYMBOLS.name, topics.IDENTITIES.name, topics.CPU_STACKS.name]
    if not no_gpu:
        wanted += [topics.GPU_LAUNCHES.name, topics.GPU_KERNELS.name, topics.GPU_METRICS.name]
    console = Console(stderr=True)
    try:
        with console.status(f"Checking Kafka at {settings.kafka}…"):
            check_broker(kafka, wanted, timeout=8.0)
        columns = (TextColumn("[bold]loadgen[/] {task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("node-windows"), TimeElapsedColumn(), TimeRemainingColumn())
        with Progress(*columns, console=console, transient=True) as bar:
            windows = max(1, math.ceil(duration / window - 1e-9))
            task = bar.add_task(f"{nodes} nodes" + ("" if no_pace else " (paced)"), total=nodes * windows)
            report = run_loadgen(kafka, nodes=nodes, rate=rate, duration=duration, window=window, seed=seed,
                                 pace=not no_pace, gpu=not no_gpu, launch_rate=launch_rate, node_prefix=node_prefix,
                                 progress=lambda done, total: bar.update(task, completed=done, total=total),
                                 replay=replay, ready=_handshake(ready_file, go_file))
    except (PublishError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    if fmt == "json":
        click.echo(json.dumps(report.to_json()))
        return
    gen = max(report.generate_s, 1e-9)
    click.echo(f"sent {len(report.nodes)} simulated nodes x {report.windows} windows of "
               f"{report.window_ns / 1e9:g} s (seed {seed}) to {settings.kafka} in {report.elapsed_s:.1f} s")
    click.echo(f"  cpu.stacks    {report.batches:>9,} batches   {report.total_samples:,} samples "
               f"({report.total_samples / gen:,.0f} samples/s generated and encoded)")
    if not no_gpu:
        click.echo(f"  gpu.launches  {report.launches:>9,} sampled launches (standing for {report.launch_weight:,})")
        click.echo(f"  gpu.kernels   {report.kernels:>9,} kernels, {report.kernel_ns / 1e9:,.3f} s of GPU time")
        click.echo(f"  gpu.metrics   {report.metrics:>9,} polls")
    click.echo(f"  symbols       {report.symbol_chunks:>9,} chunks for {len(report.build_ids)} build ids")
    click.echo(f"  identities    {report.identities:>9,} workload definitions "
               f"({len(report.samples_by_identity):,} workloads sampled)")
    click.echo(f"  {report.bytes / 1e6:,.1f} MB in all")
    if report.replay_windows:
        click.echo(f"  replayed {report.replay_windows} pre-encoded windows per node; CPU {report.cpu_prepare_s:.1f} s "
                   f"to prepare, {report.cpu_send_s:.2f} s to send")
    top = sorted(report.samples_by_leaf.items(), key=lambda kv: -kv[1])[:5]
    click.echo("top leaf functions: " + "; ".join(f"{fn[:60]} ({binary}) {n:,}" for (binary, fn), n in top))


def _handshake(ready_file: str | None, go_file: str | None) -> Callable[[], None] | None:
    """What loadgen does between set-up and the first window: say it is ready, wait for the go."""
    if ready_file is None and go_file is None:
        return None

    def ready() -> None:
        if ready_file is not None:
            Path(ready_file).touch()
        while go_file is not None and not Path(go_file).exists():
            time.sleep(0.05)

    return ready
