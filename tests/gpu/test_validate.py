"""The parts of the GPU validation (tests/gpu/validate.sh) that run without a GPU: its arguments, the readers of both
sides, the comparison, nvidia-smi parsing, and the shell script's syntax."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.elf_helpers import need
from tests.gpu import train_loop, validate

HERE = Path(__file__).resolve().parent


def test_scripts_parse() -> None:
    need("bash")
    assert subprocess.run(["bash", "-n", str(HERE / "validate.sh")], capture_output=True).returncode == 0


def test_arguments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUT", str(tmp_path))
    args = validate.parse_args(["--steps", "50"])
    assert (args.steps, args.out, args.run_timeout) == (50, tmp_path, 90.0)
    monkeypatch.delenv("OUT")
    assert validate.parse_args([]).out is None
    with pytest.raises(SystemExit) as caught:
        validate.parse_args(["--steps", "0"])
    assert caught.value.code == 2
    loop = train_loop.parse_args(["--markers", "m.json"])
    assert (loop.steps, loop.warmup, loop.profile, loop.no_graphs) == (200, 20, None, False)
    with pytest.raises(SystemExit):
        train_loop.parse_args(["--markers", "m.json", "--steps", "0"])


def test_records_are_cut_to_the_window() -> None:
    lines = [
        {"type": "on", "clock": "cupti-timestamp-callback", "clock_measured_offset_ns": 12},
        {"type": "launch", "correlation_id": 1, "nested": False},
        {"type": "launch", "correlation_id": 2, "nested": True},
        {"type": "launch", "correlation_id": 3, "nested": False},
        {"type": "kernel", "correlation_id": 1, "name": "a", "start_ns": 99, "end_ns": 150},  # starts before
        {"type": "kernel", "correlation_id": 1, "name": "a", "start_ns": 100, "end_ns": 130},
        {"type": "kernel", "correlation_id": 3, "name": "b", "start_ns": 140, "end_ns": 200},
        {"type": "kernel", "correlation_id": 9, "name": "a", "start_ns": 150, "end_ns": 157},  # no launch seen
        {"type": "kernel", "correlation_id": 3, "name": "b", "start_ns": 190, "end_ns": 201},  # ends after
        {"type": "summary", "kernels": 5},
    ]
    totals, facts = validate.read_records([json.dumps(x) for x in lines] + [""], 100, 200)
    assert (totals.count, totals.ns) == ({"a": 2, "b": 1}, {"a": 37, "b": 60})
    assert facts == {"launches": 2, "nested_launches": 1, "kernels_outside_window": 2, "kernels_with_launch": 2,
                     "kernels_in_window": 3, "clock": "cupti-timestamp-callback", "clock_measured_offset_ns": 12,
                     "activity": "always", "summary": {"kernels": 5}}


def test_sampled_run_has_kernel_records_for_the_sampled_launches() -> None:
    lines = [{"type": "on", "activity": "sampled"},
             *({"type": "launch", "correlation_id": i, "nested": False, "weight": 5 if i % 5 == 0 else 0}
               for i in range(1, 201)),
             {"type": "launch", "correlation_id": 1001, "nested": True, "weight": 5},
             *({"type": "kernel", "correlation_id": i} for i in range(5, 201, 5)),  # each sampled launch's kernel
             {"type": "kernel", "correlation_id": 1001}, {"type": "kernel", "correlation_id": 7},  # a skipped one's
             {"type": "kernel", "correlation_id": 5000}]  # no launch seen
    facts = validate.sampled_facts([json.dumps(x) for x in lines])
    assert facts == {"launches": 200, "sampled": 40, "sampled_without_kernel": 0,
                     "kernels": {"sampled": 41, "skipped": 1, "unknown": 1}, "records_per_sampled_record": 43 / 41,
                     "records_per_launch": 43 / 200, "ok": True}
    no_records_for_sampled = [x for x in lines if x.get("type") != "kernel" or x["correlation_id"] % 10]
    facts = validate.sampled_facts([json.dumps(x) for x in no_records_for_sampled])
    assert (facts["sampled_without_kernel"], facts["ok"]) == (20, False)
    every_kernel = lines + [{"type": "kernel", "correlation_id": i} for i in range(1, 201) if i % 5]
    assert validate.sampled_facts([json.dumps(x) for x in every_kernel])["ok"] is False
    assert validate.sampled_facts([])["ok"] is False  # nothing recorded: not a pass


def test_chrome_trace_kernels() -> None:
    trace = {"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "gemm", "dur": 10.5},
        {"ph": "X", "cat": "Kernel", "name": "gemm", "dur": 0.001},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "dur": 3.0},
        {"ph": "X", "cat": "kernel", "name": "relu", "dur": 2.0004},
        {"ph": "i", "cat": "kernel", "name": "marker"},
    ]}
    totals = validate.read_chrome_trace(trace)
    assert (totals.count, totals.ns) == ({"gemm": 2, "relu": 1}, {"gemm": 10_501, "relu": 2_000})


def test_comparison_holds_significant_kernels_to_the_goal() -> None:
    shim = validate.KernelTotals({"big": 10, "mid": 5, "tiny": 1, "only_shim": 1},
                                 {"big": 1_030_000, "mid": 96_000, "tiny": 500, "only_shim": 100})
    torch = validate.KernelTotals({"big": 10, "mid": 5, "tiny": 1}, {"big": 1_000_000, "mid": 100_000, "tiny": 1_000})
    result = validate.compare(shim, torch)
    assert [(r["name"], r["ratio"], r["within_goal"]) for r in result["rows"]] == [
        ("big", 1.03, True), ("mid", 0.96, True), ("tiny", 0.5, False), ("only_shim", None, False)]
    assert (result["shim_total_ns"], result["torch_total_ns"], result["significant"]) == (1_126_600, 1_101_000, 2)
    assert result["ok"] is True  # "tiny" has under 1% of the GPU time
    worse = validate.compare(validate.KernelTotals({"mid": 5}, {"mid": 90_000}), torch)
    assert worse["ok"] is False
    assert "TOTAL" in validate.format_table(result).splitlines()[-1]


def test_mangled_names_are_demangled_as_torch_shows_them() -> None:
    need("c++filt")
    names = validate.demangle(["_Z11native_gemmPKfS0_Pfi", "ampere_sgemm_128x64_nn"])
    assert names == {"_Z11native_gemmPKfS0_Pfi": "native_gemm(float const*, float const*, float*, int)",
                     "ampere_sgemm_128x64_nn": "ampere_sgemm_128x64_nn"}
    totals = validate.rename(validate.KernelTotals({"a": 1, "b": 2}, {"a": 5, "b": 7}), {"a": "x", "b": "x"})
    assert (totals.count, totals.ns) == ({"x": 3}, {"x": 12})


def test_nvidia_smi_lines() -> None:
    text = "35, 1024, 71.50, 44, 1980\n0, 3, [N/A], 30, 210\n"
    assert validate.parse_smi(text) == [
        {"utilization.gpu": 35.0, "memory.used": 1024.0, "power.draw": 71.5, "temperature.gpu": 44.0,
         "clocks.sm": 1980.0},
        {"utilization.gpu": 0.0, "memory.used": 3.0, "power.draw": None, "temperature.gpu": 30.0, "clocks.sm": 210.0}]


def test_nvml_table_pairs_both_readings() -> None:
    sampler = validate.NvmlSampler.__new__(validate.NvmlSampler)
    sampler.note, sampler.source = "", "the agent's collector"
    reading = {"utilization.gpu": 50.0, "memory.used": 100.0, "power.draw": 70.0, "temperature.gpu": 40.0,
               "clocks.sm": 1500.0}
    sampler.pairs = [{"nvml": reading, "smi": {**reading, "power.draw": 72.0}},
                     {"nvml": reading, "smi": {**reading, "power.draw": None}}]
    lines = sampler.table().splitlines()
    assert lines[3].split() == ["power.draw", "70.0", "72.0", "2.0"]
    assert lines[2].split() == ["memory.used", "100.0", "100.0", "0.0"]
    assert lines[-1] == "(2 back-to-back pairs; NVML read by the agent's collector)"


def test_the_collectors_record_gives_gpu_0_in_nvidia_smis_units() -> None:
    """The NVML side is what the agent stores: its GpuMetrics device row of GPU 0 (not a MIG device of it), memory
    in MiB, power in W; a poll it did not make or a field it could not read gives no pair."""
    gpu0 = {"index": 0, "parent_uuid": "", "gpu_util_pct": 35, "mem_used_bytes": 1536 << 20, "power_mw": 71_500,
            "temperature_c": 44, "sm_clock_mhz": 1980}
    mig = {**gpu0, "parent_uuid": "GPU-0", "gpu_util_pct": 99}
    record = {"devices": [mig, {**gpu0, "index": 1, "gpu_util_pct": 7}, gpu0]}
    assert validate.collector_reading(record) == {"utilization.gpu": 35.0, "memory.used": 1536.0,
                                                  "power.draw": 71.5, "temperature.gpu": 44.0, "clocks.sm": 1980.0}
    assert validate.collector_reading(None) is None
    assert validate.collector_reading({"devices": [{**gpu0, "power_mw": None}]}) is None


def test_script_stops_in_one_line_without_torch(tmp_path: Path) -> None:
    need("bash")
    need("gcc")
    fake = tmp_path / "python3"
    fake.write_text("#!/bin/sh\nexit 1\n")  # an interpreter whose `import torch` fails
    fake.chmod(0o755)
    out = subprocess.run(["bash", str(HERE / "validate.sh")], capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "PYTHON": str(fake)})
    assert out.returncode == 2
    assert out.stderr.splitlines()[-1] == f"validate.sh: {fake} has no torch with a usable CUDA device"


def test_copies_are_labelled_alike_on_both_sides() -> None:
    htod, dtoh, dtod, memset = 1 | 2 << 16 | 3 << 24, 2 | 3 << 16 | 1 << 24, 8 | 3 << 16 | 3 << 24, 0x100 | 3 << 24
    lines = [{"type": "memory", "correlation_id": 1, "start_ns": 100, "end_ns": 110, "memory_kind": htod},
             {"type": "memory", "correlation_id": 2, "start_ns": 120, "end_ns": 150, "memory_kind": dtoh},
             {"type": "memory", "correlation_id": 3, "start_ns": 150, "end_ns": 155, "memory_kind": memset},
             {"type": "memory", "correlation_id": 4, "start_ns": 190, "end_ns": 250, "memory_kind": dtod},
             {"type": "kernel", "correlation_id": 5, "start_ns": 100, "end_ns": 101, "name": "k", "graph_id": 4}]
    shim = validate.read_memory_records([json.dumps(x) for x in lines], 100, 200)  # the DtoD one ends after
    assert (shim.count, shim.ns) == ({"[memcpy HtoD] pinned>device": 1, "[memcpy DtoH] device>pageable": 1,
                                      "[memset] device": 1},
                                     {"[memcpy HtoD] pinned>device": 10, "[memcpy DtoH] device>pageable": 30,
                                      "[memset] device": 5})
    trace = {"traceEvents": [
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "dur": 0.010},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pageable)", "dur": 0.031},
        {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "dur": 0.005},
        {"ph": "X", "cat": "kernel", "name": "k", "dur": 1.0}]}
    torch = validate.read_chrome_memory(trace)
    assert torch.count == shim.count
    assert validate.compare(shim, torch)["ok"] is True
    assert validate.graph_kernel_count([json.dumps(x) for x in lines]) == 1


def test_range_paths_of_the_nvtx_run() -> None:
    launches = [{"type": "launch", "correlation_id": i, "nested": False, "weight": 1, "kind": "kernel",
                 **({"nvtx_range": "step > forward > aten::linear"} if i % 10 else {})} for i in range(1, 101)]
    summary = {"type": "summary", "launch_ranges": 90, "nvtx_paths_cut": 0, "kernels": 100}
    facts = validate.range_facts([json.dumps(x) for x in [*launches, summary]])
    assert (facts["sampled"], facts["ranged"], facts["ok"]) == (100, 90, True)
    assert facts["top_paths"] == [("step > forward > aten::linear", 90)]
    assert facts["counters"] == {"launch_ranges": 90, "nvtx_paths_cut": 0}
    facts = validate.range_facts([json.dumps(x) for x in launches[:20]])
    assert (facts["ranged"], facts["ok"]) == (18, True)
    assert validate.range_facts([json.dumps({**x, "nvtx_range": ""}) for x in launches])["ok"] is False


def test_range_paths_count_only_the_measured_steps_and_name_the_bare_launches() -> None:
    """Set-up launches before the measured steps (no range open) do not count against the goal; the launches of the
    steps without a path are listed by API and thread."""
    setup = [{"type": "launch", "correlation_id": i, "nested": False, "weight": 1, "kind": "kernel",
              "api": "cudaMemcpyAsync", "tid": 7, "ts_ns": 100 + i} for i in range(50)]
    steps = [{"type": "launch", "correlation_id": 100 + i, "nested": False, "weight": 1, "kind": "kernel",
              "api": "cudaLaunchKernel", "tid": 8, "ts_ns": 1_000 + i,
              **({"nvtx_range": "step > forward"} if i % 20 else {})} for i in range(100)]
    lines = [json.dumps(x) for x in [*setup, *steps]]
    facts = validate.range_facts(lines, 1_000, 2_000)
    assert (facts["sampled"], facts["ranged"], facts["outside_window"], facts["ok"]) == (100, 95, 50, True)
    assert facts["unranged"] == [("cudaLaunchKernel (thread 8)", 5)]
    assert validate.range_facts(lines)["ok"] is False  # 95 of 150 without the window


def test_sampled_copies_count_as_timed() -> None:
    lines = [{"type": "launch", "correlation_id": 1, "nested": False, "weight": 1},
             {"type": "launch", "correlation_id": 2, "nested": False, "weight": 1},
             {"type": "kernel", "correlation_id": 1}, {"type": "memory", "correlation_id": 2}]
    facts = validate.sampled_facts([json.dumps(x) for x in lines])
    assert (facts["sampled_without_kernel"], facts["kernels"]["sampled"], facts["ok"]) == (0, 2, True)
