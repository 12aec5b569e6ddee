"""Workload identity as a user gets it: processes in real cgroups shaped like a containerd pod's container, a Slurm
job step's and a Docker container's, a kubelet double at its HTTPS /pods (CA, bearer token) and a pod-resources double
naming the GPU the pod holds, the simulated libnvidia-ml.so.1 → the real `fleetprof agent` (BPF) → Kafka →
symbolizer and sink → chDB → `query top --pod/--job/--namespace/--container` and `report cost --by pod|job|team`.
Exact: every sample of a process carries its own identity, each filter keeps exactly its processes' samples, and the
GPU's hours go to the pod that holds it (needs root, bcc and cgroup v2: a failure on CI without them)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from click.testing import CliRunner

from simulate.nvml import Segment, SimDevice, SimProcess, sim_env, write_scenario
from tests.cgroup_helpers import cgroup_tree
from tests.kubelet_double import KubeletDouble, PodResourcesDouble, make_tls, pod, pod_list
from tests.pipeline_helpers import agent_started, sink, symbolizer, wait_for

SPIN = ("import sys\ndef {name}():\n    x = 0\n    while True:\n        x += 1\nprint('ready', flush=True)\n"
        "{name}()\n")
BUSY = {"gpu_util": 90, "mem_util": 40, "mem_used": 10 * 1024**3, "sm_clock": 1755, "mem_clock": 2619,
        "power": 400_000, "temp": 60, "pcie_tx": 1000, "pcie_rx": 1000, "clock_events": 0}


def _cli(store, *args: str) -> str:
    from fleetprof.cli import cli
    from fleetprof.commands import COMMANDS
    from tests.test_cost_report import silent_address

    for command in COMMANDS:
        cli.add_command(command)
    base = ["--data-dir", os.path.dirname(store.location), "--database", store.database]
    result = CliRunner().invoke(cli, [*base, *args], env={"FLEETPROF_API": silent_address(),
                                                          "FLEETPROF_CLICKHOUSE": ""})
    assert result.exit_code == 0, result.output
    return result.stdout


def test_processes_in_pod_slurm_and_docker_cgroups_are_profiled_as_their_workloads(
        bpf_ok, kafka_bootstrap, store, tmp_path: Path) -> None:
    run = uuid.uuid4().hex[:8]
    node, root = f"ident-{run}", f"fleetprof-test-{run}"
    pod_uid = str(uuid.uuid4())
    pod_cid, docker_cid = uuid.uuid4().hex * 2, uuid.uuid4().hex * 2
    job = str(40000 + int(run[:4], 16))
    gpu_pod, gpu_job = f"GPU-{uuid.uuid4()}", f"GPU-{uuid.uuid4()}"
    pod_cgroup = (f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{pod_uid.replace('-', '_')}.slice/"
                  f"cri-containerd-{pod_cid}.scope")
    slurm_cgroup = f"system.slice/slurmstepd.scope/job_{job}/step_0/user/task_0"
    docker_cgroup = f"system.slice/docker-{docker_cid}.scope"

    tls = make_tls(tmp_path)
    token = tmp_path / "token"
    token.write_text(f"token-{run}\n")
    kubelet = KubeletDouble(pod_list([pod("trainer-0", "ml-train", pod_uid,
                                          {"team": "vision", "job-name": "train-llm", "tier": "not-kept"},
                                          [("trainer", f"containerd://{pod_cid}")])]),
                            token=f"token-{run}", tls=tls).start()
    socket = tmp_path / "pod-resources.sock"
    holders = PodResourcesDouble(socket, [("ml-train", "trainer-0", [("trainer", [("nvidia.com/gpu", [gpu_pod])])])])
    holders.start()
    with cgroup_tree(root) as tree:
        try:
            slurm_env = dict(os.environ, SLURM_JOB_ID=job, SLURM_STEP_ID="0", SLURM_JOB_ACCOUNT="physics",
                             SLURM_JOB_USER="root")
            procs = {"pod_spin": tree.run(pod_cgroup, [sys.executable, "-c", SPIN.format(name="pod_spin")]),
                     "slurm_spin": tree.run(slurm_cgroup, [sys.executable, "-c", SPIN.format(name="slurm_spin")],
                                            env=slurm_env),
                     "docker_spin": tree.run(docker_cgroup, [sys.executable, "-c", SPIN.format(name="docker_spin")])}
            for proc in procs.values():
                assert proc.stdout.readline().strip() == "ready"
            pids = {name: proc.pid for name, proc in procs.items()}
            scenario = write_scenario(tmp_path / "nvml.txt", [SimDevice("g0", gpu_pod), SimDevice("g1", gpu_job)], [
                Segment(0.0, "g0", BUSY, processes=[]),
                Segment(0.0, "g1", {**BUSY, "gpu_util": 30}, processes=[SimProcess(pids["slurm_spin"], 30, 10,
                                                                                  1 << 30)])])
            agent = subprocess.Popen(
                [sys.executable, "-m", "fleetprof", "agent", "--once", "--format", "json", "--window", "8s",
                 "--node", node, "--cgroup", f"/{root}", "--frequency", "49", "--no-python-frames",
                 "--kubelet-url", kubelet.url, "--kubelet-ca-file", str(tls.ca_file), "--kubelet-token-file",
                 str(token), "--pod-labels", "team,job-name", "--pod-resources-socket", str(socket)],
                env=sim_env(scenario, dict(os.environ, FLEETPROF_KAFKA=kafka_bootstrap)), stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True)
            agent_started(agent)
            out, err = agent.communicate(timeout=120)
            assert agent.returncode == 0, err
        finally:
            kubelet.stop()
            holders.stop()
    assert f"token-{run}" not in out + err  # never logged
    assert kubelet.requests and set(kubelet.requests) == {f"Bearer token-{run}"}

    with symbolizer(kafka_bootstrap, f"sym-{run}") as sym, sink(store, kafka_bootstrap, f"sink-{run}") as snk:
        def identities_of(pid: int) -> set[str]:
            _, rows = store.query_sql("SELECT DISTINCT identity FROM cpu_samples WHERE node = {n:String} AND "
                                      "pid = {p:UInt32}", {"n": node, "p": pid})
            return {r[0] for r in rows}

        def stored() -> bool:
            _, rows = store.query_sql("SELECT count() FROM workload_identities WHERE node = {n:String}", {"n": node})
            _, gpus = store.query_sql("SELECT uniqExact(uuid) FROM gpu_device_metrics WHERE node = {n:String}",
                                      {"n": node})  # NVML polls go out after the samples (StoreRunner.max_delay)
            return all(identities_of(p) for p in pids.values()) and rows[0][0] >= 3 and gpus[0][0] == 2
        wait_for(stored, timeout=90, what="the three workloads' samples, identities and GPU readings",
                 running=[sym, snk])

        # one identity per process, each defined in the dimension table exactly as the cgroup and kubelet say
        ids = {}
        for name, pid in pids.items():
            found = identities_of(pid)
            assert len(found) == 1 and "" not in found, (name, found)
            ids[name] = found.pop()
        cols, rows = store.query_sql(
            "SELECT identity, kind, container_runtime, container_id, container_name, pod_name, namespace, pod_uid, "
            "labels, slurm_job_id, slurm_step, slurm_user, slurm_account, systemd_unit, team "
            "FROM workload_identities FINAL WHERE identity IN {ids:Array(String)}", {"ids": list(ids.values())})
        defined = {r[0]: dict(zip(cols[1:], r[1:], strict=True)) for r in rows}
        blank = dict.fromkeys(cols[1:], "")
        blank["labels"] = {}
        assert defined[ids["pod_spin"]] == {**blank, "kind": "pod", "container_runtime": "containerd",
                                            "container_id": pod_cid, "container_name": "trainer",
                                            "pod_name": "trainer-0", "namespace": "ml-train", "pod_uid": pod_uid,
                                            "labels": {"team": "vision", "job-name": "train-llm"}, "team": "vision"}
        assert defined[ids["slurm_spin"]] == {**blank, "kind": "slurm", "slurm_job_id": job, "slurm_step": "0",
                                              "slurm_user": "root", "slurm_account": "physics",
                                              "team": "physics"}
        assert defined[ids["docker_spin"]] == {**blank, "kind": "container", "container_runtime": "docker",
                                               "container_id": docker_cid}

        # the GPU the pod holds is the pod's, though none of its processes runs there; the other, its process's
        _, rows = store.query_sql("SELECT uuid, groupUniqArray(identity) FROM gpu_device_metrics WHERE node = "
                                  "{n:String} GROUP BY uuid", {"n": node})
        assert dict(rows) == {gpu_pod: [ids["pod_spin"]], gpu_job: [""]}
        _, rows = store.query_sql("SELECT DISTINCT pid, identity FROM gpu_process_metrics WHERE node = {n:String}",
                                  {"n": node})
        assert rows == [(pids["slurm_spin"], ids["slurm_spin"])]

    # every filter keeps exactly its workload's samples
    since = (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%d %H:%M:%S")
    until = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%d %H:%M:%S")
    _, rows = store.query_sql("SELECT identity, sum(count) FROM cpu_samples WHERE node = {n:String} GROUP BY identity",
                              {"n": node})
    samples = dict(rows)
    by_name = {name: samples[key] for name, key in ids.items()}
    window = ["--since", since.replace(" ", "T"), "--until", until.replace(" ", "T"), "--node", node]
    for flag, value, name in (("pod", "trainer-0", "pod_spin"), ("pod", "ml-train/trainer-0", "pod_spin"),
                              ("namespace", "ml-train", "pod_spin"), ("container", "trainer", "pod_spin"),
                              ("container", docker_cid[:12], "docker_spin"), ("job", job, "slurm_spin"),
                              ("job", "train-llm", "pod_spin")):
        folded = _cli(store, "query", "flamegraph", *window, f"--{flag}", value, "--merge-processes")
        assert sum(int(line.rsplit(" ", 1)[1]) for line in folded.splitlines()) == by_name[name], (flag, value)
        top = _cli(store, "query", "top", *window, f"--{flag}", value, "--format", "csv", "--limit", "1000")
        assert top.splitlines()[0].startswith("function,") and len(top.splitlines()) > 1, top

    # the cost report: the pod's GPU to the pod, the job's to its Slurm job, teams from the label and the account
    window = ["--since", since.replace(" ", "T"), "--until", until.replace(" ", "T"), "--price-per-gpu-hour", "2"]
    by_pod = _cli(store, "report", "cost", *window, "--node", node, "--by", "pod", "--format", "csv").splitlines()
    by_job = _cli(store, "report", "cost", *window, "--node", node, "--by", "job", "--format", "csv").splitlines()
    by_team = _cli(store, "report", "cost", *window, "--node", node, "--by", "team", "--format", "csv").splitlines()
    def groups(lines: list[str]) -> dict[str, str]:  # group -> gpu_hours; both GPUs were polled together
        return {line.split(",")[0]: line.split(",")[1] for line in lines[1:]}
    pods, jobs, teams = groups(by_pod), groups(by_job), groups(by_team)
    assert list(pods) == ["ml-train/trainer-0", "unattributed", "total"], by_pod
    assert pods["ml-train/trainer-0"] == pods["unattributed"] == jobs[job] == teams["vision"] == teams["physics"]
    assert set(jobs) == {job, "ml-train/train-llm", "total"}, by_job  # a Kubernetes Job is a job too
    assert set(teams) == {"vision", "physics", "total"}, by_team
