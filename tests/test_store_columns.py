"""Numpy columns into the store: each cast to its column's type exactly, never wrapped, else given as a list."""

import numpy as np
import pytest

from fleetprof.store_columns import native_columns


def test_arrays_take_their_column_types_dtype_and_other_columns_are_left_alone() -> None:
    ints = np.array([0, 255], dtype=np.int64)
    got = native_columns([ints, ints, [1, 2], ints, np.array([-1, 5], dtype=np.int64)],
                         ["UInt8", "UInt64", "UInt8", "DateTime", "Int16"])
    assert got[0].dtype == np.uint8 and got[0].tolist() == [0, 255]
    assert got[1].dtype == np.uint64 and got[1].tolist() == [0, 255]
    assert got[2] == [1, 2]  # a list stays a list
    assert got[3] == [0, 255] and isinstance(got[3][0], int)  # no dtype for a DateTime: Python ints
    assert got[4].dtype == np.int16 and got[4].tolist() == [-1, 5]
    ids = np.array([2**64 - 2], dtype=np.uint64)
    assert native_columns([ids], ["UInt64"])[0] is ids  # already its type: not copied
    # a value the type cannot hold is never wrapped: the list goes on, which clickhouse-connect refuses
    assert native_columns([np.array([256], dtype=np.int64)], ["UInt8"])[0] == [256]
    assert native_columns([np.array([-1], dtype=np.int64)], ["UInt64"])[0] == [-1]
    assert native_columns([ints], None)[0] == [0, 255]  # types unknown: lists


def test_arrays_store_exactly_and_a_value_out_of_range_is_refused_by_its_column(store) -> None:
    store.query_sql("CREATE TABLE t_columns (a UInt8, b UInt32, c UInt64, d Int16, t DateTime) "
                    "ENGINE = MergeTree ORDER BY tuple()", readonly=False)
    a = np.array([0, 255], dtype=np.int64)
    b = np.array([0, 2**32 - 1], dtype=np.int64)
    c = np.array([-2, 7], dtype=np.int64).view(np.uint64)
    d = np.array([-(2**15), 2**15 - 1], dtype=np.int64)
    t = np.array([1_764_000_000, 1_764_000_010], dtype=np.int64)
    store.insert("t_columns", [a, b, c, d, t], ["a", "b", "c", "d", "t"], column_oriented=True)
    _, rows = store.query_sql("SELECT a, b, c, d, toUnixTimestamp(t) FROM t_columns ORDER BY a")
    assert rows == [(0, 0, 2**64 - 2, -(2**15), 1_764_000_000), (255, 2**32 - 1, 7, 2**15 - 1, 1_764_000_010)]
    with pytest.raises(Exception, match="`a`"):  # named by its column, nothing written
        store.insert("t_columns", [np.array([256], dtype=np.int64), b[:1], c[:1], d[:1], t[:1]],
                     ["a", "b", "c", "d", "t"], column_oriented=True)
    _, rows = store.query_sql("SELECT count() FROM t_columns")
    assert rows == [(2,)]
