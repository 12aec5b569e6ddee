"""`fleetprof db migrate`: bring the store's tables up to date (sql/migrations/)."""

from __future__ import annotations

import click
from clickhouse_connect.driver.exceptions import ClickHouseError

from fleetprof.settings import Settings
from fleetprof.store import StoreError, one_line, open_store


@click.group()
def db() -> None:
    """The ClickHouse store: schema migrations."""


@db.command()
@click.pass_obj
def migrate(settings: Settings) -> None:
    """Apply the migrations this store has not run yet and print their names."""
    try:
        with open_store(settings.clickhouse_dsn, settings.database, **settings.clickhouse_credentials()) as store:
            applied = store.migrate()
            location = store.location
    except (StoreError, ClickHouseError) as exc:
        raise click.ClickException(one_line(exc)) from None
    for name in applied:
        click.echo(name)
    if not applied:
        click.echo(f"{location} (database {settings.database}) is up to date", err=True)
