"""The local Kafka broker against a real Apache Kafka: start/stop, topics, transactions, `fleetprof kafka`."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, ConfigResource

from fleetprof import broker_cds
from fleetprof.broker import BrokerError, LocalBroker, create_topics, find_java
from fleetprof.broker_runtime import JIT, JVM_OPTS_ENV, LIB_DIR, jvm_flags
from schemas import topics
from tests.conftest import consecutive_free_port


def _admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def _fleetprof(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # The real entry point in a child process: exit codes and stderr exactly as a user sees them.
    cmd = [sys.executable, "-c", "from fleetprof.cli import main; main()", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, check=False)


def test_start_is_idempotent(kafka_broker: LocalBroker) -> None:
    pid = kafka_broker.pid()
    assert pid is not None and kafka_broker.is_running()
    kafka_broker.start()
    # A second handle on the same data dir (another process, in real life) finds the running broker too.
    other = LocalBroker(kafka_broker.data_dir, kafka_broker.port, kafka_broker.controller_port)
    other.start()
    assert kafka_broker.pid() == other.pid() == pid
    status = other.status()
    assert status["running"] is True and status["pid"] == pid
    assert status["bootstrap"] == kafka_broker.bootstrap == f"127.0.0.1:{kafka_broker.port}"
    assert status["data_dir"] == str(kafka_broker.data_dir)


def test_the_broker_jvm_compiles_with_c1_unless_told_otherwise(kafka_broker: LocalBroker, monkeypatch) -> None:
    """The running broker has the C1-only flag; FLEETPROF_BROKER_JVM_OPTS comes after it, so its flags win."""
    cmdline = Path(f"/proc/{kafka_broker.pid()}/cmdline").read_bytes().split(b"\0")
    assert JIT.encode() in cmdline
    assert cmdline.index(JIT.encode()) < cmdline.index(b"kafka.Kafka")
    monkeypatch.setenv(JVM_OPTS_ENV, "-XX:TieredStopAtLevel=4 -Dfleetprof.note='two words'")
    flags = jvm_flags()
    assert flags[-2:] == ["-XX:TieredStopAtLevel=4", "-Dfleetprof.note=two words"]
    assert flags.index(JIT) < flags.index("-XX:TieredStopAtLevel=4")


def test_broker_logs_through_log4j(kafka_broker: LocalBroker) -> None:
    server_log = kafka_broker.logs_dir / "server.log"
    assert "Kafka Server started" in server_log.read_text()
    assert "SLF4J" not in kafka_broker.log_file.read_text()  # e.g. "No SLF4J providers were found"


def test_topics_have_their_partitions_and_config(kafka_bootstrap: str) -> None:
    admin = _admin(kafka_bootstrap)
    metadata = admin.list_topics(timeout=10).topics
    for topic in topics.ALL:
        assert len(metadata[topic.name].partitions) == topic.partitions, topic.name
    resources = [ConfigResource("topic", t.name) for t in (topics.SYMBOLS, topics.CPU_STACKS)]
    symbols, cpu_stacks = (f.result(timeout=10) for f in admin.describe_configs(resources).values())
    assert symbols["cleanup.policy"].value == "compact"
    assert symbols["retention.ms"].value == "-1"
    assert cpu_stacks["cleanup.policy"].value == "delete"
    assert cpu_stacks["retention.ms"].value == str(topics.CPU_STACKS.retention_ms)
    assert create_topics(kafka_bootstrap) == []  # idempotent: everything exists already


def test_transactional_commit_visible_to_read_committed(kafka_bootstrap: str) -> None:
    topic = topics.Topic(f"test.txn.{uuid.uuid4().hex[:8]}", "Test", 1, topics.HOUR_MS)
    assert create_topics(kafka_bootstrap, [topic]) == [topic.name]
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": topic.name})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic.name, b"aborted")
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(topic.name, b"committed")
    producer.commit_transaction(30)

    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": topic.name,
                         "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    consumer.subscribe([topic.name])
    seen: list[bytes] = []
    deadline = time.monotonic() + 30
    try:
        while b"committed" not in seen and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                seen.append(msg.value())
    finally:
        consumer.close()
    # The aborted record precedes the committed one in the log, so it would have shown up first.
    assert seen == [b"committed"]


def test_start_refuses_a_port_someone_else_holds(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        broker = LocalBroker(tmp_path, port=port, controller_port=consecutive_free_port())
        with pytest.raises(BrokerError, match="already in use"):
            broker.start()
    assert not broker.is_running()


def test_cli_up_status_down(kafka_broker: LocalBroker, tmp_path: Path) -> None:
    # Depends on kafka_broker only so that a machine without Java skips (or, on CI, fails) here as well.
    port = consecutive_free_port()
    bootstrap = f"127.0.0.1:{port}"
    common = ["--data-dir", str(tmp_path), "--kafka", bootstrap]
    archive = broker_cds.archive_for(find_java(), LIB_DIR)
    had_archive = archive.exists()
    try:
        up = _fleetprof(*common, "kafka", "up")
        assert up.returncode == 0, up.stderr
        assert up.stdout.splitlines() == [f"Kafka broker running on {bootstrap} (data dir {tmp_path})"]

        status = _fleetprof(*common, "kafka", "status", "--format", "json")
        assert status.returncode == 0
        info = json.loads(status.stdout)
        assert info["running"] is True and info["bootstrap"] == bootstrap
        if had_archive:  # the classes come from the archive (fleetprof/broker_cds.py), mapped into the JVM
            assert str(archive) in Path(f"/proc/{info['pid']}/maps").read_text()
        assert {t.name for t in topics.ALL} <= set(_admin(bootstrap).list_topics(timeout=10).topics)

        down = _fleetprof(*common, "kafka", "down")
        assert down.returncode == 0, down.stderr
        assert "stopped" in down.stdout
        assert archive.exists()  # this broker's dump after its clean stop, or the one it mapped
        status = _fleetprof(*common, "kafka", "status")
        assert status.returncode == 3
        assert status.stdout.startswith("Kafka broker not running")
        assert _fleetprof(*common, "kafka", "down").returncode == 0  # stopping twice is fine
    finally:
        LocalBroker(tmp_path, port, port + 1).stop()  # never leave a JVM behind when an assertion fails


def test_missing_java_is_one_clear_line(tmp_path: Path) -> None:
    # A PATH with no java on it (the interpreter is started by its absolute path).
    env = {"PATH": str(tmp_path / "empty-bin"), "HOME": str(tmp_path)}
    port = consecutive_free_port()
    result = _fleetprof("--data-dir", str(tmp_path), "--kafka", f"127.0.0.1:{port}", "kafka", "up", env=env)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "Error: Java 17+ is required to run the local Kafka broker: install a JRE "
        "(apt-get install openjdk-17-jre-headless)"
    ]
