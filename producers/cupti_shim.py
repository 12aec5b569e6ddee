"""The CUPTI shim (native/cupti_shim/, injected into CUDA processes), built with gcc by producers/native_build.py.

The shim compiles against the CUDA and CUPTI headers of PyPI's nvidia-* wheels (the project's test extra installs
them), or against a local CUDA toolkit's headers named by FLEETPROF_CUDA_INCLUDE; it never links libcupti (it opens
it at run time), so one build serves CUDA 12 and 13.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from producers.native_build import NativeBuildError, NativeLibrary, build

# header -> the wheel that carries it
CUDA_HEADERS = {
    "cupti.h": "nvidia-cuda-cupti-cu12",
    "cuda.h": "nvidia-cuda-runtime-cu12",
    "crt/host_defines.h": "nvidia-cuda-nvcc-cu12",
}
CUDA_INCLUDE_ENV = "FLEETPROF_CUDA_INCLUDE"


def _wheel_include_dirs() -> list[Path]:
    """Every include folder under the installed `nvidia` namespace package (nvidia/*/include, nvidia/*/*/include)."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    found: list[Path] = []
    for root in roots:
        found += sorted(Path(root).glob("*/include")) + sorted(Path(root).glob("*/*/include"))
    return found


def cuda_include_dirs() -> list[Path]:
    """The include folders that hold the shim's CUDA headers, one per header; NativeBuildError naming what is
    missing."""
    override = os.environ.get(CUDA_INCLUDE_ENV, "")
    candidates = [Path(p) for p in override.split(os.pathsep) if p] if override else _wheel_include_dirs()
    chosen: list[Path] = []
    missing: list[str] = []
    for header, wheel in CUDA_HEADERS.items():
        where = next((d for d in candidates if (d / header).is_file()), None)
        if where is None:
            missing.append(f"{header} ({wheel})")
        elif where not in chosen:
            chosen.append(where)
    if missing:
        source = f"{CUDA_INCLUDE_ENV}={override}" if override else "the installed nvidia-* wheels"
        raise NativeBuildError(f"cannot build the CUPTI shim: no {', '.join(missing)} in {source}: "
                               f"run bash infra/setup.sh (pip install -e '.[test]'), or set {CUDA_INCLUDE_ENV}")
    return chosen


NVTX_HEADER = "nvtx3/nvToolsExt.h"
NVTX_WHEEL = "nvidia-nvtx-cu12"


def nvtx_include_dir() -> Path:
    """The include folder of the NVTX3 headers (the nvidia-nvtx-cu12 wheel of the test extra, or one named in
    FLEETPROF_CUDA_INCLUDE), for building test workloads that use NVTX the way applications do; the shim itself
    declares the NVTX ABI it needs and does not need them."""
    override = os.environ.get(CUDA_INCLUDE_ENV, "")
    candidates = [Path(p) for p in override.split(os.pathsep) if p] if override else _wheel_include_dirs()
    found = next((d for d in candidates if (d / NVTX_HEADER).is_file()), None)
    if found is None:
        raise NativeBuildError(f"no {NVTX_HEADER} ({NVTX_WHEEL}) in the installed nvidia-* wheels: run bash "
                               "infra/setup.sh (pip install -e '.[test]')")
    return found


CUPTI_SHIM = NativeLibrary(
    name="cupti_shim",
    sources=("cupti_shim/fleetprof_cupti.c", "cupti_shim/launches.c", "cupti_shim/activity.c",
             "cupti_shim/memory.c", "cupti_shim/nvtx.c", "cupti_shim/record.c"),
    output="libfleetprof_cupti.so",
    cflags=("-fvisibility=hidden", "-D_GNU_SOURCE", "-pthread"),
    ldflags=("-ldl", "-pthread"),
    soname="libfleetprof_cupti.so",
    include_dirs=cuda_include_dirs,
)


def build_shim(force: bool = False) -> Path:
    """libfleetprof_cupti.so, built now if missing or stale."""
    return build(CUPTI_SHIM, force=force)
