"""The stage registry as `fleetprof process` and `fleetprof up` read it: real stages on the real broker and store."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, KafkaException, TopicPartition

from fleetprof.cli import cli
from fleetprof.commands import COMMANDS
from fleetprof.local_pipeline import LocalPipeline
from fleetprof.settings import Settings
from fleetprof.stage_registry import BY_NAME, STAGES, Runner, StageContext, UpMode, make_runner
from fleetprof.store import StoreError
from processors.runner import TopicRunner, TopicStage
from processors.store_writer import STATE_COLUMNS, StoreRunner
from schemas import topics

# the --alert-* options' defaults, as click hands them to the command
ALERT_DEFAULTS = {"alert_below": 20.0, "alert_for": "30s", "alert_busy_above": 50.0, "alert_recover_above": 40.0,
                  "alert_recover_for": "15s", "alert_evidence_stacks": 10, "alert_webhook_url_file": None}


def _settings(kafka: str, data_dir: Path, database: str = "fleetprof") -> Settings:
    return Settings(data_dir=data_dir, kafka=kafka, clickhouse="", database=database, api="127.0.0.1:9")


def _wait_for_list_offsets(bootstrap: str) -> None:
    """Right after the session's broker created its topics, a partition's leader may still refuse ListOffsets
    (NOT_LEADER_FOR_PARTITION), which SymbolFeed.catch_up does not retry: wait until every topic answers."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "registry-test"})
    try:
        for topic in topics.ALL:
            for p in range(topic.partitions):
                deadline = time.monotonic() + 30
                while True:
                    try:
                        consumer.get_watermark_offsets(TopicPartition(topic.name, p), timeout=5)
                        break
                    except KafkaException:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.2)
    finally:
        consumer.close()


def test_the_registry_holds_the_four_stages_in_order():
    assert [(e.name, e.inputs, e.runner, e.up) for e in STAGES] == [
        ("symbolize", ("cpu.stacks",), Runner.TOPIC, UpMode.SCALED_CHILDREN),
        ("correlate", ("gpu.launches", "gpu.kernels"), Runner.TOPIC, UpMode.ONE_CHILD),
        ("alerts", ("gpu.metrics",), Runner.TOPIC, UpMode.ONE_CHILD),
        ("sink", ("cpu.samples", "gpu.metrics", "gpu.samples", "alerts", "identities"), Runner.STORE,
         UpMode.IN_PROCESS),
    ]
    assert all(name in topics.BY_NAME for e in STAGES for name in e.inputs)


def test_process_help_lists_every_stage_of_the_registry():
    for command in COMMANDS:
        cli.add_command(command)
    out = CliRunner().invoke(cli, ["process", "--help"], terminal_width=200)
    assert out.exit_code == 0, out.output
    assert "Usage: cli process [OPTIONS] {symbolize|correlate|alerts|sink}" in out.output
    assert "The --alert-* options apply to the alerts stage." in out.output
    stages = out.output.split("Stages:\n")[1].split("\n\n")[0].splitlines()
    assert stages == [
        "  symbolize  cpu.stacks → cpu.samples: frames named from the symbols topic (and debuginfod)",
        "  correlate  gpu.launches + gpu.kernels → gpu.samples: GPU kernel time by launching CPU stack",
        "  alerts     gpu.metrics → alerts: GPU utilization drops, with CPU evidence from the store, and the webhook",
        "  sink       cpu.samples + gpu.metrics + gpu.samples + alerts + identities → ClickHouse tables",
    ]


def test_each_topic_stage_is_built_and_run_as_its_entry_says(kafka_bootstrap, tmp_path, monkeypatch):
    monkeypatch.delenv("FLEETPROF_ALERT_WEBHOOK_URL", raising=False)
    _wait_for_list_offsets(kafka_bootstrap)
    # (batch size, poll timeout, gathering) of each runner: without --batch-size, and with --batch-size 7
    want = {"symbolize": [(200, 0.5, 1.0), (7, 0.5, 1.0)], "correlate": [(50_000, 0.5, 2.0), (7, 0.5, 2.0)],
            "alerts": [(500, 0.2, 0), (7, 0.2, 0)]}
    for entry in STAGES:
        if entry.runner is not Runner.TOPIC:
            continue
        for batch_size, (size, poll, gather) in zip((None, 7), want[entry.name], strict=True):
            context = StageContext(_settings(kafka_bootstrap, tmp_path), threading.Event(), options=ALERT_DEFAULTS)
            with context.resources:
                runner = make_runner(entry, context, batch_size)
                try:
                    assert isinstance(runner, TopicRunner) and isinstance(runner.stage, TopicStage)
                    assert (runner.stage.name, runner.stage.inputs) == (entry.name, entry.inputs)
                    assert (runner.batch_size, runner.poll_timeout, runner.gather_s) == (size, poll, gather)
                    assert runner.columnar is (entry.name == "symbolize")
                finally:
                    runner.close()
    assert BY_NAME["alerts"].alert_options and not any(e.alert_options for e in STAGES if e.name != "alerts")


def test_the_sink_writes_the_store_it_is_given_or_opens_its_own(kafka_bootstrap, store, chdb_dir):
    entry = BY_NAME["sink"]
    stop = threading.Event()
    given = make_runner(entry, StageContext(_settings(kafka_bootstrap, Path(chdb_dir).parent), stop, store=store),
                        batch_size=None)
    try:
        assert isinstance(given, StoreRunner) and given.store is store
        assert (given.name, given.inputs, given.batch_messages, given.stop) == ("sink", entry.inputs, 2000, stop)
    finally:
        given.close()
    database = f"t_registry_{uuid.uuid4().hex[:8]}"
    context = StageContext(_settings(kafka_bootstrap, Path(chdb_dir).parent, database), stop)
    with context.resources:
        own = make_runner(entry, context, batch_size=50)
        try:
            assert own.batch_messages == 50 and own.store.database == database
            assert own.store.query_named("sink_state", {"topic": "cpu.samples"})[1] == []  # migrated
            own.store.insert("sink_state", [["cpu.samples", 3, 0, 9, "AFTER", datetime.now(tz=UTC)]], STATE_COLUMNS)
            assert own.store.query_named("sink_state", {"topic": "cpu.samples"})[1] == [(3, 0, 9, "AFTER")]
        finally:
            own.close()
    with pytest.raises(StoreError, match="the store is closed"):  # closed with the process's resources
        own.store.query_named("sink_state", {"topic": "cpu.samples"})


def test_up_starts_the_registry_stages(kafka_bootstrap, store, chdb_dir):
    """Two symbolizers, the correlator and the alerter as `fleetprof process` children (the alerter with the alert
    settings), the sink in this process on the store given."""
    pipeline = LocalPipeline(_settings(kafka_bootstrap, Path(chdb_dir).parent), symbolizers=2,
                             alert_env={"FLEETPROF_ALERT_BELOW": "12.5"})
    pipeline.store = store
    try:
        pipeline.start_processors()
        assert [(c.name, c.index, c.log_path.name) for c in pipeline.children] == [
            ("symbolize", 0, "symbolize-0.log"), ("symbolize", 1, "symbolize-1.log"),
            ("correlate", 0, "correlate-0.log"), ("alerts", 0, "alerts-0.log")]
        assert [c.env["FLEETPROF_ALERT_BELOW"] if c.env else None for c in pipeline.children] == \
            [None, None, None, "12.5"]
        assert pipeline.sink.store is store and pipeline.sink_thread.name == "sink"
        pipeline.wait_ready(90)  # each child's "stage NAME running" line
        assert all(f'"msg": "stage {c.name} running"' in c.log_path.read_text() for c in pipeline.children)
        assert all(c.proc.poll() is None and c.restarts == 0 for c in pipeline.children)
        assert pipeline.sink_thread.is_alive()
    finally:
        pipeline.store = None  # the fixture's: it closes it
        pipeline.stop()
    for child in pipeline.children:
        assert child.proc.returncode == 0, child.log_path.read_text()
        assert f'"msg": "stage {child.name} stopped"' in child.log_path.read_text()
