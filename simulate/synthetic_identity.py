"""Who the synthetic fleet's processes and GPUs belong to (loadgen labels all of it simulated).

Most nodes are Kubernetes nodes: their GPUs are split among 1, 2 or 4 training pods (the same layout on the nodes of
one block of five), each pod the worker of one job spread over the Kubernetes nodes of its block (namespace, team,
`app.kubernetes.io/name`, `job-name`, `team` labels: the agent's default allow-list), each trainer and its DataLoader
workers in its pod's `pytorch` container, the log shipper in a DaemonSet pod; every GPU is held by the pod of the
trainer that runs on it. Every fifth node (index % 5 == 2) runs a Slurm job step instead, two nodes per job (so one
identity spans nodes, as a real multi-node job does), every third job an array of one task per node; there the
shipper is a systemd unit and no pod holds a GPU (no kubelet: the device rows carry no identity, the process rows
the step's). The cgroup paths are those the agent would read (producers/cgroup_identity.py parses them back).

Everything derives from (seed, node prefix, node index) through hashes, never from the node's random stream: adding
identities left the fleet's stacks, pids and layouts as they were. Identities are computed once per node.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass

from producers.workload_identity import Identity

# (namespace, team, app) of the training jobs
K8S_TEAMS = (("llm-pretrain", "foundation-models", "llama-pretrain"), ("recsys", "ranking", "dlrm-train"),
             ("vision", "perception", "vit-finetune"), ("speech", "audio", "whisper-finetune"))
SLURM_ACCOUNTS = (("nlp", "akumar"), ("vision", "mchen"), ("rl", "jsmith"), ("genomics", "lgarcia"))
PODS_PER_NODE = (1, 2, 4)  # per block of five nodes, in turn
BLOCK = 5  # nodes per block; one Kubernetes job per pod slot spans its block's Kubernetes nodes
SLURM_SLOT = 2  # index % BLOCK: a Slurm node; two consecutive blocks' Slurm nodes share a job
SHIPPER_NAMESPACE = "observability"
_K8S_SUFFIX = "bcdfghjklmnpqrstvwxz2456789"  # what Kubernetes' generateName draws from


@dataclass(frozen=True)
class Placement:
    """Where a process runs: its cgroup path, container id ('' outside a container) and identity."""

    cgroup: str
    container_id: str
    identity: Identity


@dataclass(frozen=True)
class NodeWorkloads:
    scheduler: str  # "kubernetes" or "slurm"
    trainers: tuple[Placement, ...]  # per GPU: its trainer's (the trainer's DataLoader workers share it)
    shipper: Placement
    gpu_owners: tuple[Identity | None, ...]  # per GPU: the pod that holds it (None on a Slurm node)

    def identities(self) -> list[Identity]:
        """Every identity the node's records reference, each once, in the order first referenced."""
        seen = [p.identity for p in (*self.trainers, self.shipper)] + [o for o in self.gpu_owners if o is not None]
        return list(dict.fromkeys(seen))


def _digest(*parts: object) -> bytes:
    return hashlib.sha256("/".join(map(str, parts)).encode()).digest()


def _number(*parts: object) -> int:
    return int.from_bytes(_digest(*parts)[:8], "little")


def _uid(*parts: object) -> str:
    return str(uuid.UUID(bytes=_digest(*parts)[:16], version=4))


def _suffix(n: int, *parts: object) -> str:
    x = _number(*parts)
    return "".join(_K8S_SUFFIX[(x >> (5 * i)) % len(_K8S_SUFFIX)] for i in range(n))


def is_slurm_node(index: int) -> bool:
    return index % BLOCK == SLURM_SLOT


def node_workloads(seed: int, prefix: str, name: str, index: int, gpus: int) -> NodeWorkloads:
    """The workloads of node `index` (named `name`) of the fleet (seed, node prefix)."""
    return _slurm(seed, prefix, name, index, gpus) if is_slurm_node(index) else _kubernetes(seed, prefix, name, index,
                                                                                              gpus)


def _kubernetes(seed: int, prefix: str, name: str, index: int, gpus: int) -> NodeWorkloads:
    block = index // BLOCK
    pods = next((n for n in PODS_PER_NODE[block % len(PODS_PER_NODE)::-1] if gpus % n == 0), 1)
    rank = index % BLOCK - (index % BLOCK > SLURM_SLOT)  # the node's place among its block's Kubernetes nodes
    cg = "/kubepods.slice/kubepods-pod{}.slice/cri-containerd-{}.scope"  # Guaranteed QoS: requests = limits
    per_pod: list[Placement] = []
    for k in range(pods):
        namespace, team, app = K8S_TEAMS[_number(seed, prefix, "team", block, k) % len(K8S_TEAMS)]
        job = f"{app}-{_suffix(5, seed, prefix, 'job', block, k)}"
        uid = _uid(seed, name, "pod", k)
        cid = _digest(seed, name, "pod", k, "pytorch").hex()
        identity = Identity("pod", container_runtime="containerd", container_id=cid, container_name="pytorch",
                            pod_name=f"{job}-worker-{rank}", namespace=namespace, pod_uid=uid,
                            labels=(("app.kubernetes.io/name", app), ("job-name", job), ("team", team)), team=team)
        per_pod.append(Placement(cg.format(uid.replace("-", "_"), cid), cid, identity))
    trainers = tuple(per_pod[g * pods // gpus] for g in range(gpus))
    uid = _uid(seed, name, "vector")
    cid = _digest(seed, name, "vector").hex()
    vector = Identity("pod", container_runtime="containerd", container_id=cid, container_name="vector",
                      pod_name=f"vector-{_suffix(5, seed, name, 'vector')}", namespace=SHIPPER_NAMESPACE, pod_uid=uid,
                      labels=(("app.kubernetes.io/name", "vector"), ("team", SHIPPER_NAMESPACE)),
                      team=SHIPPER_NAMESPACE)
    shipper = Placement("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/"
                        "cri-containerd-{}.scope".format(uid.replace("-", "_"), cid), cid, vector)
    return NodeWorkloads("kubernetes", trainers, shipper, tuple(p.identity for p in trainers))


def _slurm(seed: int, prefix: str, name: str, index: int, gpus: int) -> NodeWorkloads:
    job = index // (2 * BLOCK)  # the Slurm nodes of two consecutive blocks
    task = index // BLOCK % 2  # the node's place in its job
    base = 1_000_000 + _number(seed, prefix, "slurm", job) % 8_000_000
    account, user = SLURM_ACCOUNTS[_number(seed, prefix, "account", job) % len(SLURM_ACCOUNTS)]
    array = job % 3 == 2
    job_id = str(base + 1 + task) if array else str(base)  # an array task is a job of its own
    identity = Identity("slurm", slurm_job_id=job_id, slurm_step="0", slurm_user=user,
                        slurm_array_job_id=str(base) if array else "", slurm_array_task_id=str(task) if array else "",
                        slurm_account=account, team=account)
    cg = f"/system.slice/slurmstepd.scope/job_{job_id}/step_0/user/task_{{}}"  # srun: one task per GPU
    trainers = tuple(Placement(cg.format(g), "", identity) for g in range(gpus))
    shipper = Placement("/system.slice/vector.service", "", Identity("systemd", systemd_unit="vector.service"))
    return NodeWorkloads("slurm", trainers, shipper, (None,) * gpus)
