"""The broker JVM's class-data-sharing archive (JDK AppCDS): the classes a broker loaded, parsed and verified once,
then mapped by every later start instead of being loaded again from the jars.

A broker started without an archive writes one when it exits (-XX:ArchiveClassesAtExit) to a name of its own;
stopping it cleanly moves that file into place, so two brokers dumping at once never leave a half-written archive
under the name the next start maps. The archive sits beside the jars it was made from (a new pom's fetch swaps the
whole lib dir, archive included) and is named for the java binary, so another JDK makes its own instead of
being refused. A JVM that cannot use the archive it is given warns on its stdout (the broker's log) and starts
without it; a truncated archive, though, crashes JDK 17 at start (SIGBUS), so a dump is moved into place only after
its JVM exited cleanly and `java -Xshare:on` has mapped it over the same jars. On this project's 2-core VM a broker
start took 7.9-10.6 s of CPU without the archive and 4.4-5.9 s with it (ready in 3.6-4.4 s instead of 6.4-8.8).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from pathlib import Path

PENDING = "cds-archive-pending"  # in the broker's home: where its JVM writes the archive when it exits


def archive_for(java: str, lib: Path) -> Path:
    """The archive of this java binary (its resolved path, size and mtime) over the jars in `lib`."""
    real = Path(java).resolve()
    st = real.stat()
    digest = hashlib.sha256(f"{real}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return lib / f"classes-{digest}.jsa"


def broker_flags(java: str, lib: Path, home: Path) -> list[str]:
    """The JVM flags that use the archive, or that write it at exit when there is none yet (and the jars' dir
    takes files)."""
    archive = archive_for(java, lib)
    if archive.exists():
        (home / PENDING).unlink(missing_ok=True)
        return [f"-XX:SharedArchiveFile={archive}"]
    if not os.access(lib, os.W_OK):
        (home / PENDING).unlink(missing_ok=True)
        return []
    dump = archive.with_name(f"{archive.name}.{os.getpid()}-{time.time_ns()}.tmp")
    (home / PENDING).write_text(f"{dump}\n{java}\n")
    return [f"-XX:ArchiveClassesAtExit={dump}"]


def tool_flags(java: str, lib: Path) -> list[str]:
    """Flags for a one-shot Kafka tool (storage format): the archive when there is one, and no optimizing JIT or
    parallel GC threads, which a run of a second or two only pays for (4 -> 2 s of CPU here)."""
    archive = archive_for(java, lib)
    shared = [f"-XX:SharedArchiveFile={archive}"] if archive.exists() else []
    return [*shared, "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]


def finish(home: Path, exited_cleanly: bool) -> None:
    """After the broker of `home` exited: keep the archive its JVM wrote (only after a clean exit, the one that
    writes it whole), else drop the partial file."""
    pending = home / PENDING
    try:
        dump_name, java = pending.read_text().split()
    except (OSError, ValueError):
        return
    pending.unlink(missing_ok=True)
    dump = Path(dump_name)
    if exited_cleanly and dump.exists() and _maps(java, dump):
        os.replace(dump, dump.with_name(dump.name.split(".jsa.", 1)[0] + ".jsa"))
    else:
        dump.unlink(missing_ok=True)


def _maps(java: str, archive: Path) -> bool:
    """Whether this JVM maps the archive over the jars beside it (-Xshare:on fails instead of going on without)."""
    try:
        # a bad archive crashes the check: no hs_err file in the caller's working directory, no core
        run = subprocess.run([java, "-Xshare:on", f"-XX:SharedArchiveFile={archive}", "-XX:ErrorFile=/dev/null",
                              "-XX:-CreateCoredumpOnCrash", "-cp", f"{archive.parent}/*", "-version"],
                             capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return run.returncode == 0
