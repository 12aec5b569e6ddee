"""`fleetprof process STAGE`: one processor instance in its consumer group (what a Deployment runs)."""

from __future__ import annotations

import logging
import threading

import click

from fleetprof import logs
from fleetprof.settings import Settings

log = logging.getLogger("fleetprof.process")


STAGE_BATCH_SIZE = {"correlate": 5000}


@click.command("process")
@click.argument("stage", type=click.Choice(["symbolize", "correlate", "sink"]))
@click.option("--batch-size", type=click.IntRange(1, 100_000), default=None, help="Messages per batch.")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=0,
              help="Serve Prometheus /metrics on 127.0.0.1:PORT (0: off).")
@click.option("--log-level", default="INFO", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]))
@click.pass_obj
def process(settings: Settings, stage: str, batch_size: int | None, metrics_port: int, log_level: str) -> None:
    """Run one processor STAGE until SIGTERM: symbolize (cpu.stacks → cpu.samples), correlate (gpu.launches +
    gpu.kernels → gpu.samples) or sink (→ ClickHouse)."""
    logs.configure(log_level)
    from processors.metrics import serve_metrics
    from processors.runner import install_sigterm

    stop = threading.Event()
    install_sigterm(stop)
    if metrics_port:
        serve_metrics(metrics_port)
    kafka = settings.kafka_config()
    log.info("starting stage %s against %s", stage, settings.kafka)
    if stage == "sink":
        from fleetprof.store import open_store
        from processors.store_writer import StoreRunner

        store = open_store(settings.clickhouse_dsn, settings.database)
        try:
            store.migrate()
            kwargs = {"batch_messages": batch_size} if batch_size else {}
            StoreRunner(store, kafka, **kwargs).run(stop)
        finally:
            store.close()
    else:
        from processors.runner import TopicRunner
        from processors.stages import TOPIC_STAGES

        # a correlator transaction also carries its state's changelog: larger batches amortize it
        default = STAGE_BATCH_SIZE.get(stage)
        kwargs = {"batch_size": batch_size or default} if batch_size or default else {}
        TopicRunner(TOPIC_STAGES[stage](kafka), kafka, **kwargs).run(stop)
    log.info("stage %s stopped", stage)
