"""What the collectors and the outbox encoder need of the agent's identity resolver, declared here by them (the
resolver, producers/identity_resolver.py, is one implementation): an id per process and per GPU, and the record that
defines an id. None stands for "no resolver": every id is 0 and no identity table is sent.

Ids travel in Avro longs with the same bits (records' identity_id); the resolver speaks the unsigned id.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from schemas.wire import long_to_u64, u64_to_long

if TYPE_CHECKING:
    from producers.process_info import ProcessInfo


class Identities(Protocol):
    def identify(self, info: ProcessInfo) -> int:
        """The id of the process's identity (0: none); dict lookups only, never blocks."""
        ...

    def gpu_owner(self, uuid: str) -> int:
        """The id of the pod holding that GPU UUID (MIG UUIDs too), 0 if none."""
        ...

    def record(self, identity_id: int) -> dict | None:
        """The WorkloadIdentity record of an id identify() or gpu_owner() returned."""
        ...


def process_identity(identities: Identities | None, info: ProcessInfo | None) -> int:
    """The identity_id (a long) a record of this process carries; 0 without a resolver or a process."""
    if identities is None or info is None:
        return 0
    return u64_to_long(identities.identify(info))


def gpu_identity(identities: Identities | None, uuid: str) -> int:
    """The identity_id (a long) of the pod holding a GPU; 0 without a resolver."""
    return 0 if identities is None or not uuid else u64_to_long(identities.gpu_owner(uuid))


def identity_record(identities: Identities | None, identity_id: int) -> dict | None:
    """The WorkloadIdentity record of a record's identity_id (a long), or None."""
    if identities is None or not identity_id:
        return None
    return identities.record(long_to_u64(identity_id))
