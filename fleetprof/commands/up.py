"""`fleetprof up`: the local pipeline on the embedded defaults, profiling this machine, until Ctrl-C."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import click
from rich.console import Console

from fleetprof import logs
from fleetprof.alerting import alert_env, alert_options
from fleetprof.local_pipeline import Child, LocalPipeline, PartFailed, agent_child
from fleetprof.settings import Settings

READY_TIMEOUT_S = 180.0  # the agent compiles its BPF programs first: tens of seconds on a busy machine


@click.command("up")
@click.option("--data-dir", type=click.Path(path_type=Path), default=None,
              help="Local state: the Kafka broker, the chDB store, logs (the one `fleetprof kafka status|down` see). "
                   "[env FLEETPROF_DATA_DIR; default ~/.local/share/fleetprof]")
@click.option("--symbolizers", type=click.IntRange(1, 16), default=1, show_default=True,
              help="Symbolizer processes in the consumer group.")
@click.option("--agent/--no-agent", default=True, show_default=True,
              help="Run this machine's node agent (CPU stacks and CUDA kernels with BPF, as root; NVML metrics).")
@click.option("--simulate-gpu", is_flag=True,
              help="Also run a simulated GPU workload, and the agent against a simulated NVML library (a demo; "
                   "labelled simulated; CPU and kernel timing need root for BPF).")
@click.option("--api", "api_addr", default=None, help="Query API address host:port [env FLEETPROF_API; 127.0.0.1:7474]")
@alert_options
@click.pass_obj
def up(settings: Settings, data_dir: Path | None, symbolizers: int, agent: bool, simulate_gpu: bool,
       api_addr: str | None, **alert_values: object) -> None:
    """Start Kafka (local broker), migrate the store, run the processors, the sink, the query API with the web UI,
    and this machine's node agent; say "ready" once every part answers."""
    if data_dir is not None:
        settings.data_dir = data_dir
    if api_addr:
        settings.api = api_addr
    console = Console(stderr=True)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    logs.configure("INFO", settings.data_dir / "logs" / "up.log")
    pipeline = LocalPipeline(settings, symbolizers=symbolizers, alert_env=alert_env(alert_values))
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: pipeline.stop_event.set())
    try:
        with console.status("Starting Kafka…"):
            bootstrap = pipeline.start_kafka()
        console.print(f"[green]✓[/] Kafka at {bootstrap}, topics ready")
        with console.status("Opening the store…"):
            applied = pipeline.start_store()
        console.print(f"[green]✓[/] store {settings.clickhouse_dsn} database {settings.database}"
                      f" ({len(applied)} migrations applied)")
        pipeline.start_processors()
        if simulate_gpu or agent:
            _start_agent(pipeline, simulate_gpu)
        url = pipeline.start_api()
        with console.status("Waiting for the processors and the agent…"):
            pipeline.wait_ready(READY_TIMEOUT_S, on_ready=lambda child: _said_ready(console, child, symbolizers))
        console.print("[green]✓[/] sink running (in this process: it owns the store)")
        console.print(f"[green]✓[/] query API and web UI at {url}/ — try: fleetprof query top --kind cpu --since 5m")
        console.print(f"ready (logs in {settings.data_dir / 'logs'}; Ctrl-C stops)")
        pipeline.wait(on_event=lambda e: console.print(f"[yellow]![/] {e}"))
        if pipeline.failure:
            raise PartFailed(f"{pipeline.failure} (see {settings.data_dir / 'logs' / 'up.log'})")
    except Exception as exc:  # one line for the user; details are in the log
        logging.getLogger("fleetprof.up").exception("up failed")
        raise click.ClickException(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
    finally:
        with console.status("Stopping…"):
            pipeline.stop()
        console.print("stopped")


def _start_agent(pipeline: LocalPipeline, simulate_gpu: bool) -> None:
    """The node agent; with --simulate-gpu, beside a simulated GPU workload and against a simulated NVML library."""
    env = None
    if simulate_gpu:
        from simulate import gpu_demo as demo

        logs_dir = pipeline.logs_dir
        workload = pipeline.start_child(Child("simulated-gpu-workload", 0, logs_dir / "simulated-gpu-workload.log",
                                              demo.workload_command(), dict(os.environ),
                                              what="the simulated GPU workload"))
        folder = pipeline.settings.data_dir / "simulated-gpu"
        folder.mkdir(parents=True, exist_ok=True)
        env = demo.agent_env(demo.demo_scenario(folder / "nvml-scenario.txt", workload.proc.pid))
    pipeline.start_child(agent_child(pipeline.logs_dir, env))


def _said_ready(console: Console, child: Child, symbolizers: int) -> None:
    if child.off:
        console.print(f"[yellow]![/] {child.what} is off: {child.off}")
        return
    if child.name == "agent":
        collecting = next((ln for ln in child.lines() if ln.startswith("collecting ")), "collecting")
        console.print(f"[green]✓[/] node agent: {collecting.split(';')[0]}")
        for line in child.lines():
            if " off: " in line:  # a part of the agent that cannot run here (no BPF, no driver)
                console.print(f"[yellow]![/] node agent: {line.strip()}")
    elif child.name == "simulated-gpu-workload":
        console.print("[green]✓[/] SIMULATED GPU: a simulated workload, the agent reads a simulated NVML library "
                      "(try: fleetprof query top --kind gpu --since 5m; fleetprof query metrics --since 5m)")
    elif child.index == 0:
        count = f" ({symbolizers} processes)" if child.name == "symbolize" and symbolizers > 1 else ""
        console.print(f"[green]✓[/] {child.name}{count} running")
