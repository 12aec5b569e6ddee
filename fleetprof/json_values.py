"""Query result values as JSON: what the query API answers with and what its client hands back, so that a command
gets the same rows whether it reads the store itself or through the API."""

from __future__ import annotations

import base64
import math
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any


def jsonable(value: Any) -> Any:
    """A query result value as JSON: times in UTC ISO-8601, non-finite floats as null, bytes as text or base64."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, datetime):
        # the store's clients return aware datetimes; a naive one is taken as UTC, as ClickHouse's default zone
        return (value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)).isoformat()
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return base64.b64encode(value).decode()
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [jsonable(v) for v in value]
    return str(value)  # UUID, IPv4/IPv6, Enum members, ...
