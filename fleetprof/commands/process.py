"""`fleetprof process STAGE`: one processor instance in its consumer group (what a Deployment runs)."""

from __future__ import annotations

import logging
import threading

import click

from fleetprof import logs
from fleetprof.alerting import alert_options
from fleetprof.settings import Settings
from fleetprof.stage_registry import BY_NAME, STAGES, StageContext, make_runner

log = logging.getLogger("fleetprof.process")


class ProcessCommand(click.Command):
    """`process`, whose help lists the registry's stages."""

    def format_help_text(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_help_text(ctx, formatter)
        with formatter.section("Stages"):
            formatter.write_dl([(entry.name, f"{' + '.join(entry.inputs)} → {entry.summary}") for entry in STAGES])


ALERT_STAGES = ", ".join(entry.name for entry in STAGES if entry.alert_options)


@click.command("process", cls=ProcessCommand,
               help="Run one processor STAGE in its consumer group until SIGTERM (what a Deployment runs; "
                    f"`fleetprof up` runs every stage on one machine). The --alert-* options apply to the "
                    f"{ALERT_STAGES} stage.")
@click.argument("stage", type=click.Choice([entry.name for entry in STAGES]))
@click.option("--batch-size", type=click.IntRange(1, 100_000), default=None,
              help="Messages per batch; for the sink, messages per poll (its batches end at 64 MiB of messages or "
                   "after their wait, see README).")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=0,
              help="Serve Prometheus /metrics on 127.0.0.1:PORT (0: off).")
@click.option("--metrics-host", default="127.0.0.1", show_default=True, envvar="FLEETPROF_METRICS_HOST",
              help="Address /metrics listens on (e.g. 0.0.0.0 in a pod, for Prometheus to scrape).")
@click.option("--log-level", default="INFO", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]))
@alert_options
@click.pass_obj
def process(settings: Settings, stage: str, batch_size: int | None, metrics_port: int, metrics_host: str,
            log_level: str, **alert_values: object) -> None:
    logs.configure(log_level)
    from processors.metrics import serve_metrics
    from processors.runner import install_sigterm

    stop = threading.Event()
    install_sigterm(stop)
    if metrics_port:
        if metrics_host not in ("127.0.0.1", "::1", "localhost"):
            log.warning("Prometheus /metrics listens on %s, beyond this machine", metrics_host)
        serve_metrics(metrics_port, metrics_host)
    context = StageContext(settings, stop, options=alert_values)
    log.info("starting stage %s against %s", stage, settings.kafka)
    with context.resources:
        runner = make_runner(BY_NAME[stage], context, batch_size)
        log.info("stage %s running", stage)  # `fleetprof up` waits for this line
        runner.run(stop)
    log.info("stage %s stopped", stage)
