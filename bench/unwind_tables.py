"""Unwind table compile time (seconds per binary, one core): fleetprof's CFI reader next to pyelftools' decoding of the
same .eh_frame (its CFI entries parsed, then `get_decoded()` for every FDE) in the same run. The ratio is the figure;
the goals are python3.11 well under a second and a ~500 MB binary in memory well below its size.

    .venv/bin/python bench/unwind_tables.py [--big-mb 500] [--sample 2000] [--repeat 3]

Files: Debian's /usr/bin/python3.11 (libpython linked in statically), libc.so.6, and a stand-in for a ~500 MB binary
written to a temporary directory: python3.11's .eh_frame copied until the file reaches the size, each copy's FDEs
moved (their pcrel addresses rewritten) to their own slice of a sparse text segment as big as python3.11 itself, so
FDEs per MB of file and the mix of CFI programs stay python3.11's. Each copy has its own CIEs, so the reader's memo
of CFI programs (keyed by CIE) finds no more repeats across copies than inside one. pyelftools on the stand-in: a
fixed sample of FDEs spread over the section, each parsed at its offset and decoded, the time extrapolated to all
FDEs and labelled so. Peak RSS: every fleetprof compile runs in a fresh child process (VmHWM, the peak resident set,
next to VmRSS before compiling). Prints a table and writes bench/out/unwind_tables.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from elftools.dwarf.callframe import FDE, CallFrameInfo  # noqa: E402
from elftools.elf.elffile import ELFFile  # noqa: E402

from producers.unwind_cfi import Bases, parse_cie  # noqa: E402
from producers.unwind_tables import compile_unwind_table  # noqa: E402

PYTHON = "/usr/bin/python3.11"
BASE = 0x400000  # the stand-in's first byte, mapped at its file offset + BASE


def libc() -> str | None:
    out = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.strip().startswith("libc.so.6 ") and "x86-64" in line:
            return os.path.realpath(line.split("=>")[1].strip())
    return None


def fde_fields(eh: bytes, eh_addr: int) -> list[tuple[int, int]]:
    """(offset of the address field, the FDE's start) of every FDE; all must be pcrel sdata4 (what ld writes)."""
    out, pos, checked = [], 0, set()
    while pos + 8 <= len(eh):
        length, ident = struct.unpack_from("<II", eh, pos)
        if length == 0:
            break
        if ident and pos + 4 - ident not in checked:
            cie = parse_cie(eh, pos + 4 - ident, True, eh_addr, Bases())
            assert cie is not None and cie.fde_enc == 0x1B, "the stand-in needs pcrel sdata4 FDE addresses"
            checked.add(pos + 4 - ident)
        if ident:
            out.append((pos + 8, eh_addr + pos + 8 + struct.unpack_from("<i", eh, pos + 8)[0]))
        pos += 4 + length
    return out


def build_stand_in(src: str, out: Path, target_bytes: int) -> dict:
    """A sparse ELF of about target_bytes: src's .eh_frame repeated, each copy describing its own slice of text."""
    with open(src, "rb") as f:
        elf = ELFFile(f)
        sec = elf.get_section_by_name(".eh_frame")
        eh_addr, eh = sec["sh_addr"], sec.data()
        code = [s for s in elf.iter_segments() if s["p_type"] == "PT_LOAD" and s["p_flags"] & 1][0]
    body = eh[:-4] if eh[-4:] == bytes(4) else eh  # the zero terminator goes after the last copy only
    fields = fde_fields(body, eh_addr)
    share = -(-os.path.getsize(src) // 0x1000) * 0x1000  # each copy's slice of the text: the size of src
    copies = max(1, target_bytes // (share + len(body)))
    text_at = BASE + 0x1000
    eh_off = 0x1000 + copies * share
    big = bytearray(body * copies)
    for k in range(copies):
        moved = text_at + k * share - code["p_vaddr"]
        at = BASE + eh_off + k * len(body)
        for off, start in fields:
            struct.pack_into("<i", big, k * len(body) + off, start + moved - (at + off))
    big += bytes(4)
    names = b"\0.shstrtab\0.text\0.eh_frame\0"
    names_off = eh_off + len(big)
    shoff = -(-(names_off + len(names)) // 8) * 8
    shdr = struct.Struct("<IIQQQQIIQQ")
    sections = [shdr.pack(0, 0, 0, 0, 0, 0, 0, 0, 0, 0), shdr.pack(1, 3, 0, 0, names_off, len(names), 0, 0, 1, 0),
                shdr.pack(11, 1, 6, text_at, 0x1000, copies * share, 0, 0, 16, 0),
                shdr.pack(17, 1, 2, BASE + eh_off, eh_off, len(big), 0, 0, 8, 0)]
    phdr = struct.Struct("<IIQQQQQQ")
    phdrs = [phdr.pack(1, 5, 0x1000, text_at, text_at, copies * share, copies * share, 0x1000),
             phdr.pack(1, 4, eh_off, BASE + eh_off, BASE + eh_off, len(big), len(big), 0x1000)]
    ehdr = struct.pack("<16sHHIQQQIHHHHHH", b"\x7fELF\x02\x01\x01" + bytes(9), 2, 62, 1, text_at, 64, shoff, 0, 64,
                       56, len(phdrs), 64, len(sections), 1)
    with open(out, "wb") as f:
        f.write(ehdr + b"".join(phdrs))
        f.seek(eh_off)  # the text in between stays a hole
        f.write(big)
        f.write(names)
        f.seek(shoff)
        f.write(b"".join(sections))
    return {"copies": copies, "fdes": copies * len(fields), "eh_frame_mb": len(big) / 1e6,
            "file_mb": os.path.getsize(out) / 1e6}


def rss_kb(field: str) -> int:
    """VmRSS (now) or VmHWM (the peak so far) of this process, in kB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def child(path: str, repeat: int) -> None:
    """In a fresh process: compile `path` `repeat` times; print times, sizes and memory as JSON."""
    before = rss_kb("VmRSS")
    times, table = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        table = compile_unwind_table(path)
        times.append(time.perf_counter() - started)
    peak = rss_kb("VmHWM")  # not ru_maxrss: Linux carries the parent's peak over fork and exec into it
    print(json.dumps({"first_s": times[0], "best_s": min(times), "rows": table.count, "bytes": len(table.rows),
                      "fdes": table.stats["fdes"], "unsupported_rows": table.stats["unsupported_rows"],
                      "rss_before_mb": before / 1024, "rss_peak_mb": peak / 1024}))


def fleetprof_run(path: str, repeat: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", path, "--repeat", str(repeat)], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout)


def pyelftools_run(path: str, sample: int | None) -> dict:
    """pyelftools' time for every FDE of .eh_frame: measured on all, or on `sample` FDEs and extrapolated."""
    with open(path, "rb") as f:
        elf = ELFFile(f)
        info = elf.get_dwarf_info()
        sec = info.eh_frame_sec
        if sample is not None:  # where the FDEs are, found before the clock starts
            offsets = [off - 8 for off, _ in fde_fields(elf.get_section_by_name(".eh_frame").data(), sec.address)]
            total = len(offsets)
        started = time.perf_counter()
        reader = CallFrameInfo(sec.stream, sec.size, sec.address, info.structs, for_eh_frame=True)
        if sample is None:
            fdes = [e for e in reader.get_entries() if isinstance(e, FDE)]
            total = len(fdes)
        else:
            fdes = [reader._parse_entry_at(offsets[i * total // sample]) for i in range(sample)]
        for fde in fdes:
            # pyelftools cannot decode DW_CFA_GNU_args_size (it changes no rule): left out, as the tests do
            fde.instructions = [i for i in fde.instructions if i.opcode.name != "GNU_args_size"]
            fde.get_decoded()
        elapsed = time.perf_counter() - started
    return {"pyelftools_s": elapsed * total / len(fdes), "pyelftools_measured_fdes": len(fdes),
            "pyelftools_mode": "all FDEs" if sample is None else f"{len(fdes)} of {total} FDEs, extrapolated"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--big-mb", type=int, default=500, help="size of the stand-in binary (0: leave it out)")
    ap.add_argument("--sample", type=int, default=2000, help="FDEs pyelftools decodes on the stand-in")
    ap.add_argument("--repeat", type=int, default=3, help="fleetprof compiles per real file (best taken)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.repeat)
        return
    files = {"python3.11": PYTHON, "libc.so.6": libc()}
    rows = []
    with tempfile.TemporaryDirectory(prefix="fleetprof-unwind-") as tmp:
        big = {}
        if args.big_mb:
            started = time.perf_counter()
            big = build_stand_in(PYTHON, Path(tmp) / "big.elf", args.big_mb * 1_000_000)
            big["build_s"] = time.perf_counter() - started
            files[f"stand-in {big['file_mb']:.0f} MB"] = str(Path(tmp) / "big.elf")
        for label, path in files.items():
            if not path or not os.path.exists(path):
                continue
            is_big = path.endswith("big.elf")
            ours = fleetprof_run(path, 1 if is_big else args.repeat)
            peer = pyelftools_run(path, args.sample if is_big else None)
            rows.append({"binary": label, "path": path if not is_big else "(stand-in)",
                         "file_mb": os.path.getsize(path) / 1e6, **ours, **peer,
                         "ratio": peer["pyelftools_s"] / ours["best_s"]})
    result = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.node()}: {os.cpu_count()} cores",
              "stand_in": big, "rows": rows}
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "unwind_tables.json").write_text(json.dumps(result, indent=2) + "\n")

    print(f"{'binary':<18} {'MB':>6} {'FDEs':>8} {'rows':>9} {'table MB':>9} {'fleetprof s':>12} {'pyelftools s':>13} "
          f"{'ratio':>6} {'RSS MB before/peak':>19}  pyelftools measured on")
    for r in rows:
        print(f"{r['binary']:<18} {r['file_mb']:>6.1f} {r['fdes']:>8,} {r['rows']:>9,} {r['bytes'] / 1e6:>9.2f} "
              f"{r['best_s']:>12.3f} {r['pyelftools_s']:>13.2f} {r['ratio']:>5.0f}x "
              f"{r['rss_before_mb']:>9.0f}/{r['rss_peak_mb']:<9.0f}  {r['pyelftools_mode']}")
    if big:
        print(f"stand-in: {big['copies']} copies of python3.11's .eh_frame ({big['eh_frame_mb']:.1f} MB of CFI) in a "
              f"{big['file_mb']:.0f} MB sparse file, built in {big['build_s']:.1f} s")


if __name__ == "__main__":
    main()
