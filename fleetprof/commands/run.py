"""`fleetprof run [--record FILE] -- CMD ARGS...`: run a CUDA program with the CUPTI shim injected.

The shim (native/cupti_shim, built here on first use) is loaded by the CUDA driver through CUDA_INJECTION64_PATH and
by NVTX through NVTX_INJECTION64_PATH (for the ranges; left alone when another NVTX tool is set).
It stays idle until a fleetprof agent attaches to its probes; with --record it also writes every launch and kernel
record to FILE as JSON lines (self-check mode, no agent needed). CMD replaces this process (exec), so its signals
and exit status are the command's own.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from producers.cupti_shim import build_shim
from producers.native_build import NativeBuildError

INJECTION_ENV = "CUDA_INJECTION64_PATH"
NVTX_INJECTION_ENV = "NVTX_INJECTION64_PATH"
RECORD_ENV = "FLEETPROF_CUPTI_RECORD"
COMMAND_NOT_FOUND = 127  # what a shell returns for a command it cannot run


class CommandNotRun(click.ClickException):
    exit_code = COMMAND_NOT_FOUND


def injection_env(base: dict[str, str], shim: Path, record: Path | None) -> dict[str, str]:
    """`base` with the shim injected (and the self-check file set); ClickException when another injection is set."""
    current = base.get(INJECTION_ENV)
    if current and Path(current).resolve() != shim.resolve():
        raise click.ClickException(f"{INJECTION_ENV} is already set to {current}: CUDA loads one injection library; "
                                   "unset it to run under fleetprof")
    env = dict(base)
    env[INJECTION_ENV] = str(shim)
    # NVTX, unlike CUDA, does not fail without its tool: another one set (a tracer of the user's) keeps its place
    env.setdefault(NVTX_INJECTION_ENV, str(shim))
    if record is not None:
        env[RECORD_ENV] = str(record.resolve())
    return env


@click.command("run", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--record", type=click.Path(dir_okay=False, writable=True, path_type=Path), default=None,
              help="Also append every kernel launch and kernel record to FILE as JSON lines (self-check mode).")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(record: Path | None, command: tuple[str, ...]) -> None:
    """Run COMMAND with fleetprof's CUPTI shim injected (put -- before it)."""
    try:
        shim = build_shim()
    except NativeBuildError as exc:
        raise click.ClickException(str(exc)) from None
    env = injection_env(dict(os.environ), shim, record)
    try:
        os.execvpe(command[0], list(command), env)
    except OSError as exc:
        raise CommandNotRun(f"cannot run {command[0]}: {exc.strerror}") from None
