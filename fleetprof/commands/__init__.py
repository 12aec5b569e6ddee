"""The explicit list of subcommands."""

from __future__ import annotations

import click

from fleetprof.commands.agent import agent
from fleetprof.commands.db import db
from fleetprof.commands.kafka import kafka
from fleetprof.commands.loadgen import loadgen
from fleetprof.commands.process import process
from fleetprof.commands.query import query
from fleetprof.commands.report import report
from fleetprof.commands.run import run
from fleetprof.commands.sql import sql
from fleetprof.commands.symbolize import symbolize
from fleetprof.commands.ui import ui
from fleetprof.commands.up import up

COMMANDS: list[click.Command] = []
COMMANDS.append(kafka)
COMMANDS.append(process)
COMMANDS.append(up)
COMMANDS.append(db)
COMMANDS.append(sql)
COMMANDS.append(query)
COMMANDS.append(loadgen)
COMMANDS.append(symbolize)
COMMANDS.append(agent)
COMMANDS.append(run)
COMMANDS.append(report)
COMMANDS.append(ui)
