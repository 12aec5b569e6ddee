"""producers/identity_resolver with the kubelet doubles (a real HTTP server, a real gRPC server): exact identities,
the refresh policy, counters, one log line per change of the kubelet's state, and identify() never waiting."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from producers.identity_metrics import IdentityMetrics
from producers.identity_resolver import UNKNOWN_TRIES, IdentityResolver
from producers.kubelet_pods import KubeletClient
from producers.pod_resources import PodResourcesClient
from producers.process_info import ProcessInfo
from producers.slurm_env import SlurmEnv
from producers.workload_identity import NO_IDENTITY, Identity
from tests.kubelet_double import KubeletDouble, PodResourcesDouble, container_id, pod, pod_list, pod_uid

MAIN, SIDE, NEW, PAUSE = (container_id(s) for s in ("main", "side", "new", "pause"))
UID1 = pod_uid(1)
GPU0, MIG = "GPU-6f2d1c0e-8a4b-4c7e-9f1a-2b3c4d5e6f70", "MIG-9b8a7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"
TRAINER = pod("trainer-0", "ml", UID1, {"app.kubernetes.io/name": "trainer", "team": "vision", "other": "x"},
              [("main", f"containerd://{MAIN}"), ("side", f"containerd://{SIDE}")])
NEW_POD = pod("fresh", "ml", pod_uid(2), {"team": "nlp"}, [("app", f"cri-o://{NEW}")])


def kube_path(uid: str, cid: str, prefix: str = "cri-containerd") -> str:
    return (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid.replace('-', '_')}.slice/"
            f"{prefix}-{cid}.scope")


def proc(cgroup: str, pid: int = 100) -> ProcessInfo:
    return ProcessInfo(pid, "python3", "/usr/bin/python3", cgroup, "")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def kubelet():
    double = KubeletDouble(body=pod_list([TRAINER])).start()
    yield double
    double.stop()


def resolver_for(double: KubeletDouble, clock: Clock | None = None, **kwargs) -> IdentityResolver:
    return IdentityResolver("node-1", KubeletClient(double.url, timeout_s=kwargs.pop("timeout_s", 2)),
                            pod_labels=("app.kubernetes.io/name", "team"), clock=clock or Clock(), **kwargs)


TRAINER_MAIN = Identity("pod", container_runtime="containerd", container_id=MAIN, container_name="main",
                        pod_name="trainer-0", namespace="ml", pod_uid=UID1,
                        labels=(("app.kubernetes.io/name", "trainer"), ("team", "vision")), team="vision")


def test_identities_of_each_kind(kubelet) -> None:
    r = resolver_for(kubelet, slurm_env=lambda pid: SlurmEnv(), uid_of=lambda pid: None)
    r.step()
    main = r.identify(proc(kube_path(UID1, MAIN)))
    assert main == TRAINER_MAIN.identity_id
    rec = r.record(main)
    assert {k: rec[k] for k in ("kind", "container_name", "pod_name", "namespace", "pod_uid", "labels", "team",
                                "node", "simulated")} == {
        "kind": "pod", "container_name": "main", "pod_name": "trainer-0", "namespace": "ml", "pod_uid": UID1,
        "labels": {"app.kubernetes.io/name": "trainer", "team": "vision"}, "team": "vision", "node": "node-1",
        "simulated": False}
    # a container of the pod the kubelet has not listed yet (its pause container): the pod uid names the pod
    assert r.identify(proc(kube_path(UID1, PAUSE))) == Identity(
        "pod", container_runtime="containerd", container_id=PAUSE, pod_name="trainer-0", namespace="ml",
        pod_uid=UID1, labels=TRAINER_MAIN.labels, team="vision").identity_id
    # a plain Docker container, a systemd service, the host
    assert r.identify(proc(f"/system.slice/docker-{NEW}.scope")) == Identity(
        "container", container_runtime="docker", container_id=NEW).identity_id
    assert r.identify(proc("/system.slice/nginx.service")) == Identity("systemd", systemd_unit="nginx.service"
                                                                       ).identity_id
    assert r.identify(proc("/")) == Identity("host").identity_id
    assert r.record(12345) is None


def test_unknown_container_triggers_a_coalesced_refresh_and_otherwise_the_period(kubelet) -> None:
    clock = Clock()
    r = resolver_for(kubelet, clock, refresh_s=60, min_refresh_s=5)
    r.step()
    assert r.refresh_attempts == 1
    clock.now += 1
    r.step()  # nothing due
    assert r.identify(proc(kube_path(UID1, MAIN))) == TRAINER_MAIN.identity_id
    clock.now += 1
    r.step()  # a known container asks for nothing
    assert r.refresh_attempts == 1
    kubelet.body = pod_list([TRAINER, NEW_POD])
    first = r.identify(proc(kube_path(pod_uid(2), NEW, "crio"), pid=200))
    assert r.record(first)["kind"] == "container"
    r.step()  # asked for, but within min_refresh_s of the last one
    assert r.refresh_attempts == 1
    clock.now = 1005
    r.step()
    assert r.refresh_attempts == 2
    assert r.identify(proc(kube_path(pod_uid(2), NEW, "crio"), pid=200)) == Identity(
        "pod", container_runtime="cri-o", container_id=NEW, container_name="app", pod_name="fresh", namespace="ml",
        pod_uid=pod_uid(2), labels=(("team", "nlp"),), team="nlp").identity_id
    # several unknown ids at once: one refresh
    for i in range(5):
        r.identify(proc(f"/system.slice/docker-{container_id(f'x{i}')}.scope", pid=300 + i))
    clock.now = 1010
    r.step()
    r.step()
    assert r.refresh_attempts == 3
    # an id the kubelet never lists asks UNKNOWN_TRIES times in all, then waits for the period
    for _ in range(6):
        r.identify(proc(f"/system.slice/docker-{container_id('x0')}.scope", pid=300))
        clock.now += 5
        r.step()
    assert r.refresh_attempts == 3 + UNKNOWN_TRIES - 1
    asked = r.refresh_attempts
    clock.now = r._last_attempt + 59
    r.step()
    assert r.refresh_attempts == asked
    clock.now += 1
    r.step()
    assert r.refresh_attempts == asked + 1
    assert r.counters()["unknown_containers"] == 6  # NEW and x0..x4, each counted once
    assert r.counters()["kubelet_refreshes_ok"] == asked + 1


def test_kubelet_failures_one_line_per_change_of_state(kubelet, caplog) -> None:
    caplog.set_level(logging.INFO, logger="fleetprof.agent")
    clock = Clock()
    r = resolver_for(kubelet, clock, refresh_s=10, max_label_len=4)
    r.step()
    kubelet.mode = "unauthorized"
    for _ in range(3):
        clock.now += 10
        r.step()
    kubelet.mode = "malformed"
    for _ in range(2):
        clock.now += 10
        r.step()
    kubelet.mode = "ok"
    clock.now += 10
    r.step()
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "fleetprof.agent"]
    assert lines == [
        f"kubelet at {kubelet.url}: 1 pods",
        f"kubelet at {kubelet.url}: unauthorized (HTTP 401); identities carry container ids only until it "
        "answers, retrying every 10 s",
        f"kubelet at {kubelet.url}: malformed (39 bytes that are not JSON); "
        "identities carry container ids only until it answers, retrying every 10 s",
        f"kubelet at {kubelet.url} answers again: 1 pods"]
    c = r.counters()
    assert (c["kubelet_refreshes_ok"], c["kubelet_refreshes_failed"], c["kubelet_refreshes_failed_unauthorized"],
            c["kubelet_refreshes_failed_malformed"]) == (2, 5, 3, 2)
    assert c["label_values_cut"] == 4  # "trainer" and "vision" cut to 4 characters, in each of the 2 answers
    metrics = {s.name: s.value for m in IdentityMetrics(r).collect() for s in m.samples if not s.labels}
    assert metrics["fleetprof_agent_identity_label_values_cut_total"] == 4
    by_result = {s.labels["result"]: s.value for m in IdentityMetrics(r).collect() for s in m.samples
                 if m.name == "fleetprof_agent_identity_kubelet_refreshes"}
    assert by_result == {"ok": 2, "unauthorized": 3, "malformed": 2}


def test_kubelet_down_gives_container_ids(caplog) -> None:
    caplog.set_level(logging.INFO, logger="fleetprof.agent")
    clock = Clock()
    r = IdentityResolver("node-1", KubeletClient("http://127.0.0.1:1", timeout_s=1), clock=clock, refresh_s=10)
    for _ in range(3):
        r.step()
        clock.now += 10
    assert r.identify(proc(kube_path(UID1, MAIN))) == Identity(
        "container", container_runtime="containerd", container_id=MAIN, pod_uid=UID1).identity_id
    assert r.counters()["kubelet_refreshes_failed_unreachable"] == 3
    assert len([rec for rec in caplog.records if "unreachable" in rec.getMessage()]) == 1


def test_identify_does_not_wait_for_a_slow_kubelet(kubelet) -> None:
    kubelet.mode = "slow"
    r = IdentityResolver("node-1", KubeletClient(kubelet.url, timeout_s=20), min_refresh_s=0.0)
    r.start()
    try:
        deadline = time.monotonic() + 10
        while not kubelet.requests and time.monotonic() < deadline:  # the thread's first fetch is in the server
            time.sleep(0.01)
        assert kubelet.requests and not kubelet.release.is_set()
        started = time.monotonic()
        ids = [r.identify(proc(kube_path(UID1, container_id(f"n{i}")), pid=i)) for i in range(1000)]
        took = time.monotonic() - started
        assert not kubelet.release.is_set()  # the server is still holding its answer
        assert took < 0.5, took
        assert r.record(ids[0])["kind"] == "container"
        kubelet.release.set()
        deadline = time.monotonic() + 10
        while r.counters()["kubelet_refreshes_ok"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert r.identify(proc(kube_path(UID1, MAIN))) == TRAINER_MAIN.identity_id
    finally:
        r.close()


def test_five_thousand_pods_and_gpu_owners(kubelet, tmp_path: Path) -> None:
    pods = [pod(f"job-{i}", "batch", pod_uid(i), {"team": f"t{i % 3}"}, [("main", f"containerd://"
                                                                                 f"{container_id(f'm{i}')}")])
            for i in range(5000)]
    kubelet.body = pod_list(pods)
    sock = tmp_path / "kubelet.sock"
    grpc_double = PodResourcesDouble(sock, [("batch", "job-17", [("main", [("nvidia.com/gpu", [GPU0])])]),
                                            ("batch", "job-99", [("main", [("nvidia.com/mig-3g.40gb", [MIG])])]),
                                            ("other", "gone", [("c", [("nvidia.com/gpu", ["GPU-x"])])])]).start()
    try:
        r = resolver_for(kubelet, pod_resources=PodResourcesClient(str(sock), timeout_s=5), timeout_s=10)
        r.step()
        process = r.identify(proc(kube_path(pod_uid(17), container_id("m17"))))
        assert r.gpu_owner(GPU0) == process  # the GPU's readings and the process's samples name one workload
        assert r.record(r.gpu_owner(MIG))["pod_name"] == "job-99"
        assert r.gpu_owner("GPU-x") == Identity("pod", container_name="c", pod_name="gone", namespace="other"
                                                ).identity_id  # pod-resources knows it, the pod list not
        assert r.gpu_owner("GPU-unknown") == NO_IDENTITY
        started = time.monotonic()
        for i in range(5000):
            r.identify(proc(kube_path(pod_uid(i), container_id(f"m{i}")), pid=i))
        # the 5,000 lookups come from the pod list held in memory (its 5,000 pods counted below), not a kubelet
        # round trip each; how fast is bench/identity_cost.py's. A bound, not a goal: 2 s failed at 2.3 s in a
        # local CI run on the 2-core VM under load.
        assert time.monotonic() - started < 10
        c = r.counters()
        assert (c["kubelet_pods"], c["gpus_held"], c["pod_resources_polls_ok"], c["unknown_containers"]) == (
            5000, 3, 1, 0)
        r.close()
    finally:
        grpc_double.stop()


def test_slurm_identity_from_path_then_environment() -> None:
    envs = {500: SlurmEnv(job_id="4242", array_job_id="4240", array_task_id="2", account="physics", user="ana"),
            600: SlurmEnv(job_id="77", account="chem"), 700: SlurmEnv(job_id="88", step="0", uid="3001")}
    r = IdentityResolver("node-1", slurm_env=lambda pid: envs.get(pid, SlurmEnv()), uid_of=lambda pid: None,
                         name_of_uid={1000: "bob", 3001: "cy"}.get)
    v2 = proc("/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0", pid=500)
    before = r.identify(v2)  # the environment is read on the thread: what the path says, for now
    assert before == Identity("slurm", slurm_job_id="4242", slurm_step="0").identity_id
    r.step()
    assert r.identify(v2) == Identity("slurm", slurm_job_id="4242", slurm_step="0", slurm_user="ana",
                                      slurm_array_job_id="4240", slurm_array_task_id="2", slurm_account="physics",
                                      team="physics").identity_id
    v1 = proc("/slurm/uid_1000/job_77/step_batch/task_0", pid=600)
    r.identify(v1)
    r.step()
    assert r.identify(v1) == Identity("slurm", slurm_job_id="77", slurm_step="batch", slurm_user="bob",
                                      slurm_account="chem", team="chem").identity_id
    # no cgroup plugin: the task sits in slurmd's unit, and only its environment names the job
    plain = proc("/system.slice/slurmd.service", pid=700)
    r.identify(plain)
    r.step()
    assert r.identify(plain) == Identity("slurm", slurm_job_id="88", slurm_step="0", slurm_user="cy").identity_id
    r.identify(proc("/system.slice/slurmd.service", pid=701))  # slurmd itself
    r.step()
    assert r.identify(proc("/system.slice/slurmd.service", pid=701)) == Identity(
        "systemd", systemd_unit="slurmd.service").identity_id
    assert r.counters()["slurm_env_reads"] == 4
