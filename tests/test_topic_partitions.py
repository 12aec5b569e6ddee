"""Topic partition counts: the defaults sized for 10,000 nodes, and the environment overrides (schemas/topics.py)."""

from __future__ import annotations

import pytest

from schemas import topics


def test_defaults_are_sized_for_a_fleet() -> None:
    counts = topics.partition_counts({})
    assert counts == {"cpu.stacks": 48, "gpu.launches": 48, "gpu.kernels": 48, "gpu.metrics": 24, "symbols": 3,
                      "identities": 3, "cpu.samples": 24, "gpu.samples": 24, "correlate.state": 12,
                      "alerts.state": 12, "alerts": 1, "deadletter": 1}


def test_one_setting_for_every_partitioned_topic_and_one_per_topic_over_it() -> None:
    env = {"FLEETPROF_PARTITIONS": "8", "FLEETPROF_PARTITIONS_GPU_LAUNCHES": "16",
           "FLEETPROF_PARTITIONS_GPU_KERNELS": " 16 ", "FLEETPROF_PARTITIONS_DEADLETTER": "2"}
    counts = topics.partition_counts(env)
    assert counts["gpu.launches"] == counts["gpu.kernels"] == 16
    assert counts["deadletter"] == 2  # a one-partition topic changes only by its own variable
    assert counts["alerts"] == 1
    assert {counts[t.name] for t in topics.ALL if t.name not in ("gpu.launches", "gpu.kernels", "alerts",
                                                                   "deadletter")} == {8}
    assert topics.GPU_SAMPLES.env_name == "FLEETPROF_PARTITIONS_GPU_SAMPLES"
    assert topics.CORRELATE_STATE.env_name == "FLEETPROF_PARTITIONS_CORRELATE_STATE"


@pytest.mark.parametrize("env, words", [
    ({"FLEETPROF_PARTITIONS": "many"}, "FLEETPROF_PARTITIONS='many' is not a whole number"),
    ({"FLEETPROF_PARTITIONS_CPU_STACKS": "0"}, "FLEETPROF_PARTITIONS_CPU_STACKS='0' must be from 1 to 10000"),
    ({"FLEETPROF_PARTITIONS_GPU_KERNELS": "12"}, "gpu.launches has 48 partitions and gpu.kernels 12"),
])
def test_bad_settings_name_their_variable(env: dict[str, str], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        topics.partition_counts(env)


def test_a_topic_reads_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETPROF_PARTITIONS", "5")
    monkeypatch.delenv("FLEETPROF_PARTITIONS_CPU_STACKS", raising=False)
    monkeypatch.setenv("FLEETPROF_PARTITIONS_GPU_METRICS", "7")
    assert topics.CPU_STACKS.partitions == 5
    assert topics.GPU_METRICS.partitions == 7
    assert topics.ALERTS.partitions == 1


def test_create_topics_refuses_a_bad_setting_before_asking_the_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    from fleetprof.broker import BrokerError, create_topics

    monkeypatch.setenv("FLEETPROF_PARTITIONS_GPU_LAUNCHES", "7")
    monkeypatch.setenv("FLEETPROF_PARTITIONS_GPU_KERNELS", "8")
    with pytest.raises(BrokerError, match="gpu.launches has 7 partitions and gpu.kernels 8"):
        create_topics("127.0.0.1:1", timeout=1)
