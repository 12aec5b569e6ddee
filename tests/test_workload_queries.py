"""The workload filters (namespace, pod, job, container) on the profile and NVML named queries, and the per-workload
GPU utilization and CPU-while-idle queries, on known rows (tests/workload_rows.py): exact sums, through the hourly
rollups and the 10 s windows, with rows of older agents ('' identity) left out by every filter."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest

from tests.workload_rows import CPU_COLUMNS, DEVICE_COLUMNS, PROCESS_COLUMNS, A, B, workload_rows

# filter -> the CPU samples it keeps (A 6, B 12, C 24, D 48, '' 96)
CASES = [
    ({}, 186),
    ({"namespace": "ml"}, 18),
    ({"namespace": "infra"}, 48),
    ({"namespace": "nope"}, 0),
    ({"pod": "train-0"}, 54),
    ({"pod": "ml/train-0"}, 6),
    ({"pod": "infra/train-0"}, 48),
    ({"pod": "ml/serve-0"}, 12),
    ({"container": "trainer"}, 54),
    ({"container": "c0ffee"}, 6),
    ({"container": "containerd://dead00"}, 48),
    ({"container": "beef000002bbbb"}, 12),
    ({"job": "4242"}, 24),
    ({"job": "4240"}, 24),
    ({"job": "4240_2"}, 24),
    ({"job": "4240_3"}, 0),
    ({"job": "train"}, 6),
    ({"job": "nightly"}, 48),
    ({"job": "infra/nightly"}, 48),
    ({"job": "ml/nightly"}, 0),
    ({"namespace": "ml", "pod": "serve-0"}, 12),
    ({"namespace": "ml", "container": "trainer"}, 6),
    ({"namespace": "ml", "job": "nightly"}, 0),
]


@pytest.fixture(scope="module")
def rows(module_store):
    return workload_rows(module_store)


def run(rows, name, **params):
    return rows.store.query_named(name, {"since": rows.since, "until": rows.until, **params})


@pytest.mark.parametrize(("filters", "samples"), CASES)
def test_cpu_filters_rollup_and_windows(rows, filters, samples):
    # flamegraph_cpu reads the whole hours from cpu_samples_1h; totals_cpu reads the windows only: both agree
    _, flame = run(rows, "flamegraph_cpu", **filters)
    assert sum(count for _, count in flame) == samples
    _, totals = run(rows, "totals_cpu", **filters)
    assert sum(int(r[-1]) for r in totals) == samples


@pytest.mark.parametrize(("filters", "samples"), CASES)
def test_gpu_filters_rollup_and_windows(rows, filters, samples):
    _, flame = run(rows, "flamegraph_gpu", **filters)
    assert sum(ns for _, ns in flame) == samples * 1000
    _, top = run(rows, "top_kernels_gpu", **filters)
    assert sum(r[2] for r in top if r[0] == "gemm") == samples * 1000


def test_flamegraph_stacks_per_workload(rows):
    _, flame = run(rows, "flamegraph_cpu", pod="train-0")
    assert flame == [(["main", "run", "compute"], 54)]
    _, per_process = run(rows, "flamegraph_processes_cpu", namespace="ml")
    assert sorted((r[0], r[1], r[2], r[-1]) for r in per_process) == [("n1", 10, "train", 6), ("n2", 20, "serve", 12)]
    _, ids = run(rows, "flamegraph_ids_gpu", job="4240_2")
    assert [(r[0], r[2]) for r in ids] == [(104, 24000)]


def test_whole_hours_only_range_reads_the_rollup(rows):
    # [H, H+2h): whole hours only, from the rollup; 0, 1800, 3590, 3600 s are inside
    h = rows.since + timedelta(seconds=10)
    _, flame = rows.store.query_named("flamegraph_cpu", {"since": h, "until": h + timedelta(hours=2),
                                                         "namespace": "ml"})
    assert sorted(flame) == [(["main", "run", "compute"], 4), (["main", "run", "io"], 8)]


@pytest.mark.parametrize(("filters", "device_rows", "process_rows"), [
    ({}, 1260, 1260),
    ({"pod": "ml/train-0"}, 360, 360),  # GPU-a, held by A
    ({"job": "4242"}, 180, 180),  # GPU-b while C's process was listed on it
    ({"namespace": "ml"}, 540, 540),  # GPU-a, and GPU-c where B's process was listed
    ({"namespace": "infra"}, 180, 180),
    ({"container": "nope"}, 0, 0),
])
def test_nvml_filters(rows, filters, device_rows, process_rows):
    window = {"since": rows.nvml_since, "until": rows.nvml_until, "limit": 10_000, **filters}
    assert len(rows.store.query_named("gpu_metrics", window)[1]) == device_rows
    assert len(rows.store.query_named("gpu_process_metrics", window)[1]) == process_rows


UTIL = {
    "pod": [("", 2, 2.0, 0.65, 1.35), ("ml/train-0", 1, 1.0, 0.75, 0.25), ("infra/train-0", 1, 0.25, 0.125, 0.125),
            ("ml/serve-0", 1, 0.25, 0.125, 0.125)],
    "namespace": [("", 2, 2.0, 0.65, 1.35), ("ml", 2, 1.25, 0.875, 0.375), ("infra", 1, 0.25, 0.125, 0.125)],
    "job": [("", 3, 1.75, 0.65, 1.1), ("ml/train", 1, 1.0, 0.75, 0.25), ("4240_2", 1, 0.5, 0.125, 0.375),
            ("infra/nightly", 1, 0.25, 0.125, 0.125)],
    "team": [("", 3, 1.75, 0.65, 1.1), ("vision", 1, 1.0, 0.75, 0.25), ("physics", 1, 0.5, 0.125, 0.375),
             ("search", 1, 0.25, 0.125, 0.125)],
    "container": [("", 2, 2.0, 0.65, 1.35), ("trainer", 2, 1.25, 0.875, 0.375), ("server", 1, 0.25, 0.125, 0.125)],
}


def hours(columns, found):
    at = {c: i for i, c in enumerate(columns)}
    return [(r[at["workload"]], r[at["gpus"]], round(r[at["covered_s"]] / 3600, 9), round(r[at["busy_s"]] / 3600, 9),
             round(r[at["idle_s"]] / 3600, 9)) for r in found]


@pytest.mark.parametrize("by", list(UTIL))
def test_gpu_utilization_by_workload(rows, by):
    columns, found = rows.store.query_named("gpu_utilization_by_workload",
                                            {"since": rows.nvml_since, "until": rows.nvml_until, "by": by})
    assert hours(columns, found) == UTIL[by]
    # every GPU-hour of gpu_idle_time's GPU level, given to somebody or to nobody
    assert sum(r[2] for r in hours(columns, found)) == pytest.approx(3.5)


def test_gpu_utilization_by_workload_filtered(rows):
    columns, found = rows.store.query_named("gpu_utilization_by_workload", {
        "since": rows.nvml_since, "until": rows.nvml_until, "by": "pod", "namespace": "ml"})
    assert hours(columns, found) == [("ml/train-0", 1, 1.0, 0.75, 0.25), ("ml/serve-0", 1, 0.25, 0.125, 0.125)]
    mean = dict(zip([r[0] for r in found], [r[columns.index("mean_util_pct")] for r in found], strict=True))
    assert mean == {"ml/train-0": 75.0, "ml/serve-0": 50.0}


def test_cpu_while_gpu_idle_per_workload(store):
    """n3 GPU 0 idle (0 %) in two windows W and W+10 with A's pid 60 and an old agent's pid 70 listed; n3 GPU 1 busy
    with B's pid 80: only A's and pid 70's samples in those windows count."""
    rows = workload_rows(store)
    w = rows.nvml_until + timedelta(minutes=5)
    store.insert("gpu_device_metrics", [[w + timedelta(seconds=s), "n3", g, f"GPU-{g}", "H100", "", u, [], False, ""]
                                        for s in (1, 11) for g, u in ((0, 0), (1, 90))], DEVICE_COLUMNS)
    store.insert("gpu_process_metrics", [[w + timedelta(seconds=s), "n3", g, pid, "p", "", 0, False, ident]
                                         for s in (1, 11) for g, pid, ident in ((0, 60, A), (0, 70, ""), (1, 80, B))],
                 PROCESS_COLUMNS)
    store.insert("cpu_samples", [[w + timedelta(seconds=s), "n3", pid, "p", "", 101, n, ident]
                                 for s in (0, 10) for pid, n, ident in ((60, 3, A), (70, 5, ""), (80, 7, B))],
                 CPU_COLUMNS)
    window = {"since": w, "until": w + timedelta(seconds=20), "node": "n3"}
    _, by_pod = store.query_named("cpu_while_gpu_idle_by_workload", window)
    assert by_pod == [("", 10, 10 / 16, 1, 2), ("ml/train-0", 6, 6 / 16, 1, 2)]
    _, stacks = store.query_named("cpu_while_gpu_idle", {**window, "pod": "ml/train-0"})
    assert stacks == [("main;run;compute", 6, 1.0, 1, 2)]
    _, none = store.query_named("cpu_while_gpu_idle", {**window, "namespace": "infra"})
    assert none == []


def cost_csv(rows, *args: str) -> str:
    from click.testing import CliRunner

    from fleetprof.cli import cli
    from fleetprof.commands import COMMANDS
    from tests.test_cost_report import silent_address

    for command in COMMANDS:
        cli.add_command(command)
    base = ["--data-dir", os.path.dirname(rows.store.location), "--database", rows.store.database]
    window = ["--since", rows.nvml_since.isoformat(), "--until", rows.nvml_until.isoformat()]
    result = CliRunner().invoke(cli, [*base, "report", "cost", *window, "--price-per-gpu-hour", "2", *args],
                                env={"FLEETPROF_API": silent_address(), "FLEETPROF_CLICKHOUSE": ""})
    assert result.exit_code == 0, result.output
    return result.stdout


COST = {
    "pod": ["pod,gpu_hours,busy_hours,idle_hours,cost,busy_cost,idle_cost",
            "unattributed,2.000000,0.650000,1.350000,4.000000,1.300000,2.700000",
            "ml/train-0,1.000000,0.750000,0.250000,2.000000,1.500000,0.500000",
            "infra/train-0,0.250000,0.125000,0.125000,0.500000,0.250000,0.250000",
            "ml/serve-0,0.250000,0.125000,0.125000,0.500000,0.250000,0.250000",
            "total,3.500000,1.650000,1.850000,7.000000,3.300000,3.700000"],
    "job": ["job,gpu_hours,busy_hours,idle_hours,cost,busy_cost,idle_cost",
            "unattributed,1.750000,0.650000,1.100000,3.500000,1.300000,2.200000",
            "ml/train,1.000000,0.750000,0.250000,2.000000,1.500000,0.500000",
            "4240_2,0.500000,0.125000,0.375000,1.000000,0.250000,0.750000",
            "infra/nightly,0.250000,0.125000,0.125000,0.500000,0.250000,0.250000",
            "total,3.500000,1.650000,1.850000,7.000000,3.300000,3.700000"],
    "namespace": ["namespace,gpu_hours,busy_hours,idle_hours,cost,busy_cost,idle_cost",
                  "unattributed,2.000000,0.650000,1.350000,4.000000,1.300000,2.700000",
                  "ml,1.250000,0.875000,0.375000,2.500000,1.750000,0.750000",
                  "infra,0.250000,0.125000,0.125000,0.500000,0.250000,0.250000",
                  "total,3.500000,1.650000,1.850000,7.000000,3.300000,3.700000"],
    "team": ["team,gpu_hours,busy_hours,idle_hours,cost,busy_cost,idle_cost",
             "unattributed,1.750000,0.650000,1.100000,3.500000,1.300000,2.200000",
             "vision,1.000000,0.750000,0.250000,2.000000,1.500000,0.500000",
             "physics,0.500000,0.125000,0.375000,1.000000,0.250000,0.750000",
             "search,0.250000,0.125000,0.125000,0.500000,0.250000,0.250000",
             "total,3.500000,1.650000,1.850000,7.000000,3.300000,3.700000"],
}


@pytest.mark.parametrize("by", list(COST))
def test_cost_report_by_workload(rows, by):
    assert cost_csv(rows, "--by", by, "--format", "csv").splitlines() == COST[by]


def test_cost_report_by_pod_text_and_html(rows):
    text = cost_csv(rows, "--by", "pod")
    assert "GPU-hours by pod" in text and "ml/train-0" in text and "unattributed" in text
    assert "Workload GPU-hours: a GPU's go to the pod that holds it" in text
    html = cost_csv(rows, "--by", "pod", "--format", "html")
    assert "GPU cost by pod" in html and "ml/train-0" in html and "infra/train-0" in html
    assert cost_csv(rows, "--format", "csv").splitlines()[0].startswith("node,")  # the default grouping is kept


def cli(rows, *args: str, api: str | None = None):
    from click.testing import CliRunner

    from fleetprof.cli import cli as root
    from fleetprof.commands import COMMANDS
    from tests.test_cost_report import silent_address

    for command in COMMANDS:
        root.add_command(command)
    base = ["--data-dir", os.path.dirname(rows.store.location), "--database", rows.store.database]
    return CliRunner().invoke(root, [*base, *args], env={"FLEETPROF_API": api or silent_address(),
                                                        "FLEETPROF_CLICKHOUSE": ""})


@pytest.mark.parametrize("through_api", [False, True])
def test_query_cli_workload_options(rows, through_api):
    from fleetprof.api import serve_api

    server = serve_api(rows.store, "127.0.0.1", 0) if through_api else None
    api = server.address if server else None
    window = ["--since", rows.since.isoformat(), "--until", rows.until.isoformat()]
    try:
        top = cli(rows, "query", "top", *window, "--pod", "infra/train-0", "--format", "csv", api=api)
        assert top.exit_code == 0, top.output
        assert top.stdout.splitlines()[1:] == ["compute,app,48,48,1.0", "main,app,0,48,0.0", "run,app,0,48,0.0"]
        flame = cli(rows, "query", "flamegraph", *window, "--kind", "gpu", "--job", "4240_2", "--merge-processes",
                    api=api)
        assert flame.stdout == "main;launch;gemm 24000\n"
        empty = cli(rows, "query", "top", *window, "--namespace", "ml", "--container", "server", "--job", "x",
                    api=api)
        assert "for namespace 'ml' and job 'x' and container 'server'" in empty.stderr
        nvml = ["--since", rows.nvml_since.isoformat(), "--until", rows.nvml_until.isoformat()]
        metrics = cli(rows, "query", "metrics", *nvml, "--namespace", "ml", "--format", "csv", "--columns",
                      "node,uuid", api=api)
        assert metrics.exit_code == 0, metrics.output
        assert sorted(set(metrics.stdout.splitlines()[1:])) == ["n1,GPU-a", "n2,GPU-c"]
        assert len(metrics.stdout.splitlines()) == 541
    finally:
        if server:
            server.stop()
