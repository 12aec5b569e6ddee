"""The fast GpuLaunch writer: the bytes `single_object.encode("GpuLaunch", ...)` writes, with the tail of the record
(user_addrs, mappings, code_objects, simulated) cached per launching path."""

from __future__ import annotations

import io

import fastavro

from schemas.single_object import MARKER, default_registry


class LaunchEncoder:
    """GpuLaunch bytes, as single_object.encode writes them, with the tail cached per launching path: a launch's
    stack repeats, only the fields before it change."""

    def __init__(self) -> None:
        sv = default_registry().latest("GpuLaunch")
        names = [f["name"] for f in sv.parsed["fields"]]
        cut = names.index("user_addrs")
        if names[cut:] != ["user_addrs", "mappings", "code_objects", "simulated"]:
            raise RuntimeError("GpuLaunch layout changed: update schemas/gpu_launch_writer.py")
        self.header = MARKER + sv.fingerprint
        self.head = fastavro.parse_schema({"type": "record", "name": "fleetprof.GpuLaunchHead",
                                           "fields": sv.parsed["fields"][:cut]}, named_schemas={})
        self.tail = fastavro.parse_schema({"type": "record", "name": "fleetprof.GpuLaunchTail",
                                           "fields": sv.parsed["fields"][cut:]}, named_schemas={})
        self.tails: dict[tuple, bytes] = {}

    def encode(self, record: dict) -> bytes:
        buf = io.BytesIO()
        buf.write(self.header)
        fastavro.schemaless_writer(buf, self.head, record)
        if record["mappings"]:  # the first launch of a process in a window carries its mappings: not cached
            fastavro.schemaless_writer(buf, self.tail, record)
            return buf.getvalue()
        codes = tuple((c["qualname"], c["file"], c["first_line"]) for c in record.get("code_objects", ()))
        key = (tuple(record["user_addrs"]), codes, record["simulated"])
        tail = self.tails.get(key)
        if tail is None:
            part = io.BytesIO()
            fastavro.schemaless_writer(part, self.tail, record)
            tail = self.tails[key] = part.getvalue()
        return buf.getvalue() + tail
