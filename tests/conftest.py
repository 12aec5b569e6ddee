"""Fixtures shared by the test modules; each area keeps its own under a `# --- <area> ---` heading."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from fleetprof.broker import BrokerError, LocalBroker, create_topics, ensure_jars, find_java

# --- Kafka ---


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports on 127.0.0.1 that nobody listens on right now."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:  # all bound at once, so the kernel hands out distinct ports
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]


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
