"""The web UI's JSON endpoints over a real uvicorn and chDB store with known rows (tests/webui_helpers.py), and
`fleetprof ui` serving them through up's API."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx
import pytest

from fleetprof.flamegraph_formats import FORMATS
from fleetprof.query_client import StoreTarget
from fleetprof.settings import REPO_ROOT
from fleetprof.webui import model
from fleetprof.webui.routes import EXPORTS
from tests.webui_helpers import (
    FIRST_HALF_CPU,
    FIRST_HALF_GPU,
    SECOND_HALF_GPU,
    SERVE,
    TRAIN,
    cli_export,
    pprof_stacks,
    rooted,
    stacks_of,
)

# --- the endpoints --------------------------------------------------------------------------------------------------


def test_flamegraph_endpoints_return_exact_stacks(served):
    ui = served
    whole = {"since": ui.t0, "until": ui.t1}
    second = {"since": ui.t0 + 60, "until": ui.t1}
    with httpx.Client(base_url=ui.url, timeout=30) as http:
        body = http.get("/api/flamegraph", params=whole).json()
        # each process's stacks under a frame of its own, named as the exports name it (node too: all nodes)
        assert stacks_of(body) == {**rooted(FIRST_HALF_CPU, TRAIN), "train (pid 10 on n1);main;run;io": 18,
                                   "serve (pid 20 on n2);main;idle": 6}
        assert body["total"] == 54 and body["unit"] == "samples"
        binary_of = {body["frames"][i]: body["binaries"][b] for i, b in enumerate(body["frame_binary"])}
        assert binary_of == {TRAIN: "", SERVE: "", "main": "app", "run": "app", "compute": "app", "io": "libc.so.6",
                             "idle": "app"}
        language_of = {body["frames"][i]: body["languages"][k] for i, k in enumerate(body["frame_language"])}
        assert language_of[TRAIN] == language_of[SERVE] == "process" and language_of["main"] == "native"
        # labels follow the data: n2's CPU samples are loadgen's (simulated), n1's are real eBPF samples
        assert body["simulated"] == ["n2"]
        assert body["simulated_line"] == ("SIMULATED: CPU samples from node n2 come from fleetprof loadgen's "
                                          "simulated fleet")
        n1 = http.get("/api/flamegraph", params={**whole, "node": "n1"}).json()
        assert stacks_of(n1) == rooted({**FIRST_HALF_CPU, "main;run;io": 18}, "train (pid 10)")
        assert (n1["simulated"], n1["simulated_line"]) == ([], "")
        assert stacks_of(http.get("/api/flamegraph", params=second).json()) == {
            "train (pid 10 on n1);main;run;io": 18, "serve (pid 20 on n2);main;idle": 6}
        gpu = http.get("/api/flamegraph", params={**whole, "kind": "gpu"}).json()
        assert stacks_of(gpu) == rooted({**FIRST_HALF_GPU, **SECOND_HALF_GPU}, TRAIN) and gpu["unit"] == "ns"
        assert gpu["simulated"] == ["n1"]  # n1's GPU kernel times come from the simulated GPU library
        assert gpu["simulated_line"] == ("SIMULATED: GPU kernel times from node n1 come from fleetprof's simulated "
                                         "GPU library")
        n2 = http.get("/api/flamegraph", params={**whole, "node": "n2"}).json()
        assert stacks_of(n2) == {"serve (pid 20);main;idle": 6} and n2["simulated"] == ["n2"]
        assert stacks_of(http.get("/api/flamegraph", params={**whole, "pid": 10}).json()) == rooted(
            {**FIRST_HALF_CPU, "main;run;io": 18}, TRAIN)
        diff = http.get("/api/flamegraph/diff", params={**second, "base_since": ui.t0, "base_until": ui.t0 + 60})
        body = diff.json()
        assert stacks_of(body) == {f"{TRAIN};main;run;io": 18, f"{SERVE};main;idle": 6, f"{TRAIN};main;run;compute": 0}
        base = dict(zip(stacks_of(body), body["base_counts"], strict=True))
        assert base == {f"{TRAIN};main;run;io": 0, f"{SERVE};main;idle": 0, f"{TRAIN};main;run;compute": 30}
        assert (body["total"], body["base_total"]) == (24, 30)


def test_gpu_processes_without_a_command_are_named_from_cpu_samples(ui_store):
    """GPU rows carry no comm yet: the GPU flame graph names such a process by its command on CPU, as the export does
    (flamegraph_processes_gpu), and a process never sampled on CPU by its pid alone."""
    from datetime import UTC, datetime

    ts = datetime.fromtimestamp(ui_store.t0 + 5, tz=UTC)
    ui_store.store.insert("gpu_kernel_samples", [[ts, "n1", 10, "", "", 0, 7, 200, "gemm_kernel", 500, 1],
                                                 [ts, "n1", 77, "", "", 0, 7, 200, "gemm_kernel", 300, 1]],
                          ["ts", "node", "pid", "comm", "container_id", "device", "stream", "stack_id", "kernel_name",
                           "duration_ns", "launches"])
    target = StoreTarget(ui_store.store)
    window = {"since": datetime.fromtimestamp(ui_store.t0, tz=UTC), "until": datetime.fromtimestamp(ui_store.t1,
                                                                                                    tz=UTC)}
    params = {**window, "node": "n1"}
    answer = model.flamegraph_of_ids(model.StackIds.from_rows(target.named("flamegraph_ids_gpu", params)[1]),
                                     target.named("flamegraph_names_gpu", params)[1], one_node=True)
    assert stacks_of(answer) == {"train (pid 10);main;launch;gemm_kernel": 24_000_500,
                                 "train (pid 10);main;launch;nccl_allreduce": 6_000_000,
                                 "pid 77;main;launch;gemm_kernel": 300}


def test_timeseries_nodes_and_processes(served):
    ui = served
    with httpx.Client(base_url=ui.url, timeout=30) as http:
        ts = http.get("/api/timeseries", params={"since": ui.t0, "until": ui.t1}).json()
        assert (ts["since_ms"], ts["until_ms"], ts["step_ms"], ts["activity_step_ms"]) == (
            ui.t0 * 1000, ui.t1 * 1000, 1000, 10_000)
        assert ts["simulated"] == ["n1"] and ts["truncated"] is False  # n1's NVML readings; n2 has none
        assert ts["simulated_line"] == ("SIMULATED: GPU readings from node n1 come from fleetprof's simulated NVML "
                                        "library")
        assert http.get("/api/timeseries", params={"since": ui.t0, "until": ui.t1, "node": "n2"}).json()[
            "simulated"] == []
        [device] = ts["devices"]
        assert (device["node"], device["gpu_index"], device["uuid"], device["name"]) == ("n1", 0, "GPU-0001",
                                                                                           "Simulated H100")
        assert device["t"] == [(ui.t0 + s) * 1000 for s in range(120)]
        assert device["gpu_util_pct"] == [90] * 60 + [20] * 60
        assert device["power_mw"] == [300_000] * 60 + [120_000] * 60 and device["power_limit_mw"] == [400_000] * 120
        assert device["temperature_c"] == [71] * 60 + [52] * 60 and device["pcie_rx_kbps"] == [9 * 1024] * 120
        [proc] = ts["processes"]
        assert (proc["node"], proc["pid"], proc["comm"]) == ("n1", 10, "train")
        assert proc["sm_util_pct"] == [90] * 60 + [20] * 60
        assert ts["activity"]["cpu"] == {"t": [(ui.t0 + 10 * i) * 1000 for i in range(12)], "v": [5] * 6 + [4] * 6}
        assert ts["activity"]["gpu"]["v"] == [4_000_000] * 6 + [1_000_000] * 6
        # 2 hours in buckets of 15 s (epoch-aligned): each bucket averages the readings in it
        wide = http.get("/api/timeseries", params={"since": ui.t0 - 3600, "until": ui.t0 + 3600}).json()
        buckets: dict[int, list[int]] = {}
        for s in range(120):
            buckets.setdefault((ui.t0 + s) // 15 * 15_000, []).append(90 if s < 60 else 20)
        assert wide["step_ms"] == 15_000 and wide["devices"][0]["t"] == list(buckets)
        assert wide["devices"][0]["gpu_util_pct"] == [pytest.approx(sum(v) / len(v)) for v in buckets.values()]
        assert http.get("/api/nodes", params={"since": ui.t0, "until": ui.t1}).json() == {"nodes": [
            {"node": "n1", "cpu_samples": 48, "gpu_ns": 30_000_000, "gpus": 1, "simulated": True},
            {"node": "n2", "cpu_samples": 6, "gpu_ns": 0, "gpus": 0, "simulated": False}]}
        assert http.get("/api/processes", params={"since": ui.t0, "until": ui.t1}).json() == {"processes": [
            {"node": "n1", "pid": 10, "comm": "train", "cpu_samples": 48, "gpu_ns": 30_000_000, "kernel_thread": False},
            {"node": "n2", "pid": 20, "comm": "serve", "cpu_samples": 6, "gpu_ns": 0, "kernel_thread": False}]}
        assert http.get("/api/processes", params={"since": ui.t0, "until": ui.t1, "node": "n2"}).json()[
            "processes"] == [{"node": "n2", "pid": 20, "comm": "serve", "cpu_samples": 6, "gpu_ns": 0,
                              "kernel_thread": False}]


def test_exports_are_the_clis_bytes(served):
    ui = served
    since, until = ui.t0 + 60, ui.t1
    with httpx.Client(base_url=ui.url, timeout=30) as http:
        assert set(EXPORTS) == set(FORMATS)  # the UI offers every format the CLI writes
        for fmt in EXPORTS:
            response = http.get("/api/export", params={"since": since, "until": until, "format": fmt})
            assert response.status_code == 200
            assert response.content == cli_export(ui, fmt, since, until), fmt
        assert response.headers["content-disposition"].startswith('attachment; filename="fleetprof-cpu-')
        gpu = http.get("/api/export", params={"since": ui.t0, "until": ui.t1, "kind": "gpu", "format": "pprof",
                                              "node": "n1"})
        assert gpu.content == cli_export(ui, "pprof", ui.t0, ui.t1, "--kind", "gpu", "--node", "n1")
        assert pprof_stacks(gpu.content) == {**FIRST_HALF_GPU, **SECOND_HALF_GPU}
        folded = http.get("/api/export", params={"since": since, "until": until, "format": "folded"}).text
        assert folded == "train (pid 10 on n1);main;run;io 18\nserve (pid 20 on n2);main;idle 6\n"
        one_node = {"since": since, "until": until, "format": "folded", "node": "n1"}
        assert http.get("/api/export", params=one_node).text == "train (pid 10);main;run;io 18\n"
        for fmt in ("folded", "pprof", "html"):
            merged = http.get("/api/export", params={"since": since, "until": until, "format": fmt,
                                                     "processes": "merge"})
            assert merged.content == cli_export(ui, fmt, since, until, "--merge-processes"), fmt
        assert http.get("/api/export", params={"since": since, "until": until, "processes": "merge"}).text == \
            "main;run;io 18\nmain;idle 6\n"


def test_bad_parameters_are_one_line_400s(served):
    ui = served
    whole = {"since": ui.t0, "until": ui.t1}
    with httpx.Client(base_url=ui.url, timeout=30) as http:
        for path, params, needle in [
            ("/api/flamegraph", {**whole, "kind": "disk"}, "kind must be one of cpu, gpu"),
            ("/api/flamegraph", {**whole, "pid": "abc"}, "pid must be a process id"),
            ("/api/flamegraph", {**whole, "pid": "²"}, "pid must be a process id"),
            ("/api/flamegraph", {"since": ui.t1, "until": ui.t0}, "must be before"),
            ("/api/timeseries", {"since": "yesterday"}, "not a time"),
            ("/api/flamegraph/diff", whole, "base_since is required"),
            ("/api/export", {**whole, "format": "svg"}, "format must be one of"),
            ("/api/export", {**whole, "processes": "both"}, "processes must be split or merge, not 'both'"),
        ]:
            response = http.get(path, params=params)
            assert response.status_code == 400, (path, params)
            error = response.json()["error"]
            assert needle in error and "\n" not in error, error


def test_the_page_and_its_files_are_served(served):
    with httpx.Client(base_url=served.url, timeout=30) as http:
        page = http.get("/")
        assert page.status_code == 200 and '<canvas id="flame">' in page.text
        for path in ("/static/app.js", "/static/flamegraph.js", "/static/tree.js", "/static/colors.js",
                     "/static/format.js", "/static/legend.js", "/static/processes.js", "/static/charts.js",
                     "/static/style.css",
                     "/static/vendor/uPlot.iife.min.js", "/static/vendor/uPlot.min.css"):
            assert http.get(path).status_code == 200, path
        assert http.get("/static/../api.py").status_code == 404
        # the query API is still there, and the UI never closed the store it borrowed
        assert http.get("/api/query/totals_cpu", params={"since": served.t0, "until": served.t1}).json()["rows"] == [
            ["n1", 48], ["n2", 6]]


# --- `fleetprof ui` -------------------------------------------------------------------------------------------------


def test_fleetprof_ui_serves_through_ups_api(served):
    ui = served
    env = {k: v for k, v in os.environ.items() if k != "FLEETPROF_CLICKHOUSE"}
    env["FLEETPROF_API"] = ui.address  # this process owns the chDB directory: the command must go through the API
    args = [sys.executable, "-m", "fleetprof", "--data-dir", os.path.dirname(ui.store.location), "--database",
            ui.store.database, "ui", "--listen", "127.0.0.1:0", "--no-open"]
    proc = subprocess.Popen(args, cwd=REPO_ROOT, env=env, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        assert line.startswith("web UI at http://127.0.0.1:"), line
        assert f"reading the fleetprof API at {ui.address}" in line
        url = line.split()[3]
        with httpx.Client(base_url=url, timeout=30) as http:
            assert http.get("/healthz").json()["service"] == "fleetprof-ui"
            assert '<canvas id="flame">' in http.get("/").text
            body = http.get("/api/flamegraph", params={"since": ui.t0 + 60, "until": ui.t1}).json()
            # through the API's JSON rows (not Arrow): the process columns too
            assert stacks_of(body) == {f"{TRAIN};main;run;io": 18, f"{SERVE};main;idle": 6}
            folded = http.get("/api/export", params={"since": ui.t0, "until": ui.t1, "format": "folded"})
            assert folded.content == cli_export(ui, "folded", ui.t0, ui.t1)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_fleetprof_ui_bad_listen_address():
    done = subprocess.run([sys.executable, "-m", "fleetprof", "ui", "--listen", "nowhere"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr == "Error: --listen: not a host:port address: 'nowhere'\n"
