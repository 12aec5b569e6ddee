"""pprof output: gzip'd profile.proto, readable by `go tool pprof`, Parca and Pyroscope.

The message types are declared here from the published profile.proto field numbers with protobuf's descriptor
API, so no generated code or protoc is needed.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Iterable

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


def build_profile(stacks: Iterable[tuple[list[str], int]], sample_type: str = "samples", unit: str = "count",
                  time_nanos: int = 0, duration_nanos: int = 0):
    """A Profile message from (root-first function names, value) pairs; one Function and Location per name."""
    strings: dict[str, int] = {"": 0}

    def s(text: str) -> int:
        return strings.setdefault(text, len(strings))

    prof = Profile()
    prof.sample_type.add(type=s(sample_type), unit=s(unit))
    locations: dict[str, int] = {}
    for functions, value in stacks:
        ids = []
        for name in reversed(functions):  # pprof lists a sample's locations leaf first
            loc = locations.get(name)
            if loc is None:
                loc = locations[name] = len(locations) + 1
                python = _PYTHON_FRAME.match(name)
                if python:  # `qualname (file:line)`: the function, its file and the line, as pprof has them
                    prof.function.add(id=loc, name=s(python[1]), system_name=s(python[1]), filename=s(python[2]))
                    prof.location.add(id=loc).line.add(function_id=loc, line=int(python[3]))
                else:
                    prof.function.add(id=loc, name=s(name), system_name=s(name))
                    prof.location.add(id=loc).line.add(function_id=loc)
            ids.append(loc)
        prof.sample.add(location_id=ids, value=[int(value)])
    prof.time_nanos = time_nanos
    prof.duration_nanos = duration_nanos
    prof.string_table.extend(strings)
    return prof


def pprof_bytes(stacks: Iterable[tuple[list[str], int]], **kwargs) -> bytes:
    """The gzip'd profile.proto bytes that pprof tools read."""
    return gzip.compress(build_profile(stacks, **kwargs).SerializeToString(), mtime=0)
