"""Avro single-object encoding of any fleetprof record: the marker C3 01, the CRC-64-AVRO fingerprint of the writer
schema (little endian), then the Avro body, written with fastavro and read with it or, where the writer schema is
the reader's, with the compiled reader of schemas/avro_fast.py (the same values; fastavro reads what it is unsure of).

A reader resolves the writer schema by its fingerprint and reads the record into the newest known version of the
same record name, so schemas evolve without a registry server. This module knows no record in particular: the fast
paths for the hot messages (schemas/cpu_batch_writer.py, cpu_batch_reader.py, gpu_launch_writer.py) build on it.
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import Any

import fastavro
from fastavro.schema import fingerprint, to_parsing_canonical_form

MARKER = b"\xc3\x01"
HEADER_LEN = len(MARKER) + 8
SCHEMA_DIR = Path(__file__).resolve().parent


class DecodeError(ValueError):
    """A message that cannot be decoded; str(err) is the one-line reason that goes with its dead letter."""


@dataclass(frozen=True)
class SchemaVersion:
    name: str  # full record name, e.g. "fleetprof.CpuStackBatch"
    version: int
    parsed: dict
    fingerprint: bytes  # 8 bytes, little endian, as written after the marker
    ints_fit: Callable[[Any], bool] | None = None  # whether every `int` of a record fits 32 bits (None: it has none)


_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1
_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}


def _int_check(schema: Any, named: dict[str, Any]) -> Callable[[Any], bool] | None:
    """A function telling whether every Avro `int` in a datum of `schema` fits 32 bits, or None when the schema
    holds no int. fastavro reads an int as it reads a long, unchecked, so a message can carry an int that no writer
    could encode again: a stage would pass it on and the runner would fail writing its output."""
    if isinstance(schema, str):
        if schema == "int":
            return _plain_int
        return None if schema in _PRIMITIVES else named.get(schema)
    if isinstance(schema, list):
        branches = [(b, _int_check(b, named)) for b in schema]
        if all(check is None for _, check in branches):
            return None
        nullable = "null" in schema
        if sorted(schema, key=str) == ["int", "null"]:
            return _nullable_int
        checks = [check for _, check in branches if check is not None]
        return lambda v: (v is None and nullable) or any(check(v) for check in checks)
    kind = schema["type"]
    if kind == "record":
        named[schema["name"]] = None  # a record that holds itself: no int found through that path
        fields = [(f["name"], check) for f in schema["fields"] if (check := _int_check(f["type"], named))]
        check = _RecordCheck(fields) if fields else None
        named[schema["name"]] = check
        return check
    if kind == "array":
        item = _int_check(schema["items"], named)
        if item is None:
            return None
        if isinstance(item, _RecordCheck):
            return item.all_of
        return lambda a: all(item(x) for x in a)
    if kind == "map":
        value = _int_check(schema["values"], named)
        return None if value is None else (lambda m: all(value(x) for x in m.values()))
    if kind in ("enum", "fixed"):
        named[schema["name"]] = None
        return None
    return _int_check(kind, named)


class _RecordCheck:
    """The int check of a record type; over an array of them, its plain int fields are checked a column at a time
    (min and max at C speed: a CpuSamples message holds thousands of samples, each a record)."""

    def __init__(self, fields: list[tuple[str, Callable[[Any], bool]]]) -> None:
        self.fields = fields
        self.others = [(name, check) for name, check in fields if check not in (_plain_int, _nullable_int)]
        self.columns = [itemgetter(name) for name, check in fields if check is _plain_int]
        self.nullable_columns = [itemgetter(name) for name, check in fields if check is _nullable_int]

    def __call__(self, record: Any) -> bool:
        return all(check(record[name]) for name, check in self.fields)

    def all_of(self, records: list) -> bool:
        if not records:
            return True
        for column in self.columns:
            if min(map(column, records)) < _INT_MIN or max(map(column, records)) > _INT_MAX:
                return False
        for column in self.nullable_columns:  # GpuMetrics: most device fields are ["null", "int"]
            values = [v for v in map(column, records) if v is not None]
            if values and (min(values) < _INT_MIN or max(values) > _INT_MAX):
                return False
        return all(check(r[name]) for r in records for name, check in self.others)


def _plain_int(v: Any) -> bool:
    """A bare `int`'s check (the one a record's fields can have checked a column at a time)."""
    return _INT_MIN <= v <= _INT_MAX


def _nullable_int(v: Any) -> bool:
    """A ["null", "int"] union's check (checked a column at a time too, its nulls left out)."""
    return v is None or _INT_MIN <= v <= _INT_MAX


def crc64_avro(schema: dict) -> bytes:
    """CRC-64-AVRO of the schema's Parsing Canonical Form, in single-object byte order."""
    value = int(fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"), 16)
    return struct.pack("<Q", value)


class SchemaRegistry:
    """All known versions of every record schema, by fingerprint and by name."""

    def __init__(self) -> None:
        self._by_fingerprint: dict[bytes, SchemaVersion] = {}
        self._latest: dict[str, SchemaVersion] = {}

    def register(self, schema_json: dict, version: int) -> SchemaVersion:
        parsed = fastavro.parse_schema(schema_json, named_schemas={})
        name = parsed["name"]
        sv = SchemaVersion(name, version, parsed, crc64_avro(schema_json), _int_check(parsed, {}))
        self._by_fingerprint[sv.fingerprint] = sv
        current = self._latest.get(name)
        if current is None or current.version < version:
            self._latest[name] = sv
        return sv

    def register_file(self, path: Path) -> SchemaVersion:
        # files are named <topic-ish>.v<N>.avsc
        version = int(path.name.rsplit(".", 2)[1].lstrip("v"))
        return self.register(json.loads(path.read_text()), version)

    def load_dir(self, directory: Path = SCHEMA_DIR) -> SchemaRegistry:
        for path in sorted(directory.glob("*.v*.avsc")):
            self.register_file(path)
        return self

    def latest(self, name: str) -> SchemaVersion:
        full = name if "." in name else f"fleetprof.{name}"
        try:
            return self._latest[full]
        except KeyError:
            raise KeyError(f"no schema named {full}") from None

    def version(self, name: str, version: int) -> SchemaVersion:
        full = self.latest(name).name
        for sv in self._by_fingerprint.values():
            if sv.name == full and sv.version == version:
                return sv
        raise KeyError(f"no version {version} of schema {full}")

    def by_fingerprint(self, fp: bytes) -> SchemaVersion | None:
        return self._by_fingerprint.get(fp)

    def names(self) -> list[str]:
        return sorted(self._latest)


_default: SchemaRegistry | None = None


def default_registry() -> SchemaRegistry:
    global _default
    if _default is None:
        _default = SchemaRegistry().load_dir()
    return _default


def encode(name: str, record: dict, registry: SchemaRegistry | None = None, version: int | None = None) -> bytes:
    """Encode `record` with the newest (or the given) version of schema `name`."""
    reg = registry or default_registry()
    return encode_as(reg.latest(name) if version is None else reg.version(name, version), record)


# record name -> a writer giving the newest version's Avro body as fastavro writes it, or None to leave it to fastavro
_FAST_WRITERS: dict[str, Callable[[dict], bytes | None]] = {}


def register_fast_writer(name: str, write: Callable[[dict], bytes | None]) -> None:
    """Use `write` for records of `name` in its newest schema version (it must write fastavro's bytes)."""
    _FAST_WRITERS[name] = write


def encode_as(schema: SchemaVersion, record: dict) -> bytes:
    """Encode `record` with the given schema version."""
    compiled = fast_writer(schema)  # 4-8x faster than the hand-written writers below (bench/RESULTS.md)
    if compiled is not None:
        try:
            return compiled(record, MARKER + schema.fingerprint)
        except ValueError:
            pass  # a value it does not take as is: fastavro coerces it or says what is wrong
    fast = _FAST_WRITERS.get(schema.name)
    if fast is not None and default_registry().latest(schema.name) is schema:
        body = fast(record)
        if body is not None:
            return MARKER + schema.fingerprint + body
    buf = io.BytesIO()
    buf.write(MARKER)
    buf.write(schema.fingerprint)
    fastavro.schemaless_writer(buf, schema.parsed, record)
    return buf.getvalue()


def writer_of(data: bytes, registry: SchemaRegistry | None = None) -> SchemaVersion:
    """The writer schema of an encoded message, or DecodeError saying why not."""
    if len(data) < HEADER_LEN or data[:2] != MARKER:
        raise DecodeError("not an Avro single-object message (missing C3 01 marker)")
    fp = bytes(data[2:HEADER_LEN])
    sv = (registry or default_registry()).by_fingerprint(fp)
    if sv is None:
        raise DecodeError(f"unknown schema fingerprint {struct.unpack('<Q', fp)[0]:016x}")
    return sv


def writer_and_reader(data: bytes, expect: str | None = None,
                      registry: SchemaRegistry | None = None) -> tuple[SchemaVersion, SchemaVersion]:
    """The writer schema of an encoded message and the schema it is read with (the newest of its record name), or
    DecodeError saying why not. expect: the record name the message must have."""
    reg = registry or default_registry()
    writer = writer_of(data, reg)
    if expect is not None:
        want = expect if "." in expect else f"fleetprof.{expect}"
        if writer.name != want:
            raise DecodeError(f"expected {want}, got {writer.name}")
    return writer, reg.latest(writer.name)


# fingerprint -> the compiled (reader, writer) of that version (schemas/avro_fast.py), each None where there is none
_COMPILED: dict[bytes, tuple[Callable[[bytes, int], Any] | None, Callable[[Any, bytes], bytes] | None]] = {}


def _compiled(schema: SchemaVersion) -> tuple[Callable[[bytes, int], Any] | None, Callable[[Any, bytes], bytes] | None]:
    pair = _COMPILED.get(schema.fingerprint)
    if pair is None:
        from schemas import avro_fast  # builds the C codec on first use

        pair = _COMPILED[schema.fingerprint] = (avro_fast.reader_for(schema.parsed),
                                                avro_fast.writer_for(schema.parsed))
    return pair


def fast_reader(schema: SchemaVersion) -> Callable[[bytes, int], Any] | None:
    """The compiled reader of bodies written and read as `schema`, None where there is none (FLEETPROF_AVRO_FAST=0
    turns it off)."""
    return _compiled(schema)[0]


def fast_writer(schema: SchemaVersion) -> Callable[[Any, bytes], bytes] | None:
    """The compiled writer of `schema`, None where there is none (FLEETPROF_AVRO_FAST=0 turns it off)."""
    return _compiled(schema)[1]


def read_body(data: bytes, writer: SchemaVersion, reader: SchemaVersion) -> dict:
    """The record after the header of `data`, written with `writer`, read as `reader`; or DecodeError."""
    if writer is reader:
        fast = fast_reader(writer)
        if fast is not None:
            try:
                return fast(data, HEADER_LEN)
            except ValueError:
                pass  # the compiled reader decides no error: fastavro reads it and says what is wrong, if anything
    buf = io.BytesIO(data)
    buf.seek(HEADER_LEN)
    try:
        record = fastavro.schemaless_reader(buf, writer.parsed, reader.parsed)
    except Exception as exc:  # fastavro raises EOFError, ValueError, UnicodeDecodeError, IndexError...
        raise DecodeError(f"truncated or corrupt Avro body for {writer.name}: {type(exc).__name__}: {exc}") from None
    if buf.tell() != len(data):
        raise DecodeError(f"{len(data) - buf.tell()} trailing bytes after {writer.name} record")
    if reader.ints_fit is not None and not reader.ints_fit(record):
        raise DecodeError(f"an int field of {writer.name} holds a value outside 32 bits")
    return record


def decode(data: bytes, expect: str | None = None, registry: SchemaRegistry | None = None,
           columns: Mapping[str, tuple[str, ...]] | None = None) -> tuple[str, dict]:
    """Decode one message into (record name, record) read with the newest version of its schema. columns: record
    name -> its arrays of records that come as {item field: column} (read_columns: an int or long field's an int64
    numpy array, any other's a list). For CPU stack batches with their stacks left columnar, see
    schemas/cpu_batch_reader.py."""
    writer, reader = writer_and_reader(data, expect, registry)
    fields = columns.get(writer.name) if columns else None
    if not fields:
        return writer.name, read_body(data, writer, reader)
    return writer.name, read_columns(data, writer, reader, fields)


# (fingerprint, fields) -> the compiled reader with those fields as columns, None where there is none
_COLUMNS_READERS: dict[tuple[bytes, tuple[str, ...]], Callable[[bytes, int], Any] | None] = {}


def read_columns(data: bytes, writer: SchemaVersion, reader: SchemaVersion, fields: tuple[str, ...]) -> dict:
    """As read_body, with each of the record's arrays of records `fields` as {item field: column}: the compiled
    codec fills the columns without a dict per item; otherwise the items are read as usual and turned into the same
    columns (int and long fields as int64 numpy arrays)."""
    if writer is reader:
        key = (writer.fingerprint, fields)
        if key not in _COLUMNS_READERS:
            from schemas import avro_fast

            _COLUMNS_READERS[key] = avro_fast.columns_reader_for(writer.parsed, fields)
        fast = _COLUMNS_READERS[key]
        if fast is not None:
            try:
                return fast(data, HEADER_LEN)
            except ValueError:
                pass  # as in read_body: fastavro decides
    record = read_body(data, writer, reader)
    for field in fields:
        items = record[field]
        names = list(items[0]) if items else _item_fields(reader.parsed, field)
        ints = _item_int_fields(reader.parsed, field)
        record[field] = {name: _column([item[name] for item in items], name in ints) for name in names}
    return record


def _column(values: list, ints: bool) -> Any:
    """An item field's column as the compiled reader gives it: an int or long field's as an int64 numpy array."""
    if not ints:
        return values
    import numpy as np  # only the sink reads columns; the stages that never do need not load numpy

    return np.array(values, dtype=np.int64)


def _item_fields(parsed: dict, field: str) -> list[str]:
    """The field names of the records in the array `field` of a parsed record schema."""
    return [g["name"] for g in _item_schema_fields(parsed, field)]


def _item_int_fields(parsed: dict, field: str) -> frozenset[str]:
    """The int and long fields (no logical type) of the records in the array `field` of a parsed record schema."""
    return frozenset(g["name"] for g in _item_schema_fields(parsed, field)
                     if g["type"] in ("int", "long") or (isinstance(g["type"], dict) and "logicalType" not in g["type"]
                                                         and g["type"].get("type") in ("int", "long")))


def _item_schema_fields(parsed: dict, field: str) -> list[dict]:
    for f in parsed["fields"]:
        if f["name"] == field and isinstance(f["type"], dict) and isinstance(f["type"].get("items"), dict):
            return f["type"]["items"].get("fields", [])
    raise ValueError(f"{parsed.get('name')}.{field} is not an array of records")
