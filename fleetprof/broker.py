"""A local single-node Apache Kafka broker (KRaft, combined broker+controller) bound to 127.0.0.1.

Used by `fleetprof kafka up` and the tests. The jars, Java and the JVM's flags: fleetprof/broker_runtime.py; the
broker's state (server.properties, the log dirs, its own logs, a pid file) lives under <data dir>/kafka/.
"""

from __future__ import annotations

import base64
import fcntl
import logging
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from fleetprof import broker_cds
from fleetprof.broker_runtime import KAFKA_DIR, BrokerError, ensure_jars, find_java, jvm_flags
from schemas import topics as topic_defs

LOG4J_CONFIG = KAFKA_DIR / "log4j2.properties"

log = logging.getLogger(__name__)


# --- reaching a broker --------------------------------------------------------


def _split(bootstrap: str) -> tuple[str, int]:
    host, _, port = bootstrap.rpartition(":")
    return host or "127.0.0.1", int(port)


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _admin(bootstrap: str) -> AdminClient:
    return AdminClient({
        "bootstrap.servers": bootstrap,
        # Short backoffs: while waiting for a starting broker librdkafka would otherwise back off up to 10 s.
        "reconnect.backoff.ms": 50,
        "reconnect.backoff.max.ms": 500,
        # Connection errors are expected while waiting and reported by us once; keep librdkafka quiet.
        "log_level": 0,
    })


def _answers_metadata(admin: AdminClient, timeout: float) -> bool:
    try:
        md = admin.list_topics(timeout=timeout)
    except KafkaException:
        return False
    return bool(md.brokers)


def _wait(bootstrap: str, timeout: float, alive: Callable[[], str | None] | None = None) -> None:
    """Poll until `bootstrap` answers a metadata request; `alive` gives a reason when waiting is pointless."""
    host, port = _split(bootstrap)
    deadline = time.monotonic() + timeout
    admin: AdminClient | None = None
    while True:
        if alive is not None:
            reason = alive()
            if reason:
                raise BrokerError(reason)
        # A TCP probe first: an AdminClient made before the port opens would sit in reconnect backoff.
        if _port_open(host, port):
            admin = admin or _admin(bootstrap)
            if _answers_metadata(admin, timeout=min(2.0, max(0.1, deadline - time.monotonic()))):
                return
        if time.monotonic() >= deadline:
            raise BrokerError(f"Kafka broker at {bootstrap} did not answer a metadata request "
                              f"within {timeout:.0f} s")
        time.sleep(0.2)


def answers(bootstrap: str, timeout: float = 1.5) -> bool:
    """Whether a Kafka broker (this data directory's, or anyone's) already serves this address."""
    try:
        _wait(bootstrap, timeout)
        return True
    except BrokerError:
        return False


def wait_for_broker(bootstrap: str, timeout: float = 30) -> None:
    """Return once the broker at `bootstrap` answers a metadata request; BrokerError after `timeout` s."""
    _wait(bootstrap, timeout)


def create_topics(bootstrap: str, topics: Iterable[topic_defs.Topic] = topic_defs.ALL,
                  timeout: float = 30) -> list[str]:
    """Create every topic that does not exist yet (config from schemas/topics.py, RF 1; partition counts from there
    too, sized for 10,000 nodes unless FLEETPROF_PARTITIONS / FLEETPROF_PARTITIONS_<TOPIC> say otherwise).

    Returns the names created; existing topics are left as they are. Returns once the new topics have
    leaders, so callers can produce straight away. A bad partition setting raises BrokerError naming it.
    """
    topics = list(topics)
    try:
        topic_defs.partition_counts()  # every count valid, the joined topics alike, before anything is created
    except ValueError as exc:
        raise BrokerError(str(exc)) from None
    admin = _admin(bootstrap)
    try:
        existing = set(admin.list_topics(timeout=timeout).topics)
    except KafkaException as exc:
        raise BrokerError(f"cannot list topics on {bootstrap}: {exc.args[0]}") from None
    wanted = [NewTopic(t.name, num_partitions=t.partitions, replication_factor=1, config=t.config())
              for t in topics if t.name not in existing]
    if not wanted:
        return []
    created: list[str] = []
    futures = admin.create_topics(wanted, operation_timeout=timeout, request_timeout=timeout)
    for name, future in futures.items():
        try:
            future.result(timeout=timeout)
            created.append(name)
        except KafkaException as exc:
            err: KafkaError = exc.args[0]
            if err.code() != KafkaError.TOPIC_ALREADY_EXISTS:  # another process won the race: fine
                raise BrokerError(f"cannot create topic {name} on {bootstrap}: {err.str()}") from None
    _wait_for_leaders(admin, created, time.monotonic() + timeout)
    return created


def _wait_for_leaders(admin: AdminClient, names: list[str], deadline: float) -> None:
    while names:
        md = admin.list_topics(timeout=max(0.1, deadline - time.monotonic()))
        if all(n in md.topics and md.topics[n].error is None and md.topics[n].partitions
               and all(p.leader >= 0 for p in md.topics[n].partitions.values()) for n in names):
            return
        if time.monotonic() >= deadline:
            raise BrokerError(f"topics {', '.join(names)} have no leader yet")
        time.sleep(0.1)


# --- the local broker ---------------------------------------------------------

LOCAL_HOSTS = {"127.0.0.1", "localhost"}


def local_broker(bootstrap: str, data_dir: Path) -> LocalBroker:
    """The one local broker of `data_dir` (what `fleetprof kafka` and `fleetprof up` both mean): the ports it runs
    on when it runs, else 127.0.0.1:<port of bootstrap> with its controller on port+1."""
    host, _, port_text = bootstrap.rpartition(":")
    if host not in LOCAL_HOSTS or not port_text.isdigit():
        raise BrokerError(f"the local broker listens on 127.0.0.1:<port>, but the Kafka address is {bootstrap!r}; "
                          "a remote cluster is managed outside fleetprof")
    port = int(port_text)
    if not 0 < port < 65535:
        raise BrokerError(f"Kafka port {port} is out of range (the controller takes port+1)")
    broker = LocalBroker(data_dir, port=port, controller_port=port + 1)
    running = broker.recorded_ports() if broker.pid() is not None else None
    return LocalBroker(data_dir, *running) if running else broker


def _cluster_id() -> str:
    # Kafka's Uuid text form: url-safe base64 of 16 random bytes without padding; Kafka never hands out one
    # that starts with "-" because a command line would take it for a flag.
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def _pid_alive(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)  # reap it if it is our own exited child, or it lingers as a zombie
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


class LocalBroker:
    """One Kafka broker+controller on 127.0.0.1, its state under `data_dir`/kafka."""

    def __init__(self, data_dir: Path, port: int = 9092, controller_port: int = 9093) -> None:
        self.data_dir = Path(data_dir)
        self.port = port
        self.controller_port = controller_port
        self.home = self.data_dir / "kafka"
        self.config_file = self.home / "server.properties"
        self.log_dirs = self.home / "data"
        self.logs_dir = self.home / "logs"
        self.log_file = self.home / "broker.log"
        self.pid_file = self.home / "broker.pid"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __repr__(self) -> str:
        return f"LocalBroker({self.bootstrap}, {self.home})"

    # -- state --

    def pid(self) -> int | None:
        """The pid of this data dir's broker process if it is alive, else None."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        if not self._alive(pid):
            return None
        # Pids are reused: make sure it is a Kafka started on this very config file.
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return pid  # no /proc: trust the pid file
        if b"kafka.Kafka" in cmdline and os.fsencode(self.config_file) in cmdline:
            return pid
        return None

    def recorded_ports(self) -> tuple[int, int] | None:
        """(port, controller port) of the last start's server.properties, None without one."""
        try:
            props = dict(line.split("=", 1) for line in self.config_file.read_text().splitlines()
                         if "=" in line and not line.startswith("#"))
            ports = {name: int(addr.rsplit(":", 1)[1]) for name, addr in
                     (item.split("://", 1) for item in props["listeners"].split(","))}
            return ports["PLAINTEXT"], ports["CONTROLLER"]
        except (OSError, KeyError, ValueError, IndexError):
            return None

    def is_running(self) -> bool:
        """True when this data dir's broker process is alive and its port accepts connections."""
        return self.pid() is not None and _port_open("127.0.0.1", self.port)

    def status(self) -> dict[str, object]:
        """running, pid, bootstrap, data_dir (and the log file) as plain JSON-able values."""
        pid = self.pid()
        running = pid is not None and _port_open("127.0.0.1", self.port)
        return {"running": running, "pid": pid, "bootstrap": self.bootstrap, "data_dir": str(self.data_dir),
                "log": str(self.log_file)}

    # -- start / stop --

    def start(self, timeout: float = 90) -> None:
        """Start the broker unless it already runs, and return once it answers a metadata request."""
        self.home.mkdir(parents=True, exist_ok=True)
        # One starter per data dir: two `fleetprof kafka up` at once must not launch two JVMs.
        with open(self.home / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.pid() is not None:
                # Already running, or being started by someone else: just wait until it answers.
                _wait(self.bootstrap, timeout, self._exit_reason)
                return
            for port in (self.port, self.controller_port):
                if _port_open("127.0.0.1", port):
                    raise BrokerError(f"127.0.0.1:{port} is already in use by another process; "
                                      "pick other ports (--kafka 127.0.0.1:<port>)")
            java = find_java()
            lib = ensure_jars()
            self._write_config()
            self._format(java, lib)
            self._launch(java, lib)
            try:
                _wait(self.bootstrap, timeout, self._exit_reason)
            except BrokerError:
                self.stop(timeout=10)
                raise

    def stop(self, timeout: float = 30) -> None:
        """Stop the broker (SIGTERM, then SIGKILL after `timeout` s); nothing to do if it is not running."""
        pid = self.pid()
        if pid is not None:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:  # exited on its own meanwhile
                pid = None
        clean = False
        if pid is not None:
            clean = self._wait_exit(pid, timeout)
            if not clean:
                log.warning("Kafka broker %d ignored SIGTERM for %.0f s; killing it", pid, timeout)
                try:
                    os.killpg(pid, signal.SIGKILL)  # its own session: take any children with it
                except ProcessLookupError:
                    pass
                self._wait_exit(pid, 10)
        broker_cds.finish(self.home, exited_cleanly=clean)
        self.pid_file.unlink(missing_ok=True)
        self._proc = None

    def _wait_exit(self, pid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self._alive(pid):
                return True
            time.sleep(0.1)
        return False

    def _alive(self, pid: int) -> bool:
        # Our own child is asked through Popen, which keeps its exit code; waitpid elsewhere would steal it.
        if self._proc is not None and self._proc.pid == pid:
            return self._proc.poll() is None
        return _pid_alive(pid)

    def _exit_reason(self) -> str | None:
        """Why waiting for the broker is pointless (its process is gone), or None."""
        if self._proc is not None:
            code = self._proc.poll()
            if code is None:
                return None
        elif self.pid() is not None:
            return None
        else:
            code = None
        detail = self._last_error()
        return (f"Kafka broker exited during start-up"
                f"{f' (exit code {code})' if code is not None else ''}: {detail} (log: {self.log_file})")

    def _last_error(self) -> str:
        for path in (self.log_file, self.logs_dir / "server.log"):
            try:
                lines = path.read_text(errors="replace").splitlines()
            except OSError:
                continue
            errors = [ln for ln in lines if " ERROR " in ln or "Exception" in ln or "Error:" in ln]
            if errors:
                return errors[-1].strip()[:300]
        return "no error logged"

    def _write_config(self) -> None:
        # Rewritten on every start so a changed port takes effect; the log dirs keep the data.
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port},"
                                    f"CONTROLLER://127.0.0.1:{self.controller_port}",
            "inter.broker.listener.name": "PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.log_dirs),
            "num.partitions": "1",
            "auto.create.topics.enable": "false",
            "group.initial.rebalance.delay.ms": "0",
            # One node: every internal topic has one replica, or groups and transactions never work.
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "8",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "8",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "min.insync.replicas": "1",
            "default.replication.factor": "1",
        }
        text = "# Written by fleetprof/broker.py on every start; edits are overwritten.\n"
        text += "".join(f"{k}={_escape(v)}\n" for k, v in props.items())
        self.config_file.write_text(text)

    def _format(self, java: str, lib: Path) -> None:
        if (self.log_dirs / "meta.properties").exists():
            return
        cmd = [java, *broker_cds.tool_flags(java, lib), "-cp", f"{lib}/*", *self._log_flags(),
               "kafka.tools.StorageTool", "format", "-t", _cluster_id(), "-c", str(self.config_file), "--standalone",
               "--ignore-formatted"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if proc.returncode != 0:
            lines = (proc.stderr + proc.stdout).strip().splitlines() or ["no output"]
            raise BrokerError(f"formatting Kafka storage in {self.log_dirs} failed: {lines[-1].strip()}")

    def _log_flags(self) -> list[str]:
        return [f"-Dlog4j2.configurationFile={LOG4J_CONFIG}", f"-Dkafka.logs.dir={self.logs_dir}"]

    def _launch(self, java: str, lib: Path) -> None:
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        broker_cds.finish(self.home, exited_cleanly=False)  # what a broker that died unstopped left half-written
        cmd = [java, *jvm_flags(), *broker_cds.broker_flags(java, lib, self.home), *self._log_flags(), "-cp",
               f"{lib}/*", "kafka.Kafka", str(self.config_file)]
        with open(self.log_file, "ab") as out:
            # Own session: the broker outlives the `fleetprof kafka up` that started it, and its Ctrl-C.
            self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                          cwd=self.home, start_new_session=True)
        self.pid_file.write_text(f"{self._proc.pid}\n")


def _escape(value: str) -> str:
    # java.util.Properties treats backslashes as escapes (and '#', '!' at line start as comments).
    return value.replace("\\", "\\\\")
