"""Known rows with workload identities (migration 0015) for the workload filter and grouping tests.

Identities: A pod ml/train-0 (container trainer, Job train, team vision), B pod ml/serve-0 (server, team search),
C Slurm job 4242 = array task 4240_2 (account and team physics), D pod infra/train-0 (trainer, Job nightly, no team);
'' is a row of an agent older than identities.

CPU: at six offsets from H (a whole hour) -10, 0, 1800, 3590, 3600, 7210 s, per identity one row: A pid 10 stack 101
x1, B pid 20 stack 102 x2, C pid 30 stack 103 x4, D pid 40 stack 101 x8, '' pid 50 stack 103 x16; so over
[H-10, H+7220) (whole hours H and H+1 from the rollup, the edges from the windows) A 6, B 12, C 24, D 48, '' 96.
GPU kernels: the same offsets and identities, kernel gemm, stack 104, ns = the CPU count x 1000.

NVML over [N, N+1 h), readings every 10 s:
  n1 GPU 0 GPU-a 75 % for 1 h, held by A (device identity), A's pid 10 listed;
  n1 GPU 1 GPU-b 25 % for 1 h, no holder, C's pid 30 listed for the first 30 min, nobody after;
  n2 GPU 0 GPU-c 50 % for 30 min, no holder, B's pid 20 and D's pid 40 listed (the time splits in halves);
  n2 GPU 1 GPU-d 40 % for 1 h, no holder, pid 50 listed without identity.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

A, B, C, D = "a000000000000001", "b000000000000002", "c000000000000003", "d000000000000004"
IDENTITY_COLUMNS = ["identity", "node", "updated", "kind", "container_runtime", "container_id", "container_name",
                    "pod_name", "namespace", "pod_uid", "labels", "slurm_job_id", "slurm_step", "slurm_user",
                    "slurm_array_job_id", "slurm_array_task_id", "slurm_account", "systemd_unit", "team", "simulated"]
CPU_COLUMNS = ["ts", "node", "pid", "comm", "container_id", "stack_id", "count", "identity"]
GPU_COLUMNS = ["ts", "node", "pid", "comm", "container_id", "device", "stream", "stack_id", "kernel_name",
               "duration_ns", "launches", "identity"]
DEVICE_COLUMNS = ["ts", "node", "gpu_index", "uuid", "name", "parent_uuid", "gpu_util_pct", "xid_errors", "simulated",
                  "identity"]
PROCESS_COLUMNS = ["ts", "node", "gpu_index", "pid", "comm", "container_id", "sm_util_pct", "simulated", "identity"]
OFFSETS = [-10, 0, 1800, 3590, 3600, 7210]
# identity -> (pid, comm, stack, count per row)
CPU_ROWS = {A: (10, "train", 101, 1), B: (20, "serve", 102, 2), C: (30, "sim", 103, 4), D: (40, "train", 101, 8),
            "": (50, "old", 103, 16)}


def identities(when: datetime) -> list[list]:
    def row(identity, node, kind, runtime="", cid="", cname="", pod="", ns="", labels=None, job="", user="",
            array_job="", task="", account="", team=""):
        return [identity, node, when, kind, runtime, cid, cname, pod, ns, f"uid-{identity[:4]}" if pod else "",
                labels or {}, job, "0" if job else "", user, array_job, task, account, "", team, False]
    return [
        row(A, "n1", "pod", "containerd", "c0ffee0001aaaa", "trainer", "train-0", "ml",
            {"job-name": "train", "team": "vision"}, team="vision"),
        row(B, "n2", "pod", "containerd", "beef000002bbbb", "server", "serve-0", "ml", {"team": "search"},
            team="search"),
        row(C, "n1", "slurm", job="4242", user="alice", array_job="4240", task="2", account="physics", team="physics"),
        row(D, "n2", "pod", "cri-o", "dead000004dddd", "trainer", "train-0", "infra",
            {"batch.kubernetes.io/job-name": "nightly"}),
    ]


def first_hour() -> datetime:
    return datetime.now(tz=UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=6)


def put_definitions(store, when: datetime) -> None:
    functions = {1: "main", 2: "run", 3: "compute", 4: "io", 5: "idle", 6: "launch", 7: "gemm"}
    store.insert("frames", [[f, name, "app" if f != 7 else "[gpu]", "GPU_KERNEL" if f == 7 else "NATIVE", when]
                            for f, name in functions.items()], ["frame_id", "function", "binary", "kind", "last_seen"])
    stacks = {101: [1, 2, 3], 102: [1, 2, 4], 103: [1, 5], 104: [1, 6, 7]}
    store.insert("stacks", [[s, frames, when] for s, frames in stacks.items()], ["stack_id", "frame_ids", "last_seen"])


def workload_rows(store) -> SimpleNamespace:
    """Insert everything above; returns .store, .since / .until (the CPU and GPU range) and .nvml_since /
    .nvml_until."""
    h = first_hour()
    put_definitions(store, h)
    store.insert("workload_identities", identities(h), IDENTITY_COLUMNS)
    cpu, gpu = [], []
    for offset in OFFSETS:
        ts = h + timedelta(seconds=offset)
        for identity, (pid, comm, stack, count) in CPU_ROWS.items():
            node = "n1" if pid in (10, 30, 50) else "n2"
            cpu.append([ts, node, pid, comm, "", stack, count, identity])
            gpu.append([ts, node, pid, "", "", 0, 7, 104, "gemm", count * 1000, 1, identity])
    store.insert("cpu_samples", cpu, CPU_COLUMNS)
    store.insert("gpu_kernel_samples", gpu, GPU_COLUMNS)
    n = h - timedelta(hours=2)
    at = lambda s: n + timedelta(seconds=s)  # noqa: E731
    devices = [[at(10 * i), "n1", 0, "GPU-a", "H100", "", 75, [], False, A] for i in range(360)]
    devices += [[at(10 * i), "n1", 1, "GPU-b", "H100", "", 25, [], False, ""] for i in range(360)]
    devices += [[at(10 * i), "n2", 0, "GPU-c", "A100", "", 50, [], False, ""] for i in range(180)]
    devices += [[at(10 * i), "n2", 1, "GPU-d", "A100", "", 40, [], False, ""] for i in range(360)]
    store.insert("gpu_device_metrics", devices, DEVICE_COLUMNS)
    processes = [[at(10 * i), "n1", 0, 10, "train", "", 60, False, A] for i in range(360)]
    processes += [[at(10 * i), "n1", 1, 30, "sim", "", 20, False, C] for i in range(180)]
    processes += [[at(10 * i), "n2", 0, pid, comm, "", 25, False, ident] for i in range(180)
                  for pid, comm, ident in ((20, "serve", B), (40, "train", D))]
    processes += [[at(10 * i), "n2", 1, 50, "old", "", 40, False, ""] for i in range(360)]
    store.insert("gpu_process_metrics", processes, PROCESS_COLUMNS)
    return SimpleNamespace(store=store, since=h - timedelta(seconds=10), until=h + timedelta(seconds=7220),
                           nvml_since=n, nvml_until=at(3600))
