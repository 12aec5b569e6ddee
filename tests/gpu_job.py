"""A simulated GPU job under the real `fleetprof agent --once`, for the end-to-end GPU tests: a simulator build of
the test's own (attaching to it turns on no probes in other tests' processes), a process holding it so that the agent
attaches before the job starts (then every launch the job makes is decided with the probes on, and stored totals can
be compared exactly), and the simulated libnvidia-ml.so.1 with the given scenario."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from processors.correlate_stage import build_correlate
from processors.runner import TopicRunner
from simulate.nvml import sim_env
from tests.pipeline_helpers import Running, agent_started

ROOT = Path(__file__).resolve().parent.parent


def simulator_env(tmp_path: Path, kafka_bootstrap: str) -> tuple[dict[str, str], str]:
    """An environment whose GPU simulator is built under tmp_path, and the library's path."""
    env = dict(os.environ, FLEETPROF_NATIVE_BUILD=str(tmp_path / "native"), FLEETPROF_KAFKA=kafka_bootstrap)
    built = subprocess.run([sys.executable, "-c", "from simulate.gpu import build_gpusim; print(build_gpusim())"],
                           env=env, capture_output=True, text=True, check=True)
    return env, built.stdout.strip()


def run_job(env: dict[str, str], lib: str, nvml_scenario: Path, agent_args: list[str], job: list[str],
            started: str) -> tuple[dict, dict]:
    """Run `job` (its report: JSON on stdout) under an agent started with `agent_args`; the agent's last summary and
    the job's report. `started` opens the agent's `collecting ...` line."""
    holder = subprocess.Popen([sys.executable, "-c", f"import ctypes, sys; ctypes.CDLL({lib!r}); "
                               "print('ready', flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    agent = work = None
    try:
        assert holder.stdout.readline().strip() == "ready"
        agent = subprocess.Popen([sys.executable, "-m", "fleetprof", "agent", "--once", "--format", "json",
                                  *agent_args], env=sim_env(nvml_scenario, env), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        lines = agent_started(agent)
        assert any(line.startswith(started) for line in lines), "".join(lines)
        work = subprocess.Popen(job, env=env, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        report = json.loads(work.communicate(timeout=60)[0])
        out, err = agent.communicate(timeout=90)
    finally:
        holder.stdin.close()
        holder.wait(10)
        for p in (agent, work):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    assert agent.returncode == 0, err
    return json.loads(out.splitlines()[-1]), report


def correlator(bootstrap: str, group: str) -> Running:
    """The correlator stage in a thread (symbolizer and sink: tests/pipeline_helpers.py)."""
    kafka = {"bootstrap.servers": bootstrap}
    return Running(TopicRunner(build_correlate(kafka, group=group), kafka, group=group, poll_timeout=0.2),
                   threading.Event())
