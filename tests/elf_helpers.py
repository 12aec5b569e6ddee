"""Real ELF files and the answers the system's own tools give about them (readelf, nm, eu-addr2line, gcc), for the
ELF symbol table and `fleetprof symbolize` tests."""

from __future__ import annotations

import bisect
import os
import shutil
import subprocess
import sys
import sysconfig
from collections import defaultdict
from pathlib import Path

import pytest

FUNCTION_TYPES = set("TtWi")  # nm's letters for defined code symbols (i: GNU ifunc)


def unavailable(message: str) -> None:
    """Skip with the reason; on CI a missing prerequisite is a broken runner and fails."""
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def need(tool: str) -> str:
    """The tool's path, or skip (fail on CI) without it."""
    path = shutil.which(tool)
    if path is None:
        unavailable(f"{tool} not found (bash infra/setup.sh installs it)")
    return path


def run(*args: str) -> str:
    return subprocess.run(args, capture_output=True, text=True, check=True).stdout


def _ldconfig_path(soname: str) -> str | None:
    try:
        out = run("ldconfig", "-p")
    except (OSError, subprocess.CalledProcessError):
        out = ""
    for line in out.splitlines():
        if line.strip().startswith(soname + " ") and "x86-64" in line and "=>" in line:
            return line.split("=>")[1].strip()
    for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64"):
        if os.path.exists(f"{d}/{soname}"):
            return f"{d}/{soname}"
    return None


def system_elves() -> list[str]:
    """Real ELF files of this machine: libc, libstdc++, the python3 binaries and a shared libpython if any."""
    found = [_ldconfig_path("libc.so.6"), _ldconfig_path("libstdc++.so.6")]
    found += [os.path.realpath(p) for p in ("/usr/bin/python3", sys.executable) if os.path.exists(p)]
    lib = sysconfig.get_config_var("LDLIBRARY") or ""
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    if lib.endswith(".so") or ".so." in lib:
        found.append(os.path.realpath(os.path.join(libdir, lib)))
    out = []
    for path in found:
        if path and os.path.isfile(path) and path not in out:
            with open(path, "rb") as f:
                if f.read(4) == b"\x7fELF":
                    out.append(path)
    return out


def libc_path() -> str:
    path = _ldconfig_path("libc.so.6")
    if path is None:
        unavailable("no libc.so.6 on this machine")
    return path


class NmTable:
    """nm's view of an ELF file's code symbols: names by address, sizes, and the letter of each name."""

    def __init__(self, path: str, dynamic: bool) -> None:
        need("nm")
        args = ["nm", "--defined-only", "-S"] + (["-D"] if dynamic else []) + [path]
        self.names: dict[int, set[str]] = defaultdict(set)
        self.sizes: dict[int, int] = defaultdict(int)
        self.letters: dict[tuple[int, str], str] = {}
        self.addr_of: dict[str, set[int]] = defaultdict(set)
        for line in run(*args).splitlines():
            parts = line.split()
            if len(parts) == 4:
                addr, size, letter, name = int(parts[0], 16), int(parts[1], 16), parts[2], parts[3]
            elif len(parts) == 3:
                addr, size, letter, name = int(parts[0], 16), 0, parts[1], parts[2]
            else:
                continue
            if letter not in FUNCTION_TYPES or addr == 0:
                continue
            name = name.split("@")[0]  # nm -D adds symbol versions (memcpy@@GLIBC_2.14); tables hold plain names
            self.names[addr].add(name)
            self.sizes[addr] = max(self.sizes[addr], size)
            self.letters[(addr, name)] = letter
            self.addr_of[name].add(addr)

        self._starts = sorted(self.sizes)

    def containing(self, addr: int) -> set[str]:
        """Names of the sized function with the nearest start that contains addr, or an empty set."""
        i = bisect.bisect_right(self._starts, addr) - 1
        while i >= 0:
            start = self._starts[i]
            if addr < start + self.sizes[start]:
                return self.names[start]
            i -= 1
        return set()


def readelf_types(path: str) -> dict[str, str]:
    """Symbol name -> ELF type (FUNC, OBJECT, NOTYPE, IFUNC...) from `readelf -sW` (both tables)."""
    types: dict[str, str] = {}
    for line in run("readelf", "-sW", path).splitlines():
        parts = line.split()
        if len(parts) >= 8 and parts[0].endswith(":") and parts[0][:-1].isdigit():
            types.setdefault(parts[7].split("@")[0], parts[3])
    return types


def readelf_build_id(path: str) -> str:
    for line in run("readelf", "-n", path).splitlines():
        if "Build ID:" in line:
            return line.split("Build ID:")[1].strip()
    return ""


def readelf_loads(path: str) -> list[tuple[int, int, int]]:
    """(file offset, vaddr, memsz) of each LOAD program header, sorted by offset."""
    loads = []
    for line in run("readelf", "-lW", path).splitlines():
        parts = line.split()
        if parts and parts[0] == "LOAD":
            loads.append((int(parts[1], 16), int(parts[2], 16), int(parts[5], 16)))
    return sorted(loads)


def eu_addr2line_functions(path: str, addrs: list[int], no_debug_dir: Path) -> list[str]:
    """eu-addr2line -f's function line for each address, from the file's own symbol table: separate debug files
    (libc6-dbg, debuginfod) would name DWARF scopes and hidden aliases that the file itself does not carry."""
    need("eu-addr2line")
    env = {k: v for k, v in os.environ.items() if k != "DEBUGINFOD_URLS"}
    out = subprocess.run(["eu-addr2line", f"--debuginfo-path={no_debug_dir}", "-f", "-e", path,
                          *[hex(a) for a in addrs]], capture_output=True, text=True, check=True, env=env).stdout
    lines = out.splitlines()
    return [lines[2 * i] for i in range(len(addrs))]  # function, then file:line, per address


def gcc_build(tmp: Path, name: str, source: str, *flags: str, suffix: str = ".c") -> Path:
    """Compile source into tmp/name with gcc (shared library by default flags given by the caller)."""
    need("gcc")
    src = tmp / (name + suffix)
    src.write_text(source)
    out = tmp / name
    subprocess.run(["gcc", *flags, "-o", str(out), str(src)], check=True, capture_output=True, text=True)
    return out


SMALL_C = """
int visible_one(int x) { return x + 1; }
static int __attribute__((noinline)) hidden_two(int x) { return x * 3 + visible_one(x); }
int visible_three(int x) { return hidden_two(x) + 2; }
int alias_of_three(int x) __attribute__((alias("visible_three")));
int __attribute__((weak)) weak_four(int x) { return x - 4; }
"""


def small_library(tmp: Path, *extra: str) -> Path:
    """A small .symtab shared library with a local, a weak and an aliased function."""
    return gcc_build(tmp, "libsmall.so", SMALL_C, "-shared", "-fPIC", "-O1", *extra)


def many_functions_library(tmp: Path, count: int = 100_000) -> Path:
    """A shared library of `count` tiny functions at distinct addresses (assembly: builds in about a second).
    Every 1000th also has a weak and a local alias; every 7th has size 0."""
    lines = [".text"]
    for i in range(count):
        name = f"fn_{i:06d}"
        lines += [f".globl {name}", f".type {name}, @function", f"{name}:"]
        if i % 1000 == 0:
            lines += [f".weak {name}_w", f".type {name}_w, @function", f"{name}_w:",
                      f".type {name}_local, @function", f"{name}_local:"]
        lines += ["  nop"] * (i % 4) + ["  ret"]
        if i % 7:
            lines.append(f".size {name}, .-{name}")
    return gcc_build(tmp, "libmany.so", "\n".join(lines) + "\n", "-shared", "-nostdlib", suffix=".s")
