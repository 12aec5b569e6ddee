"""The GPU simulator (native/sim/gpu/): exported symbols, the USDT probe ABI it shares with the CUPTI shim, its native
launch paths, the simulated workload against exactly what it launched, kernel timing, and its probes firing for
real through bcc with exact values (skipped off CI without BPF)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from elftools.elf.elffile import ELFFile

from simulate.gpu import GpuSim, build_gpusim
from tests.usdt_probes import (
    PROBE_ARGS,
    assert_probes_follow_the_abi,
    attach,
    built,
    dynamic_symbols,
    load_bcc,
    observed,
    private_copy,
    sdt_notes,
)

ROOT = Path(__file__).resolve().parent.parent


# ---- build and ELF contents ----

def gpusim_library() -> Path:
    return built(build_gpusim)


def test_simulator_exports_its_api() -> None:
    names, _ = dynamic_symbols(gpusim_library())
    assert names == {"gpusim_launch", "gpusim_synchronize", "gpusim_set_device", "gpusim_device_count",
                     "gpusim_launch_rate", "gpusim_attached", "gpusim_stats", "gpusim_sizeof", "gpusim_log_start",
                     "gpusim_log_drain", "gpusim_native_train_step", "gpusim_native_kernels", "gpusim_memcpy",
                     "gpusim_memset", "gpusim_graph_create", "gpusim_graph_launch", "gpusim_graph_launch_rate",
                     "gpusim_range_push", "gpusim_range_push_domain", "gpusim_range_pop"}


def test_simulator_probes_follow_the_abi() -> None:
    assert_probes_follow_the_abi(gpusim_library())
    assert sorted(n["name"] for n in sdt_notes(gpusim_library())[0]) == sorted(PROBE_ARGS)  # all six


def test_native_paths_keep_their_frames() -> None:
    sim = GpuSim(gpusim_library())
    with gpusim_library().open("rb") as f:
        symtab = {s.name: s for s in ELFFile(f).get_section_by_name(".symtab").iter_symbols()}
    for kernel in sim.native_kernels():
        for function in kernel.path.split(";"):
            assert symtab[function]["st_info"]["type"] == "STT_FUNC", function
    assert [(k.path, k.name, k.duration_ns) for k in sim.native_kernels()] == [
        ("gpusim_native_train_step;native_forward;native_gemm", "_Z11native_gemmPKfS0_Pfi", 200_000),
        ("gpusim_native_train_step;native_backward;native_gemm_bwd", "_Z15native_gemm_bwdPKfS0_Pfi", 400_000)]


# ---- the simulator and its workload, no agent attached ----

FLASH, SGEMM, RESIZE = "_Z14flash_attn_fwdILi128EEvPKfS1_Pf", "ampere_sgemm_128x64_nn", "_Z12resize_imagePKhPhii"
GEMM, GEMM_BWD = "_Z11native_gemmPKfS0_Pfi", "_Z15native_gemm_bwdPKfS0_Pfi"
NATIVE = "train_loop;train_step;native_step;gpusim_native_train_step"
REQUESTED_NS = {FLASH: 300_000, SGEMM: 500_000, RESIZE: 100_000, GEMM: 200_000, GEMM_BWD: 400_000}
PATHS = {
    "data_loader;augment": RESIZE,
    "train_loop;train_step;backward;matmul": SGEMM,
    "train_loop;train_step;forward;attention": FLASH,
    f"{NATIVE};native_backward;native_gemm_bwd": GEMM_BWD,
    f"{NATIVE};native_forward;native_gemm": GEMM,
}


def _workload(seconds: float, rate: float, env: dict[str, str] | None = None) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "simulate.gpu_workload", "--seconds", str(seconds),
                          "--launches-per-s", str(rate)], capture_output=True, text=True, cwd=ROOT, timeout=120,
                         env={**os.environ, **(env or {})})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_workload_reports_exactly_what_it_launched() -> None:
    gpusim_library()
    report = _workload(1.0, 250)  # 250 launches: 50 steps of 5
    steps = 50
    assert report["simulated"] is True and report["steps"] == steps and report["dropped"] == 0
    assert report["launched"] == [{"path": path, "kernel": kernel, "launches": steps,
                                   "duration_ns": steps * REQUESTED_NS[kernel]} for path, kernel in PATHS.items()]
    assert report["by_kernel"] == {k: {"launches": steps, "duration_ns": steps * ns} for k, ns in REQUESTED_NS.items()}
    executed = report["executed"]
    assert {k: (v["kernels"], v["duration_ns"]) for k, v in executed.items()} == {
        k: (steps, steps * ns) for k, ns in REQUESTED_NS.items()}
    assert [k for k, v in executed.items() if v["wall_ns"] < v["duration_ns"]] == []
    sim = report["simulator"]
    assert (sim["launches"], sim["kernels_executed"], sim["launches_decided"], sim["kernels_fired"]) == (
        5 * steps, 5 * steps, 0, 0)  # no agent: no rate limit decisions, no probe fired


def test_workload_rejects_bad_arguments() -> None:
    out = subprocess.run([sys.executable, "-m", "simulate.gpu_workload", "--seconds", "0"],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].endswith("--seconds and --launches-per-s must be positive")


def test_kernels_take_their_duration_in_order_on_the_realtime_clock() -> None:
    sim = GpuSim(gpusim_library())
    sim.synchronize()
    sim.log_start(64)
    plan = [("k_30ms", 30_000_000, 0), ("k_1ms", 1_000_000, 2), ("k_50us", 50_000, 0), ("k_2ms", 2_000_000, 3)]
    before = time.time_ns()
    ids = [sim.launch(name, ns, stream) for name, ns, stream in plan]
    sim.synchronize()
    after = time.time_ns()
    ran = sim.drain()
    assert [(k.name, k.duration_ns, k.stream_id, k.correlation_id, k.device_id, k.state) for k in ran] == [
        (name, ns, stream, cid, 0, "unseen") for (name, ns, stream), cid in zip(plan, ids, strict=True)]
    for k in ran:
        wall = k.end_ns - k.start_ns
        assert k.duration_ns <= wall < k.duration_ns + 20_000_000, k  # 20 ms: room for a busy machine, not 2x
    assert before <= ran[0].start_ns and ran[-1].end_ns <= after
    assert all(a.end_ns <= b.start_ns for a, b in zip(ran, ran[1:], strict=False))  # one device: serial


# ---- the probes firing for real, through bcc ----

@pytest.fixture(scope="module")
def bcc() -> Any:
    return load_bcc()


WORKLOAD_CHILD = r"""
import json, sys
from pathlib import Path
from simulate.gpu import GpuSim
from simulate import gpu_workload as workload
sim = GpuSim(Path(sys.argv[3]))
print("ready", flush=True)
sys.stdin.readline()
report = workload.run(float(sys.argv[1]), float(sys.argv[2]), sim)
report["attached"] = sim.attached()
print(json.dumps(report), flush=True)
sys.stdin.readline()  # stay alive until the parent has read the stacks
"""


@pytest.fixture
def workload_child(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[subprocess.Popen]:
    seconds, rate, limit = request.param
    library = private_copy(gpusim_library(), tmp_path)
    child = subprocess.Popen([sys.executable, "-c", WORKLOAD_CHILD, str(seconds), str(rate), str(library)],
                             cwd=ROOT, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             env={**os.environ, "PYTHONPATH": str(ROOT), "FLEETPROF_LAUNCH_RATE": str(limit)})
    try:
        assert child.stdout.readline().strip() == "ready"
        yield child
    finally:
        child.kill()
        child.wait()


def _run_attached(bcc: Any, child: subprocess.Popen) -> tuple[Any, dict[str, Any]]:
    bpf = attach(bcc, child.pid)
    child.stdin.write("go\n")
    child.stdin.flush()
    return bpf, json.loads(child.stdout.readline())


@pytest.mark.parametrize("workload_child", [(1.0, 250, 0)], indirect=True)
def test_simulator_probes_fire_with_exact_values(bcc: Any, workload_child: subprocess.Popen) -> None:
    bpf, report = _run_attached(bcc, workload_child)
    seen = observed(bpf)
    assert report["attached"] == 7  # the kernel raised the three semaphores attached here
    assert (seen["launches"], seen["weighted"], seen["executed"]) == (250, 0, 250)
    assert seen["apis"] == {"gpusimLaunchKernel (simulated)": 250}
    # the same kernels with the same start/end as the simulator's own log, to the nanosecond
    assert seen["kernels"] == {k: (v["kernels"], v["wall_ns"]) for k, v in report["executed"].items()}
    stacks = []
    for key, count in bpf[b"launch_stacks"].items():
        if key.value < 0:
            continue  # a stack the map could not take (hash collision): the others suffice
        frames = [bpf.sym(a, workload_child.pid, show_module=False).decode() for a in bpf[b"stacks"].walk(key.value)]
        stacks.append((frames, count.value))
    native = [f for f, _ in stacks if "native_gemm" in f]
    assert native and all(f[f.index("native_gemm"):f.index("native_gemm") + 3] ==
                          ["native_gemm", "native_forward", "gpusim_native_train_step"] for f in native)
    assert all(f[:2] == ["gpusim_submit", "gpusim_launch"] for f, _ in stacks)  # fired as gpusim_launch returns


@pytest.mark.parametrize("workload_child", [(1.5, 2000, 100)], indirect=True)
def test_simulator_weights_reach_the_agent(bcc: Any, workload_child: subprocess.Popen) -> None:
    bpf, report = _run_attached(bcc, workload_child)
    seen, stats = observed(bpf), report["simulator"]
    assert stats["launches_decided"] == stats["launches"] == 3000
    assert seen["launches"] == stats["launches_sampled"] < 3000
    assert seen["launches"] - seen["weighted"] + seen["weight_sum"] == stats["weight_sum"]
    assert seen["executed"] == stats["kernels_fired"] == stats["launches_sampled"]
