"""The synthetic fleet's workload identities: Kubernetes pods and Slurm job steps laid out as documented, cgroup
paths the agent's parser reads back to the same containers, pods and jobs, and every record carrying its process's
(or its GPU's holder's) id. Pure."""

from __future__ import annotations

import re

import pytest

from producers.cgroup_identity import parse_cgroup_path
from producers.workload_identity import Identity
from schemas.single_object import decode, encode
from schemas.wire import long_to_u64, u64_to_long
from simulate.synthetic_fleet import SimNode, SyntheticFleet
from simulate.synthetic_identity import K8S_TEAMS, SLURM_ACCOUNTS

SUFFIX = "[bcdfghjklmnpqrstvwxz2456789]{5}"


@pytest.fixture(scope="module")
def fleet() -> SyntheticFleet:
    return SyntheticFleet(seed=7)


def _by_id(node: SimNode) -> dict[int, Identity]:
    """The node's identities by the id records carry (a long)."""
    return {u64_to_long(i.identity_id): i for i in node.identities}


def _trainer_ids(node: SimNode) -> list[int]:
    return [p.identity_id for p in node.processes if p.kind == "trainer"]


def test_schedulers_and_pods_per_node(fleet: SyntheticFleet) -> None:
    assert [fleet.node(i).workloads.scheduler for i in range(10)] == \
        ["kubernetes"] * 2 + ["slurm"] + ["kubernetes"] * 4 + ["slurm"] + ["kubernetes"] * 2
    for index, pods in ((0, 1), (4, 1), (5, 2), (9, 2), (10, 4), (14, 4), (15, 1)):
        ids = _trainer_ids(fleet.node(index))
        per = 8 // pods  # each pod holds consecutive GPUs
        assert [ids.index(i) for i in ids] == [g // per * per for g in range(8)], index
    for index in (2, 7, 12):
        assert len(set(_trainer_ids(fleet.node(index)))) == 1  # one job step per Slurm node


def test_kubernetes_pods(fleet: SyntheticFleet) -> None:
    jobs: dict[int, set[str]] = {}  # pod slot -> job names over the block's nodes
    for index, rank in ((0, 0), (1, 1), (3, 2), (4, 3)):  # block 0's Kubernetes nodes, node 2 runs Slurm
        node = fleet.node(index)
        ids = _by_id(node)
        assert set(ids) == {p.identity_id for p in node.processes}  # exactly what the records reference
        trainer = ids[node.processes[0].identity_id]
        namespace, team, app = next(t for t in K8S_TEAMS if t[0] == trainer.namespace)
        job = dict(trainer.labels)["job-name"]
        jobs.setdefault(0, set()).add(job)
        assert re.fullmatch(rf"{app}-{SUFFIX}", job)
        assert trainer == Identity("pod", container_runtime="containerd", container_id=trainer.container_id,
                                   container_name="pytorch", pod_name=f"{job}-worker-{rank}", namespace=namespace,
                                   pod_uid=trainer.pod_uid, labels=(("app.kubernetes.io/name", app),
                                                                    ("job-name", job), ("team", team)), team=team)
        shipper = node.processes[-1]
        vector = ids[shipper.identity_id]
        assert shipper.comm == "vector" and re.fullmatch(f"vector-{SUFFIX}", vector.pod_name)
        assert vector == Identity("pod", container_runtime="containerd", container_id=vector.container_id,
                                  container_name="vector", pod_name=vector.pod_name, namespace="observability",
                                  pod_uid=vector.pod_uid, labels=(("app.kubernetes.io/name", "vector"),
                                                                  ("team", "observability")), team="observability")
        for proc in node.processes:  # the agent's cgroup parser finds the same container and pod
            identity = ids[proc.identity_id]
            parsed = parse_cgroup_path(proc.cgroup)
            assert (parsed.container_runtime, parsed.container_id, parsed.pod_uid) == \
                ("containerd", identity.container_id, identity.pod_uid)
            assert proc.container_id == identity.container_id
        # the GPUs are held by the pod of the trainer on them
        assert node.gpu_owner_ids == _trainer_ids(node)
    assert len(jobs[0]) == 1  # one job over the block
    # every identity names its own node's pod: none is shared between nodes
    all_ids = [i for index in (0, 1, 3, 4, 5) for i in _by_id(fleet.node(index))]
    assert len(all_ids) == len(set(all_ids)) == 4 * 2 + 3


def test_slurm_job_steps(fleet: SyntheticFleet) -> None:
    first, second = fleet.node(2), fleet.node(7)  # one job over two nodes: the same identity
    assert _by_id(first) == _by_id(second) and len(_by_id(first)) == 2
    step = _by_id(first)[first.processes[0].identity_id]
    account, user = next(a for a in SLURM_ACCOUNTS if a[0] == step.slurm_account)
    assert step == Identity("slurm", slurm_job_id=step.slurm_job_id, slurm_step="0", slurm_user=user,
                            slurm_account=account, team=account)
    assert 1_000_000 <= int(step.slurm_job_id) < 9_000_000
    assert _by_id(first)[first.processes[-1].identity_id] == Identity("systemd", systemd_unit="vector.service")
    for node in (first, second):
        assert node.gpu_owner_ids == [0] * 8  # no kubelet: no pod holds a GPU
        for proc in node.processes:
            parsed = parse_cgroup_path(proc.cgroup)
            if proc.kind == "shipper":
                assert (proc.cgroup, proc.container_id) == ("/system.slice/vector.service", "")
                continue
            assert (parsed.slurm_job_id, parsed.slurm_step, proc.container_id) == (step.slurm_job_id, "0", "")
            if proc.kind == "trainer":  # srun: one task per GPU (a worker is in its trainer's)
                assert proc.cgroup.endswith(f"/task_{proc.device}")
    # every third job is an array, one task per node: a job id each, the array's id shared
    a, b = (_by_id(fleet.node(i))[fleet.node(i).processes[0].identity_id] for i in (22, 27))
    assert a.slurm_array_job_id == b.slurm_array_job_id != ""
    assert (int(a.slurm_job_id), int(b.slurm_job_id)) == (int(a.slurm_array_job_id) + 1,
                                                          int(a.slurm_array_job_id) + 2)
    assert (a.slurm_array_task_id, b.slurm_array_task_id) == ("0", "1") and a.team == b.team == a.slurm_account


def test_workers_share_their_trainers_identity(fleet: SyntheticFleet) -> None:
    for index in (0, 2, 5, 10):
        procs = fleet.node(index).processes
        workers = [p for p in procs if p.kind == "worker"]
        assert [w.identity_id for w in workers] == [procs[i // 2].identity_id for i in range(16)]
        assert [w.cgroup for w in workers] == [procs[i // 2].cgroup for i in range(16)]


def test_another_fleet_has_other_workloads(fleet: SyntheticFleet) -> None:
    other = SyntheticFleet(seed=7, node_prefix="other-node")
    for index in (0, 2):
        assert not set(_by_id(fleet.node(index))) & set(_by_id(other.node(index))) - {
            u64_to_long(Identity("systemd", systemd_unit="vector.service").identity_id)}


def test_records_carry_the_ids_and_definitions_encode(fleet: SyntheticFleet) -> None:
    for index in (0, 2, 5):
        node = fleet.node(index)
        ids = _by_id(node)
        _, procs, _ = fleet.cpu_window(node, 1520)
        assert [p["identity_id"] for p in procs] == [node.processes[
            [q.pid for q in node.processes].index(p["pid"])].identity_id for p in procs]
        launches, _ = fleet.gpu_window(node, 1_700_000_000 * 10**9, 10**10, 2.0)
        by_pid = {p.pid: p.identity_id for p in node.processes}
        assert launches and all(r["identity_id"] == by_pid[r["pid"]] != 0 for r in launches)
        poll = fleet.metrics(node, 1_700_000_000 * 10**9)
        assert [d["identity_id"] for d in poll["devices"]] == node.gpu_owner_ids
        assert [p["identity_id"] for p in poll["processes"]] == _trainer_ids(node)
        assert decode(encode("GpuMetrics", poll))[1] == poll
        for iid, identity in ids.items():
            record = identity.record(node.name, 123, simulated=True)
            assert decode(encode("WorkloadIdentity", record), expect="WorkloadIdentity")[1] == record
            assert long_to_u64(record["identity_id"]) == identity.identity_id and record["identity_id"] == iid
