"""The README's main job as a user runs it: `fleetprof up`, then `fleetprof loadgen`, then `fleetprof query top`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

from processors.demangle import demangle
from tests.conftest import consecutive_free_port, free_ports


def _fleetprof(env: dict, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fleetprof", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def _start_up(env: dict, *args: str) -> tuple[subprocess.Popen, str]:
    """`fleetprof up ARGS` started, once it says its query API is up; with what it printed so far."""
    up = subprocess.Popen([sys.executable, "-m", "fleetprof", "up", *args], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not any("query API at" in line for line in lines):
        line = up.stdout.readline()
        if not line and up.poll() is not None:
            break
        lines.append(line)
    text = "".join(lines)
    if "query API at" not in text:
        up.kill()
        up.wait()
        raise AssertionError(f"fleetprof up did not come up:\n{text}")
    return up, text


def test_up_then_loadgen_then_query_top_shows_exactly_what_was_sent(tmp_path):
    kafka_port = consecutive_free_port()
    api_port = next(p for p in free_ports(3) if p not in (kafka_port, kafka_port + 1))
    env = dict(os.environ, FLEETPROF_DATA_DIR=str(tmp_path / "data"), FLEETPROF_KAFKA=f"127.0.0.1:{kafka_port}",
               FLEETPROF_API=f"127.0.0.1:{api_port}")
    up, _ = _start_up(env)
    try:

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
            top = _fleetprof(env, "query", "top", "--kind", "cpu", "--since", "5m", "--limit", "100000",
                             "--format", "json")
            assert top.returncode == 0, top.stderr
            got = Counter({f"{r['function']} ({r['binary']})": r["self"] for r in json.loads(top.stdout) if r["self"]})
            time.sleep(1)
        assert got == want
        assert sum(got.values()) == report["total_samples"]
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            out, _ = up.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            up.kill()
            raise
    assert up.returncode == 0, out
    assert "stopped" in out
    status = _fleetprof(env, "kafka", "status")
    assert status.returncode == 3  # the broker `up` started is gone with it


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
        up.send_signal(signal.SIGTERM)
        try:
            out, _ = up.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            up.kill()
            raise
    assert up.returncode == 0, out
