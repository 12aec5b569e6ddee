"""The explicit list of subcommands."""

from __future__ import annotations

import click

from fleetprof.commands.kafka import kafka
from fleetprof.commands.process import process
from fleetprof.commands.up import up

COMMANDS: list[click.Command] = []
COMMANDS.append(kafka)
COMMANDS.append(process)
COMMANDS.append(up)
