"""The --since / --until options of the query commands, as one checked time range."""

from __future__ import annotations

from datetime import datetime

import click

from fleetprof.store import parse_time


def time_range(since: str, until: str) -> tuple[datetime, datetime]:
    """(start, end) from --since / --until; a one-line usage error when they do not parse or are out of order."""
    try:
        end = parse_time(until)
        start = parse_time(since, now=end)  # a relative --since counts back from --until
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if start >= end:
        raise click.ClickException(f"--since ({start.isoformat()}) must be before --until ({end.isoformat()})")
    return start, end
