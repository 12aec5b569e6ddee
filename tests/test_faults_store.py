"""The store unavailable for 30 s while data keeps coming, for real: the sink (`fleetprof process sink`) keeps its
chDB directory on a tmpfs of the test's own, and the test makes that filesystem refuse every write for 30 s.

How the outage is made. There is no ClickHouse server to stop here: chDB is the engine inside the sink's process, so
the store is unavailable when its disk is. Two ways were tried by hand against chDB: filling the tmpfs to ENOSPC
(ClickHouse then refuses each insert up front, "Cannot reserve 1.00 MiB, not enough space", before touching a file)
and turning the filesystem read-only, the way a disk that fails is remounted read-only by the kernel. The second is
used: it fails the real write path (creating the part's directory fails with EROFS), which is the harsher and more
common failure. `mount -o remount,ro` on the tmpfs itself is refused while chDB holds files open for writing, so
the test bind-mounts the directory over itself and remounts that bind read-only: every file created through the
path fails, while files already open stay open, as on a disk that went read-only under a running server. Removing
the bind mount ends the outage. In both ways chDB survives: the insert raises, reads go on, and after the outage
inserts succeed and the tables hold exactly what was written.

What must hold: the sink logs the failed writes and retries them (its retry counter moves), commits no input while
the store refuses writes, and afterwards the store holds exactly what was sent. Needs root for the mounts: skipped
with the reason without it, a failure on CI.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from confluent_kafka import TopicPartition

from fleetprof.settings import DEFAULT_DATABASE
from processors.sink import SINK_INPUTS
from schemas import topics
from tests.elf_helpers import unavailable
from tests.pipeline_helpers import symbolizer, wait_for
from tests.test_faults_kill import (
    Load,
    Process,
    committed,
    dead_letters_for,
    drain,
    ends,
    stored_cpu,
    stored_gpu,
    stored_unmatched,
)
from tests.test_gpu_pipeline import Run, start_at_end
from tests.test_scale_out import nodes_over_partitions

OUTAGE_S = 30.0


def _mount(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["mount", *args], capture_output=True, text=True)


def _mounted(path: Path) -> bool:
    return subprocess.run(["mountpoint", "-q", str(path)]).returncode == 0


def _unmount_all(path: Path) -> None:
    """Take every mount stacked on `path` off it (lazily if something still holds it: never leave one behind)."""
    while _mounted(path):
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "--lazy", str(path)], check=True)


@pytest.fixture
def tmpfs_dir(tmp_path: Path) -> Iterator[Path]:
    """A fresh 256 MiB tmpfs of this test's own (root only)."""
    path = tmp_path / "store"
    path.mkdir()
    done = _mount("-t", "tmpfs", "-o", "size=256m,mode=0700", "tmpfs", str(path))
    if done.returncode != 0:
        unavailable(f"cannot mount a tmpfs for the store (needs root): {done.stderr.strip()}")
    try:
        yield path
    finally:
        _unmount_all(path)


class ReadOnly:
    """`path` read-only for new files while inside: a read-only bind mount of it over itself."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.bound = False

    def __enter__(self) -> ReadOnly:
        done = _mount("--bind", str(self.path), str(self.path))
        self.bound = done.returncode == 0
        # a mount with a file open for writing on it cannot turn read-only (EBUSY): the sink may open one on the new
        # bind mount between the two commands, and closes it within its batch
        for _ in range(100 if self.bound else 0):
            done = _mount("-o", "remount,bind,ro", str(self.path))
            if done.returncode == 0:
                break
            time.sleep(0.05)
        if done.returncode != 0:
            self.__exit__()
            unavailable(f"cannot make the store's filesystem read-only: {done.stderr.strip()}")
        return self

    def __exit__(self, *exc) -> None:
        if self.bound:  # only the bind mount on top goes; the tmpfs underneath, with the store, stays
            if subprocess.run(["umount", str(self.path)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "--lazy", str(self.path)], check=True)  # files still open on it
            self.bound = False


def store_retries(sink: Process) -> float:
    body = httpx.get(f"http://127.0.0.1:{sink.port}/metrics", timeout=5).text
    found = re.search(r'^fleetprof_processor_store_retries_total\{stage="sink"\} (\S+)$', body, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def test_the_store_read_only_for_30s_loses_nothing_and_duplicates_nothing(kafka_bootstrap, tmpfs_dir, tmp_path):
    run = Run(kafka_bootstrap, None)  # this test's GPU node, build id and correlator group
    prefix = f"ro-{run.id}-"
    nodes = nodes_over_partitions(prefix.rstrip("-"), 1, topics.CPU_STACKS.partitions)
    sym_group = f"sym-{run.id}"
    start_at_end(kafka_bootstrap, sym_group, [topics.CPU_STACKS.name])
    start_at_end(kafka_bootstrap, "fleetprof-sink", list(SINK_INPUTS))
    out_starts = {t: ends(kafka_bootstrap, t) for t in (topics.CPU_SAMPLES.name, topics.GPU_SAMPLES.name)}
    dead_start = ends(kafka_bootstrap, topics.DEADLETTER.name)
    run.send_symbols()
    load = Load(kafka_bootstrap, run, nodes)
    sink_inputs = [TopicPartition(t, p) for t in (topics.CPU_SAMPLES.name, topics.GPU_SAMPLES.name)
                   for p in range(topics.BY_NAME[t].partitions)]
    sink = Process(kafka_bootstrap, "sink", int(uuid.uuid4().hex[:5], 16) + 3_000_000, tmpfs_dir, tmp_path, 0, 500)
    try:
        with symbolizer(kafka_bootstrap, sym_group) as sym, run.correlator() as corr:
            load.start()
            try:
                wait_for(lambda: sink.taken() > 0, timeout=90, what="the sink writing", running=[sym, corr])
                with ReadOnly(tmpfs_dir):
                    down = time.monotonic()
                    wait_for(lambda: sink.check_alive() or "store write failed" in sink.log.read_text(),
                             timeout=OUTAGE_S, what="the sink failing to write", running=[sym, corr])
                    held = committed(kafka_bootstrap, "fleetprof-sink", sink_inputs)
                    while time.monotonic() - down < OUTAGE_S:  # the outage lasts its time whatever happens
                        sink.check_alive()
                        time.sleep(0.5)
                    # nothing was committed while nothing could be written
                    assert committed(kafka_bootstrap, "fleetprof-sink", sink_inputs) == held
                    retries_during = store_retries(sink)
                    failed_lines = sink.log.read_text().count("store write failed")
            finally:
                load.halt.set()
                load.join(60)
            assert load.error is None, load.error
            drain(kafka_bootstrap, out_starts, prefix, run.node, load, sink)
        retries_after = store_retries(sink)
        assert sink.stop(signal.SIGTERM) == 0, sink.log.read_text()
    finally:
        sink.close()
    log = sink.log.read_text()
    print(f"\nsent {load.windows} CPU windows x {len(nodes)} nodes and {load.pairs} GPU pairs; {failed_lines} failed "
          f"writes logged in the {OUTAGE_S:.0f} s outage, {retries_after:.0f} retries")
    assert retries_after >= retries_during >= 3  # retried again and again through the outage
    assert failed_lines >= 3 and "Read-only file system" in log

    assert stored_cpu(tmpfs_dir, prefix) == load.cpu
    gpu_ns, launches = stored_gpu(tmpfs_dir, run.node)
    assert gpu_ns == load.gpu and launches == load.launches
    # an insert that failed part way (the window table written, its view's target not) left no hole in the rollups
    assert stored_cpu(tmpfs_dir, prefix, "cpu_samples_1h") == load.cpu
    assert stored_gpu(tmpfs_dir, run.node, "gpu_kernel_samples_1h") == (load.gpu, load.launches)
    assert stored_unmatched(tmpfs_dir, run.node) == 0
    # and the store came back whole: no part was found broken and set aside
    assert list((tmpfs_dir / "chdb" / "data" / DEFAULT_DATABASE).glob("*/detached/*")) == []
    assert dead_letters_for(kafka_bootstrap, dead_start, run.id) == []
