"""A compiled Avro reader and writer (schemas/avro_read.c, avro_write.c): for bodies whose writer schema is the
reader schema, the values fastavro gives, 3-5x faster; for records of the types fastavro reads, the bytes fastavro
writes. Both are strict and decide nothing: where the reader is unsure of a body, or the writer of a value, it
raises ValueError and schemas/single_object.py uses fastavro, which says what is wrong or coerces what it accepts.

Built with gcc on first use into .build/native/, the cache of the project's other C; where it
cannot be built (no gcc or Python headers, a read-only install, a big-endian host) every message goes through
fastavro, as before, and `unavailable()` says why; FLEETPROF_AVRO_FAST=0 turns it off (for A/B benches).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
# the extension module, reading, writing; and what they share
SOURCES = tuple(HERE / name for name in ("avro_fast.c", "avro_read.c", "avro_read_columns.c", "avro_write.c",
                                          "avro_varints.c"))
HEADERS = (HERE / "avro_fast.h", HERE / "avro_read.h")
MODULE = "schemas._avro_fast"

# the type codes of avro_fast.h
T_NULL, T_BOOLEAN, T_INT, T_LONG, T_FLOAT, T_DOUBLE, T_BYTES, T_STRING = range(8)
T_RECORD, T_ENUM, T_ARRAY, T_MAP, T_UNION, T_FIXED, T_COLUMNS = range(8, 15)
_PRIMITIVES = {"null": T_NULL, "boolean": T_BOOLEAN, "int": T_INT, "long": T_LONG, "float": T_FLOAT,
               "double": T_DOUBLE, "bytes": T_BYTES, "string": T_STRING}

_module: Any = None
_why_not: str | None = None


# the same cache as the project's other C (producers/native_build.py), which this layer may not import
BUILD_DIR = Path(os.environ.get("FLEETPROF_NATIVE_BUILD", HERE.parent / ".build" / "native"))


class BuildError(RuntimeError):
    """The extension could not be built; the message is one line."""


def _build() -> Path:
    """The built extension module (built now if missing or stale: the source, flags and Python decide its name)."""
    gcc = shutil.which("gcc")
    if gcc is None:
        raise BuildError("no gcc (bash infra/setup.sh installs it)")
    include = Path(sysconfig.get_paths()["include"])
    if not (include / "Python.h").exists():
        raise BuildError(f"no Python.h in {include} (Debian libpython3-dev)")
    cmd = [gcc, "-O2", "-g", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall", "-Werror", f"-I{include}"]
    code = b"".join(path.read_bytes() for path in (*SOURCES, *HEADERS))
    digest = hashlib.sha256(code + repr((cmd, sys.version)).encode()).hexdigest()[:16]
    out_dir = BUILD_DIR / f"avro_fast-{digest}"
    target = out_dir / "_avro_fast.so"
    if target.exists():
        return target
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".avro_fast-", dir=out_dir.parent))
    done = subprocess.run([*cmd, *map(str, SOURCES), "-o", str(staging / target.name)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        raise BuildError(f"gcc failed: {next(iter(done.stderr.splitlines()), '')[:300]}")
    try:
        staging.rename(out_dir)  # atomic: a concurrent build either wins or finds it done
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _load() -> Any:
    global _module, _why_not
    if _module is not None or _why_not is not None:
        return _module
    if os.environ.get("FLEETPROF_AVRO_FAST", "1") == "0":
        _why_not = "turned off (FLEETPROF_AVRO_FAST=0)"
        return None
    try:
        if sys.byteorder != "little":
            raise BuildError("avro_read.c reads floats as little-endian")
        path = _build()
        loader = importlib.machinery.ExtensionFileLoader(MODULE, str(path))
        spec = importlib.util.spec_from_file_location(MODULE, str(path), loader=loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        _module = module
    except (BuildError, OSError, ImportError) as exc:
        _why_not = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return _module


def unavailable() -> str | None:
    """Why the compiled reader is not in use, None when it is."""
    _load()
    return _why_not


def type_tree(schema: Any, named: dict[str, Any] | None = None) -> Any:
    """The type tree the C codec walks, from a schema fastavro.parse_schema returned; ValueError for what it cannot
    read (a logical type, a recursive record)."""
    named = {} if named is None else named
    if isinstance(schema, str):
        if schema in _PRIMITIVES:
            return _PRIMITIVES[schema]
        if schema not in named or named[schema] is None:
            raise ValueError(f"unknown or recursive named type {schema}")
        return named[schema]
    if isinstance(schema, list):
        return (T_UNION, tuple(type_tree(s, named) for s in schema))
    if not isinstance(schema, dict):
        raise ValueError(f"not an Avro schema: {schema!r}")
    if "logicalType" in schema:
        raise ValueError(f"logical type {schema['logicalType']} is not read here")
    kind = schema["type"]
    if kind in _PRIMITIVES:
        return _PRIMITIVES[kind]
    if kind == "record":
        named[schema["name"]] = None  # a field naming its own record is recursive: not read here
        fields = schema["fields"]
        tree = (T_RECORD, tuple(sys.intern(f["name"]) for f in fields),
                tuple(type_tree(f["type"], named) for f in fields),
                {f["name"]: f["default"] for f in fields if "default" in f})
    elif kind == "enum":
        tree = (T_ENUM, tuple(sys.intern(s) for s in schema["symbols"]))
    elif kind == "array":
        return (T_ARRAY, type_tree(schema["items"], named))
    elif kind == "map":
        return (T_MAP, type_tree(schema["values"], named))
    elif kind == "fixed":
        tree = (T_FIXED, int(schema["size"]))
    else:
        raise ValueError(f"unknown Avro type {kind}")
    named[schema["name"]] = tree
    return tree


def _tree(parsed_schema: Any) -> tuple[Any, Any] | None:
    """(the module, the schema's type tree), None where the codec is unavailable or cannot handle the schema."""
    module = _load()
    if module is None:
        return None
    try:
        return module, type_tree(parsed_schema)
    except ValueError:
        return None


def writer_for(parsed_schema: Any) -> Callable[[Any, bytes], bytes] | None:
    """write(record, prefix) -> prefix + the body fastavro writes (a missing field as its default), raising
    ValueError for a value fastavro would have to coerce (an int where a float goes, a tuple for an array) or a
    missing field without a default: those are left to fastavro; None as for reader_for."""
    found = _tree(parsed_schema)
    if found is None:
        return None
    write, tree = found[0].write, found[1]
    return lambda record, prefix: write(tree, record, prefix)


def reader_for(parsed_schema: Any) -> Callable[[bytes, int], Any] | None:
    """read(data, offset) for bodies of `parsed_schema`, raising ValueError where unsure; None when the compiled
    reader is unavailable or cannot read this schema."""
    found = _tree(parsed_schema)
    if found is None:
        return None
    read, tree = found[0].read, found[1]
    return lambda data, offset: read(tree, data, offset)


def batch_reader_for(parsed_schema: Any, tail_from: int | None = None, max_tails: int = 20_000,
                     max_tail_bytes: int = 1024) -> Callable[[list[bytes], int], list] | None:
    """read_each(datas, offset): for each bytes, read(data, offset) of reader_for, or None where that would raise
    ValueError; None as for reader_for. With `tail_from` (a record's field index), the fields from there on are read
    once per distinct bytes of at most `max_tail_bytes` (at most `max_tails` kept; a longer tail is read every time):
    records with the same tail share its values, lists and dicts included, so their users must only read them."""
    found = _tree(parsed_schema)
    if found is None:
        return None
    read_each, tree = found[0].read_each, found[1]
    if tail_from is None or tree[0] != T_RECORD or not 0 <= tail_from < len(tree[1]):
        return lambda datas, offset: read_each(tree, datas, offset)
    tails: dict[bytes, tuple] = {}
    return lambda datas, offset: read_each(tree, datas, offset, tail_from, tails, max_tails, max_tail_bytes)


def columns_reader_for(parsed_schema: Any, fields: tuple[str, ...]) -> Callable[[bytes, int], Any] | None:
    """As reader_for, but each of the record's arrays of records `fields` comes as {item field: column} (in item
    order) instead of a list of dicts: an int or long item field's column a read-only int64 numpy array, any other's
    a list; None as for reader_for, or where one of `fields` is not such an array."""
    found = _tree(parsed_schema)
    if found is None:
        return None
    read, tree = found[0].read, found[1]
    if tree[0] != T_RECORD:
        return None
    types = list(tree[2])
    numeric: dict[str, tuple[str, ...]] = {}  # each array's int and long item fields: int64 bytes from read()
    for field in fields:
        array = types[tree[1].index(field)] if field in tree[1] else None
        if not (isinstance(array, tuple) and array[0] == T_ARRAY and isinstance(array[1], tuple)
                and array[1][0] == T_RECORD):
            return None
        types[tree[1].index(field)] = (T_COLUMNS, array[1])
        numeric[field] = tuple(name for name, kind in zip(array[1][1], array[1][2], strict=True)
                               if kind in (T_INT, T_LONG))
    columnar = (T_RECORD, tree[1], tuple(types), tree[3])
    import numpy as np  # only the sink reads columns: the other stages need not load numpy

    def read_columns(data: bytes, offset: int) -> Any:
        record = read(columnar, data, offset)
        for field, names in numeric.items():
            columns = record[field]
            for name in names:
                columns[name] = np.frombuffer(columns[name], dtype=np.int64)
        return record

    return read_columns


def varints_reader() -> Callable[[bytes], tuple[bytes, bytes, bytes]] | None:
    """varints(data) -> (values, ends, bad), each int64 bytes: every run of bytes that ends in a byte < 0x80 decoded
    as a zigzag varint, where each run ends, and the indexes of runs over 64 bits (avro_varints.c); None where the
    module is unavailable."""
    module = _load()
    return None if module is None else module.varints


def walk_stacks_reader() -> Callable[..., tuple[int, bytes]] | None:
    """walk_stacks(values, k, count, before, between1, between2, after1, after2) -> (k after, each stack's first
    varint index as int64 bytes), ValueError "not one block" or "truncated stacks array" (avro_varints.c): the
    columnar CPU-batch reader's fast walk over one block of a stacks array; None where the module is unavailable."""
    module = _load()
    return None if module is None else module.walk_stacks
