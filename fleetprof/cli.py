"""The one CLI, `fleetprof`: subcommands live in fleetprof/commands/, one module each."""

from __future__ import annotations

import sys
from pathlib import Path
from urllib.parse import urlsplit

import click

from fleetprof.commands import SUBCOMMANDS, load_command
from fleetprof.settings import ConfigError, Settings


class LazyGroup(click.Group):
    """Subcommands from fleetprof.commands.SUBCOMMANDS, each imported when it is asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*SUBCOMMANDS, *(name for name in super().list_commands(ctx) if name not in SUBCOMMANDS)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return super().get_command(ctx, cmd_name) or load_command(cmd_name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.option("--config", "config_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="TOML config file with [kafka] (bootstrap and any librdkafka setting, SASL/TLS included) and "
                   "[clickhouse] (url, user, password, database); the environment overrides it. "
                   "[env FLEETPROF_CONFIG]")
@click.option("--data-dir", type=click.Path(path_type=Path), default=None,
              help="Local state: Kafka logs, chDB store. [env FLEETPROF_DATA_DIR; default ~/.local/share/fleetprof]")
@click.option("--kafka", default=None, help="Kafka bootstrap host:port. [env FLEETPROF_KAFKA; default 127.0.0.1:9092]")
@click.option("--clickhouse", default=None,
              help="ClickHouse server URL (credentials from FLEETPROF_CLICKHOUSE_USER/PASSWORD). "
                   "Default: chDB in the data dir.")
@click.option("--database", default=None, help="ClickHouse database. [env FLEETPROF_DATABASE; default fleetprof]")
@click.pass_context
def cli(ctx: click.Context, config_path: Path | None, data_dir: Path | None, kafka: str | None,
        clickhouse: str | None, database: str | None) -> None:
    """fleetprof: always-on CPU and GPU profiling for fleets of CUDA machines."""
    try:
        settings = Settings.load(config_path)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--config") from None
    if data_dir is not None:
        settings.data_dir = data_dir
    if kafka is not None:
        settings.kafka = kafka
    if clickhouse is not None:
        if urlsplit(clickhouse).password is not None:  # every user of the machine reads command lines (ps)
            raise click.BadParameter("the URL holds a password: give it in FLEETPROF_CLICKHOUSE_PASSWORD (or put "
                                     "the whole URL in FLEETPROF_CLICKHOUSE) instead", param_hint="--clickhouse")
        settings.clickhouse = clickhouse
    if database is not None:
        settings.database = database
    ctx.obj = settings


def main() -> None:
    try:
        cli.main(prog_name="fleetprof", standalone_mode=True)
    except KeyboardInterrupt:
        sys.exit(130)
    except ConfigError as exc:  # a secret file named in the environment that cannot be read, found late
        click.echo(f"Error: {exc}", err=True)
        sys.exit(1)
