"""`fleetprof kafka up|down|status`: the local single-node Kafka broker under the data directory."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console

from fleetprof.broker import BrokerError, LocalBroker, create_topics
from fleetprof.broker import local_broker as find_local_broker
from fleetprof.settings import Settings

EXIT_NOT_RUNNING = 3


def local_broker(settings: Settings) -> LocalBroker:
    """The data directory's local broker (the one `fleetprof up` starts there too)."""
    try:
        return find_local_broker(settings.kafka, settings.data_dir)
    except BrokerError as exc:
        raise click.ClickException(str(exc)) from None


@click.group()
@click.option("--data-dir", type=click.Path(path_type=Path), default=None,
              help="Whose local broker: the data directory's (the one `fleetprof up` starts there too). "
                   "[env FLEETPROF_DATA_DIR; default ~/.local/share/fleetprof]")
@click.pass_obj
def kafka(settings: Settings, data_dir: Path | None) -> None:
    """Run the local Kafka broker (KRaft, 127.0.0.1 only, data under the data directory)."""
    if data_dir is not None:
        settings.data_dir = data_dir


@kafka.command()
@click.option("--timeout", type=float, default=90, show_default=True, help="Seconds to wait for the broker.")
@click.pass_obj
def up(settings: Settings, timeout: float) -> None:
    """Start the broker (if it is not running) and create every fleetprof topic."""
    broker = local_broker(settings)
    try:
        with Console(stderr=True).status("Starting Kafka broker…"):
            broker.start(timeout=timeout)
            create_topics(broker.bootstrap)
    except BrokerError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"Kafka broker running on {broker.bootstrap} (data dir {broker.data_dir})")


@kafka.command()
@click.option("--timeout", type=float, default=30, show_default=True,
              help="Seconds to wait after SIGTERM before SIGKILL.")
@click.pass_obj
def down(settings: Settings, timeout: float) -> None:
    """Stop the broker; its data stays in the data directory."""
    broker = local_broker(settings)
    was_running = broker.pid() is not None
    try:
        broker.stop(timeout=timeout)
    except (BrokerError, OSError) as exc:
        raise click.ClickException(f"cannot stop the Kafka broker: {exc}") from None
    state = "stopped" if was_running else "was not running"
    click.echo(f"Kafka broker on {broker.bootstrap} {state} (data dir {broker.data_dir})")


@kafka.command()
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.pass_obj
def status(settings: Settings, fmt: str) -> None:
    """Say whether the broker runs; exit status 0 if it does, 3 if not."""
    info = local_broker(settings).status()
    if fmt == "json":
        click.echo(json.dumps(info))
    elif info["running"]:
        click.echo(f"Kafka broker running on {info['bootstrap']} "
                   f"(pid {info['pid']}, data dir {info['data_dir']})")
    else:
        click.echo(f"Kafka broker not running on {info['bootstrap']} (data dir {info['data_dir']})")
    if not info["running"]:
        click.get_current_context().exit(EXIT_NOT_RUNNING)
