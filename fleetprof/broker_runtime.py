"""What the local broker runs on: its jars (fetched with Maven through infra/kafka/pom.xml into infra/kafka/lib), a
Java 17+ runtime, and the JVM's flags."""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

from fleetprof.settings import INFRA_DIR

KAFKA_DIR = INFRA_DIR / "kafka"
LIB_DIR = KAFKA_DIR / "lib"
POM = KAFKA_DIR / "pom.xml"
POM_STAMP = LIB_DIR / ".pom.sha256"
HEAP = "-Xmx512m"
# C1 only: the embedded broker serves one machine, the tests and the benches, is started often and shares a few cores
# with the processors. C2 had spent ~8 s of CPU compiling by the end of a fleet bench's set-up and took 4 s more in
# its first two windows, which made those windows late; with C1 the broker spent 1.5 s and 0.7 s, and 20% less CPU
# over a 300 s 100-node run (bench/RESULTS.md, 2026-12-05). FLEETPROF_BROKER_JVM_OPTS adds flags after these (a
# long-lived broker with spare cores may want `-XX:TieredStopAtLevel=4` back).
JIT = "-XX:TieredStopAtLevel=1"
JVM_OPTS_ENV = "FLEETPROF_BROKER_JVM_OPTS"
MIN_JAVA = 17

JAVA_MISSING = ("Java 17+ is required to run the local Kafka broker: install a JRE "
                "(apt-get install openjdk-17-jre-headless)")

log = logging.getLogger("fleetprof.broker")


class BrokerError(RuntimeError):
    """A one-line, user-facing reason why the local broker cannot start, stop or be reached."""


# --- jars and java ------------------------------------------------------------


def _pom_hash() -> str:
    return hashlib.sha256(POM.read_bytes()).hexdigest()


def jars_ready() -> bool:
    """True when infra/kafka/lib holds the jars of the current pom.xml."""
    if not any(LIB_DIR.glob("kafka_2.13-*.jar")):
        return False
    # A lib fetched from an older pom may carry a wrong SLF4J binding; the stamp says which pom it came from.
    return POM_STAMP.exists() and POM_STAMP.read_text().strip() == _pom_hash()


def ensure_jars() -> Path:
    """Fetch the broker's jars with Maven unless infra/kafka/lib is already current; return the lib dir."""
    if jars_ready():
        return LIB_DIR
    mvn = shutil.which("mvn")
    if mvn is None:
        raise BrokerError("Maven (mvn) is required to fetch the Kafka jars into infra/kafka/lib: "
                          "install it (apt-get install maven) or run infra/setup.sh")
    # Parallel test workers may all find the lib stale: one fetches, the others then find it ready.
    lock = os.open(KAFKA_DIR, os.O_RDONLY)  # flock on the directory itself: no lock file in the tree
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not jars_ready():
            _fetch_jars(mvn)
    finally:
        os.close(lock)
    return LIB_DIR


def _fetch_jars(mvn: str) -> None:
    # Fetch into a fresh directory, then swap: jars of an older pom must not linger on the 'lib/*' classpath.
    # Both scratch dirs sit in the git-ignored target/, so an interrupted fetch leaves nothing in `git status`.
    staging = KAFKA_DIR / "target" / f"lib-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    cmd = [mvn, "-q", "-B", "-f", str(POM), "dependency:copy-dependencies",
           f"-DoutputDirectory={staging}", "-DincludeScope=runtime"]
    log.info("fetching Kafka jars: %s", " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not any(staging.glob("kafka_2.13-*.jar")):
        shutil.rmtree(staging, ignore_errors=True)
        lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "ERROR" in ln] or ["no output"]
        raise BrokerError(f"mvn could not fetch the Kafka jars (exit {proc.returncode}): {lines[0].strip()}")
    (staging / POM_STAMP.name).write_text(_pom_hash() + "\n")
    old = KAFKA_DIR / "target" / f"lib-old-{os.getpid()}"
    if LIB_DIR.exists():
        LIB_DIR.rename(old)
    staging.rename(LIB_DIR)
    shutil.rmtree(old, ignore_errors=True)


def find_java() -> str:
    """Path of a Java 17+ runtime, or BrokerError with the one line that says how to install one."""
    java = shutil.which("java")
    if java is None:
        raise BrokerError(JAVA_MISSING)
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BrokerError(f"{JAVA_MISSING} ({java} -version failed: {exc})") from None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not match:
        raise BrokerError(f"{JAVA_MISSING} (cannot read the version of {java})")
    major = int(match.group(1))
    if major == 1 and match.group(2):  # "1.8.0_x" style
        major = int(match.group(2))
    if major < MIN_JAVA:
        raise BrokerError(f"{JAVA_MISSING} (found Java {major} at {java})")
    return java


def jvm_flags() -> list[str]:
    """The broker JVM's heap and JIT flags, then FLEETPROF_BROKER_JVM_OPTS (later flags win)."""
    extra = shlex.split(os.environ.get(JVM_OPTS_ENV, ""))
    return [HEAP, "-Xms128m", JIT, "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true", *extra]
