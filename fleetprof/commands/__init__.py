"""The explicit list of subcommands, by name. A command's module is imported only when that command runs (or when
--help lists them all): `fleetprof query` does not pay for the agent's BPF, NVML and kubelet imports."""

from __future__ import annotations

import importlib

import click

SUBCOMMANDS: dict[str, str] = {  # name -> "module:attribute", in the order --help lists them
    "kafka": "fleetprof.commands.kafka:kafka",
    "process": "fleetprof.commands.process:process",
    "up": "fleetprof.commands.up:up",
    "db": "fleetprof.commands.db:db",
    "sql": "fleetprof.commands.sql:sql",
    "query": "fleetprof.commands.query:query",
    "loadgen": "fleetprof.commands.loadgen:loadgen",
    "symbolize": "fleetprof.commands.symbolize:symbolize",
    "agent": "fleetprof.commands.agent:agent",
    "run": "fleetprof.commands.run:run",
    "report": "fleetprof.commands.report:report",
    "ui": "fleetprof.commands.ui:ui",
}


def load_command(name: str) -> click.Command | None:
    """The subcommand `name`, its module imported now; None for an unknown name."""
    target = SUBCOMMANDS.get(name)
    if target is None:
        return None
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def __getattr__(name: str) -> list[click.Command]:
    if name == "COMMANDS":  # every command, imported: for callers that add them to a group themselves
        return [load_command(n) for n in SUBCOMMANDS]
    raise AttributeError(name)
