"""Durations as people type them on a command line: `500ms`, `30s`, `5m`, `1.5h`, or a number of seconds."""

from __future__ import annotations

import re

import click

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "": 1.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|)\s*$")


def parse_duration(text: str) -> float:
    """Seconds; ValueError (one line) for anything else, and for zero."""
    match = _DURATION.match(str(text))
    if not match:
        raise ValueError(f"{text!r} is not a duration like 500ms, 30s, 5m, 1h or a number of seconds")
    seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds <= 0:
        raise ValueError(f"{text!r} must be longer than zero")
    return seconds


class Duration(click.ParamType):
    """A click option taking a duration (see parse_duration); the value is seconds."""

    name = "duration"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, int | float):
            if value <= 0:
                self.fail(f"{value!r} must be longer than zero", param, ctx)
            return float(value)
        try:
            return parse_duration(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
