"""The CpuStackBatch layout that the fast writer (cpu_batch_writer.py) and the columnar reader (cpu_batch_reader.py)
work from, derived at import from the newest CpuStackBatch schema file (schemas/cpu_stack_batch.v<N>.avsc): every
record's fields in order with their Avro types, the fewest bytes of each array item, and the order in which the
StackCount fields that PackedStacks holds are written.

Both fast paths write and read the processes array (last in the batch) and each process's stacks array (last in
ProcessStacks) themselves, and every other field through this layout; a schema they cannot handle fails here, at
import, naming the field, instead of being written or read wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from schemas.packed_stacks import ADDRESS_COLUMNS, NUMBER_COLUMNS
from schemas.single_object import SchemaVersion, default_registry

SCALARS = ("int", "long", "string", "boolean")  # each takes one byte at least: a varint, or a length


class LayoutError(RuntimeError):
    """A CpuStackBatch schema the fast paths do not handle; the message names the field."""


@dataclass(frozen=True)
class Field:
    name: str
    kind: str  # one of SCALARS, "array" (of the record `items`) or "stacks" (PackedStacks)
    items: Record | None = None


@dataclass(frozen=True)
class Record:
    name: str
    fields: tuple[Field, ...]
    min_bytes: int  # the fewest bytes of one record: one-byte numbers, empty strings and arrays

    def leading_longs(self) -> tuple[str, ...]:
        """The names of the long fields before any other: a reader may take them at once."""
        names = []
        for f in self.fields:
            if f.kind != "long":
                break
            names.append(f.name)
        return tuple(names)


@dataclass(frozen=True)
class StackField:
    name: str
    kind: str  # "int" or "long": one column of PackedStacks; "addresses": an array of longs, two columns
    column: str  # the PackedStacks column of the number, or of the addresses
    lens_column: str = ""  # of an address array: the column of its lengths


@dataclass(frozen=True)
class CpuBatchLayout:
    schema: SchemaVersion  # the schema the layout comes from; the reader takes only messages written with it
    batch: Record  # its last field is the processes array
    process: Record  # the items of that array; their last field is the stacks array
    process_schema: dict[str, Any]  # ProcessStacks as parsed by fastavro, for the writer
    stack: tuple[StackField, ...]  # StackCount's fields in schema order

    def stack_gaps(self) -> tuple[int, ...]:
        """How many numbers a stack has before its first address array, between consecutive ones, after the last."""
        gaps = [0]
        for f in self.stack:
            if f.kind == "addresses":
                gaps.append(0)
            else:
                gaps[-1] += 1
        return tuple(gaps)


def _kind(path: str, avro_type: Any) -> tuple[str, dict | None]:
    if isinstance(avro_type, str) and avro_type in SCALARS:
        return avro_type, None
    if isinstance(avro_type, dict) and avro_type.get("type") == "array" and isinstance(avro_type["items"], dict) \
            and avro_type["items"].get("type") == "record":
        return "array", avro_type["items"]
    raise LayoutError(f"field {path} has type {avro_type!r}; the CPU-batch fast paths read only "
                      f"{', '.join(SCALARS)} and arrays of records: extend schemas/cpu_batch_layout.py and its users")


def _fields(path: str, schema: dict, last: str) -> tuple[list[Field], str, dict]:
    """The fields of a record before its last one, which must be an array of records the fast paths handle
    themselves (`last`): (those fields, the array's name, its item schema)."""
    *head, tail = schema["fields"]
    _, tail_items = _kind(f"{path}.{tail['name']}", tail["type"])
    if tail_items is None:
        raise LayoutError(f"field {path}.{tail['name']} comes last, where the fast paths expect the "
                          f"{last} array of records")
    fields = []
    for f in head:
        where = f"{path}.{f['name']}"
        kind, items = _kind(where, f["type"])
        fields.append(Field(f["name"], kind, None if items is None else _scalar_record(where, items)))
    return fields, tail["name"], tail_items


def _scalar_record(path: str, schema: dict) -> Record:
    """An array item made of scalars only (Mapping)."""
    fields = []
    for f in schema["fields"]:
        kind, items = _kind(f"{path}.{f['name']}", f["type"])
        if items is not None:
            raise LayoutError(f"field {path}.{f['name']} is an array inside an array item")
        fields.append(Field(f["name"], kind))
    return Record(schema["name"], tuple(fields), len(fields))


def _stack(path: str, schema: dict) -> tuple[StackField, ...]:
    fields = []
    for f in schema["fields"]:
        name, avro_type = f["name"], f["type"]
        if name in NUMBER_COLUMNS and avro_type in ("int", "long"):
            fields.append(StackField(name, avro_type, NUMBER_COLUMNS[name]))
        elif name in ADDRESS_COLUMNS and isinstance(avro_type, dict) and avro_type.get("type") == "array" \
                and avro_type.get("items") == "long":
            fields.append(StackField(name, "addresses", *ADDRESS_COLUMNS[name]))
        else:
            raise LayoutError(f"field {path}.{name} of type {avro_type!r} is not a PackedStacks "
                              "column: update schemas/packed_stacks.py")
    missing = (set(NUMBER_COLUMNS) | set(ADDRESS_COLUMNS)) - {f.name for f in fields}
    if missing:
        raise LayoutError(f"{path} lacks the PackedStacks field(s) {', '.join(sorted(missing))}")
    return tuple(fields)


def derive(schema: SchemaVersion) -> CpuBatchLayout:
    """The layout of one CpuStackBatch schema version, or LayoutError naming what the fast paths cannot handle.
    Every field takes one byte at least (a varint, a string's length, an array's end), hence each min_bytes."""
    batch_fields, processes, process_schema = _fields("CpuStackBatch", schema.parsed, "processes")
    path = f"CpuStackBatch.{processes}"
    process_fields, stacks, stack_schema = _fields(path, process_schema, "stacks")
    if process_fields and process_fields[-1].kind == "string":
        # the reader finds the stacks' first varint among the message's runs of bytes that end below 0x80, and a
        # string's last byte may be any byte
        raise LayoutError(f"field {path}.{process_fields[-1].name} is a string right before the "
                          f"{stacks} array; the columnar reader needs a number, boolean or array there")
    stack = _stack(f"{path}.{stacks}", stack_schema)
    process = Record(process_schema["name"], (*process_fields, Field(stacks, "stacks")), len(process_fields) + 1)
    batch = Record(schema.name, (*batch_fields, Field(processes, "array", process)), len(batch_fields) + 1)
    return CpuBatchLayout(schema, batch, process, process_schema, stack)


LAYOUT = derive(default_registry().latest("CpuStackBatch"))
