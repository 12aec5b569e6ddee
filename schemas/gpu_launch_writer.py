"""The fast GpuLaunch writer: the bytes `single_object.encode("GpuLaunch", ...)` writes, with the tail of the record
(user_addrs, mappings, code_objects, simulated) cached per launching path."""

from __future__ import annotations

import io

import fastavro

from schemas import avro_fast
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
        # the compiled writer (schemas/avro_fast.py) where it is built: a launch's head in ~1 us instead of fastavro's
        self.write_head, self.write_tail = avro_fast.writer_for(self.head), avro_fast.writer_for(self.tail)

    def encode(self, record: dict) -> bytes:
        head = self._write(self.head, self.write_head, record, self.header)
        if record["mappings"]:  # the first launch of a process in a window carries its mappings: not cached
            return head + self._write(self.tail, self.write_tail, record)
        codes = tuple((c["qualname"], c["file"], c["first_line"]) for c in record.get("code_objects", ()))
        key = (tuple(record["user_addrs"]), codes, record["simulated"])
        tail = self.tails.get(key)
        if tail is None:
            tail = self.tails[key] = self._write(self.tail, self.write_tail, record)
        return head + tail

    @staticmethod
    def _write(schema: dict, compiled, record: dict, prefix: bytes = b"") -> bytes:
        """prefix + the part of `record` that `schema` holds: the compiled writer's bytes, fastavro's where it
        refuses a value."""
        if compiled is not None:
            try:
                return compiled(record, prefix)
            except ValueError:
                pass
        buf = io.BytesIO()
        buf.write(prefix)
        fastavro.schemaless_writer(buf, schema, record)
        return buf.getvalue()
