"""`fleetprof report cost` on known NVML readings and kernel time: exact GPU-hours, busy/idle split and cost for
every --by, in every format, through the store and through a running API; and its one-line errors."""

from __future__ import annotations

import os
import re
import socket
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from click.testing import CliRunner, Result

from fleetprof.api import serve_api
from fleetprof.cli import cli
from fleetprof.commands import COMMANDS

DEVICE_COLUMNS = ["ts", "node", "gpu_index", "uuid", "name", "parent_uuid", "gpu_util_pct", "xid_errors", "simulated"]
PROCESS_COLUMNS = ["ts", "node", "gpu_index", "pid", "comm", "container_id", "sm_util_pct", "simulated"]
KERNEL_COLUMNS = ["ts", "node", "pid", "comm", "container_id", "device", "stream", "stack_id", "kernel_name",
                  "duration_ns", "launches"]
NS_PER_HOUR = 3_600_000_000_000


def silent_address() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
def costs(store):
    """One hour [B, B + 1 h) of 10 s NVML readings:

    n1 GPU 0 at 75 % for 1 h, n1 GPU 1 at 25 % for 1 h, n2 GPU 0 at 50 % for 30 min.
    Processes: n1 pid 10 train (container c1) on GPU 0 at 60 % for 1 h and on GPU 1 at 20 % for 30 min;
    n2 pid 20 serve (no container) on GPU 0 at 50 % for 30 min.
    Kernels: gemm 0.5 h from main;step (100 launches), relu 0.1 h from main;load (10 launches).
    """
    now = datetime.now(tz=UTC).replace(microsecond=0)
    b = now - timedelta(hours=2, seconds=now.second % 10)
    at = lambda s: b + timedelta(seconds=s)  # noqa: E731
    devices = [[at(10 * i), "n1", 0, "GPU-a", "H100", "", 75, [], False] for i in range(360)]
    devices += [[at(10 * i), "n1", 1, "GPU-b", "H100", "", 25, [], False] for i in range(360)]
    devices += [[at(10 * i), "n2", 0, "GPU-c", "A100", "", 50, [], False] for i in range(180)]
    store.insert("gpu_device_metrics", devices, DEVICE_COLUMNS)
    processes = [[at(10 * i), "n1", 0, 10, "train", "c1", 60, False] for i in range(360)]
    processes += [[at(10 * i), "n1", 1, 10, "train", "c1", 20, False] for i in range(180)]
    processes += [[at(10 * i), "n2", 0, 20, "serve", "", 50, False] for i in range(180)]
    store.insert("gpu_process_metrics", processes, PROCESS_COLUMNS)
    store.insert("frames", [[1, "main", "app", "NATIVE", b], [2, "step", "app", "NATIVE", b],
                            [3, "load", "app", "NATIVE", b], [5, "gemm", "[gpu]", "GPU_KERNEL", b],
                            [6, "relu", "[gpu]", "GPU_KERNEL", b]], ["frame_id", "function", "binary", "kind",
                                                                     "last_seen"])
    store.insert("stacks", [[200, [1, 2, 5], b], [203, [1, 3, 6], b]], ["stack_id", "frame_ids", "last_seen"])
    store.insert("gpu_kernel_samples", [
        [at(0), "n1", 10, "", "", 0, 7, 200, "gemm", NS_PER_HOUR // 2, 100],
        [at(10), "n2", 20, "", "", 0, 7, 203, "relu", NS_PER_HOUR // 10, 10],
    ], KERNEL_COLUMNS)
    return SimpleNamespace(store=store, since=b, until=at(3600))


def report(costs, *args: str, api: str | None = None) -> Result:
    """`fleetprof report cost` over the fixture's hour at 2.5 per GPU-hour, in this process."""
    for command in COMMANDS:
        cli.add_command(command)
    base = ["--data-dir", os.path.dirname(costs.store.location), "--database", costs.store.database]
    window = ["--since", costs.since.isoformat(), "--until", costs.until.isoformat()]
    return CliRunner().invoke(cli, [*base, "report", "cost", *window, "--price-per-gpu-hour", "2.5", *args],
                              env={"FLEETPROF_API": api or silent_address(), "FLEETPROF_CLICKHOUSE": ""})


CSV = {
    "node": "node,gpu_hours,busy_hours,idle_hours,cost,busy_cost,idle_cost\n"
            "n1,2.000000,1.000000,1.000000,5.000000,2.500000,2.500000\n"
            "n2,0.500000,0.250000,0.250000,1.250000,0.625000,0.625000\n"
            "total,2.500000,1.250000,1.250000,6.250000,3.125000,3.125000\n",
    "gpu": "node,gpu,gpu_hours,busy_hours,idle_hours,cost,busy_cost,idle_cost\n"
           "n1,0,1.000000,0.750000,0.250000,2.500000,1.875000,0.625000\n"
           "n1,1,1.000000,0.250000,0.750000,2.500000,0.625000,1.875000\n"
           "n2,0,0.500000,0.250000,0.250000,1.250000,0.625000,0.625000\n"
           "total,,2.500000,1.250000,1.250000,6.250000,3.125000,3.125000\n",
    "process": "node,pid,comm,gpu_hours,busy_hours,idle_hours,cost,busy_cost,idle_cost\n"
               "n1,10,train,1.500000,0.700000,0.800000,3.750000,1.750000,2.000000\n"
               "n2,20,serve,0.500000,0.250000,0.250000,1.250000,0.625000,0.625000\n"
               "total,,,2.000000,0.950000,1.050000,5.000000,2.375000,2.625000\n",
    "container": "container,gpu_hours,busy_hours,idle_hours,cost,busy_cost,idle_cost\n"
                 "c1,1.500000,0.700000,0.800000,3.750000,1.750000,2.000000\n"
                 ",0.500000,0.250000,0.250000,1.250000,0.625000,0.625000\n"
                 "total,2.000000,0.950000,1.050000,5.000000,2.375000,2.625000\n",
    "kernel": "kernel,launches,gpu_hours,cost,share\n"
              "gemm,100,0.500000,1.250000,0.833333\n"
              "relu,10,0.100000,0.250000,0.166667\n"
              "total,110,0.600000,1.500000,1.000000\n",
}


@pytest.mark.parametrize("by", list(CSV))
def test_csv_for_every_by(costs, by):
    result = report(costs, "--by", by, "--format", "csv")
    assert result.exit_code == 0, result.output
    assert result.stdout == CSV[by]
    assert result.stderr == ""


def test_through_a_running_api(costs):
    server = serve_api(costs.store, "127.0.0.1", 0)
    try:
        result = report(costs, "--by", "gpu", "--format", "csv", api=server.address)
    finally:
        server.stop()
    assert result.exit_code == 0, result.output
    assert result.stdout == CSV["gpu"]


def test_node_filter_and_max_gap(costs, tmp_path):
    result = report(costs, "--by", "gpu", "--node", "n2", "--format", "csv")
    assert result.stdout.splitlines()[1:] == ["n2,0,0.500000,0.250000,0.250000,1.250000,0.625000,0.625000",
                                              "total,,0.500000,0.250000,0.250000,1.250000,0.625000,0.625000"]
    # readings 10 s apart standing for at most 5 s each: half the time
    out = tmp_path / "half.csv"
    result = report(costs, "--by", "node", "--max-gap", "5", "--format", "csv", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert out.read_text().splitlines()[-1] == "total,1.250000,0.625000,0.625000,3.125000,1.562500,1.562500"
    assert result.stdout == "" and result.stderr == f"wrote the csv report to {out}\n"


def test_markdown(costs):
    result = report(costs, "--by", "node", "--format", "md")
    assert result.exit_code == 0, result.output
    md = result.stdout
    assert md.startswith("# GPU cost by node\n")
    assert "- Price: 2.5 per GPU-hour\n" in md
    assert ("- GPUs: 2.500 GPU-hours, busy 1.250 (50.0%), idle 1.250 (50.0%): cost 6.25, of which idle 3.13\n"
            in md)
    assert ("## GPU-hours by node\n\n"
            "| node | GPU-hours | busy h | idle h | busy % | cost | busy cost | idle cost |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|\n"
            "| n1 | 2.000 | 1.000 | 1.000 | 50.0% | 5.00 | 2.50 | 2.50 |\n"
            "| n2 | 0.500 | 0.250 | 0.250 | 50.0% | 1.25 | 0.63 | 0.63 |\n"
            "| **total** | **2.500** | **1.250** | **1.250** | **50.0%** | **6.25** | **3.13** | **3.13** |\n") in md
    assert "| gemm | 100 | 30.0 min | 0.500 | 1.25 | 83.3% |\n" in md
    assert ("## Top launching stacks\n\n| launching stack | launches | GPU time | GPU-hours | cost |\n"
            "|---|---:|---:|---:|---:|\n| main;step | 100 | 30.0 min | 0.500 | 1.25 |\n"
            "| main;load | 10 | 6.0 min | 0.100 | 0.25 |\n") in md


def test_html_is_self_contained_with_charts(costs, tmp_path):
    out = tmp_path / "cost.html"
    result = report(costs, "--by", "container", "--format", "html", "-o", str(out))
    assert result.exit_code == 0, result.output
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert page.count("<svg") == 2
    assert not re.search(r"https?:|<script|<link|src=", page)
    assert "Price: 2.5 per GPU-hour" in page and costs.since.isoformat() in page
    # the busy/idle bars of c1 (0.7 + 0.8 h) scale to the full 460 px, the container-less group's 0.5 h to a third
    assert '<rect x="260.00" y="28" width="214.67" height="15" class="busy"/>' in page
    assert '<rect x="474.67" y="28" width="245.33" height="15" class="idle"/>' in page
    assert "<td>(no container)</td>" in page
    assert '<td class="num">3.75</td>' in page and '<td class="num">5.00</td>' in page
    assert '<td class="stack">main;step</td>' in page


def test_table_for_kernels(costs):
    result = report(costs, "--by", "kernel")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "GPU cost by kernel"
    assert any(re.fullmatch(r"\s*gemm\s+│\s+100\s+│\s+30\.0 min\s+│\s+0\.500\s+│\s+1\.25\s+│\s+83\.3%\s*", ln)
               for ln in lines), result.stdout
    assert any(re.fullmatch(r"\s*total\s+│\s+110\s+│\s+36\.0 min\s+│\s+0\.600\s+│\s+1\.50\s+│\s+100\.0%\s*", ln)
               for ln in lines), result.stdout


def test_empty_range(costs):
    for command in COMMANDS:
        cli.add_command(command)
    base = ["--data-dir", os.path.dirname(costs.store.location), "--database", costs.store.database]
    result = CliRunner().invoke(cli, [*base, "report", "cost", "--since", "30d", "--until", "29d",
                                      "--price-per-gpu-hour", "1", "--format", "csv"],
                                env={"FLEETPROF_API": silent_address(), "FLEETPROF_CLICKHOUSE": ""})
    assert result.exit_code == 0, result.output
    assert result.stdout == ("node,gpu_hours,busy_hours,idle_hours,cost,busy_cost,idle_cost\n"
                             "total,0.000000,0.000000,0.000000,0.000000,0.000000,0.000000\n")


@pytest.mark.parametrize("args, message", [
    (["--price-per-gpu-hour", "-1"], "--price-per-gpu-hour wants a finite number >= 0, got '-1'"),
    (["--price-per-gpu-hour", "cheap"], "--price-per-gpu-hour wants a number, got 'cheap'"),
    (["--price-per-gpu-hour", "nan"], "--price-per-gpu-hour wants a finite number >= 0, got 'nan'"),
    ([], "give --price-per-gpu-hour PRICE (what one GPU-hour costs)"),
    (["--price-per-gpu-hour", "1", "--by", "rack"],
     "--by wants one of node, gpu, process, container, kernel, namespace, pod, job, team, got 'rack'"),
    (["--price-per-gpu-hour", "1", "--since", "yesterday"],
     "not a time: 'yesterday' (use 5m, 2h, 7d, epoch seconds or ISO-8601)"),
    (["--price-per-gpu-hour", "1", "--since", "2025-01-02", "--until", "2025-01-01"], "must be before --until"),
])
def test_bad_input_is_one_line(store, args, message):
    for command in COMMANDS:
        cli.add_command(command)
    base = ["--data-dir", os.path.dirname(store.location), "--database", store.database]
    result = CliRunner().invoke(cli, [*base, "report", "cost", *args],
                                env={"FLEETPROF_API": silent_address(), "FLEETPROF_CLICKHOUSE": ""})
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("Error: ") and message in result.stderr
    assert result.stdout == ""


def test_names_folded_stacks_and_simulated_labels(costs, tmp_path):
    """A mangled kernel reads demangled (and adds up with its demangled twin), a long launching stack folds to its
    top frames with the whole one behind --full-stacks and a click in HTML, and only data that was simulated says so:
    n2's readings and kernel times here, not n1's."""
    b, store = costs.since, costs.store
    frames = [[10 + i, f"f{i}", "app", "NATIVE", b] for i in range(7)] + [[30, "k", "[gpu]", "GPU_KERNEL", b]]
    store.insert("frames", frames, ["frame_id", "function", "binary", "kind", "last_seen"])
    store.insert("stacks", [[300, [*range(10, 17), 30], b]], ["stack_id", "frame_ids", "last_seen"])
    store.insert("gpu_kernel_samples", [
        [b, "n2", 20, "", "", 0, 7, 300, "_Z15native_gemm_bwdPKfS0_Pfi", NS_PER_HOUR // 5, 40],
        [b, "n2", 20, "", "", 0, 7, 300, "native_gemm_bwd(float const*, float const*, float*, int)",
         NS_PER_HOUR // 20, 10],
    ], KERNEL_COLUMNS)
    store.insert("gpu_device_metrics", [[b, "n2", 1, "GPU-d", "Simulated GPU", "", 10, [], True]], DEVICE_COLUMNS)
    store.insert("profile_windows", [[b, "n2", "gpu", True, 0], [b, "n1", "gpu", False, 0]],
                 ["ts", "node", "kind", "simulated", "frequency_hz"])
    md = report(costs, "--by", "node", "--format", "md")
    assert md.exit_code == 0, md.output
    text = md.stdout
    assert ("- SIMULATED: GPU kernel times from node n2 come from fleetprof's simulated GPU library\n"
            "- SIMULATED: GPU readings from node n2 come from fleetprof's simulated NVML library\n") in text
    assert "| n1 | 2.000 |" in text and "| n2 (simulated) | 0.500 |" in text
    assert "| native_gemm_bwd(float const*, float const*, float*, int) | 50 | 15.0 min | 0.250 |" in text
    assert "_Z15native_gemm_bwd" not in text
    assert "| [+3 frames];f3;f4;f5;f6 | 50 | 15.0 min |" in text
    full = report(costs, "--by", "node", "--format", "md", "--full-stacks").stdout
    assert "| f0;f1;f2;f3;f4;f5;f6 | 50 | 15.0 min |" in full
    out = tmp_path / "cost.html"
    assert report(costs, "--by", "kernel", "--format", "html", "-o", str(out)).exit_code == 0
    page = out.read_text()
    assert ('<td class="stack"><details><summary>[+3 frames];f3;f4;f5;f6</summary>f0;f1;f2;f3;f4;f5;f6</details>'
            '</td>') in page
    assert "<li>SIMULATED: GPU kernel times from node n2 come from fleetprof&#x27;s simulated GPU library</li>" in page
    # the fixture's own hour alone: nothing simulated, nothing said
    plain = report(costs, "--by", "node", "--format", "md", "--node", "n1").stdout
    assert "SIMULATED" not in plain and "(simulated)" not in plain
