"""NVTX ranges through the CUPTI shim as an NVTX injection library: a C workload built with the real NVTX3 headers
(nvidia-nvtx-cu12) pushes, pops, starts and ends ranges around kernel launches on the simulated libcupti; the
shim's record file carries each sampled launch's range path (launch_range's argument)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from producers.cupti_shim import build_shim, nvtx_include_dir
from producers.native_build import NativeBuildError
from simulate.cupti import build_simulated_cupti
from tests.elf_helpers import gcc_build, unavailable
from tests.usdt_probes import built

HERE = Path(__file__).resolve().parent
BEFORE = "[range before attach]"


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        include = nvtx_include_dir()
    except NativeBuildError as exc:
        unavailable(str(exc))
    return gcc_build(tmp_path_factory.mktemp("nvtx"), "cupti_nvtx_workload",
                     (HERE / "cupti_nvtx_workload.c").read_text(), "-O2", f"-I{include}", "-ldl", "-pthread")


def run_workload(workload: Path, record: Path, *args: str) -> subprocess.CompletedProcess:
    shim, cupti = built(build_shim), built(build_simulated_cupti)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("FLEETPROF_")},
           "FLEETPROF_CUPTI_LIBRARY": str(cupti), "CUDA_INJECTION64_PATH": str(shim),
           "NVTX_INJECTION64_PATH": str(shim), "FLEETPROF_CUPTI_RECORD": str(record), "FLEETPROF_LAUNCH_RATE": "0"}
    done = subprocess.run([str(workload), *args], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    return done


def by_type(record: Path) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for line in record.read_text().splitlines():
        entry = json.loads(line)
        out.setdefault(entry["type"], []).append(entry)
    return out


def test_range_paths_of_the_real_nvtx3_library(workload: Path, tmp_path: Path) -> None:
    record = tmp_path / "records.jsonl"
    run_workload(workload, record)
    r = by_type(record)
    paths = {x["api"]: x.get("nvtx_range") for x in r["launch"]}
    early = BEFORE + " > "  # "early" was pushed before CUDA started the shim (and its record file): unknown
    assert paths == {
        "early_only": BEFORE,
        "forward": early + "step > forward",
        "backward": early + "step > backward",  # copied at the push: the caller freed its string since
        "domain": early + "step > backward > megatron:layer0 > megatron:attn",  # a domain, a registered string
        "started": early + "step > backward > wide > prefetch",  # push/pop first, then open start/end ranges
        "ended": early + "step > backward > wide",  # ended on another thread: gone
        "long": early + "m" * 92 + "...",  # a message is kept to 95 bytes
        "deep": early + " > ".join(["level"] * 31) + "...",  # 32 levels kept, the 9 deeper counted
        "over": (early + " > ".join(["n" * 90] * 10))[:508] + "...",  # 511 bytes and the NUL
        "many_starts": early + "kept",  # after 100 start/end pairs: none refused, none left
        "outside": None,
        "after": None,
    }
    summary = r["summary"][0]
    assert {k: summary[k] for k in ("launch_ranges", "nvtx_messages_cut", "nvtx_too_deep", "nvtx_pops_unmatched",
                                    "nvtx_paths_cut", "nvtx_starts_refused")} == {
        "launch_ranges": 10, "nvtx_messages_cut": 1, "nvtx_too_deep": 9, "nvtx_pops_unmatched": 1,
        "nvtx_paths_cut": 2, "nvtx_starts_refused": 0}
