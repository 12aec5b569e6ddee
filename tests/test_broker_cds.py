"""The broker JVM's class-data-sharing archive (fleetprof/broker_cds.py) with the real JDK and the Kafka jars: a
clean exit's dump is kept and mapped by the next JVM, a truncated or unclean one never is (JDK 17 would crash on it)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fleetprof import broker_cds
from fleetprof.broker import BrokerError, LocalBroker, ensure_jars, find_java


@pytest.fixture
def jvm(kafka_broker: LocalBroker, tmp_path: Path) -> tuple[str, Path]:
    """(java, a lib dir of its own: links to the broker's jars), so this test's archives are no broker's."""
    del kafka_broker  # only for its skip (or, on CI, failure) without Java or the jars
    try:
        java, jars = find_java(), ensure_jars()
    except BrokerError as exc:
        pytest.fail(str(exc))
    lib = tmp_path / "lib"
    lib.mkdir()
    for jar in jars.glob("*.jar"):
        (lib / jar.name).symlink_to(jar)
    return java, lib


def _run_tool(java: str, lib: Path, flags: list[str]) -> subprocess.CompletedProcess[str]:
    """A short Kafka tool run in a JVM with `flags` (it loads a good share of the broker's classes)."""
    return subprocess.run([java, *flags, "-cp", f"{lib}/*", "kafka.tools.StorageTool", "random-uuid"],
                          capture_output=True, text=True, timeout=120, check=False)


def _pending_dump(home: Path) -> Path:
    return Path((home / broker_cds.PENDING).read_text().split()[0])


def test_a_clean_exits_dump_is_kept_and_mapped_by_the_next_jvm(jvm: tuple[str, Path], tmp_path: Path) -> None:
    java, lib = jvm
    archive = broker_cds.archive_for(java, lib)
    flags = broker_cds.broker_flags(java, lib, tmp_path)
    dump = _pending_dump(tmp_path)
    assert flags == [f"-XX:ArchiveClassesAtExit={dump}"] and dump.parent == lib and not archive.exists()
    assert _run_tool(java, lib, flags).returncode == 0
    broker_cds.finish(tmp_path, exited_cleanly=True)
    assert archive.exists() and not dump.exists() and not (tmp_path / broker_cds.PENDING).exists()

    assert broker_cds.broker_flags(java, lib, tmp_path) == [f"-XX:SharedArchiveFile={archive}"]
    shared = _run_tool(java, lib, ["-Xshare:on", f"-XX:SharedArchiveFile={archive}", "-Xlog:cds=info"])
    assert shared.returncode == 0, shared.stdout + shared.stderr  # -Xshare:on fails unless it maps the archive
    assert broker_cds.tool_flags(java, lib)[0] == f"-XX:SharedArchiveFile={archive}"


@pytest.mark.parametrize("case", ["truncated", "unclean exit", "never written"])
def test_a_dump_that_may_be_partial_is_dropped(jvm: tuple[str, Path], tmp_path: Path, case: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    java, lib = jvm
    monkeypatch.chdir(tmp_path)
    archive = broker_cds.archive_for(java, lib)
    flags = broker_cds.broker_flags(java, lib, tmp_path)
    dump = _pending_dump(tmp_path)
    if case != "never written":
        assert _run_tool(java, lib, flags).returncode == 0
    if case == "truncated":  # as a full disk or a kill mid-write would leave it
        with open(dump, "r+b") as f:
            f.truncate(dump.stat().st_size // 2)
    broker_cds.finish(tmp_path, exited_cleanly=case != "unclean exit")
    assert not archive.exists() and not dump.exists() and not (tmp_path / broker_cds.PENDING).exists()
    assert not list(tmp_path.glob("hs_err_pid*")) and not list(tmp_path.glob("core*"))  # the check's crash left none
    assert broker_cds.broker_flags(java, lib, tmp_path)[0].startswith("-XX:ArchiveClassesAtExit=")
