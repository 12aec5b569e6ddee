"""NCCL collectives hidden, isolated and labelled: `fleetprof query top|flamegraph --kind gpu --collectives` and the
web UI's collectives parameter, over known rows in chDB."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import httpx
import pytest

from tests.test_query_cli import base_args, run_here, silent_address
from tests.webui_helpers import cli_export, serving_window, stacks_of

GEMM = "ampere_sgemm_128x64_nn"
ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
ALL_GATHER = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
ALL_REDUCE_LABEL = "[nccl AllReduce bfloat16] ncclDevKernel_AllReduce_Sum_bf16_RING_LL"
ALL_GATHER_LABEL = "[nccl AllGather] ncclDevKernel_AllGather_RING_LL"
# GPU time per launching stack, the kernel last as a profile names it
GEMM_STACK = {f"main;backward;{GEMM}": 6_000_000}
NCCL_STACKS = {f"main;backward;ncclGroupEnd;{ALL_REDUCE_LABEL}": 3_000_000,
               f"main;ncclGroupEnd;{ALL_GATHER_LABEL}": 1_000_000}


@pytest.fixture(scope="module")
def job(module_store) -> Iterator[SimpleNamespace]:
    """module_store with one training process's GPU time on n1 (pid 10, comm train) over [since, until): a GEMM
    (6 ms) and two NCCL collectives (3 ms, 1 ms), stored as CUPTI names them (mangled); and the API serving it."""
    now = datetime.now(tz=UTC).replace(microsecond=0)
    since = now - timedelta(hours=1, seconds=now.second % 10)
    frames = [[1, "main", "app", "NATIVE", since], [2, "backward", "app", "NATIVE", since],
              [3, "ncclGroupEnd", "libnccl.so.2", "NATIVE", since], [7, GEMM, "[gpu]", "GPU_KERNEL", since],
              [8, ALL_REDUCE, "[gpu]", "GPU_KERNEL", since], [9, ALL_GATHER, "[gpu]", "GPU_KERNEL", since]]
    stacks = [[200, [1, 2, 7], since], [201, [1, 2, 3, 8], since], [202, [1, 3, 9], since]]
    gpu = [[since, "n1", 10, "train", "", 0, 7, 200, GEMM, 6_000_000, 3],
           [since, "n1", 10, "train", "", 0, 8, 201,
            "_Z40ncclDevKernel_AllReduce_Sum_bf16_RING_LL24ncclDevKernelArgsStorageILm4096EE", 3_000_000, 2],
           [since, "n1", 10, "train", "", 0, 8, 202,
            "_Z31ncclDevKernel_AllGather_RING_LL24ncclDevKernelArgsStorageILm4096EE", 1_000_000, 1]]
    module_store.insert("frames", frames, ["frame_id", "function", "binary", "kind", "last_seen"])
    module_store.insert("stacks", stacks, ["stack_id", "frame_ids", "last_seen"])
    module_store.insert("gpu_kernel_samples", gpu, ["ts", "node", "pid", "comm", "container_id", "device", "stream",
                                                    "stack_id", "kernel_name", "duration_ns", "launches"])
    with serving_window(module_store, since) as served:
        yield served


def top(job, *extra: str) -> list[dict]:
    result = run_here([*base_args(job), "query", "top", "--kind", "gpu", "--since", str(job.t0), "--until",
                       str(job.t1), "--format", "json", *extra], silent_address())
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_top_labels_nccl_kernels_and_keeps_their_names(job):
    rows = top(job)
    assert [(r["function"], r["self"], r["total"], r["kernel"]) for r in rows] == [
        (GEMM, 6_000_000, 6_000_000, GEMM),
        (ALL_REDUCE_LABEL, 3_000_000, 3_000_000, ALL_REDUCE),
        (ALL_GATHER_LABEL, 1_000_000, 1_000_000, ALL_GATHER),
        ("main", 0, 10_000_000, ""),
        ("backward", 0, 9_000_000, ""),
        ("ncclGroupEnd", 0, 4_000_000, "")]
    table = run_here([*base_args(job), "query", "top", "--kind", "gpu", "--since", str(job.t0), "--until",
                      str(job.t1)], silent_address())
    assert f"{ALL_REDUCE_LABEL}  [gpu]" in table.stdout and "30.0%" in table.stdout


def test_top_hides_or_isolates_collectives(job):
    # shares are of what is shown: the totals leave out what the rows leave out
    assert [(r["function"], r["self"], r["total"], r["share"]) for r in top(job, "--collectives", "only")] == [
        (ALL_REDUCE_LABEL, 3_000_000, 3_000_000, 0.75), (ALL_GATHER_LABEL, 1_000_000, 1_000_000, 0.25),
        ("main", 0, 4_000_000, 0.0), ("ncclGroupEnd", 0, 4_000_000, 0.0), ("backward", 0, 3_000_000, 0.0)]
    assert [(r["function"], r["self"], r["total"], r["share"]) for r in top(job, "--collectives", "hide")] == [
        (GEMM, 6_000_000, 6_000_000, 1.0), ("backward", 0, 6_000_000, 0.0), ("main", 0, 6_000_000, 0.0)]


def test_flamegraph_labels_hides_or_isolates_collectives(job):
    def folded(*extra: str) -> dict[str, int]:
        text = cli_export(job, "folded", job.t0, job.t1, "--kind", "gpu", "--merge-processes", *extra).decode()
        return {line.rsplit(" ", 1)[0]: int(line.rsplit(" ", 1)[1]) for line in text.splitlines()}

    assert folded() == {**GEMM_STACK, **NCCL_STACKS}
    assert folded("--collectives", "only") == NCCL_STACKS
    assert folded("--collectives", "hide") == GEMM_STACK
    per_process = cli_export(job, "folded", job.t0, job.t1, "--kind", "gpu", "--collectives", "only", "--node", "n1")
    assert per_process.decode() == "".join(f"train (pid 10);{stack} {n}\n" for stack, n in NCCL_STACKS.items())


def test_collectives_go_with_gpu_only(job):
    result = run_here([*base_args(job), "query", "flamegraph", "--kind", "cpu", "--collectives", "hide"],
                      silent_address())
    assert result.exit_code == 2 and "--collectives picks NCCL kernels: it goes with --kind gpu" in result.stderr
    result = run_here([*base_args(job), "query", "top", "--kind", "gpu", "--collectives", "some"], silent_address())
    assert result.exit_code == 2 and "'some' is not one of 'all', 'hide', 'only'" in result.stderr


def test_an_empty_answer_says_what_it_found_none_of(job):
    later = [str(job.t1 + 60), "--until", str(job.t1 + 70)]
    result = run_here([*base_args(job), "query", "top", "--kind", "gpu", "--collectives", "only", "--since", *later],
                      silent_address())
    until = datetime.fromtimestamp(job.t1 + 70, tz=UTC)
    assert result.stderr.endswith(f"to {until.isoformat()}\n")
    assert result.stderr.startswith("0 rows: no GPU kernel time in NCCL collectives from ")


def test_the_ui_flame_graph_hides_or_isolates_collectives(job):
    window = {"since": job.t0, "until": job.t1, "kind": "gpu", "node": "n1"}
    with httpx.Client(base_url=job.url, timeout=30) as http:
        def stacks(**params) -> dict[str, int]:
            answer = http.get("/api/flamegraph", params={**window, **params})
            assert answer.status_code == 200, answer.text
            return {stack.removeprefix("train (pid 10);"): n for stack, n in stacks_of(answer.json()).items()}

        assert stacks() == {**GEMM_STACK, **NCCL_STACKS}
        assert stacks(collectives="only") == NCCL_STACKS
        assert stacks(collectives="hide") == GEMM_STACK
        answer = http.get("/api/flamegraph", params={**window, "collectives": "only"}).json()
        assert answer["filters"]["collectives"] == "only" and answer["total"] == 4_000_000
        diff = http.get("/api/flamegraph/diff", params={**window, "collectives": "hide", "base_since": job.t0,
                                                        "base_until": job.t1}).json()
        assert diff["total"] == diff["base_total"] == 6_000_000
        export = http.get("/api/export", params={**window, "format": "folded", "collectives": "only"})
        assert export.content == cli_export(job, "folded", job.t0, job.t1, "--kind", "gpu", "--node", "n1",
                                            "--collectives", "only")
        for params, needle in [({**window, "collectives": "some"}, "collectives must be one of all, hide, only"),
                               ({**window, "kind": "cpu", "collectives": "hide"}, "it goes with kind=gpu")]:
            answer = http.get("/api/flamegraph", params=params)
            assert answer.status_code == 400 and needle in answer.json()["error"]
        # CPU flame graphs and the charts take no collectives, and say nothing of them
        assert http.get("/api/flamegraph", params={**window, "kind": "cpu", "collectives": "all"}).status_code == 200
