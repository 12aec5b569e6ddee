"""What a cgroup path says about its workload: the container runtime and id, the Kubernetes pod uid, the Slurm job,
step and uid, and the systemd unit. Pure functions of the path (cgroup v2 unified and v1 hierarchies, the systemd
and the cgroupfs drivers); nothing is read here.

Shapes handled (the id is 64 hex digits; a pod uid is written with '_' for '-' by the systemd driver):
  /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope
  /kubepods.slice/kubepods-pod<uid>.slice/crio-<id>.scope            (and crio-conmon-<id>.scope, docker-<id>.scope)
  /kubepods/burstable/pod<uid>/<id>                                  (cgroupfs driver: the runtime is not written)
  /system.slice/docker-<id>.scope, /docker/<id>, /system.slice/containerd.service/<ns>/<id> (plain containers)
  /system.slice/slurmstepd.scope/job_<id>/step_<n>/user/task_<k>   (v2; step_batch, step_extern, step_interactive)
  /slurm/uid_<uid>/job_<id>/step_<n>/task_<k>                        (v1; also /slurm_<node>/... for multiple slurmd)
  /system.slice/nginx.service, /user.slice/user-1000.slice/session-3.scope
A path seen from inside another cgroup namespace (/../../kubepods-...) is matched the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CONTAINERD, CRIO, DOCKER, PODMAN = "containerd", "cri-o", "docker", "podman"

_HEX64 = r"[0-9a-f]{64}"
# <prefix>-<id>.scope, the systemd driver's container unit; conmon scopes hold CRI-O's/podman's monitor of that id
_SCOPE = re.compile(rf"^(cri-containerd|crio-conmon|crio|docker|libpod-conmon|libpod|nerdctl)-({_HEX64})\.scope$")
_SCOPE_RUNTIME = {"cri-containerd": CONTAINERD, "crio": CRIO, "crio-conmon": CRIO, "docker": DOCKER,
                  "libpod": PODMAN, "libpod-conmon": PODMAN, "nerdctl": CONTAINERD}
_BARE_ID = re.compile(rf"^(?:cri-containerd:|crio:|docker:)?({_HEX64})$")
_POD_SLICE = re.compile(r"^(?:[a-z0-9]+-)*kubepods(?:-[a-z]+)*-pod([0-9a-f_]{36})\.slice$")
_POD_DIR = re.compile(r"^pod([0-9a-f-]{36})$")
_SLURM_JOB = re.compile(r"^job_(\d+)$")
_SLURM_STEP = re.compile(r"^step_(\d+|batch|extern|interactive)$")
_SLURM_UID = re.compile(r"^uid_(\d+)$")
_UNIT = re.compile(r"^[^/]+\.(service|scope)$")


@dataclass(frozen=True)
class CgroupIdentity:
    container_runtime: str = ""  # containerd | cri-o | docker | podman | "" (unknown or none)
    container_id: str = ""
    pod_uid: str = ""  # with dashes, as the API server writes it
    slurm_job_id: str = ""
    slurm_step: str = ""  # "0", "1", ..., "batch", "extern", "interactive"
    slurm_uid: int | None = None  # cgroup v1 paths name it
    systemd_unit: str = ""  # the innermost .service / .scope that is not a container's

    @property
    def is_slurm(self) -> bool:
        return bool(self.slurm_job_id)

    @property
    def is_kubernetes(self) -> bool:
        return bool(self.pod_uid)


def parse_cgroup_path(path: str) -> CgroupIdentity:
    """Everything the path names; fields it does not name stay empty."""
    parts = [p for p in path.split("/") if p and p not in (".", "..")]
    runtime, cid = _container(parts)
    job, step, uid = _slurm(parts)
    return CgroupIdentity(container_runtime=runtime, container_id=cid, pod_uid=_pod_uid(parts),
                          slurm_job_id=job, slurm_step=step, slurm_uid=uid,
                          systemd_unit="" if cid else _unit(parts))


def _container(parts: list[str]) -> tuple[str, str]:
    """(runtime, id) of the innermost container component; the runtime is "" where only the id is written."""
    for i in range(len(parts) - 1, -1, -1):
        part = parts[i]
        m = _SCOPE.match(part)
        if m:
            return _SCOPE_RUNTIME[m.group(1)], m.group(2)
        m = _BARE_ID.match(part)
        if m:
            parent = parts[i - 1] if i else ""
            if parent == "docker":  # cgroup v1 /docker/<id>, Docker's cgroupfs driver
                return DOCKER, m.group(1)
            if parent == "lxc.payload" or parent.startswith("libpod_parent"):
                return PODMAN, m.group(1)
            return _runtime_from_ancestors(parts[:i]), m.group(1)
    return "", ""


def _runtime_from_ancestors(parts: list[str]) -> str:
    # containerd's own cgroup (non-Kubernetes containers: /system.slice/containerd.service/<namespace>/<id>)
    if any(p == "containerd.service" or p == "containerd" for p in parts):
        return CONTAINERD
    return ""  # /kubepods/<qos>/pod<uid>/<id>: any CRI runtime; the kubelet's containerID says which


def _pod_uid(parts: list[str]) -> str:
    for part in reversed(parts):
        m = _POD_SLICE.match(part)
        if m:
            return m.group(1).replace("_", "-")
        m = _POD_DIR.match(part)
        if m:
            return m.group(1)
    return ""


def _slurm(parts: list[str]) -> tuple[str, str, int | None]:
    job = step = ""
    uid = None
    in_slurm = False
    for part in parts:
        if part == "slurmstepd.scope" or part == "slurm" or part.startswith("slurm_"):
            in_slurm = True
            continue
        if not in_slurm:
            continue
        if m := _SLURM_UID.match(part):
            uid = int(m.group(1))
        elif m := _SLURM_JOB.match(part):
            job = m.group(1)
        elif job and (m := _SLURM_STEP.match(part)):
            step = m.group(1)
    return job, step, uid if job else None


def _unit(parts: list[str]) -> str:
    for part in reversed(parts):
        if _UNIT.match(part):
            return part
    return ""

