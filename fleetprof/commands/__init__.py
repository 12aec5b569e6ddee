"""The explicit list of subcommands."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
