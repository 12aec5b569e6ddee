"""The README's main job as a user runs it: `fleetprof up` (its agent profiling this machine), then `fleetprof
loadgen` next to it and `fleetprof query top`; and `fleetprof up --simulate-gpu`."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

from processors.demangle import demangle
from tests.conftest import consecutive_free_port, free_ports
from tests.test_cpu_sampler import workload_binary  # noqa: F401 - a fixture


def _fleetprof(env: dict, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fleetprof", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def _start_up(env: dict, *args: str, command: tuple[str, ...] = (sys.executable, "-m", "fleetprof")
              ) -> tuple[subprocess.Popen, str]:
    """`fleetprof up ARGS` started, once it says it is ready; with what it printed so far."""
    up = subprocess.Popen([*command, "up", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    lines: list[str] = []
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not any(line.startswith("ready") for line in lines):
        line = up.stdout.readline()
        if not line and up.poll() is not None:
            break
        lines.append(line)
    text = "".join(lines)
    if not any(line.startswith("ready") for line in lines):
        up.kill()
        up.wait()
        raise AssertionError(f"fleetprof up did not come up:\n{text}")
    return up, text


def _stop_up(up: subprocess.Popen) -> str:
    up.send_signal(signal.SIGTERM)
    try:
        out, _ = up.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        up.kill()
        raise
    assert up.returncode == 0, out
    return out


def test_up_simulate_gpu_shows_simulated_gpu_time_and_metrics(tmp_path):
    """`fleetprof up --simulate-gpu`: the simulated workload and the real agent with the simulated NVML library;
    GPU time by kernel (with BPF) and the NVML metrics become queryable, all labelled simulated."""
    from producers.cpu_sampler import BpfUnavailable, check_bpf
    from tests.elf_helpers import unavailable

    try:
        check_bpf()
        bpf = True
    except BpfUnavailable as exc:
        bpf = False
        if os.environ.get("CI"):
            unavailable(f"BPF unavailable: {exc}")
    kafka_port = consecutive_free_port()
    api_port = next(p for p in free_ports(3) if p not in (kafka_port, kafka_port + 1))
    # a simulator build of this test's own: the agent attaches to it by path, and to no other test's copy
    env = dict(os.environ, FLEETPROF_DATA_DIR=str(tmp_path / "data"), FLEETPROF_KAFKA=f"127.0.0.1:{kafka_port}",
               FLEETPROF_API=f"127.0.0.1:{api_port}", FLEETPROF_NATIVE_BUILD=str(tmp_path / "native"))
    up, text = _start_up(env, "--simulate-gpu")
    try:
        assert "SIMULATED GPU" in text, text

        kernels: set[str] = set()
        metrics: list[dict] = []
        want = {"ampere_sgemm_128x64_nn", "void flash_attn_fwd<128>(float const*, float const*, float*)",
                "resize_image(unsigned char const*, unsigned char*, int, int)"}
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and not (metrics and (not bpf or want <= kernels)):
            time.sleep(2)
            got = _fleetprof(env, "query", "metrics", "--since", "5m", "--format", "json")
            assert got.returncode == 0, got.stderr
            metrics = json.loads(got.stdout)
            if bpf:
                top = _fleetprof(env, "query", "top", "--kind", "gpu", "--since", "5m", "--format", "json")
                assert top.returncode == 0, top.stderr
                kernels = {r["function"] for r in json.loads(top.stdout) if r["self"]}
        assert metrics and {m["name"] for m in metrics} == {"fleetprof simulated H100"}
        assert all(m["simulated"] for m in metrics) and {m["gpu_index"] for m in metrics} == {0, 1}
        if bpf:
            assert want <= kernels, kernels
    finally:
        _stop_up(up)


def test_up_as_the_readme_says_profiles_this_machine(tmp_path, workload_binary):  # noqa: F811
    """`.venv/bin/fleetprof up` and nothing else: this machine's own CPU stacks (here a busy C workload's
    main → outer → leaf) through `query top` and the web UI's API, within a few of the agent's 10 s windows of
    "ready"; `fleetprof kafka status` sees up's broker; a second agent on the node refuses, naming up's."""
    from producers.cpu_sampler import BpfUnavailable, check_bpf
    from tests.elf_helpers import unavailable

    try:
        check_bpf()
    except BpfUnavailable as exc:
        unavailable(f"BPF unavailable: {exc}")
    kafka_port = consecutive_free_port()
    api_port = next(p for p in free_ports(3) if p not in (kafka_port, kafka_port + 1))
    env = dict(os.environ, FLEETPROF_DATA_DIR=str(tmp_path / "data"), FLEETPROF_KAFKA=f"127.0.0.1:{kafka_port}",
               FLEETPROF_API=f"127.0.0.1:{api_port}")
    fleetprof = str(Path(sys.executable).with_name("fleetprof"))  # the README's .venv/bin/fleetprof
    up, text = _start_up(env, command=(fleetprof,))
    ready_at = time.monotonic()
    node = socket.gethostname()
    workloads = [subprocess.Popen([str(workload_binary)])]  # each lives 120 s
    try:
        assert "node agent: collecting CPU at 19 Hz" in text, text
        status = _fleetprof(env, "kafka", "status", "--format", "json")
        assert status.returncode == 0 and json.loads(status.stdout)["running"], status.stdout
        second = _fleetprof(env, "agent", "--once")
        assert second.returncode == 1 and "already runs for node" in second.stderr, second.stderr

        first_s = None  # this node's first samples in the store, seconds after "ready"
        while first_s is None and time.monotonic() - ready_at < 60:
            with urllib.request.urlopen(f"http://127.0.0.1:{api_port}/api/query/totals_cpu?since=10m&node={node}",
                                        timeout=30) as answer:
                if json.loads(answer.read())["rows"]:
                    first_s = time.monotonic() - ready_at
            time.sleep(0.5)
        assert first_s is not None, "no samples of this machine within 60 s of ready"
        top: list[dict] = []
        while time.monotonic() - ready_at < 60 and not any(r["function"] == "leaf" for r in top):
            time.sleep(2)
            if workloads[-1].poll() is not None:
                workloads.append(subprocess.Popen([str(workload_binary)]))
            got = _fleetprof(env, "query", "top", "--kind", "cpu", "--since", "5m", "--node", node, "--comm",
                             workload_binary.name, "--format", "json")
            assert got.returncode == 0, got.stderr
            top = json.loads(got.stdout)
        found_s = time.monotonic() - ready_at
        leaf = next((r for r in top if r["function"] == "leaf"), None)
        assert leaf is not None and leaf["binary"] == workload_binary.name, top
        assert leaf["self"] >= 0.5 * sum(r["self"] for r in top), top  # the busy loop is where the workload spends

        since = int(time.time() - 300)
        with urllib.request.urlopen(f"http://127.0.0.1:{api_port}/api/export?kind=cpu&format=folded&since={since}"
                                    f"&node={node}", timeout=30) as answer:
            folded = answer.read().decode()
        assert any(line.rsplit(" ", 1)[0].endswith("main;outer;leaf") for line in folded.splitlines()), folded[:2000]

        # "Using it": loadgen next to up (and its agent); the simulated nodes' totals come back exactly
        sent = _fleetprof(env, "loadgen", "--nodes", "3", "--duration", "6s", "--window", "2s", "--no-pace",
                          "--format", "json")
        assert sent.returncode == 0, sent.stderr
        report = json.loads(sent.stdout)
        want: Counter[str] = Counter()
        for b, f, n in report["samples_by_leaf"]:  # loadgen reports the symbol table's (mangled) names
            want[f"{demangle(f)} ({b})"] += n
        got: Counter[str] = Counter()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and got != want:
            got = Counter()
            for sim_node in report["nodes"]:
                top = _fleetprof(env, "query", "top", "--kind", "cpu", "--since", "5m", "--node", sim_node,
                                 "--limit", "100000", "--format", "json")
                assert top.returncode == 0, top.stderr
                got.update({f"{r['function']} ({r['binary']})": r["self"] for r in json.loads(top.stdout)
                            if r["self"]})
            time.sleep(1)
        assert got == want and sum(got.values()) == report["total_samples"]
        assert "SIMULATED: CPU samples from node" in top.stderr  # loadgen's nodes are labelled, and only they
        mine = _fleetprof(env, "query", "top", "--kind", "cpu", "--since", "5m", "--node", node)
        assert mine.returncode == 0 and "SIMULATED" not in mine.stderr, mine.stderr
        print(f"\nthis machine's first samples stored {first_s:.1f} s after ready; the workload started at ready in "
              f"query top after {found_s:.1f} s")
    finally:
        for w in workloads:
            w.kill()
            w.wait()
        out = _stop_up(up)
    assert "stopped" in out
    status = _fleetprof(env, "kafka", "status")
    assert status.returncode == 3, status.stdout  # the broker `up` started is gone with it
