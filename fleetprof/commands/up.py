"""`fleetprof up`: start the local pipeline on the embedded defaults and keep it running."""

from __future__ import annotations

import signal
import threading

import click
from rich.console import Console

from fleetprof import logs
from fleetprof.alerting import alert_env, alert_options
from fleetprof.settings import Settings


@click.command("up")
@click.option("--symbolizers", type=click.IntRange(1, 16), default=1, show_default=True,
              help="Symbolizer processes in the consumer group.")
@click.option("--simulate-gpu", is_flag=True,
              help="Also run a simulated GPU workload and the agent against a simulated NVML library (a demo; "
                   "labelled simulated; CPU and kernel timing need root for BPF).")
@click.option("--api", "api_addr", default=None, help="Query API address host:port [env FLEETPROF_API; 127.0.0.1:7474]")
@alert_options
@click.pass_obj
def up(settings: Settings, symbolizers: int, simulate_gpu: bool, api_addr: str | None, **alert_values: object) -> None:
    """Start Kafka (local broker), migrate the store, run the processors, the sink and the query API."""
    from fleetprof.local_pipeline import LocalPipeline

    if api_addr:
        settings.api = api_addr
    console = Console(stderr=True)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    logs.configure("INFO", settings.data_dir / "logs" / "up.log")
    pipeline = LocalPipeline(settings, symbolizers=symbolizers, simulate_gpu=simulate_gpu,
                             alert_env=alert_env(alert_values))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: (stop.set(), pipeline.stop_event.set()))
    try:
        with console.status("Starting Kafka…"):
            bootstrap = pipeline.start_kafka()
        console.print(f"[green]✓[/] Kafka at {bootstrap}, topics ready")
        with console.status("Opening the store…"):
            applied = pipeline.start_store()
        console.print(f"[green]✓[/] store {settings.clickhouse_dsn} database {settings.database}"
                      f" ({len(applied)} migrations applied)")
        pipeline.start_processors()
        console.print(f"[green]✓[/] {symbolizers} symbolizer(s), the correlator, the alerter and the sink running"
                      f" (logs in {settings.data_dir / 'logs'})")
        if simulate_gpu:
            pipeline.start_simulated_gpu()
            console.print("[green]✓[/] SIMULATED GPU: a simulated workload and the agent with a simulated NVML library"
                          " (try: fleetprof query top --kind gpu --since 5m; fleetprof query metrics --since 5m)")
        url = pipeline.start_api()
        console.print(f"[green]✓[/] query API at {url}   — try: fleetprof loadgen, then"
                      " fleetprof query top --kind cpu --since 5m")
        console.print(f"[green]✓[/] web UI at {url}/   — GPU metrics, flame graphs, diffs and exports")
        console.print("Press Ctrl-C to stop.")
        pipeline.wait(on_event=lambda e: console.print(f"[yellow]![/] {e}"))
        if pipeline.failure:
            raise RuntimeError(f"{pipeline.failure} (see {settings.data_dir / 'logs' / 'up.log'})")
    except Exception as exc:  # one line for the user; details are in the log
        import logging

        logging.getLogger("fleetprof.up").exception("up failed")
        raise click.ClickException(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
    finally:
        with console.status("Stopping…"):
            pipeline.stop()
        console.print("stopped")
