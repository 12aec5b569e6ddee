"""pprof output: gzip'd profile.proto, readable by `go tool pprof`, Parca and Pyroscope.

The message types are declared here from the published profile.proto field numbers with protobuf's descriptor
API, so no generated code or protoc is needed.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_T = descriptor_pb2.FieldDescriptorProto
# (message, [(field, number, type, repeated, message type)]) in the profile.proto wire format
_MESSAGES = [
    ("Profile", [("sample_type", 1, _T.TYPE_MESSAGE, True, "ValueType"), ("sample", 2, _T.TYPE_MESSAGE, True, "Sample"),
                 ("mapping", 3, _T.TYPE_MESSAGE, True, "Mapping"), ("location", 4, _T.TYPE_MESSAGE, True, "Location"),
                 ("function", 5, _T.TYPE_MESSAGE, True, "Function"), ("string_table", 6, _T.TYPE_STRING, True, None),
                 ("drop_frames", 7, _T.TYPE_INT64, False, None), ("keep_frames", 8, _T.TYPE_INT64, False, None),
                 ("time_nanos", 9, _T.TYPE_INT64, False, None), ("duration_nanos", 10, _T.TYPE_INT64, False, None),
                 ("period_type", 11, _T.TYPE_MESSAGE, False, "ValueType"), ("period", 12, _T.TYPE_INT64, False, None),
                 ("comment", 13, _T.TYPE_INT64, True, None), ("default_sample_type", 14, _T.TYPE_INT64, False, None)]),
    ("ValueType", [("type", 1, _T.TYPE_INT64, False, None), ("unit", 2, _T.TYPE_INT64, False, None)]),
    ("Sample", [("location_id", 1, _T.TYPE_UINT64, True, None), ("value", 2, _T.TYPE_INT64, True, None),
                ("label", 3, _T.TYPE_MESSAGE, True, "Label")]),
    ("Label", [("key", 1, _T.TYPE_INT64, False, None), ("str", 2, _T.TYPE_INT64, False, None),
               ("num", 3, _T.TYPE_INT64, False, None), ("num_unit", 4, _T.TYPE_INT64, False, None)]),
    ("Mapping", [("id", 1, _T.TYPE_UINT64, False, None), ("memory_start", 2, _T.TYPE_UINT64, False, None),
                 ("memory_limit", 3, _T.TYPE_UINT64, False, None), ("file_offset", 4, _T.TYPE_UINT64, False, None),
                 ("filename", 5, _T.TYPE_INT64, False, None), ("build_id", 6, _T.TYPE_INT64, False, None),
                 ("has_functions", 7, _T.TYPE_BOOL, False, None)]),
    ("Location", [("id", 1, _T.TYPE_UINT64, False, None), ("mapping_id", 2, _T.TYPE_UINT64, False, None),
                  ("address", 3, _T.TYPE_UINT64, False, None), ("line", 4, _T.TYPE_MESSAGE, True, "Line"),
                  ("is_folded", 5, _T.TYPE_BOOL, False, None)]),
    ("Line", [("function_id", 1, _T.TYPE_UINT64, False, None), ("line", 2, _T.TYPE_INT64, False, None)]),
    ("Function", [("id", 1, _T.TYPE_UINT64, False, None), ("name", 2, _T.TYPE_INT64, False, None),
                  ("system_name", 3, _T.TYPE_INT64, False, None), ("filename", 4, _T.TYPE_INT64, False, None),
                  ("start_line", 5, _T.TYPE_INT64, False, None)]),
]


def _profile_class():
    fd = descriptor_pb2.FileDescriptorProto(name="fleetprof_pprof_profile.proto", package="perftools.profiles",
                                            syntax="proto3")
    for name, fields in _MESSAGES:
        msg = fd.message_type.add(name=name)
        for fname, number, ftype, repeated, mtype in fields:
            f = msg.field.add(name=fname, number=number, type=ftype,
                              label=_T.LABEL_REPEATED if repeated else _T.LABEL_OPTIONAL)
            if mtype:
                f.type_name = f".perftools.profiles.{mtype}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("perftools.profiles.Profile"))


Profile = _profile_class()
# a Python frame as the symbolizer names it (processors/symbolize.py): `qualname (file:line)`
_PYTHON_FRAME = re.compile(r"^(.+) \((.+):(\d+)\)$")


@dataclass(frozen=True)
class Sample:
    """One sample: its frames root first, each frame's binary ('' when unknown) and build id ('' when unknown), its
    values (one per sample type) and its labels (string, or integer for a numeric label)."""

    functions: Sequence[str]
    values: Sequence[int]
    binaries: Sequence[str] = ()  # () when no frame's binary is known
    build_ids: Sequence[str] = ()
    labels: Sequence[tuple[str, str | int]] = ()


def _sample(item: Sample | tuple[Sequence[str], int]) -> Sample:
    return item if isinstance(item, Sample) else Sample(item[0], (int(item[1]),))


def build_profile(samples: Iterable[Sample | tuple[Sequence[str], int]],
                  sample_types: Sequence[tuple[str, str]] = (("samples", "count"),),
                  period_type: tuple[str, str] | None = None, period: int = 0, default_sample_type: str = "",
                  comments: Sequence[str] = (), time_nanos: int = 0, duration_nanos: int = 0):
    """A Profile message from samples, or (root-first function names, value) pairs.

    One Mapping per binary (its file name, the first build id given for it, HasFunctions: the names are resolved
    already, so pprof tools do not try to symbolize), one Location and one Function per (function name, binary), each
    Location pointing at its binary's Mapping (mapping id 0 for a frame whose binary is unknown). A Python frame,
    `qualname (file:line)`, becomes the Function `qualname` in `file` and the Location's line `line`."""
    strings: dict[str, int] = {"": 0}

    def s(text: str) -> int:
        return strings.setdefault(text, len(strings))

    prof = Profile()
    for kind, unit in sample_types:
        prof.sample_type.add(type=s(kind), unit=s(unit))
    mappings: dict[str, int] = {}
    locations: dict[tuple[str, str], int] = {}
    for sample in map(_sample, samples):
        binaries = sample.binaries or [""] * len(sample.functions)
        build_ids = sample.build_ids or [""] * len(sample.functions)
        ids = []
        # root first, so the first mapping is the binary most stacks start in (pprof tools call it the main one)
        for name, binary, build_id in zip(sample.functions, binaries, build_ids, strict=True):
            loc = locations.get((name, binary))
            if loc is None:
                loc = locations[(name, binary)] = len(locations) + 1
                mapping = mappings.get(binary, 0) if binary else 0
                if binary and not mapping:
                    mapping = mappings[binary] = len(mappings) + 1
                    prof.mapping.add(id=mapping, filename=s(binary), build_id=s(build_id), has_functions=True)
                python = _PYTHON_FRAME.match(name)
                if python:  # no linker symbol: without a system name pprof shows the name as it is (`<module>`)
                    prof.function.add(id=loc, name=s(python[1]), filename=s(python[2]))
                    prof.location.add(id=loc, mapping_id=mapping).line.add(function_id=loc, line=int(python[3]))
                else:
                    prof.function.add(id=loc, name=s(name), system_name=s(name))
                    prof.location.add(id=loc, mapping_id=mapping).line.add(function_id=loc)
            ids.append(loc)
        ids.reverse()  # pprof lists a sample's locations leaf first
        labels = [{"key": s(k), "num": v} if isinstance(v, int) else {"key": s(k), "str": s(v)}
                  for k, v in sample.labels]
        prof.sample.add(location_id=ids, value=[int(v) for v in sample.values], label=labels)
    if period_type:
        prof.period_type.type, prof.period_type.unit = s(period_type[0]), s(period_type[1])
        prof.period = period
    prof.comment.extend(s(c) for c in comments)
    if default_sample_type:
        prof.default_sample_type = s(default_sample_type)
    prof.time_nanos = time_nanos
    prof.duration_nanos = duration_nanos
    prof.string_table.extend(strings)
    return prof


def pprof_bytes(samples: Iterable[Sample | tuple[Sequence[str], int]], **kwargs) -> bytes:
    """The gzip'd profile.proto bytes that pprof tools read (build_profile's arguments)."""
    return gzip.compress(build_profile(samples, **kwargs).SerializeToString(), mtime=0)
