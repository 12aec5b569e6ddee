"""The explicit list of processor stages: what `fleetprof process STAGE` offers, and what `fleetprof up` starts.

Each entry says how its stage is built from the settings and which runner runs it; the stage's name gives its
consumer group (fleetprof-NAME) and, for a topic-to-topic stage, its transactional id (processors/runner.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from fleetprof.alerting import build_alerts_stage
from fleetprof.settings import Settings
from processors.alerts_stage import AlertsStage
from processors.correlate_stage import CorrelateStage, build_correlate
from processors.runner import TopicRunner, TopicStage
from processors.sink import SINK_INPUTS
from processors.store_writer import StoreRunner
from processors.symbolize_stage import SymbolizeStage, build_symbolize


class Runner(Enum):
    TOPIC = "topic to topic, exactly once through Kafka transactions (TopicRunner)"
    STORE = "topic to ClickHouse, exactly once through sink_state (StoreRunner)"


class UpMode(Enum):
    """How `fleetprof up` runs a stage."""

    ONE_CHILD = "one `fleetprof process NAME` child process, restarted when it dies"
    SCALED_CHILDREN = "`up --symbolizers` such child processes, instances 0 to N-1"
    IN_PROCESS = "in up's own process, which owns the store"


@dataclass
class StageContext:
    """What a builder reads: the settings, and what the process running the stage holds."""

    settings: Settings
    stop: threading.Event
    options: Mapping[str, Any] = field(default_factory=dict)  # the command's --alert-* values
    store: Any = None  # `fleetprof up`'s store (open, migrated); None: a store stage opens its own
    resources: ExitStack = field(default_factory=ExitStack)  # what a builder opened beside its stage; closed last
    kafka: dict = field(init=False)

    def __post_init__(self) -> None:
        self.kafka = self.settings.kafka_config()


@dataclass(frozen=True)
class StageEntry:
    name: str
    inputs: tuple[str, ...]
    summary: str  # what it makes of its inputs, one line for --help
    runner: Runner
    build: Callable[[StageContext], Any]  # TOPIC: the TopicStage; STORE: the store it writes
    up: UpMode
    batch_size: int | None = None  # None: the runner's default
    poll_timeout: float | None = None
    gather_s: float = 0.0  # TopicRunner's: keep polling while a burst lasts, up to this long
    alert_options: bool = False  # reads the --alert-* options (`fleetprof up` passes them as FLEETPROF_ALERT_*)


def _symbolize(context: StageContext) -> TopicStage:
    return build_symbolize(context.kafka)


def _correlate(context: StageContext) -> TopicStage:
    return build_correlate(context.kafka)


def _store(context: StageContext) -> Any:
    if context.store is not None:
        return context.store
    from fleetprof.store import open_store

    settings = context.settings
    store = open_store(settings.clickhouse_dsn, settings.database, **settings.clickhouse_credentials())
    context.resources.callback(store.close)
    store.migrate()
    return store


STAGES: tuple[StageEntry, ...] = (
    # a window's burst (every node's CPU stacks at its end) in one transaction, not cut where a poll ends
    StageEntry(SymbolizeStage.name, SymbolizeStage.inputs, "cpu.samples: frames named from the symbols topic "
               "(and debuginfod)", Runner.TOPIC, _symbolize, UpMode.SCALED_CHILDREN, gather_s=1.0),
    # a correlator transaction also carries its state's changelog and a GpuSamples record per node: one per burst
    # (every node's window at its end) amortizes them best (bench/RESULTS.md, "One transaction per burst")
    StageEntry(CorrelateStage.name, CorrelateStage.inputs, "gpu.samples: GPU kernel time by launching CPU stack",
               Runner.TOPIC, _correlate, UpMode.ONE_CHILD, batch_size=50_000, gather_s=2.0),
    # poll often: an alert should go out within a second or two of the poll that fires it
    StageEntry(AlertsStage.name, AlertsStage.inputs, "alerts: GPU utilization drops, with CPU evidence from the "
               "store, and the webhook", Runner.TOPIC, build_alerts_stage, UpMode.ONE_CHILD, batch_size=500,
               poll_timeout=0.2, alert_options=True),
    StageEntry("sink", SINK_INPUTS, "ClickHouse tables", Runner.STORE, _store, UpMode.IN_PROCESS),
)
BY_NAME = {entry.name: entry for entry in STAGES}


def make_runner(entry: StageEntry, context: StageContext, batch_size: int | None = None) -> TopicRunner | StoreRunner:
    """The entry's runner over what its builder makes; `batch_size` (a flag) overrides the entry's."""
    size = batch_size or entry.batch_size
    if entry.runner is Runner.STORE:
        batch = {"batch_messages": size} if size else {}
        return StoreRunner(entry.build(context), context.kafka, name=entry.name, inputs=entry.inputs,
                           stop=context.stop, **batch)
    kwargs: dict[str, Any] = {"batch_size": size} if size else {}
    if entry.poll_timeout is not None:
        kwargs["poll_timeout"] = entry.poll_timeout
    return TopicRunner(entry.build(context), context.kafka, gather_s=entry.gather_s, **kwargs)
