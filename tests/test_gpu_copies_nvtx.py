"""Memory copies and NVTX ranges in the GPU profile (issue 16): `fleetprof query top|flamegraph --kind gpu --what
--nvtx-range --nvtx-level`, the same through the UI's API, and the named queries gpu_copy_bytes_by_stack,
gpu_time_by_nvtx_range and gpu_time_by_nvtx_element, over rows the sink builds from one GpuSamples v3 record in chDB.
Exact answers, worked out by hand below."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import httpx
import pytest

from fleetprof.gpu_filters import nvtx_frames, nvtx_range_matches
from processors.messages import Message
from processors.sink import rows_for
from tests.test_query_cli import base_args, run_here, silent_address
from tests.webui_helpers import cli_export, pprof_stacks, serving_window, stacks_of

MS = 1_000_000
# frame id -> (function, binary, kind); stack id -> frame ids, root first, the kernel or copy label last
FRAMES = {1: ("main", "train.py", "INTERPRETED"), 2: ("step", "train.py", "INTERPRETED"),
          3: ("to_device", "train.py", "INTERPRETED"), 4: ("launch", "libtorch.so", "NATIVE"),
          10: ("gemm", "[gpu]", "GPU_KERNEL"), 11: ("[memcpy HtoD]", "[gpu]", "GPU_KERNEL"),
          12: ("[memset]", "[gpu]", "GPU_KERNEL"), 13: ("[memcpy DtoH]", "[gpu]", "GPU_KERNEL")}
STACKS = {100: [1, 2, 4, 10], 101: [1, 3, 11], 102: [1, 2, 4, 12], 103: [1, 2, 13]}
# (stack, kernel, NVTX range path, GPU ns, launches, bytes, memory kinds) of one process (n1, pid 10, train)
SAMPLES = [(100, "gemm", "step > forward", 6 * MS, 3, 0, ""),
           (100, "gemm", "step > backward", 4 * MS, 2, 0, ""),
           (101, "[memcpy HtoD]", "step > forward", 1 * MS, 2, 8_000_000, "pinned>device"),
           (102, "[memset]", "step > backward", MS // 2, 1, 1000, "device"),
           (103, "[memcpy DtoH]", "", 2 * MS, 1, 4_000_000, "device>pageable"),
           (100, "gemm", "optimizer.step", 3 * MS // 2, 1, 0, ""),
           (100, "gemm", "step > forward2", MS // 4, 1, 0, "")]
LAUNCH = "main;step;launch"


def record(node: str, pid: int, window_start_ns: int) -> dict:
    frames = [{"frame_id": i, "function": f, "binary": b, "kind": k, "build_id": ""} for i, (f, b, k) in FRAMES.items()]
    stacks = [{"stack_id": s, "frame_ids": ids} for s, ids in STACKS.items()]
    samples = [{"pid": pid, "comm": "train", "container_id": "", "device": 0, "stream": 7, "stack_id": stack,
                "kernel_name": kernel, "duration_ns": ns, "launches": n, "nvtx_range": path, "bytes": moved,
                "memory_kinds": kinds} for stack, kernel, path, ns, n, moved, kinds in SAMPLES]
    return {"node": node, "window_start_ns": window_start_ns, "window_ns": 10**10, "frames": frames, "stacks": stacks,
            "samples": samples, "unmatched": [], "timeline": [], "simulated": True}


def store_record(store, rec: dict, offset: int) -> None:
    rows = rows_for([Message("gpu.samples", 0, offset, None, "fleetprof.GpuSamples", rec)])
    for table, found in rows.items():
        store.insert(table, found.as_rows(), found.columns, dedup_token=f"gpu.samples:0:{offset}:{table}")


@pytest.fixture(scope="module")
def job(module_store) -> Iterator[SimpleNamespace]:
    """module_store with SAMPLES of n1's pid 10 in one window an hour ago, and the API serving it."""
    now = datetime.now(tz=UTC).replace(microsecond=0)
    since = now - timedelta(hours=1, seconds=now.second % 10)
    store_record(module_store, record("n1", 10, int(since.timestamp()) * 10**9), 0)
    with serving_window(module_store, since) as served:
        yield served


def cli(job, *args: str) -> str:
    result = run_here([*base_args(job), "query", *args, "--kind", "gpu", "--since", str(job.t0), "--until",
                       str(job.t1)], silent_address())
    assert result.exit_code == 0, result.output
    return result.stdout


def top(job, *extra: str) -> dict[str, tuple[int, int]]:
    """`query top --kind gpu` as function -> (self, total)."""
    return {r["function"]: (r["self"], r["total"]) for r in json.loads(cli(job, "top", "--format", "json", *extra))}


def folded(job, *extra: str) -> dict[str, int]:
    lines = cli(job, "flamegraph", "--format", "folded", *extra).splitlines()
    return {line.rsplit(" ", 1)[0]: int(line.rsplit(" ", 1)[1]) for line in lines}


def named(job, name: str, **params) -> list[tuple]:
    return [tuple(r) for r in job.store.query_named(name, {"since": job.since, "until": job.until, **params})[1]]


# --- the range rule -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "wanted", "matches"), [
    ("step > forward", "forward", True), ("forward > attention", "forward", True),
    ("step > forward2", "forward", False),
    ("step > forward > attention", "step > forward", True), ("step > forward2", "step > forward", False),
    ("outer > step > forward", "step > forward", False), ("", "forward", False), ("", "", True),
    ("nccl:AllReduce", "nccl:AllReduce", True), ("step > forward", "Forward", False)])
def test_the_range_rule(path, wanted, matches):
    assert nvtx_range_matches(path, wanted) is matches


def test_the_sql_applies_the_range_rule(job):
    for wanted in ("", "forward", "step", "step > forward", "forward2", "step > backward", "optimizer.step", "nope"):
        want = sum(ns for _, _, path, ns, *_ in SAMPLES if nvtx_range_matches(path, wanted))
        got = named(job, "totals_gpu", nvtx_range=wanted)
        assert got == ([("n1", want, sum(n for _, _, path, _, n, *_ in SAMPLES if nvtx_range_matches(path, wanted)))]
                       if want else []), wanted


# --- query top / flamegraph -----------------------------------------------------------------------------------------


def test_top_shows_copies_as_leaves_and_what_picks_them(job):
    assert top(job) == {"gemm": (11_750_000, 11_750_000), "[memcpy DtoH]": (2 * MS, 2 * MS),
                        "[memcpy HtoD]": (MS, MS), "[memset]": (MS // 2, MS // 2), "main": (0, 15_250_000),
                        "step": (0, 14_250_000), "launch": (0, 12_250_000), "to_device": (0, MS)}
    assert top(job, "--what", "copies") == {"[memcpy DtoH]": (2 * MS, 2 * MS), "[memcpy HtoD]": (MS, MS),
                                            "[memset]": (MS // 2, MS // 2), "main": (0, 3_500_000),
                                            "step": (0, 2_500_000), "to_device": (0, MS), "launch": (0, MS // 2)}
    assert top(job, "--what", "kernels") == {"gemm": (11_750_000, 11_750_000), "main": (0, 11_750_000),
                                             "step": (0, 11_750_000), "launch": (0, 11_750_000)}
    shares = {r["function"]: r["share"] for r in json.loads(cli(job, "top", "--format", "json", "--what", "copies"))}
    assert shares["[memcpy DtoH]"] == 2 / 3.5  # of what is shown


def test_top_and_flamegraph_under_an_nvtx_range(job):
    assert top(job, "--nvtx-range", "forward") == {"gemm": (6 * MS, 6 * MS), "[memcpy HtoD]": (MS, MS),
                                                   "main": (0, 7 * MS), "step": (0, 6 * MS), "launch": (0, 6 * MS),
                                                   "to_device": (0, MS)}
    assert folded(job, "--merge-processes", "--nvtx-range", "step > backward", "--what", "copies") == {
        f"{LAUNCH};[memset]": MS // 2}
    assert folded(job, "--merge-processes", "--nvtx-range", "forward2") == {f"{LAUNCH};gemm": MS // 4}


def test_the_nvtx_level_puts_ranges_between_the_root_and_the_launching_stack(job):
    merged = {f"[nvtx] step;[nvtx] forward;{LAUNCH};gemm": 6 * MS,
              f"[nvtx] step;[nvtx] backward;{LAUNCH};gemm": 4 * MS,
              f"[nvtx] optimizer.step;{LAUNCH};gemm": 3 * MS // 2,
              "main;step;[memcpy DtoH]": 2 * MS,
              "[nvtx] step;[nvtx] forward;main;to_device;[memcpy HtoD]": MS,
              f"[nvtx] step;[nvtx] backward;{LAUNCH};[memset]": MS // 2,
              f"[nvtx] step;[nvtx] forward2;{LAUNCH};gemm": MS // 4}
    assert folded(job, "--merge-processes", "--nvtx-level") == merged
    assert folded(job, "--nvtx-level", "--node", "n1") == {f"train (pid 10);{k}": v for k, v in merged.items()}
    assert folded(job, "--merge-processes", "--nvtx-level", "--nvtx-range", "step > forward", "--what",
                  "kernels") == {f"[nvtx] step;[nvtx] forward;{LAUNCH};gemm": 6 * MS}
    # pprof: the process in labels, the range frames in the stacks
    pprof = cli_export(job, "pprof", job.t0, job.t1, "--kind", "gpu", "--node", "n1", "--nvtx-level")
    assert pprof_stacks(pprof) == merged
    # without the level the ranges' time adds up per stack
    assert folded(job, "--merge-processes")[f"{LAUNCH};gemm"] == 11_750_000
    assert nvtx_frames("step > forward") == ["[nvtx] step", "[nvtx] forward"]


def test_the_options_go_with_gpu_only(job):
    for extra, needle in [(["--what", "copies"], "--what picks kernels or copies: it goes with --kind gpu"),
                          (["--nvtx-range", "x"], "--nvtx-range picks GPU time by NVTX range: it goes with"),
                          (["--what", "bytes"], "'bytes' is not one of 'all', 'kernels', 'copies'")]:
        result = run_here([*base_args(job), "query", "top", *extra], silent_address())
        assert result.exit_code == 2 and needle in result.stderr, result.output
    result = run_here([*base_args(job), "query", "flamegraph", "--nvtx-level"], silent_address())
    assert result.exit_code == 2 and "--nvtx-level shows NVTX ranges of GPU time" in result.stderr


def test_an_empty_answer_says_what_it_found_none_of(job):
    result = run_here([*base_args(job), "query", "top", "--kind", "gpu", "--since", str(job.t0), "--until",
                       str(job.t1), "--what", "copies", "--nvtx-range", "optimizer.step"], silent_address())
    assert result.exit_code == 0
    assert result.stderr.startswith("0 rows: no GPU time in memory copies and sets under NVTX range "
                                    "'optimizer.step' from ")


# --- the UI's API ---------------------------------------------------------------------------------------------------


def test_the_ui_flame_graph_takes_what_and_nvtx(job):
    window = {"since": job.t0, "until": job.t1, "kind": "gpu", "node": "n1"}
    with httpx.Client(base_url=job.url, timeout=30) as http:
        def get(**params) -> dict:
            answer = http.get("/api/flamegraph", params={**window, **params})
            assert answer.status_code == 200, answer.text
            return answer.json()

        level = get(nvtx_level=1)
        export = cli_export(job, "folded", job.t0, job.t1, "--kind", "gpu", "--node", "n1", "--nvtx-level")
        assert stacks_of(level) == {line.rsplit(" ", 1)[0]: int(line.rsplit(" ", 1)[1])
                                    for line in export.decode().splitlines()}
        assert level["filters"] == {"node": "n1", "pid": 0, "comm": "", "collectives": "all", "what": "all",
                                    "nvtx_range": "", "nvtx_level": 1, "namespace": "", "pod": "", "job": "",
                                    "container": ""}
        languages = dict(zip(level["frames"], (level["languages"][i] for i in level["frame_language"]), strict=True))
        assert languages["[nvtx] forward"] == "nvtx" and languages["gemm"] != "nvtx"
        assert stacks_of(get(what="copies", nvtx_range="forward")) == {
            "train (pid 10);main;to_device;[memcpy HtoD]": MS}
        assert get(what="kernels")["total"] == 11_750_000
        download = http.get("/api/export", params={**window, "format": "folded", "nvtx_level": 1, "what": "kernels"})
        assert download.content == cli_export(job, "folded", job.t0, job.t1, "--kind", "gpu", "--node", "n1",
                                              "--nvtx-level", "--what", "kernels")
        for params, needle in [({"what": "bytes"}, "what must be one of all, kernels, copies"),
                               ({"nvtx_level": "2"}, "nvtx_level must be 0 or 1"),
                               ({"kind": "cpu", "nvtx_range": "forward"}, "they go with kind=gpu")]:
            answer = http.get("/api/flamegraph", params={**window, **params})
            assert answer.status_code == 400 and needle in answer.json()["error"], answer.text


# --- named queries --------------------------------------------------------------------------------------------------


def test_time_and_bytes_moved_per_launching_stack(job):
    # stack, gpu_ns, kernel_ns, copy_ns, bytes, htod, dtoh, set, copies, bytes_per_s
    assert named(job, "gpu_copy_bytes_by_stack") == [
        (LAUNCH, 12_250_000, 11_750_000, MS // 2, 1000, 0, 0, 1000, 1, 1000 / 0.0005),
        ("main;step", 2 * MS, 0, 2 * MS, 4_000_000, 0, 4_000_000, 0, 1, 4_000_000 / 0.002),
        ("main;to_device", MS, 0, MS, 8_000_000, 8_000_000, 0, 0, 2, 8_000_000 / 0.001)]
    assert named(job, "gpu_copy_bytes_by_stack", nvtx_range="forward", limit=1) == [
        (LAUNCH, 6 * MS, 6 * MS, 0, 0, 0, 0, 0, 0, 0.0)]
    assert named(job, "gpu_copy_bytes_by_stack", pid=11) == []


def test_gpu_time_per_nvtx_range_path(job):
    total = 15_250_000
    # node, pid, comm, nvtx_range, gpu_ns, kernel_ns, copy_ns, launches, share
    assert named(job, "gpu_time_by_nvtx_range") == [
        ("n1", 10, "train", "step > forward", 7 * MS, 6 * MS, MS, 5, 7 * MS / total),
        ("n1", 10, "train", "step > backward", 4_500_000, 4 * MS, MS // 2, 3, 4_500_000 / total),
        ("n1", 10, "train", "", 2 * MS, 0, 2 * MS, 1, 2 * MS / total),
        ("n1", 10, "train", "optimizer.step", 1_500_000, 1_500_000, 0, 1, 1_500_000 / total),
        ("n1", 10, "train", "step > forward2", MS // 4, MS // 4, 0, 1, MS // 4 / total)]
    assert named(job, "gpu_time_by_nvtx_range", nvtx_range="step > forward") == [
        ("n1", 10, "train", "step > forward", 7 * MS, 6 * MS, MS, 5, 1.0)]


def test_gpu_time_per_nvtx_range_element(job):
    total = 15_250_000
    # node, pid, comm, nvtx_range, total_ns, self_ns, launches, share
    assert named(job, "gpu_time_by_nvtx_element") == [
        ("n1", 10, "train", "step", 11_750_000, 0, 9, 11_750_000 / total),
        ("n1", 10, "train", "forward", 7 * MS, 7 * MS, 5, 7 * MS / total),
        ("n1", 10, "train", "backward", 4_500_000, 4_500_000, 3, 4_500_000 / total),
        ("n1", 10, "train", "optimizer.step", 1_500_000, 1_500_000, 1, 1_500_000 / total),
        ("n1", 10, "train", "forward2", MS // 4, MS // 4, 1, MS // 4 / total)]
    assert named(job, "gpu_time_by_nvtx_element", node="n2") == []
