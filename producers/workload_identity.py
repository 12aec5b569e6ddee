"""A workload identity: who a process or a GPU belongs to (a Kubernetes pod's container, a Slurm job step, a plain
container, a systemd unit, or the host), and its stable 64-bit id.

The id is a hash of the fields, so the same workload gets the same id after an agent restart and on every node that
sees it (a Slurm job spanning nodes groups as one), and a better-resolved identity (the kubelet answered, the pod's
name is now known) is a new id: records keep the id they were sent with, and the dimension table holds both.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

from schemas.wire import identity_key, u64_to_long  # identity_key: said once, for every stage

__all__ = ["KINDS", "NO_IDENTITY", "Identity", "identity_key"]

NO_IDENTITY = 0  # records that reference none (the process was gone before it was read)
KINDS = ("pod", "container", "slurm", "systemd", "host")


@dataclass(frozen=True)
class Identity:
    kind: str  # one of KINDS
    container_runtime: str = ""
    container_id: str = ""
    container_name: str = ""
    pod_name: str = ""
    namespace: str = ""
    pod_uid: str = ""
    labels: tuple[tuple[str, str], ...] = ()  # sorted (key, value) pairs: hashable, one order
    slurm_job_id: str = ""
    slurm_step: str = ""
    slurm_user: str = ""
    slurm_array_job_id: str = ""
    slurm_array_task_id: str = ""
    slurm_account: str = ""
    systemd_unit: str = ""
    team: str = ""
    _id: int = field(default=0, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown identity kind {self.kind!r} (one of {', '.join(KINDS)})")
        object.__setattr__(self, "labels", tuple(sorted(dict(self.labels).items())))
        object.__setattr__(self, "_id", _hash(self))

    @property
    def identity_id(self) -> int:
        """The unsigned 64-bit id (never NO_IDENTITY)."""
        return self._id

    def record(self, node: str, time_ns: int, simulated: bool = False) -> dict:
        """The WorkloadIdentity record that defines this id."""
        fields = _fields(self)
        fields["labels"] = dict(self.labels)
        return {"identity_id": u64_to_long(self.identity_id), "node": node, "time_ns": time_ns, **fields,
                "simulated": simulated}


def _fields(identity: Identity) -> dict:
    fields = asdict(identity)
    del fields["_id"]
    return fields


def _hash(identity: Identity) -> int:
    canonical = json.dumps(_fields(identity), sort_keys=True, separators=(",", ":")).encode()
    value = int.from_bytes(hashlib.blake2b(canonical, digest_size=8).digest(), "little")
    return value or 1  # 0 means "none"
