"""producers/cgroup_identity: container runtime and id, pod uid, Slurm job/step/uid and systemd unit from real-world
shaped cgroup paths (v2 unified and v1, the systemd and cgroupfs drivers)."""

from __future__ import annotations

import pytest

from producers.cgroup_identity import CgroupIdentity, parse_cgroup_path

CID = "3f1c9a0d2b7e4c5f8a9b0c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f6a7b8c9d0e1f"
CID2 = "a" * 64
UID = "0f5e2a9c-6d1b-4f3a-9c2e-7b8d1a0e4c6f"
UID_ = UID.replace("-", "_")

CASES = [
    # Kubernetes, systemd driver, cgroup v2: containerd, CRI-O, Docker (cri-dockerd); every QoS class
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope",
     CgroupIdentity("containerd", CID, UID)),
    (f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/crio-{CID}.scope",
     CgroupIdentity("cri-o", CID, UID)),
    (f"/kubepods.slice/kubepods-pod{UID_}.slice/crio-conmon-{CID}.scope", CgroupIdentity("cri-o", CID, UID)),
    (f"/kubepods.slice/kubepods-pod{UID_}.slice/docker-{CID}.scope", CgroupIdentity("docker", CID, UID)),
    # the pod's own cgroup (no container)
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice", CgroupIdentity(pod_uid=UID)),
    # kind / nested kubelet: the slices carry a prefix
    (f"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
     f"kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope", CgroupIdentity("containerd", CID, UID)),
    # seen from inside the agent's own cgroup namespace
    (f"/../../kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope", CgroupIdentity("containerd", CID, UID)),
    # cgroupfs driver (v1 and v2): the runtime is not written
    (f"/kubepods/burstable/pod{UID}/{CID}", CgroupIdentity("", CID, UID)),
    (f"/kubepods/pod{UID}/{CID}", CgroupIdentity("", CID, UID)),
    (f"/kubepods/besteffort/pod{UID}/{CID}", CgroupIdentity("", CID, UID)),
    # plain containers
    (f"/system.slice/docker-{CID}.scope", CgroupIdentity("docker", CID)),
    (f"/docker/{CID}", CgroupIdentity("docker", CID)),
    (f"/system.slice/containerd.service/default/{CID}", CgroupIdentity("containerd", CID)),
    (f"/system.slice/nerdctl-{CID}.scope", CgroupIdentity("containerd", CID)),
    (f"/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{CID}.scope", CgroupIdentity("podman", CID)),
    (f"/machine.slice/libpod-conmon-{CID}.scope", CgroupIdentity("podman", CID)),
    # a container in a container (docker in docker): the innermost id
    (f"/docker/{CID2}/docker/{CID}", CgroupIdentity("docker", CID)),
    # Slurm, cgroup v2
    ("/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0",
     CgroupIdentity(slurm_job_id="4242", slurm_step="0", systemd_unit="slurmstepd.scope")),
    ("/system.slice/slurmstepd.scope/job_4242/step_17/user/task_3",
     CgroupIdentity(slurm_job_id="4242", slurm_step="17", systemd_unit="slurmstepd.scope")),
    ("/system.slice/slurmstepd.scope/job_4242/step_batch/user/task_0",
     CgroupIdentity(slurm_job_id="4242", slurm_step="batch", systemd_unit="slurmstepd.scope")),
    ("/system.slice/slurmstepd.scope/job_4242/step_extern/user/task_special",
     CgroupIdentity(slurm_job_id="4242", slurm_step="extern", systemd_unit="slurmstepd.scope")),
    ("/system.slice/slurmstepd.scope/job_4242/step_interactive/user/task_0",
     CgroupIdentity(slurm_job_id="4242", slurm_step="interactive", systemd_unit="slurmstepd.scope")),
    ("/system.slice/slurmstepd.scope/job_4242/step_0/slurm",  # the step's slurmstepd itself
     CgroupIdentity(slurm_job_id="4242", slurm_step="0", systemd_unit="slurmstepd.scope")),
    ("/system.slice/slurmstepd.scope/system", CgroupIdentity(systemd_unit="slurmstepd.scope")),
    # Slurm, cgroup v1 (and several slurmd per host)
    ("/slurm/uid_1000/job_77/step_0/task_1", CgroupIdentity(slurm_job_id="77", slurm_step="0", slurm_uid=1000)),
    ("/slurm/uid_1000/job_77/step_batch/task_0",
     CgroupIdentity(slurm_job_id="77", slurm_step="batch", slurm_uid=1000)),
    ("/slurm_node07/uid_2001/job_9/step_extern", CgroupIdentity(slurm_job_id="9", slurm_step="extern", slurm_uid=2001)),
    ("/slurm/uid_1000", CgroupIdentity()),
    # systemd units, user sessions and slices
    ("/system.slice/nginx.service", CgroupIdentity(systemd_unit="nginx.service")),
    ("/system.slice/slurmd.service", CgroupIdentity(systemd_unit="slurmd.service")),
    ("/user.slice/user-1000.slice/session-3.scope", CgroupIdentity(systemd_unit="session-3.scope")),
    ("/user.slice/user-1000.slice/user@1000.service/app.slice/app-gnome-firefox-4123.scope",
     CgroupIdentity(systemd_unit="app-gnome-firefox-4123.scope")),
    ("/user.slice/user-1000.slice/user@1000.service/init.scope", CgroupIdentity(systemd_unit="init.scope")),
    ("/init.scope", CgroupIdentity(systemd_unit="init.scope")),
    ("/system.slice/system-getty.slice/getty@tty1.service", CgroupIdentity(systemd_unit="getty@tty1.service")),
    # nothing to name
    ("/", CgroupIdentity()),
    ("", CgroupIdentity()),
    ("/user.slice", CgroupIdentity()),
    # lookalikes that are not ids: too short, upper case, a pod word without a uid
    ("/system.slice/docker-abc123.scope", CgroupIdentity(systemd_unit="docker-abc123.scope")),
    (f"/docker/{CID.upper()}", CgroupIdentity()),
    ("/kubepods.slice/kubepods-burstable.slice", CgroupIdentity()),
    ("/system.slice/job_12/step_0", CgroupIdentity()),  # job_ outside Slurm's hierarchy
]


@pytest.mark.parametrize(("path", "expected"), CASES, ids=[p or "empty" for p, _ in CASES])
def test_parse_cgroup_path(path: str, expected: CgroupIdentity) -> None:
    assert parse_cgroup_path(path) == expected


def test_kinds() -> None:
    assert parse_cgroup_path("/slurm/uid_1/job_2/step_0").is_slurm
    assert parse_cgroup_path(f"/kubepods/pod{UID}/{CID}").is_kubernetes
    assert not parse_cgroup_path("/system.slice/nginx.service").is_slurm
