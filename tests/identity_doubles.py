"""A double of the agent's identity resolver (the Identities interface of producers/identity_refs.py): a process in a
container's cgroup is a pod named after its container id, one under a Slurm step its job, anything else the host;
GPUs belong to the pods the test says. Dict lookups, like the real one."""

from __future__ import annotations

import re

from producers.process_info import ProcessInfo, container_id
from producers.workload_identity import Identity

_SLURM = re.compile(r"/job_(\d+)/step_(\w+)")


class CgroupIdentities:
    def __init__(self, node: str, gpu_pods: dict[str, str] | None = None, time_ns: int = 1_764_000_000_000_000_000,
                 simulated: bool = False) -> None:
        self.node, self.time_ns, self.simulated = node, time_ns, simulated
        self.known: dict[int, Identity] = {}
        self.gpus = {uuid: self._keep(self.pod(cid)) for uuid, cid in (gpu_pods or {}).items()}
        self.asked = 0  # identify() calls

    @staticmethod
    def pod(cid: str) -> Identity:
        return Identity("pod", container_runtime="containerd", container_id=cid, container_name="main",
                        pod_name=f"pod-{cid[:6]}", namespace="ml", pod_uid=f"uid-{cid[:6]}",
                        labels=(("team", "vision"),), team="vision")

    def _keep(self, identity: Identity) -> int:
        self.known[identity.identity_id] = identity
        return identity.identity_id

    def identify(self, info: ProcessInfo) -> int:
        self.asked += 1
        cid = info.container_id or container_id(info.cgroup)
        if cid:
            return self._keep(self.pod(cid))
        job = _SLURM.search(info.cgroup)
        if job:
            return self._keep(Identity("slurm", slurm_job_id=job[1], slurm_step=job[2], slurm_user="ana",
                                       slurm_account="physics", team="physics"))
        return self._keep(Identity("host"))

    def gpu_owner(self, uuid: str) -> int:
        return self.gpus.get(uuid, 0)

    def record(self, identity_id: int) -> dict | None:
        found = self.known.get(identity_id)
        return None if found is None else found.record(self.node, self.time_ns, self.simulated)
