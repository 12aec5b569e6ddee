"""Symbolizer throughput (frames/s, one core): fleetprof's symbol tables and vectorized lookup next to
`eu-addr2line -f` on the same addresses in the same run. The ratio is the figure (goal: at least 10x).

    .venv/bin/python bench/symbolizer.py [--addresses 50000] [--seed 1]

Addresses are random, inside the functions (symbol size > 0) of real libraries on this machine: libc.so.6,
libstdc++.so.6 and the venv interpreter's libpython. fleetprof's path: symbol_chunks (the agent's ELF reader) +
table_from_chunks (the symbolizer's table build), timed apart; then SymbolTable.lookup over all addresses plus the
index -> name resolution. Peer: one `eu-addr2line -f -e LIB` per library, the addresses on stdin, with an empty
--debuginfo-path so it reads the file's own symbol table as fleetprof does. Prints a table and writes
bench/out/symbolizer.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from processors.symbol_tables import table_from_chunks  # noqa: E402
from producers.elf_symbols import read_elf_symbols, symbol_chunks  # noqa: E402


def linked_library(exe: str, soname_prefix: str) -> str | None:
    out = subprocess.run(["ldd", exe], capture_output=True, text=True).stdout
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0].startswith(soname_prefix) and "=>" in parts and len(parts) > 2:
            return os.path.realpath(parts[2])
    return None


def libraries() -> dict[str, str]:
    libs = {}
    py = os.path.realpath(sys.executable)
    libs["libpython"] = linked_library(py, "libpython") or py
    libs["libc.so.6"] = linked_library(py, "libc.so.6")
    out = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.strip().startswith("libstdc++.so.6 ") and "x86-64" in line:
            libs["libstdc++.so.6"] = os.path.realpath(line.split("=>")[1].strip())
            break
    return {k: v for k, v in libs.items() if v}


def nm_aliases(path: str) -> dict[str, set[int]]:
    """Every defined function name of the file (.symtab and .dynsym, version suffix dropped) -> address."""
    names: dict[str, set[int]] = defaultdict(set)
    for flags in (["--defined-only"], ["-D", "--defined-only"]):
        out = subprocess.run(["nm", *flags, path], capture_output=True, text=True).stdout
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[1] in "TtWwiu":
                names[parts[2].split("@")[0]].add(int(parts[0], 16))
    return names


def pick_addresses(path: str, n: int, rng: np.random.Generator) -> np.ndarray:
    syms = read_elf_symbols(path)
    ok = syms.sizes > 0
    starts, sizes = syms.addrs[ok], syms.sizes[ok]
    which = rng.integers(0, len(starts), n)
    return starts[which] + (rng.random(n) * sizes[which]).astype(np.uint64)


def fleetprof_run(path: str, addrs: np.ndarray, repeat: int) -> dict:
    t = time.perf_counter()
    chunks = symbol_chunks(path)
    t_read = time.perf_counter() - t
    t = time.perf_counter()
    table = table_from_chunks(chunks)
    t_table = time.perf_counter() - t
    best = float("inf")
    names: list[str | None] = []
    for _ in range(repeat):
        t = time.perf_counter()
        idx = table.lookup(addrs)
        tn = table.names
        names = [tn[i] if i >= 0 else None for i in idx.tolist()]
        best = min(best, time.perf_counter() - t)
    return {"symbols": len(table), "chunks": len(chunks), "read_s": t_read, "table_s": t_table, "lookup_s": best,
            "names": names, "starts": table.starts, "idx": table.lookup(addrs)}


def addr2line_run(path: str, addrs: np.ndarray, empty: str) -> tuple[float, list[str]]:
    env = {k: v for k, v in os.environ.items() if k != "DEBUGINFOD_URLS"}
    text = "\n".join(hex(a) for a in addrs.tolist()) + "\n"
    t = time.perf_counter()
    out = subprocess.run(["eu-addr2line", f"--debuginfo-path={empty}", "-f", "-e", path], input=text,
                         capture_output=True, text=True, check=True, env=env).stdout
    elapsed = time.perf_counter() - t
    lines = out.splitlines()
    return elapsed, [lines[2 * i] for i in range(len(addrs))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--addresses", type=int, default=50_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=5, help="fleetprof lookups per library (best taken)")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    libs = libraries()
    per = args.addresses // len(libs)
    rows = []
    with tempfile.TemporaryDirectory(prefix="fleetprof-nodebug-") as empty:
        for label, path in libs.items():
            addrs = pick_addresses(path, per, rng)
            fp = fleetprof_run(path, addrs, args.repeat)
            peer_s, peer_names = addr2line_run(path, addrs, empty)
            aliases = nm_aliases(path)
            by_addr: dict[int, set[str]] = defaultdict(set)
            for name, where in aliases.items():
                for a in where:
                    by_addr[a].add(name)
            same = alias = differ = 0
            examples = []
            starts = fp["starts"]
            for i, (ours, theirs) in enumerate(zip(fp["names"], peer_names, strict=True)):
                # files with their own DWARF (libpython here): "inner inlined at FILE:LINE in outer"
                theirs = theirs.rsplit(" in ", 1)[-1] if " inlined at " in theirs else theirs
                theirs = theirs.split("@")[0]
                if ours == theirs:
                    same += 1
                elif ours is not None and theirs in by_addr.get(int(starts[fp["idx"][i]]), ()):
                    alias += 1
                else:
                    differ += 1
                    if len(examples) < 5:
                        examples.append({"addr": hex(int(addrs[i])), "fleetprof": ours, "eu-addr2line": theirs})
            rows.append({"library": label, "path": path, "symbols": fp["symbols"], "chunks": fp["chunks"],
                         "addresses": per, "read_s": fp["read_s"], "table_s": fp["table_s"],
                         "lookup_s": fp["lookup_s"], "fleetprof_fps": per / fp["lookup_s"],
                         "fleetprof_with_table_fps": per / (fp["lookup_s"] + fp["read_s"] + fp["table_s"]),
                         "eu_addr2line_s": peer_s, "eu_addr2line_fps": per / peer_s,
                         "same_name": same, "alias_same_address": alias, "differ": differ,
                         "differ_examples": examples})
    n = per * len(rows)
    lookup = sum(r["lookup_s"] for r in rows)
    build = sum(r["read_s"] + r["table_s"] for r in rows)
    peer = sum(r["eu_addr2line_s"] for r in rows)
    total = {"addresses": n, "fleetprof_fps": n / lookup, "fleetprof_with_table_fps": n / (lookup + build),
             "eu_addr2line_fps": n / peer, "ratio": peer / lookup, "ratio_with_table": peer / (lookup + build),
             "agree": sum(r["same_name"] + r["alias_same_address"] for r in rows) / n}
    result = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.node()}: {os.cpu_count()} cores",
              "rows": rows, "total": total}
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "symbolizer.json").write_text(json.dumps(result, indent=2) + "\n")

    print(f"{'library':<15} {'symbols':>8} {'addrs':>7} {'read ms':>8} {'table ms':>9} {'lookup ms':>10} "
          f"{'fleetprof fr/s':>15} {'eu-addr2line fr/s':>18} {'ratio':>7} {'agree':>7}")
    for r in rows:
        agree = (r["same_name"] + r["alias_same_address"]) / r["addresses"]
        print(f"{r['library']:<15} {r['symbols']:>8} {r['addresses']:>7} "
              f"{1e3 * r['read_s']:>8.1f} {1e3 * r['table_s']:>9.1f} {1e3 * r['lookup_s']:>10.2f} "
              f"{r['fleetprof_fps']:>15,.0f} {r['eu_addr2line_fps']:>18,.0f} "
              f"{r['eu_addr2line_s'] / r['lookup_s']:>6.0f}x {100 * agree:>6.2f}%")
    print(f"all: {n} addresses, fleetprof {total['fleetprof_fps']:,.0f} frames/s (lookup + names), "
          f"{total['fleetprof_with_table_fps']:,.0f} with reading and building the tables; eu-addr2line "
          f"{total['eu_addr2line_fps']:,.0f} frames/s; ratio {total['ratio']:.0f}x "
          f"({total['ratio_with_table']:.1f}x with table build); agreement {100 * total['agree']:.2f}%")


if __name__ == "__main__":
    main()
