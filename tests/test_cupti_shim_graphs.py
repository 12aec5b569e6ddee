"""The long CUDA graph replay of issue 16 (parcagpu#23: GPU memory growth and invalid timestamps after ~25M records
of vLLM's graph replays): 25M graph kernel records through the CUPTI shim on the simulated libcupti, with every record
on (FLEETPROF_CUPTI_ACTIVITY=always, the heaviest case), driven from C (tests/cupti_graph_replay.c) so it takes
seconds. Simulated: no GPU; the records are the simulated libcupti's."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from producers.cupti_shim import build_shim
from simulate.cupti import SHIM_COUNTERS, build_simulated_cupti, symbol_offset
from tests.elf_helpers import gcc_build
from tests.usdt_probes import built

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def replay(tmp_path_factory: pytest.TempPathFactory) -> Any:
    shim, cupti = built(build_shim), built(build_simulated_cupti)
    program = gcc_build(tmp_path_factory.mktemp("replay"), "cupti_graph_replay",
                        (HERE / "cupti_graph_replay.c").read_text(), "-O2", "-ldl")
    semaphore = symbol_offset(shim, "fleetprof_kernel_launch_semaphore")[0]
    counters, size = symbol_offset(shim, "shim_counters")
    assert size == 8 * len(SHIM_COUNTERS)

    def run(launches: int, nodes: int, flush_every: int, env: dict[str, str]) -> dict[str, Any]:
        done = subprocess.run([str(program), str(cupti), str(shim), str(semaphore), str(counters),
                               str(len(SHIM_COUNTERS)), str(launches), str(nodes), str(flush_every)],
                              capture_output=True, text=True, timeout=110,
                              env={**{k: v for k, v in os.environ.items() if not k.startswith("FLEETPROF_")},
                                   "FLEETPROF_CUPTI_LIBRARY": str(cupti), "FLEETPROF_CUPTI_ACTIVITY": "always", **env})
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        out["shim"] = dict(zip(SHIM_COUNTERS, out.pop("counters"), strict=True))
        out["stderr"] = done.stderr
        return out

    return run


@pytest.mark.parametrize("activity", ["always", "sampled"])
def test_25m_graph_kernel_records_stay_exact_bounded_and_plausible(replay: Any, activity: str) -> None:
    # always: every record on, most read only to be counted as skipped (the default graph rate limit);
    # sampled with every graph launch sampled: each launch holds records on for its whole replay, 25,000 times
    launches, nodes = 25_000, 1_000  # 25M kernel records
    env = {"FLEETPROF_CUPTI_ACTIVITY": "sampled", "FLEETPROF_GRAPH_LAUNCH_RATE": "0"} if activity == "sampled" else {}
    run = replay(launches, nodes, flush_every=16, env=env)  # ~3.2 MiB of records between flushes, 16 MiB of pool
    shim = run["shim"]
    # totals exact: every record the simulated CUPTI generated was delivered and read, none dropped
    assert run["generated"] == run["delivered"] == shim["kernels"] == shim["graph_kernels"] == launches * nodes
    assert (run["dropped"], shim["records_dropped"], shim["buffers_refused"]) == (0, 0, 0)
    assert shim["graph_launches"] == shim["launches"] == launches
    if activity == "always":
        assert 0 < shim["graph_launches_sampled"] < launches  # FLEETPROF_GRAPH_LAUNCH_RATE's default, 100/s
    else:
        assert shim["graph_launches_sampled"] == shim["activity_enables"] == launches
    assert shim["kernels_skipped"] == nodes * (launches - shim["graph_launches_sampled"])
    assert (shim["kernels_unseen"], shim["kernels_incomplete"]) == (0, 0)
    # no record had a timestamp outside its plausible window (end >= start, not before CUPTI came on, not after its
    # delivery), and the GPU time read is the generated one to the nanosecond
    assert shim["records_implausible"] == 0
    assert shim["gpu_ns"] == run["generated_ns"] == launches * nodes * 1000
    # memory: the pool and the correlation table are fixed; nothing grows with the records
    assert run["rss_end_kb"] - run["rss_warm_kb"] < 2048, run
    assert run["seconds"] < 90


def test_a_dry_pool_drops_and_counts_without_growing(replay: Any) -> None:
    # two 64 KiB buffers and nobody flushing: CUPTI drops what does not fit, and says so
    run = replay(200, 1_000, flush_every=0, env={"FLEETPROF_CUPTI_BUFFERS": "2", "FLEETPROF_CUPTI_BUFFER_KB": "64",
                                                  "FLEETPROF_CUPTI_FLUSH_MS": "60000"})
    shim = run["shim"]
    assert run["generated"] + run["dropped"] == 200_000
    assert shim["kernels"] == run["generated"] == 2 * (64 * 1024 // 208)
    assert shim["records_dropped"] == run["dropped"] and shim["buffers_refused"] >= 1
    assert shim["records_implausible"] == 0
    assert "raise FLEETPROF_CUPTI_BUFFERS (now 2)" in run["stderr"]
