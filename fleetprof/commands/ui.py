"""`fleetprof ui`: serve the web UI against any store, until Ctrl-C.

The UI reads where every query command reads (fleetprof.query_client.query_target): `fleetprof up`'s API when up owns
the chDB store, else the chDB directory itself, or the ClickHouse server given with --clickhouse.
"""

from __future__ import annotations

import signal
import threading
import webbrowser

import click

from fleetprof.addresses import is_loopback, parse_address
from fleetprof.app_server import AppServer, serve_app
from fleetprof.query_client import QueryError, query_target
from fleetprof.settings import Settings

DEFAULT_LISTEN = "127.0.0.1:7475"  # next to the query API's 7474, so both can run on one machine


@click.command("ui")
@click.option("--listen", default=DEFAULT_LISTEN, show_default=True,
              help="host:port to serve on (port 0 picks a free one). The UI has no authentication: keep it on "
                   "loopback unless the network is yours.")
@click.option("--open/--no-open", "open_browser", default=False, show_default=True,
              help="Open the UI in the default web browser.")
@click.pass_obj
def ui(settings: Settings, listen: str, open_browser: bool) -> None:
    """Serve the web UI: GPU metric charts, the CPU and GPU-time flame graphs of a range selected on them, diffs of
    two ranges, and exports as pprof, folded or speedscope."""
    from fleetprof.webui.routes import ui_app

    try:
        host, port = parse_address(listen)
    except ValueError as exc:
        raise click.ClickException(f"--listen: {exc}") from None
    if not is_loopback(host):
        click.echo(f"warning: the web UI has no authentication and now listens on {host}, beyond this machine",
                   err=True)
    try:
        target = query_target(settings)
    except QueryError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        try:
            server = serve_app(ui_app(target), host, port, "the web UI")
        except OSError as exc:
            raise click.ClickException(f"cannot serve the web UI on {listen}: {exc.strerror or exc}") from None
        _serve_until_stopped(server, target.where, open_browser)
    finally:
        target.close()


def _serve_until_stopped(server: AppServer, where: str, open_browser: bool) -> None:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    url = f"{server.url}/"
    click.echo(f"web UI at {url} reading {where}; Ctrl-C stops it", err=True)
    if open_browser:
        webbrowser.open(url)
    try:
        while not stop.wait(0.5):  # a timed wait, so the signal handler gets to run promptly
            pass
    finally:
        server.stop()
