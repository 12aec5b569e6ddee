"""Numpy columns as clickhouse-connect writes them at C speed: in the dtype of their ClickHouse type exactly. An
int64 array given for a UInt32 column is written value by value in Python (~80 ns a value, 350x the cast)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

# numpy's dtype names, so that the store does not load numpy (~0.1 s) for callers that give it no arrays
_DTYPES = {"UInt8": "uint8", "UInt16": "uint16", "UInt32": "uint32", "UInt64": "uint64",
           "Int8": "int8", "Int16": "int16", "Int32": "int32", "Int64": "int64"}


def native_columns(columns: Sequence[Any], types: list[str] | None) -> list[Any]:
    """`columns` with each numpy array in its column type's dtype; an array whose column is of another type
    (DateTime, Nullable, LowCardinality) or whose values it cannot hold, as a list: clickhouse-connect converts it,
    or refuses the value naming its column, as for any list."""
    numpy = sys.modules.get("numpy")  # no array can have been made without it
    if numpy is None or not any(isinstance(c, numpy.ndarray) for c in columns):
        return list(columns)
    if types is None:
        types = [""] * len(columns)
    return [_native(numpy, c, t) if isinstance(c, numpy.ndarray) else c
            for c, t in zip(columns, types, strict=True)]


def _native(numpy: Any, column: np.ndarray, type_name: str) -> np.ndarray | list:
    dtype = _DTYPES.get(type_name)
    if dtype is None or column.dtype.kind not in "iu":
        return column.tolist()
    if column.dtype == dtype or not len(column):
        return column.astype(dtype, copy=False)
    info = numpy.iinfo(dtype)
    if info.min <= int(column.min()) and int(column.max()) <= info.max:
        return column.astype(dtype)
    return column.tolist()
