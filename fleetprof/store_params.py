"""Parameter values of named queries: text from a URL or a command line to the Python value of a placeholder's
ClickHouse type (re-exported by fleetprof.store)."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta
from typing import Any

_RELATIVE_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d|w)$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_time(text: str, now: datetime | None = None) -> datetime:
    """`5m` / `2h` / `7d` / `1w` before now, epoch seconds, or ISO-8601 (no zone means UTC): an aware UTC datetime."""
    text = text.strip()
    now = now or datetime.now(tz=UTC)
    if text == "now":
        return now
    match = _RELATIVE_RE.match(text)
    if match:
        return now - timedelta(**{_UNITS[match.group(2)]: float(match.group(1))})
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return datetime.fromtimestamp(float(text), tz=UTC)
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"not a time: {text!r} (use 5m, 2h, 7d, epoch seconds or ISO-8601)") from None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def _unwrap(ch_type: str) -> str:
    for wrapper in ("Nullable(", "LowCardinality("):
        if ch_type.startswith(wrapper) and ch_type.endswith(")"):
            return _unwrap(ch_type[len(wrapper):-1])
    return ch_type


def coerce_param(ch_type: str, text: str) -> Any:
    """Text (from a URL or a command line) to the Python value for a `{name:ch_type}` placeholder."""
    base = _unwrap(ch_type)
    int_match = re.fullmatch(r"(U?)Int(\d+)", base)
    if int_match:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"expected an integer ({ch_type}), got {text!r}") from None
        bits = int(int_match.group(2))
        lo, hi = (0, 2**bits - 1) if int_match.group(1) else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        if not lo <= value <= hi:
            raise ValueError(f"{value} is out of range for {ch_type}")
        return value
    if base.startswith(("Float", "Decimal")):
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"expected a number ({ch_type}), got {text!r}") from None
    if base == "Bool":
        lowered = text.lower()
        if lowered not in ("1", "0", "true", "false"):
            raise ValueError(f"expected true or false, got {text!r}")
        return lowered in ("1", "true")
    if base.startswith("DateTime"):
        return parse_time(text)
    if base in ("Date", "Date32"):
        try:
            return date.fromisoformat(text)
        except ValueError:
            raise ValueError(f"expected a date YYYY-MM-DD, got {text!r}") from None
    # String, Enum, UUID, Array(...) and the rest: ClickHouse parses the text form itself
    return text
