"""The gcc build of the project's small C libraries under native/, on first use into `.build/native/` (rebuilt when
a source, header or flag changes): the CUPTI shim (producers/cupti_shim.py) and, under native/sim/, the GPU simulator
and the simulated libnvidia-ml.so.1 (simulate/).

They are plain gcc builds on purpose: no CUDA toolkit, no cmake. The shim compiles against the CUDA and CUPTI
headers that PyPI's nvidia-* wheels carry, so it builds on machines without a GPU.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NATIVE = ROOT / "native"
PROBES_INCLUDE = NATIVE / "include"
BUILD_DIR = Path(os.environ.get("FLEETPROF_NATIVE_BUILD", ROOT / ".build" / "native"))


class NativeBuildError(RuntimeError):
    """A native library could not be built; the message is one line naming what is missing or failed."""


@dataclass(frozen=True)
class NativeLibrary:
    name: str
    sources: tuple[str, ...]  # relative to native/
    output: str  # file name of the shared object
    cflags: tuple[str, ...] = ()
    ldflags: tuple[str, ...] = ()
    soname: str = ""
    # extra include directories, found at build time (e.g. inside installed wheels); raise NativeBuildError
    include_dirs: Callable[[], list[Path]] = field(default=lambda: [])


def _sdt_header_present() -> bool:
    return any(Path(p, "sys", "sdt.h").exists()
               for p in ("/usr/include", "/usr/include/x86_64-linux-gnu", "/usr/include/aarch64-linux-gnu"))


def _inputs_hash(lib: NativeLibrary, includes: list[Path]) -> str:
    h = hashlib.sha256()
    files = [NATIVE / s for s in lib.sources] + sorted(PROBES_INCLUDE.glob("*.h"))
    files += sorted(p for s in lib.sources for p in (NATIVE / s).parent.glob("*.h"))
    for path in files:
        h.update(str(path.relative_to(ROOT)).encode())
        h.update(path.read_bytes())
    h.update(repr((lib.cflags, lib.ldflags, lib.soname, [str(i) for i in includes])).encode())
    return h.hexdigest()[:16]


def build(lib: NativeLibrary, force: bool = False) -> Path:
    """The built shared object of `lib` (built now if missing or stale)."""
    gcc = shutil.which("gcc")
    if gcc is None:
        raise NativeBuildError(f"cannot build {lib.name}: no gcc (bash infra/setup.sh installs it)")
    if not _sdt_header_present():
        raise NativeBuildError(f"cannot build {lib.name}: no <sys/sdt.h> (Debian systemtap-sdt-dev; "
                               "bash infra/setup.sh installs it)")
    includes = [PROBES_INCLUDE, *lib.include_dirs()]
    out_dir = BUILD_DIR / f"{lib.name}-{_inputs_hash(lib, includes)}"
    target = out_dir / lib.output
    if target.exists() and not force:
        return target
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{lib.name}-", dir=out_dir.parent))
    cmd = [gcc, "-O2", "-g", "-fPIC", "-shared", "-fno-omit-frame-pointer", "-Wall", "-Werror",
           *lib.cflags, *[f"-I{i}" for i in includes],
           *[str(NATIVE / s) for s in lib.sources], "-o", str(staging / lib.output)]
    if lib.soname:
        cmd.append(f"-Wl,-soname,{lib.soname}")
    cmd += [*lib.ldflags]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        first = next((ln for ln in done.stderr.splitlines() if "error" in ln), done.stderr.strip()[:300])
        raise NativeBuildError(f"building {lib.name} failed: {first}")
    try:
        staging.rename(out_dir)  # atomic: a concurrent build of the same inputs either wins or finds it done
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    return target
