"""`fleetprof up`: the whole pipeline on one machine on the embedded defaults, profiling that machine.

This process owns the chDB store (one process per data directory): it runs the sink and serves the query API.
The processors of the stage registry (symbolizers, the correlator, the alerter) and the node agent run as child
processes, restarted if they die; an agent that finds nothing to collect here (no BPF, no GPU) says so and stays
off. Each part is ready once it answers: the broker a metadata request, the store a query, a child the line in its
log that says it runs, the API an HTTP request.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fleetprof.settings import Settings
from producers.agent import EXIT_NOTHING_TO_COLLECT

log = logging.getLogger("fleetprof.up")

REPO_ROOT = Path(__file__).resolve().parent.parent
START_RETRIES = 2  # a child that exits while the pipeline starts is started again this often before up gives up


class PartFailed(RuntimeError):
    """A part of the pipeline did not start; str() is one line naming it."""


@dataclass
class Child:
    name: str  # a processor stage, "agent", or another program's name
    index: int
    log_path: Path
    argv: list[str]
    env: dict[str, str] | None = None
    ready_line: str = ""  # text of a line in its log that says it runs ("": running is enough)
    stays_off: int | None = None  # an exit status that means "not on this machine": not restarted
    what: str = ""  # how the console names it
    proc: subprocess.Popen | None = None
    restarts: int = 0
    off: str = ""  # why it stays off
    _log_from: int = 0  # where this run's lines start in its log

    def lines(self) -> list[str]:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_from)
                return f.read().decode(errors="replace").splitlines()
        except OSError:
            return []

    def last_line(self) -> str:
        lines = [ln for ln in self.lines() if ln.strip()]
        return lines[-1].strip()[:300] if lines else "no output"


def process_child(stage: str, index: int, logs_dir: Path, env: dict[str, str] | None = None) -> Child:
    """A `fleetprof process STAGE` child; it runs once it logs that its stage is running."""
    return Child(stage, index, logs_dir / f"{stage}-{index}.log", [sys.executable, "-m", "fleetprof", "process",
                                                                   stage], env, f"stage {stage} running",
                 what=f"{stage}-{index}")


def agent_child(logs_dir: Path, env: dict[str, str] | None = None, window: str = "10s") -> Child:
    """The node agent as a child: it runs once it says what it collects."""
    return Child("agent", 0, logs_dir / "agent.log", [sys.executable, "-m", "fleetprof", "agent", "--window", window],
                 env, "collecting ", EXIT_NOTHING_TO_COLLECT, what="the node agent")


@dataclass
class LocalPipeline:
    settings: Settings
    symbolizers: int = 1
    alert_env: dict[str, str] = field(default_factory=dict)  # FLEETPROF_ALERT_* settings for the alerts child
    started_broker: object | None = None
    store: object | None = None
    api: object | None = None
    api_url: str = ""
    sink: object | None = None
    sink_thread: threading.Thread | None = None
    children: list[Child] = field(default_factory=list)
    stop_event: threading.Event = field(default_factory=threading.Event)
    failure: str | None = None

    @property
    def logs_dir(self) -> Path:
        return self.settings.data_dir / "logs"

    def start_kafka(self) -> str:
        """The broker at the settings' address: this data directory's local broker (started here unless it runs),
        or one that already answers there; every topic created."""
        from fleetprof import broker

        s = self.settings
        local = broker.local_broker(s.kafka, s.data_dir) if s.kafka_is_local else None
        if local is not None and not broker.answers(s.kafka):
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

        self.logs_dir.mkdir(parents=True, exist_ok=True)
        for entry in STAGES:
            if entry.up is UpMode.IN_PROCESS:  # the sink: it writes the store this process owns
                self.sink = make_runner(entry, StageContext(self.settings, self.stop_event, store=self.store))
                self.sink_thread = threading.Thread(target=self._run_sink, name=entry.name, daemon=True)
                self.sink_thread.start()
                continue
            # evidence comes through this process's query API (it owns the store), so the alerter reads FLEETPROF_API
            env = {**os.environ, **self.alert_env} if entry.alert_options else None
            for i in range(self.symbolizers if entry.up is UpMode.SCALED_CHILDREN else 1):
                self.start_child(process_child(entry.name, i, self.logs_dir, env))

    def start_child(self, child: Child) -> Child:
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self._spawn(child)
        self.children.append(child)
        return child

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
        self.api_url = f"http://{host}:{port}"
        return self.api_url

    def _spawn(self, child: Child) -> None:
        env = dict(child.env if child.env is not None else os.environ)
        env["FLEETPROF_KAFKA"] = self.settings.kafka  # via env, so settings never show on a command line
        env["FLEETPROF_DATA_DIR"] = str(self.settings.data_dir)
        env["FLEETPROF_INSTANCE"] = str(child.index)
        env["FLEETPROF_API"] = self.settings.api
        if self.settings.config_path is not None:  # the path, never the secrets it holds
            env["FLEETPROF_CONFIG"] = str(self.settings.config_path.resolve())
        child.log_path.parent.mkdir(parents=True, exist_ok=True)
        out = open(child.log_path, "ab")  # noqa: SIM115 - handed to the child for its lifetime
        child._log_from = out.tell()
        # the repository root as cwd: the simulated workload runs as `-m simulate...` under another interpreter
        child.proc = subprocess.Popen(child.argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, cwd=REPO_ROOT)
        out.close()

    # readiness

    def _child_state(self, child: Child) -> str:
        """"ready", "off", "starting", or why it failed (one line)."""
        if child.off:
            return "off"
        code = child.proc.poll() if child.proc else None
        if code is not None:
            if child.stays_off is not None and code == child.stays_off:
                child.off = child.last_line().removeprefix("Error: ")
                return "off"
            return f"exited with status {code}: {child.last_line()} (log: {child.log_path})"
        if not child.ready_line or any(child.ready_line in line for line in child.lines()):
            return "ready"
        return "starting"

    def wait_ready(self, timeout_s: float = 180.0, on_ready: Callable[[Child], None] | None = None) -> None:
        """Return once every part answers (children that stay off count as answered); PartFailed naming the first
        part that did not, or that stopped."""
        deadline = time.monotonic() + timeout_s
        pending = list(self.children)
        while pending:
            for child in list(pending):
                state = self._child_state(child)
                if state in ("ready", "off"):
                    pending.remove(child)
                    if on_ready is not None:
                        on_ready(child)
                elif state != "starting":
                    if child.restarts >= START_RETRIES:
                        raise PartFailed(f"{child.what or child.name} did not start: {state}")
                    log.warning("%s %s; starting it again", child.what or child.name, state)
                    child.restarts += 1
                    self._spawn(child)
            if self.failure:
                raise PartFailed(self.failure)
            if pending and time.monotonic() > deadline:
                child = pending[0]
                raise PartFailed(f"{child.what or child.name} did not start within {timeout_s:.0f} s: "
                                 f"{child.last_line()} (log: {child.log_path})")
            if pending:
                time.sleep(0.2)
        if self.sink_thread is not None and not self.sink_thread.is_alive():
            raise PartFailed(self.failure or "the sink did not start")
        if self.api_url:
            try:
                with urllib.request.urlopen(f"{self.api_url}/healthz", timeout=10) as answer:
                    answer.read()
            except OSError as exc:
                raise PartFailed(f"the query API at {self.api_url} does not answer: {exc}") from None

    # running

    def supervise(self) -> list[str]:
        """Restart children that died (not those that stay off); returns what happened, for the console."""
        events = []
        for child in self.children:
            if child.off or self.stop_event.is_set():
                continue
            code = child.proc.poll() if child.proc else 0
            if code is None:
                continue
            if child.stays_off is not None and code == child.stays_off:
                child.off = child.last_line().removeprefix("Error: ")
                events.append(f"{child.what or child.name} is off: {child.off}")
                continue
            child.restarts += 1
            events.append(f"{child.what or child.name} exited with {code}; restarting (see {child.log_path})")
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
                    child.proc.wait(timeout=30)
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

    def wait(self, poll: float = 1.0, on_event: Callable[[str], None] | None = None) -> None:
        while not self.stop_event.is_set():
            time.sleep(poll)
            for event in self.supervise():
                log.warning(event)
                if on_event:
                    on_event(event)
