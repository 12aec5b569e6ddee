"""pprof, which reads back the profiles fleetprof writes: .build/tools/pprof, built by infra/tools.sh from the Go
toolchain's own source (`go tool pprof` would compile it on first use, minutes on two cores). Missing, a test that
needs it skips, and fails on CI."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.elf_helpers import unavailable

PPROF = Path(__file__).resolve().parent.parent / ".build" / "tools" / "pprof"


def pprof(profile: Path, *args: str) -> str:
    """`pprof ARGS PROFILE`'s standard output (times in UTC, nothing read from the user's pprof settings)."""
    if not os.access(PPROF, os.X_OK):
        unavailable(f"{PPROF} missing (bash infra/tools.sh builds it)")
    env = dict(os.environ, HOME=str(profile.parent), TZ="UTC")
    return subprocess.run([str(PPROF), *args, str(profile)], capture_output=True, text=True, timeout=120,
                          check=True, env=env).stdout


def lines(text: str) -> list[str]:
    """pprof's text output as lines without their trailing blanks."""
    return [line.rstrip() for line in text.splitlines()]
