"""The CUPTI shim and the GPU simulator: builds, exported symbols, the USDT probe ABI in both ELF files, the simulated
workload against exactly what it launched, kernel timing, the shared rate limit, the shim's logic against a
simulated libcupti, and the probes firing for real through bcc (skipped off CI without BPF)."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from elftools.elf.elffile import ELFFile

from producers.cpu_sampler import BpfUnavailable, check_bpf
from producers.cupti_shim import CUDA_INCLUDE_ENV, CUPTI_SHIM, build_shim, cuda_include_dirs
from producers.native_build import NativeBuildError, NativeLibrary, build
from simulate.gpu import GpuSim, build_gpusim
from tests.elf_helpers import gcc_build, need, unavailable
from tests.gpu.validate import gcc_command, read_records

ROOT = Path(__file__).resolve().parent.parent
# The ABI of native/include/fleetprof_probes.h as sdt argument sizes (negative: signed).
PROBE_ARGS = {"kernel_launch": [4, -4, 8], "kernel_executed": [8, 8, 4, 4, 4, 8], "launch_weight": [4, 4]}
SIMULATED_CUPTI = NativeLibrary(
    name="simulated_cupti", sources=("sim/cupti/simulated_cupti.c",), output="libcupti_simulated.so",
    cflags=("-fvisibility=hidden", "-pthread"), ldflags=("-pthread",), soname="libcupti_simulated.so",
    include_dirs=cuda_include_dirs)


# ---- builds and ELF contents ----

def _built(build_one: Any) -> Path:
    """The library, or unavailable() naming what is missing (gcc, <sys/sdt.h>, the nvidia-* wheels): a skip here,
    a failure on CI."""
    try:
        return build_one()
    except NativeBuildError as exc:
        unavailable(str(exc))
        raise


def shim_library() -> Path:
    return _built(build_shim)


def gpusim_library() -> Path:
    return _built(build_gpusim)


def test_shim_builds_from_the_wheel_headers(monkeypatch: pytest.MonkeyPatch) -> None:
    need("gcc")
    monkeypatch.delenv(CUDA_INCLUDE_ENV, raising=False)
    try:
        dirs = cuda_include_dirs()
    except NativeBuildError as exc:  # the test extra's nvidia-* wheels are missing
        unavailable(str(exc))
    assert [("nvidia" in d.parts) for d in dirs] == [True] * len(dirs)
    assert {h for h in ("cupti.h", "cuda.h", "crt/host_defines.h") if any((d / h).is_file() for d in dirs)} == {
        "cupti.h", "cuda.h", "crt/host_defines.h"}
    assert shim_library().is_file()


def test_missing_cuda_headers_are_one_line_naming_the_wheels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CUDA_INCLUDE_ENV, str(tmp_path))
    with pytest.raises(NativeBuildError) as caught:
        cuda_include_dirs()
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("cannot build the CUPTI shim: no cupti.h (nvidia-cuda-cupti-cu12), cuda.h "
                              "(nvidia-cuda-runtime-cu12), crt/host_defines.h (nvidia-cuda-nvcc-cu12) in "
                              f"{CUDA_INCLUDE_ENV}={tmp_path}")


def _dynamic(path: Path) -> tuple[set[str], set[str]]:
    """(defined global function names in .dynsym, DT_NEEDED entries)."""
    with path.open("rb") as f:
        elf = ELFFile(f)
        names = {s.name for s in elf.get_section_by_name(".dynsym").iter_symbols()
                 if s["st_info"]["type"] == "STT_FUNC" and s["st_info"]["bind"] == "STB_GLOBAL"
                 and s["st_shndx"] != "SHN_UNDEF"}
        needed = {t.needed for t in elf.get_section_by_name(".dynamic").iter_tags() if t.entry.d_tag == "DT_NEEDED"}
    return names, needed


def test_shim_exports_only_initialize_injection_and_links_no_cuda() -> None:
    names, needed = _dynamic(shim_library())
    assert names == {"InitializeInjection"}
    assert [n for n in needed if "cupti" in n or "cuda" in n] == []  # libcupti is opened at run time


def test_simulator_exports_its_api() -> None:
    names, _ = _dynamic(gpusim_library())
    assert names == {"gpusim_launch", "gpusim_synchronize", "gpusim_set_device", "gpusim_device_count",
                     "gpusim_launch_rate", "gpusim_attached", "gpusim_stats", "gpusim_sizeof", "gpusim_log_start",
                     "gpusim_log_drain", "gpusim_native_train_step", "gpusim_native_kernels"}


def _file_offset(elf: ELFFile, vaddr: int) -> int:
    for seg in elf.iter_segments():
        if seg["p_type"] == "PT_LOAD" and seg["p_vaddr"] <= vaddr < seg["p_vaddr"] + seg["p_memsz"]:
            return vaddr - seg["p_vaddr"] + seg["p_offset"]
    raise ValueError(f"{vaddr:#x} is in no PT_LOAD segment")


def _sdt_notes(path: Path) -> tuple[list[dict[str, Any]], tuple[int, int]]:
    """The .note.stapsdt probes (provider, name, addresses, argument sizes) and the .probes address range."""
    with path.open("rb") as f:
        elf = ELFFile(f)
        probes = elf.get_section_by_name(".probes")
        base = elf.get_section_by_name(".stapsdt.base")["sh_addr"]
        notes = []
        for note in elf.get_section_by_name(".note.stapsdt").iter_notes():
            assert note["n_name"] == "stapsdt"  # type 3, which pyelftools names after the GNU build id
            desc = note["n_descdata"]
            pc, note_base, semaphore = struct.unpack_from("<QQQ", desc)
            provider, name, args = desc[24:].split(b"\0")[:3]
            pc, semaphore = pc + base - note_base, semaphore + base - note_base  # as the note says: prelinking
            notes.append({"provider": provider.decode(), "name": name.decode(), "semaphore": semaphore,
                          "pc_offset": _file_offset(elf, pc), "semaphore_offset": _file_offset(elf, semaphore),
                          "sizes": [int(a.split(b"@")[0]) for a in args.split()]})
    return notes, (probes["sh_addr"], probes["sh_addr"] + probes["sh_size"])


@pytest.mark.parametrize("which", ["shim", "simulator"])
def test_probes_follow_the_abi(which: str) -> None:
    notes, (low, high) = _sdt_notes(shim_library() if which == "shim" else gpusim_library())
    assert sorted(n["name"] for n in notes) == sorted(PROBE_ARGS)  # the three probes, one site each
    for note in notes:
        assert note["provider"] == "fleetprof"
        assert note["sizes"] == PROBE_ARGS[note["name"]], note["name"]
        assert low <= note["semaphore"] < high, note["name"]
    assert len({n["semaphore"] for n in notes}) == 3


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


# ---- the per-thread rate limit (native/include/fleetprof_ratelimit.h) with a synthetic clock ----

RATELIMIT_DRIVER = r"""
#include "fleetprof_ratelimit.h"
/* n launches every period_ns; every `every`-th is of kind A. out: sampled, weight sum, pending, most sampled in a
 * window, weight attributed to A, launches of A, smallest weight of a sampled launch */
void drive(uint32_t rate, uint64_t period_ns, uint64_t n, uint32_t every, uint64_t seed, uint64_t *out) {
    fleetprof_ratelimit_t rl = {0};
    uint64_t window = 0, in_window = 0, min_weight = UINT64_MAX;
    for (int i = 0; i < 7; i++) out[i] = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t now = 1000000000ull + i * period_ns;
        if (now / FLEETPROF_RATELIMIT_WINDOW_NS != window) {
            window = now / FLEETPROF_RATELIMIT_WINDOW_NS;
            in_window = 0;
        }
        uint32_t w = fleetprof_ratelimit_take(&rl, rate, now, seed);
        int a = every && i % every == 0;
        out[5] += a;
        if (w) {
            out[0]++; out[1] += w; in_window++;
            if (in_window > out[3]) out[3] = in_window;
            if (a) out[4] += w;
            if (w < min_weight) min_weight = w;
        }
    }
    out[2] = rl.skipped;
    out[6] = min_weight;
}
"""


@pytest.fixture(scope="module")
def ratelimit(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.mktemp("ratelimit")
    lib = ctypes.CDLL(str(gcc_build(folder, "libratelimit.so", RATELIMIT_DRIVER, "-shared", "-fPIC", "-O2",
                                    f"-I{ROOT / 'native' / 'include'}")))
    lib.drive.argtypes = [ctypes.c_uint32, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint64,
                          ctypes.POINTER(ctypes.c_uint64)]

    def drive(rate: int, period_ns: int, n: int, every: int = 0, seed: int = 12345) -> dict[str, int]:
        out = (ctypes.c_uint64 * 7)()
        lib.drive(rate, period_ns, n, every, seed, out)
        keys = ("sampled", "weight_sum", "pending", "max_per_window", "weight_a", "launches_a", "min_weight")
        return dict(zip(keys, out, strict=True))

    return drive


def test_rate_limit_weights_add_up_to_the_launch_count(ratelimit: Any) -> None:
    r = ratelimit(rate=1000, period_ns=100_000, n=100_000)  # 10 kHz for 10 s against 1000/s
    assert r["weight_sum"] + r["pending"] == 100_000
    assert r["min_weight"] >= 1
    assert r["max_per_window"] <= 200  # the cap: twice the rate's share of a 100 ms window
    assert 9_000 <= r["sampled"] <= 11_000  # about the rate: 10 s x 1000/s


def test_rate_limit_keeps_every_launch_below_the_rate(ratelimit: Any) -> None:
    r = ratelimit(rate=1000, period_ns=2_000_000, n=5_000)  # 500/s
    assert (r["sampled"], r["weight_sum"], r["pending"], r["min_weight"]) == (5_000, 5_000, 0, 1)
    r = ratelimit(rate=0, period_ns=1_000, n=5_000)  # 0: no limit
    assert (r["sampled"], r["weight_sum"], r["pending"]) == (5_000, 5_000, 0)


def test_rate_limit_weights_are_unbiased_per_call_path(ratelimit: Any) -> None:
    # A periodic loop (1 launch of A, then 9 of others) sampled at 1%: a stride would hit A always or never; the
    # weights attributed to A must still add up to A's launches.
    r = ratelimit(rate=100, period_ns=100_000, n=20_000_000, every=10)
    assert r["weight_sum"] + r["pending"] == 20_000_000
    assert abs(r["weight_a"] / r["launches_a"] - 1) < 0.04, r


# ---- the shim against a simulated libcupti ----

SHIM_DRIVER = r"""
import ctypes, json, os, sys, time
cupti = ctypes.CDLL(os.environ["FLEETPROF_CUPTI_LIBRARY"], mode=ctypes.RTLD_GLOBAL)
cupti.simcupti_launch.argtypes = [ctypes.c_uint32, ctypes.c_uint32, ctypes.c_char_p, ctypes.c_char_p,
                                  ctypes.c_uint32, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_int, ctypes.c_int]
cupti.simcupti_launch.restype = ctypes.c_uint32
# "-": the shim the environment injects, as the CUDA driver loads CUDA_INJECTION64_PATH
shim = ctypes.CDLL(os.environ["CUDA_INJECTION64_PATH"] if sys.argv[1] == "-" else sys.argv[1])
plan = json.loads(sys.argv[2])
states = [shim.InitializeInjection(), cupti.simcupti_state()]
def launch(driver, cbid, api, kernel, kernels=1, ns=1000, stream=0, nested=0, fail=0):
    return cupti.simcupti_launch(driver, cbid, api.encode(), kernel.encode(), kernels, ns, stream, nested, fail)
def wait_state(want):
    deadline = time.monotonic() + 5
    while cupti.simcupti_state() != want and time.monotonic() < deadline:
        time.sleep(0.01)
    return cupti.simcupti_state()
if plan.get("wait_ready"):
    print("ready", flush=True)
    states.append(wait_state(int(sys.stdin.readline())))
before = time.time_ns()
ids = [launch(*step) for step in plan["launches"]]
after = time.time_ns()
if plan.get("poke"):  # what the kernel does when an agent attaches a uprobe with a semaphore: add one
    time.sleep(0.3)
    states.append(cupti.simcupti_state())
    library = os.path.realpath(sys.argv[1])
    base = min(int(line.split("-")[0], 16) for line in open("/proc/self/maps") if line.rstrip().endswith(library))
    sem = ctypes.c_ushort.from_address(base + plan["poke"])
    sem.value = 1
    states.append(wait_state(3))
    sem.value = 0
    states.append(wait_state(0))
print(json.dumps({"ids": ids, "before": before, "after": after, "states": states}), flush=True)
if plan.get("wait_ready"):
    sys.stdin.readline()
"""


@pytest.fixture(scope="module")
def simulated_cupti() -> Path:
    return _built(lambda: build(SIMULATED_CUPTI))


def _drive_shim(plan: dict[str, Any], cupti: Path, env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", SHIM_DRIVER, str(shim_library()), json.dumps(plan)],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "FLEETPROF_CUPTI_LIBRARY": str(cupti), **env})
    assert out.returncode == 0, out.stderr
    return {**json.loads(out.stdout), "stderr": out.stderr}


def _records(path: Path) -> dict[str, list[dict[str, Any]]]:
    by_type: dict[str, list[dict[str, Any]]] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        by_type.setdefault(record["type"], []).append(record)
    return by_type


RUNTIME, DRIVER = 0, 1
LAUNCH_PLAN = [
    [RUNTIME, 211, "cudaLaunchKernel", "k_a", 1, 1000, 7],
    [RUNTIME, 211, "cudaLaunchKernel", "k_a", 1, 1000, 7, 1],  # makes a nested driver launch: counted once
    [RUNTIME, 211, "cudaLaunchKernel", "k_a", 1, 1000, 7, 0, 1],  # fails: no kernel
    [RUNTIME, 311, "cudaGraphLaunch", "k_graph", 4, 2000],  # one launch, four kernels
    [DRIVER, 307, "cuLaunchKernel", "k_b", 1, 3000],
    [RUNTIME, 3, "cudaMalloc", "k_unseen", 1, 4000],  # not a launch API: its kernel has no known launch
]


def test_shim_records_launches_and_kernels(simulated_cupti: Path, tmp_path: Path) -> None:
    record = tmp_path / "records.jsonl"
    run = _drive_shim({"launches": LAUNCH_PLAN}, simulated_cupti,
                      {"FLEETPROF_CUPTI_RECORD": str(record), "FLEETPROF_LAUNCH_RATE": "0"})
    assert run["states"] == [1, 3]  # self-check mode: CUPTI on from InitializeInjection
    a1, a2, _failed, graph, driver, unseen = run["ids"]
    r = _records(record)
    assert [(x["correlation_id"], x["callback_id"], x["domain"], x["api"], x["weight"], x["nested"])
            for x in r["launch"]] == [
        (a1, 211, "runtime", "cudaLaunchKernel", 1, False),
        (a2 + 1, 307, "driver", "cuLaunchKernel", 1, True),
        (a2, 211, "runtime", "cudaLaunchKernel", 1, False),
        (graph, 311, "runtime", "cudaGraphLaunch", 1, False),
        (driver, 307, "driver", "cuLaunchKernel", 1, False)]
    assert [(k["correlation_id"], k["name"], k["end_ns"] - k["start_ns"], k["stream_id"], k["fired"])
            for k in r["kernel"]] == [
        (a1, "k_a", 1000, 7, True), (a2, "k_a", 1000, 7, True), *[(graph, "k_graph", 2000, 0, True)] * 4,
        (driver, "k_b", 3000, 0, True), (unseen, "k_unseen", 4000, 0, True)]
    assert all(run["before"] <= k["start_ns"] <= run["after"] for k in r["kernel"])  # Unix ns, as they are
    assert r["on"][0]["clock"] == "cupti-timestamp-callback"
    # what tests/gpu/validate.sh makes of the same file
    totals, facts = read_records(record.read_text().splitlines(), run["before"], run["after"] + 10_000)
    assert (totals.count, totals.ns) == ({"k_a": 2, "k_graph": 4, "k_b": 1, "k_unseen": 1},
                                         {"k_a": 2000, "k_graph": 8000, "k_b": 3000, "k_unseen": 4000})
    assert (facts["launches"], facts["nested_launches"], facts["kernels_with_launch"]) == (4, 1, 7)
    summary = {k: v for k, v in r["summary"][0].items() if k != "type"}
    assert summary == {"launches": 4, "launches_sampled": 4, "launches_nested": 1, "launches_failed": 1,
                       "kernels": 8, "kernels_skipped": 0, "kernels_unseen": 1, "kernels_incomplete": 0,
                       "records_dropped": 0, "buffers_refused": 0}


def test_shim_without_sdt_header_still_records(simulated_cupti: Path, tmp_path: Path) -> None:
    # the build tests/gpu/validate.sh falls back to on a GPU machine without <sys/sdt.h>
    shim = tmp_path / "libfleetprof_cupti.so"
    subprocess.run(gcc_command(CUPTI_SHIM, cuda_include_dirs(), shim, no_sdt=True), check=True, capture_output=True)
    with shim.open("rb") as f:
        assert ELFFile(f).get_section_by_name(".note.stapsdt") is None
    record = tmp_path / "records.jsonl"
    out = subprocess.run([sys.executable, "-c", SHIM_DRIVER, str(shim), json.dumps({"launches": LAUNCH_PLAN[:2]})],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "FLEETPROF_CUPTI_LIBRARY": str(simulated_cupti),
                              "FLEETPROF_CUPTI_RECORD": str(record)})
    assert out.returncode == 0, out.stderr
    assert [(k["name"], k["fired"]) for k in _records(record)["kernel"]] == [("k_a", True), ("k_a", True)]


def test_shim_aligns_another_clock_to_unix_time(simulated_cupti: Path, tmp_path: Path) -> None:
    record = tmp_path / "records.jsonl"
    run = _drive_shim({"launches": [[RUNTIME, 211, "cudaLaunchKernel", "k", 1, 5000]] * 3}, simulated_cupti,
                      {"FLEETPROF_CUPTI_RECORD": str(record), "SIMULATED_CUPTI_CLOCK": "monotonic"})
    r = _records(record)
    assert r["on"][0]["clock"] == "measured-offset"
    assert [k["end_ns"] - k["start_ns"] for k in r["kernel"]] == [5000] * 3
    slack = 1_000_000  # the offset is measured between two clock reads; 1 ms is far above its error
    assert all(run["before"] - slack <= k["start_ns"] <= run["after"] + slack for k in r["kernel"])


def test_shim_rate_limit_skips_kernels_of_skipped_launches(simulated_cupti: Path, tmp_path: Path) -> None:
    record = tmp_path / "records.jsonl"
    n = 3000
    _drive_shim({"launches": [[RUNTIME, 211, "cudaLaunchKernel", "k", 1, 100]] * n}, simulated_cupti,
                {"FLEETPROF_CUPTI_RECORD": str(record), "FLEETPROF_LAUNCH_RATE": "50"})
    r = _records(record)
    weights = [x["weight"] for x in r["launch"]]
    trailing = len(weights) - max(i for i, w in enumerate(weights) if w) - 1
    assert len(weights) == n and sum(weights) + trailing == n
    assert sum(1 for w in weights if w) < n / 10  # 50/s, when the launches come at thousands per second
    fired = {k["correlation_id"]: k["fired"] for k in r["kernel"]}
    assert fired == {x["correlation_id"]: x["weight"] > 0 for x in r["launch"]}
    assert r["summary"][0]["kernels_skipped"] == weights.count(0)


def test_shim_counts_records_dropped_when_its_pool_runs_dry(simulated_cupti: Path, tmp_path: Path) -> None:
    record = tmp_path / "records.jsonl"
    run = _drive_shim({"launches": [[RUNTIME, 311, "cudaGraphLaunch", "k", 2000, 100]]}, simulated_cupti,
                      {"FLEETPROF_CUPTI_RECORD": str(record), "FLEETPROF_CUPTI_BUFFERS": "2",
                       "FLEETPROF_CUPTI_BUFFER_KB": "64", "FLEETPROF_CUPTI_FLUSH_MS": "60000"})
    summary = _records(record)["summary"][0]
    per_buffer = 64 * 1024 // 208  # records of the CUDA 12 kernel record size in one buffer
    assert (summary["kernels"], summary["records_dropped"]) == (2 * per_buffer, 2000 - 2 * per_buffer)
    assert summary["buffers_refused"] >= 1
    assert "raise FLEETPROF_CUPTI_BUFFERS (now 2)" in run["stderr"]


def _semaphore_offset(library: Path, name: str) -> int:
    """Where a semaphore sits from the start of the library's lowest mapping."""
    with library.open("rb") as f:
        elf = ELFFile(f)
        symbol = next(s for s in elf.get_section_by_name(".symtab").iter_symbols() if s.name == name)
        base = min(seg["p_vaddr"] for seg in elf.iter_segments() if seg["p_type"] == "PT_LOAD")
    return symbol["st_value"] - base


def test_shim_keeps_cupti_off_until_an_agent_attaches(simulated_cupti: Path) -> None:
    offset = _semaphore_offset(shim_library(), "fleetprof_kernel_launch_semaphore")
    run = _drive_shim({"launches": [], "poke": offset}, simulated_cupti, {"FLEETPROF_CUPTI_RECORD": ""})
    # off after init and 300 ms later; on (subscriber + kernel records) once attached; off again once detached
    assert run["states"] == [1, 0, 0, 3, 0]


# ---- fleetprof run ----

def _fleetprof(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fleetprof", *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def test_run_injects_the_shim_and_passes_the_exit_status(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_INJECTION64_PATH"} | {"PYTHONPATH": str(ROOT)}
    script = 'printf "%s\\n%s\\n" "$CUDA_INJECTION64_PATH" "$FLEETPROF_CUPTI_RECORD"; exit 7'
    out = subprocess.run([sys.executable, "-m", "fleetprof", "run", "--record", "rel.jsonl", "--", "sh", "-c", script],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert (out.returncode, out.stdout.splitlines()) == (7, [str(shim_library()), str(tmp_path / "rel.jsonl")])


def test_run_says_in_one_line_why_it_cannot(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    out = _fleetprof("run", "--", str(missing), cwd=tmp_path)
    assert (out.returncode, out.stderr) == (127, f"Error: cannot run {missing}: No such file or directory\n")
    out = _fleetprof("run", "--", "true", cwd=tmp_path, env={"CUDA_INJECTION64_PATH": "/elsewhere/libinject.so"})
    assert out.returncode == 1
    assert out.stderr == ("Error: CUDA_INJECTION64_PATH is already set to /elsewhere/libinject.so: CUDA loads one "
                          "injection library; unset it to run under fleetprof\n")


def test_run_records_what_the_injected_shim_sees(simulated_cupti: Path, tmp_path: Path) -> None:
    # the simulated libcupti stands in for CUDA and CUPTI; the driver loads the shim as the CUDA driver would
    plan = {"launches": [[RUNTIME, 211, "cudaLaunchKernel", "k_a", 1, 1000], [RUNTIME, 311, "cudaGraphLaunch", "g", 2]]}
    out = _fleetprof("run", "--record", "records.jsonl", "--", sys.executable, "-c", SHIM_DRIVER, "-", json.dumps(plan),
                     cwd=tmp_path, env={"FLEETPROF_CUPTI_LIBRARY": str(simulated_cupti)})
    assert out.returncode == 0, out.stderr
    r = _records(tmp_path / "records.jsonl")
    assert [x["api"] for x in r["launch"]] == ["cudaLaunchKernel", "cudaGraphLaunch"]
    assert [k["name"] for k in r["kernel"]] == ["k_a", "g", "g"]


# ---- the probes firing for real, through bcc ----

BPF_COUNTER = r"""
struct name_t { char s[64]; };
struct agg_t { u64 n; u64 ns; };
BPF_ARRAY(counts, u64, 4);  /* kernel_launch, launch_weight, sum of weights, kernel_executed */
BPF_HASH(kernels, struct name_t, struct agg_t, 64);
BPF_HASH(apis, struct name_t, u64, 16);
BPF_STACK_TRACE(stacks, 16384);
BPF_HASH(launch_stacks, int, u64, 256);
static void add(int i, u64 v) { u64 *c = counts.lookup(&i); if (c) __sync_fetch_and_add(c, v); }
int on_launch(struct pt_regs *ctx) {
    u64 api = 0, zero = 0; struct name_t k = {};
    bpf_usdt_readarg(3, ctx, &api);
    bpf_probe_read_user_str(&k.s, sizeof(k.s), (void *)api);
    u64 *n = apis.lookup_or_try_init(&k, &zero);
    if (n) __sync_fetch_and_add(n, 1);
    int id = stacks.get_stackid(ctx, BPF_F_USER_STACK);
    u64 *s = launch_stacks.lookup_or_try_init(&id, &zero);
    if (s) __sync_fetch_and_add(s, 1);
    add(0, 1);
    return 0;
}
int on_weight(struct pt_regs *ctx) { u32 w = 0; bpf_usdt_readarg(2, ctx, &w); add(1, 1); add(2, w); return 0; }
int on_executed(struct pt_regs *ctx) {
    u64 start = 0, end = 0, name = 0; struct name_t k = {}; struct agg_t zero = {};
    bpf_usdt_readarg(1, ctx, &start); bpf_usdt_readarg(2, ctx, &end); bpf_usdt_readarg(6, ctx, &name);
    bpf_probe_read_user_str(&k.s, sizeof(k.s), (void *)name);
    struct agg_t *a = kernels.lookup_or_try_init(&k, &zero);
    if (a) { __sync_fetch_and_add(&a->n, 1); __sync_fetch_and_add(&a->ns, end - start); }
    add(3, 1);
    return 0;
}
"""


def _pass_ref_ctr_offset(bcc: Any) -> None:
    """bcc 0.26's Python calls libbcc's 7-argument bpf_attach_uprobe with 6, so ref_ctr_offset is whatever lies on the
    stack and the kernel refuses the uprobe now and then ("ref_ctr_offset mismatch", EINVAL) when another attach to
    the same probe passed the real one. Pass the real one, from the probe's note: the kernel then keeps the semaphore
    raised too (bcc's USDT code also raises it itself, through /proc/PID/mem)."""
    lib = bcc.libbcc.lib
    real = lib.bpf_attach_uprobe
    if len(real.argtypes) != 6:
        return  # a bcc that passes it itself
    real.argtypes = [*real.argtypes, ctypes.c_uint32]

    def attach(progfd: int, kind: int, ev_name: bytes, path: bytes, addr: int, pid: int) -> int:
        try:
            notes, _ = _sdt_notes(Path(path.decode()))
        except (OSError, AttributeError, ValueError):
            notes = []
        ref_ctr = next((n["semaphore_offset"] for n in notes if n["pc_offset"] == addr), 0)
        return real(progfd, kind, ev_name, path, addr, pid, ref_ctr)

    lib.bpf_attach_uprobe = attach


@pytest.fixture(scope="module")
def bcc() -> Any:
    try:
        module = check_bpf()
    except BpfUnavailable as exc:
        unavailable(f"BPF unavailable: {exc}")
    _pass_ref_ctr_offset(module)
    return module


def _attach(bcc: Any, pid: int) -> Any:
    usdt = bcc.USDT(pid=pid)
    usdt.enable_probe(probe="fleetprof:kernel_launch", fn_name="on_launch")
    usdt.enable_probe(probe="fleetprof:launch_weight", fn_name="on_weight")
    usdt.enable_probe(probe="fleetprof:kernel_executed", fn_name="on_executed")
    bpf = bcc.BPF(text=BPF_COUNTER.encode(), usdt_contexts=[usdt])
    bpf.usdt_context = usdt  # bcc raised the semaphores through this object, and lowers them when it is freed
    return bpf


def _observed(bpf: Any) -> dict[str, Any]:
    counts = bpf[b"counts"]
    kernels = {k.s.decode(): (v.n, v.ns) for k, v in bpf[b"kernels"].items()}
    return {"launches": counts[0].value, "weighted": counts[1].value, "weight_sum": counts[2].value,
            "executed": counts[3].value, "kernels": kernels,
            "apis": {k.s.decode(): v.value for k, v in bpf[b"apis"].items()}}


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


def _private_copy(library: Path, folder: Path) -> Path:
    """A copy with its own inode: uprobes that other tests or tools left on the shared build cannot clash with
    (the kernel refuses a second uprobe on the same probe with a different semaphore offset)."""
    copy = folder / library.name
    shutil.copyfile(library, copy)
    return copy


@pytest.fixture
def workload_child(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[subprocess.Popen]:
    seconds, rate, limit = request.param
    library = _private_copy(gpusim_library(), tmp_path)
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
    bpf = _attach(bcc, child.pid)
    child.stdin.write("go\n")
    child.stdin.flush()
    return bpf, json.loads(child.stdout.readline())


@pytest.mark.parametrize("workload_child", [(1.0, 250, 0)], indirect=True)
def test_simulator_probes_fire_with_exact_values(bcc: Any, workload_child: subprocess.Popen) -> None:
    bpf, report = _run_attached(bcc, workload_child)
    seen = _observed(bpf)
    assert report["attached"] == 7  # the kernel raised all three semaphores
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
    assert all(f[0] == "gpusim_launch" for f, _ in stacks)  # fired in gpusim_launch itself, as it returns


@pytest.mark.parametrize("workload_child", [(1.5, 2000, 100)], indirect=True)
def test_simulator_weights_reach_the_agent(bcc: Any, workload_child: subprocess.Popen) -> None:
    bpf, report = _run_attached(bcc, workload_child)
    seen, stats = _observed(bpf), report["simulator"]
    assert stats["launches_decided"] == stats["launches"] == 3000
    assert seen["launches"] == stats["launches_sampled"] < 3000
    assert seen["launches"] - seen["weighted"] + seen["weight_sum"] == stats["weight_sum"]
    assert seen["executed"] == stats["kernels_fired"] == stats["launches_sampled"]


def test_shim_probes_fire_through_bcc(bcc: Any, simulated_cupti: Path, tmp_path: Path) -> None:
    plan = {"wait_ready": True, "launches": LAUNCH_PLAN}
    shim = _private_copy(shim_library(), tmp_path)
    child = subprocess.Popen([sys.executable, "-c", SHIM_DRIVER, str(shim), json.dumps(plan)], text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             env={**os.environ, "FLEETPROF_CUPTI_LIBRARY": str(simulated_cupti),
                                  "FLEETPROF_LAUNCH_RATE": "0", "FLEETPROF_CUPTI_RECORD": ""})
    try:
        assert child.stdout.readline().strip() == "ready"
        bpf = _attach(bcc, child.pid)
        child.stdin.write("3\n")  # wait until the shim has turned CUPTI on
        child.stdin.flush()
        run = json.loads(child.stdout.readline())
        child.stdin.write("exit\n")
        child.stdin.flush()
        assert child.wait(timeout=30) == 0  # exit flushes the kernel records: the probes fire then
        seen = _observed(bpf)
    finally:
        child.kill()
        child.wait()
    assert run["states"][-1] == 3
    assert seen["apis"] == {"cudaLaunchKernel": 2, "cudaGraphLaunch": 1, "cuLaunchKernel": 1}
    assert (seen["launches"], seen["weighted"], seen["executed"]) == (4, 0, 8)
    assert seen["kernels"] == {"k_a": (2, 2000), "k_graph": (4, 8000), "k_b": (1, 3000), "k_unseen": (1, 4000)}
