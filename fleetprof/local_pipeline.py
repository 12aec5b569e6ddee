"""`fleetprof up`: the whole pipeline on one machine on the embedded defaults.

This process owns the chDB store (one process per data directory): it runs the sink and serves the query API.
Symbolizers, the correlator and the alerter run as child processes in their consumer groups and are restarted if
they die; with `--simulate-gpu`, so do a simulated GPU workload and the agent.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from fleetprof.settings import Settings

log = logging.getLogger("fleetprof.up")


def _answers(bootstrap: str) -> bool:
    """Whether a Kafka broker (ours from an earlier run, or the user's own) already serves this address."""
    from fleetprof import broker

    try:
        broker.wait_for_broker(bootstrap, timeout=1.5)
        return True
    except broker.BrokerError:
        return False


@dataclass
class Child:
    stage: str  # a processor stage (`fleetprof process STAGE`), or the name of another command
    index: int
    log_path: Path
    proc: subprocess.Popen | None = None
    restarts: int = 0
    argv: list[str] | None = None  # a command other than `fleetprof process STAGE`
    env: dict[str, str] | None = None


@dataclass
class LocalPipeline:
    settings: Settings
    symbolizers: int = 1
    simulate_gpu: bool = False
    serve_api: bool = True
    alert_env: dict[str, str] = field(default_factory=dict)  # FLEETPROF_ALERT_* settings for the alerts child
    started_broker: object | None = None
    store: object | None = None
    api: object | None = None
    sink: object | None = None
    sink_thread: threading.Thread | None = None
    children: list[Child] = field(default_factory=list)
    stop_event: threading.Event = field(default_factory=threading.Event)
    failure: str | None = None

    def start_kafka(self) -> str:
        from fleetprof import broker

        s = self.settings
        if s.kafka_is_local and not _answers(s.kafka):
            port = int(s.kafka.rsplit(":", 1)[1])
            local = broker.LocalBroker(s.data_dir / "kafka", port=port, controller_port=port + 1)
            if not local.is_running():
                local.start()
                self.started_broker = local
        else:
            broker.wait_for_broker(s.kafka, timeout=30)
        broker.create_topics(s.kafka)
        return s.kafka

    def start_store(self) -> list[str]:
        from fleetprof.store import open_store

        self.store = open_store(self.settings.clickhouse_dsn, self.settings.database,
                                **self.settings.clickhouse_credentials())
        return self.store.migrate()

    def start_processors(self) -> None:
        from fleetprof.stage_registry import STAGES, StageContext, UpMode, make_runner

        logs_dir = self.settings.data_dir / "logs"
        logs_dir.mkdir(parents=True, exist_ok=True)
        for entry in STAGES:
            if entry.up is UpMode.IN_PROCESS:  # the sink: it writes the store this process owns
                self.sink = make_runner(entry, StageContext(self.settings, self.stop_event, store=self.store))
                self.sink_thread = threading.Thread(target=self._run_sink, name=entry.name, daemon=True)
                self.sink_thread.start()
                continue
            # evidence comes through this process's query API (it owns the store), so the alerter reads FLEETPROF_API
            env = {**os.environ, **self.alert_env} if entry.alert_options else None
            for i in range(self.symbolizers if entry.up is UpMode.SCALED_CHILDREN else 1):
                self._start(Child(entry.name, i, logs_dir / f"{entry.name}-{i}.log", env=env))

    def _start(self, child: Child) -> Child:
        self._spawn(child)
        self.children.append(child)
        return child

    def start_simulated_gpu(self) -> None:
        """The simulated GPU workload and a real agent reading the simulated NVML library (see simulate/gpu_demo.py)."""
        from simulate import gpu_demo as demo

        logs_dir = self.settings.data_dir / "logs"
        workload = self._start(Child("simulated-gpu-workload", 0, logs_dir / "simulated-gpu-workload.log",
                                     argv=demo.workload_command(), env=dict(os.environ)))
        folder = self.settings.data_dir / "simulated-gpu"
        folder.mkdir(parents=True, exist_ok=True)
        scenario = demo.demo_scenario(folder / "nvml-scenario.txt", workload.proc.pid)
        self._start(Child("agent", 0, logs_dir / "agent.log", env=demo.agent_env(scenario),
                          argv=[sys.executable, "-m", "fleetprof", "agent", "--window", "10s"]))

    def _run_sink(self) -> None:
        try:
            self.sink.run(self.stop_event)
        except Exception as exc:
            log.exception("sink stopped on an error")
            self.failure = f"the sink stopped: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            self.stop_event.set()

    def start_api(self) -> str:
        from fleetprof.api import serve_api

        host, port = self.settings.api.rsplit(":", 1)
        self.api = serve_api(self.store, host, int(port))
        return f"http://{host}:{port}"

    def _spawn(self, child: Child) -> None:
        env = dict(child.env if child.env is not None else os.environ)
        env["FLEETPROF_KAFKA"] = self.settings.kafka  # via env, so settings never show on a command line
        env["FLEETPROF_DATA_DIR"] = str(self.settings.data_dir)
        env["FLEETPROF_INSTANCE"] = str(child.index)
        env["FLEETPROF_API"] = self.settings.api
        if self.settings.config_path is not None:  # the path, never the secrets it holds
            env["FLEETPROF_CONFIG"] = str(self.settings.config_path.resolve())
        argv = child.argv or [sys.executable, "-m", "fleetprof", "process", child.stage]
        out = open(child.log_path, "ab")  # noqa: SIM115 - handed to the child for its lifetime
        # the repository root as cwd: the simulated workload runs as `-m producers...` under another interpreter
        child.proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      cwd=Path(__file__).resolve().parent.parent)
        out.close()

    def supervise(self) -> list[str]:
        """Restart children that died; returns what happened, for the console."""
        events = []
        for child in self.children:
            code = child.proc.poll() if child.proc else 0
            if code is not None and not self.stop_event.is_set():
                child.restarts += 1
                events.append(f"{child.stage}-{child.index} exited with {code}; restarting (see {child.log_path})")
                self._spawn(child)
        return events

    def stop(self) -> None:
        self.stop_event.set()
        for child in self.children:
            if child.proc and child.proc.poll() is None:
                child.proc.terminate()
        for child in self.children:
            if child.proc:
                try:
                    child.proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    child.proc.kill()
        if self.sink_thread:
            self.sink_thread.join(timeout=30)
        if self.api:
            self.api.stop()
        if self.store:
            self.store.close()
        if self.started_broker:
            self.started_broker.stop()

    def wait(self, poll: float = 1.0, on_event=None) -> None:
        while not self.stop_event.is_set():
            time.sleep(poll)
            for event in self.supervise():
                log.warning(event)
                if on_event:
                    on_event(event)
