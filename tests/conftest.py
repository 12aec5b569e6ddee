"""Fixtures shared by the test modules; each area keeps its own under a `# --- <area> ---` heading."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from fleetprof.broker import BrokerError, LocalBroker, create_topics, ensure_jars, find_java

# --- Kafka ---

# The topics' default partition counts are sized for 10,000 nodes (48 for the raw inputs, schemas/topics.py): on the
# test machine's 2 cores that many partitions per broker (and per `fleetprof up` a test starts) only cost time, so
# the tests run on 6, and the correlator's inputs on 12 so that tests/test_correlate_scale_out.py can run more
# instances than the old 6-partition cap. The environment is inherited by the processes the tests start. A run can
# still choose its own counts by setting these variables.
os.environ.setdefault("FLEETPROF_PARTITIONS", "6")
os.environ.setdefault("FLEETPROF_PARTITIONS_GPU_LAUNCHES", "12")
os.environ.setdefault("FLEETPROF_PARTITIONS_GPU_KERNELS", "12")
os.environ.setdefault("FLEETPROF_PARTITIONS_SYMBOLS", "3")  # see schemas/topics.py
os.environ.setdefault("FLEETPROF_PARTITIONS_IDENTITIES", "3")


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports on 127.0.0.1 that nobody listens on right now."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:  # all bound at once, so the kernel hands out distinct ports
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]


def consecutive_free_port() -> int:
    """A free port p with p+1 also free: `fleetprof kafka` and `up` put the controller on port+1."""
    for _ in range(50):
        with socket.socket() as first, socket.socket() as second:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            try:
                second.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two consecutive free ports")


def _broker_unavailable(reason: str) -> None:
    # On CI a missing Java or jar is a broken runner, not a reason to quietly skip the real-broker tests.
    if os.environ.get("CI"):
        pytest.fail(f"local Kafka broker unavailable: {reason}")
    pytest.skip(f"local Kafka broker unavailable: {reason}")


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    """A real single-node Kafka broker for the whole session, with every fleetprof topic created."""
    try:
        find_java()
        ensure_jars()
    except BrokerError as exc:
        _broker_unavailable(str(exc))
    port, controller_port = free_ports(2)
    broker = LocalBroker(tmp_path_factory.mktemp("kafka"), port=port, controller_port=controller_port)
    try:
        broker.start()
        create_topics(broker.bootstrap)
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_broker: LocalBroker) -> str:
    """bootstrap.servers of the session's Kafka broker."""
    return kafka_broker.bootstrap


# --- ClickHouse ---


@pytest.fixture(scope="session")
def chdb_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[os.PathLike]:
    """The session's chDB data directory, `<data-dir>/chdb` (what Settings.clickhouse_dsn names for that data dir).

    chDB opens one directory per process, so every test's database lives in this one. A store is kept open for the
    whole session so that chDB's engine is not shut down and restarted between tests.
    """
    from fleetprof.store import open_store

    path = tmp_path_factory.mktemp("data") / "chdb"
    keeper = open_store(f"chdb://{path}", "default")
    try:
        yield path
    finally:
        keeper.close()


@pytest.fixture
def store(chdb_dir: os.PathLike, request: pytest.FixtureRequest) -> Iterator[object]:
    """A migrated Store on a database of this test's own inside the session's chDB directory."""
    import re
    import uuid

    from fleetprof.store import open_store

    name = f"t_{re.sub(r'[^A-Za-z0-9_]', '_', request.node.name)[:40]}_{uuid.uuid4().hex[:8]}"
    s = open_store(f"chdb://{chdb_dir}", name)
    try:
        s.migrate()
        yield s
    finally:
        s.close()


@pytest.fixture(scope="module")
def module_store(chdb_dir: os.PathLike, request: pytest.FixtureRequest) -> Iterator[object]:
    """A migrated Store shared by a module's tests (one agent window that several tests judge)."""
    import uuid

    from fleetprof.store import open_store

    s = open_store(f"chdb://{chdb_dir}", f"m_{request.module.__name__.rsplit('.', 1)[-1][:40]}_{uuid.uuid4().hex[:8]}")
    try:
        s.migrate()
        yield s
    finally:
        s.close()


@pytest.fixture
def cpu_store(store: object) -> object:
    """`store` holding a small known CPU profile in [since, until), ten seconds apart, an hour ago:

    n1 pid 10 comm train: main;run;compute x5, main;run;run;io x3      n2 pid 20 comm serve: main;idle x2
    Returned as a namespace: .store, .since, .until (aware UTC datetimes).
    """
    from datetime import UTC, datetime, timedelta
    from types import SimpleNamespace

    now = datetime.now(tz=UTC).replace(microsecond=0)
    since = now - timedelta(hours=1, seconds=now.second % 10)  # recent: older rows would fall to the 30-day TTL
    until = since + timedelta(seconds=30)
    frames = [[1, "main", "app", "NATIVE", since], [2, "run", "app", "NATIVE", since],
              [3, "compute", "app", "NATIVE", since], [4, "io", "libc.so.6", "NATIVE", since],
              [5, "idle", "app", "NATIVE", since]]
    stacks = [[100, [1, 2, 3], since], [101, [1, 2, 2, 4], since], [102, [1, 5], since]]
    samples = [[since, "n1", 10, "train", "", 100, 5], [since + timedelta(seconds=10), "n1", 10, "train", "", 101, 3],
               [since + timedelta(seconds=20), "n2", 20, "serve", "", 102, 2]]
    store.insert("frames", frames, ["frame_id", "function", "binary", "kind", "last_seen"])
    store.insert("stacks", stacks, ["stack_id", "frame_ids", "last_seen"])
    store.insert("cpu_samples", samples, ["ts", "node", "pid", "comm", "container_id", "stack_id", "count"])
    return SimpleNamespace(store=store, since=since, until=until)


# --- web UI ---


@pytest.fixture
def ui_store(store: object) -> object:
    """`store` with the web UI tests' known rows: tests/webui_helpers.py known_rows."""
    from tests.webui_helpers import known_rows

    return known_rows(store)


@pytest.fixture
def served(ui_store: object) -> Iterator[object]:
    """The API that `fleetprof up` serves (and the UI with it) over ui_store, on a free port: ui_store's namespace
    with .url and .address."""
    from types import SimpleNamespace

    from fleetprof.api import serve_api

    server = serve_api(ui_store.store, "127.0.0.1", 0)
    try:
        yield SimpleNamespace(**vars(ui_store), url=server.url, address=server.address)
    finally:
        server.stop()


# --- USDT probe emitters (tests/probe_emitters.py; test_usdt_notes, test_gpu_probes) ---


@pytest.fixture(scope="session")
def emitters(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The C programs firing fleetprof probes, built once (see tests/probe_emitters.py)."""
    from tests.probe_emitters import build_emitters

    return build_emitters(tmp_path_factory.mktemp("gpu_emitters"))


@pytest.fixture
def procs(tmp_path) -> Iterator[object]:
    """Emitters started by a test, closed after it, and a view of /proc holding only them."""
    from tests.probe_emitters import Procs

    view = tmp_path / "proc"
    view.mkdir()
    started = Procs(view)
    yield started
    for e in started.started:
        e.close()


@pytest.fixture(scope="session")
def bpf_ok() -> None:
    """Skips (fails on CI) unless BPF programs can load here."""
    from producers.cpu_sampler import BpfUnavailable, check_bpf
    from tests.elf_helpers import unavailable

    try:
        check_bpf()
    except BpfUnavailable as exc:
        unavailable(f"BPF unavailable: {exc}")
