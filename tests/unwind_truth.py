"""The truth harness for the native unwinder: perf's DWARF call chains of the same processes in the same seconds,
the normalization both tools' chains go through, their agreement, and the workloads they are run on.

Names come from the same place on both sides: `perf script` is pointed (--symfs) at a tree that holds the mapped
files and nothing else, so it names frames from each file's own .symtab/.dynsym as the fleetprof symbolizer does,
never from detached debug files (/usr/lib/debug, libc6-dbg) or perf's build-id cache, which only one side would see.
What still differs is undone in frame_name. A chain reaches its thread's root when its first frame is a thread's
first function, by name (ROOTS) or, where no table names it (clone3 in libc, _start in a stripped program), by the
CFI there, which says the stack ends.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import signal
import subprocess
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from elftools.elf.elffile import ELFFile

from processors.symbolize import binary_name
from producers.elf_symbols import read_elf_symbols
from producers.process_info import parse_maps

Chain = tuple[str, ...]  # function names, root first
Expected = set[Chain] | Callable[[Chain], bool]

# Bytes of user stack copied per sample: perf's default, 8192, is enough for perf to reach the root of every chain of
# these workloads (65528, the most the kernel takes, changed nothing and makes perf script several times slower).
DUMP_SIZE = 8192
LIFETIME_S = 150  # every workload ends by itself after this, whatever happens to the test that started it

UNKNOWN = "[unknown]"
OUTERMOST = "[outermost]"  # a frame whose name neither table knows, in code whose CFI says the stack ends there
# Thread roots: _start for the main thread, clone3 (glibc >= 2.34) or clone for the others. start_thread is not one:
# perf shows clone3 above it. Debian's libc names clone3 only in its detached debug file, so with the file's own
# tables both tools see an unknown frame there, which OUTERMOST names from the CFI.
ROOTS = frozenset({"_start", "clone3", "__clone3", "clone", "__clone", OUTERMOST})
NO_FILE = frozenset({"", UNKNOWN, "[anon]", "//anon", "[heap]", "[stack]"})
_OFFSET = re.compile(r"\+0x[0-9a-fA-F]+$")
PYTHON_FRAME = re.compile(r"^.+ \(.+:\d+\)$")  # `qualname (file:line)`: a frame read from a CPython interpreter
EVALUATOR = "_PyEval_EvalFrameDefault"
PYTHON_RUN = "[python run]"
_VERSION = re.compile(r"@@?[A-Za-z_][\w.]*$")
# an entry's first line in `readelf --debug-dump=frames`: offset, length, CIE id or pointer, then CIE or FDE
_CFI_ENTRY = re.compile(r"^([0-9a-f]+) [0-9a-f]+ [0-9a-f]+ (CIE|FDE)"
                        r"(?: cie=([0-9a-f]+) pc=([0-9a-f]+)\.\.([0-9a-f]+))?")


def reaches_root(chain: Chain) -> bool:
    """Whether the chain's root frame is where a thread's stack begins."""
    return bool(chain) and chain[0] in ROOTS


class Binaries:
    """The files one process maps executable, by the name both tools give them (their basename: unique within a
    process, not across them), with where each one's CFI ends the stack: the ranges of the FDEs that leave the
    return address undefined."""

    def __init__(self, paths: Iterable[str]) -> None:
        self.paths: dict[str, str] = {}
        for path in paths:
            self.paths.setdefault(binary_name(path), path)

    @classmethod
    def of(cls, pid: int) -> Binaries:
        """The files `pid` maps executable now (nothing once it is gone)."""
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            maps = ""
        return cls(path.removesuffix(" (deleted)") for _, _, _, path in parse_maps(maps) if path.startswith("/"))

    def ends_stack(self, binary: str, file_offset: int, leaf: bool) -> bool:
        path = self.paths.get(binary)
        # a return address may be just past its function (a call as the last instruction): look one byte before it
        return path is not None and any(lo <= file_offset - (not leaf) < hi for lo, hi in _outermost(path))

    def canonical(self, binary: str, name: str) -> str:
        """The symbolizer's name for the function that `name` names in `binary`: of aliases at one address perf
        shows the longest (after other rules), the symbolizer the shortest (free and cfree in libc)."""
        path = self.paths.get(binary)
        return _aliases(path).get(name, name) if path is not None else name

    def to_file_offset(self, binary: str, address: int) -> int:
        """perf's address in a binary: a file offset, except in a non-PIE executable, where it is the vaddr."""
        path = self.paths.get(binary)
        if path is None or not _is_exec(path):
            return address
        return next((address - vaddr + off for off, vaddr, size in _loads(path) if vaddr <= address < vaddr + size),
                    address)


@cache
def _is_exec(path: str) -> bool:
    with open(path, "rb") as f:
        return ELFFile(f)["e_type"] == "ET_EXEC"


@cache
def _loads(path: str) -> list[tuple[int, int, int]]:
    """(file offset, vaddr, size) of each PT_LOAD segment."""
    with open(path, "rb") as f:
        return [(s["p_offset"], s["p_vaddr"], s["p_filesz"]) for s in ELFFile(f).iter_segments()
                if s["p_type"] == "PT_LOAD"]


@cache
def _aliases(path: str) -> dict[str, str]:
    """Each name in the table the symbolizer reads (.symtab, else .dynsym) → the one it gives that address."""
    table = read_elf_symbols(path)
    chosen = dict(zip(table.addrs.tolist(), table.names, strict=True))
    with open(path, "rb") as f:
        section = ELFFile(f).get_section_by_name(table.section) if table.section else None
        return {sym.name: chosen[sym["st_value"]] for sym in (section.iter_symbols() if section else ())
                if sym["st_value"] in chosen}


@cache
def _outermost(path: str) -> list[tuple[int, int]]:
    """File-offset ranges whose CFI makes the return address undefined (DW_CFA_undefined rip: _start, the child
    side of clone/clone3), from `readelf --debug-dump=frames`; an FDE inherits the rule from its CIE."""
    text = subprocess.run(["readelf", "--debug-dump=frames", path], capture_output=True, text=True).stdout
    ending_cies: set[str] = set()
    ranges: list[tuple[int, int]] = []
    current: tuple[str, str, tuple[int, int] | None] | None = None
    for line in text.splitlines():
        if m := _CFI_ENTRY.match(line):
            offset, kind, cie, lo, hi = m.groups()
            current = (kind, offset, (int(lo, 16), int(hi, 16)) if kind == "FDE" else None)
            if kind == "FDE" and cie.lstrip("0") in ending_cies:
                ranges.append(current[2])
        elif current and "DW_CFA_undefined: r16 (rip)" in line:
            if current[0] == "CIE":
                ending_cies.add(current[1].lstrip("0"))
            elif current[2] not in ranges:
                ranges.append(current[2])
    loads = _loads(path)
    return [(lo - vaddr + off, hi - vaddr + off) for lo, hi in ranges
            for off, vaddr, size in loads if vaddr <= lo < vaddr + size]


def frame_name(name: str, binary: str, leaf: bool, binaries: Binaries, offset: int | None = None) -> str:
    """One frame as both tools are compared on. A known function keeps its name without perf's `+0x..` (sym+off)
    and nm-style symbol versions (`@@GLIBC_2.34`: the same symbol either way), and of aliases the symbolizer's
    (Binaries.canonical). A frame neither table names is
    `[unknown] <binary>` (the offset dropped: two samples in one unnamed function are at different addresses) or
    OUTERMOST where its CFI ends the stack. `x@plt` counts as unknown: perf makes up names for PLT stubs from the
    relocations, the symbolizer (like the file's tables) has none."""
    if name.startswith(UNKNOWN) or name.endswith("@plt"):
        if binary in NO_FILE:
            return UNKNOWN
        if offset is not None and binaries.ends_stack(binary, offset, leaf):
            return OUTERMOST
        return f"{UNKNOWN} {binary}"
    return binaries.canonical(binary, _VERSION.sub("", _OFFSET.sub("", name)))


def our_chain(frames: list[tuple[str, str, str]], binaries: Binaries) -> Chain:
    """The user part of one of the store's stacks ((function, binary, kind), root first), normalized. An unknown
    frame is named `[unknown] <binary>+0x<file offset>` there. Each run of Python frames read from the interpreter
    stands where the one native evaluator frame that ran them was, and is compared as that frame: perf sees only it."""
    user = []
    for fn, binary, kind in frames:
        if kind == "KERNEL" or binary == "[kernel.kallsyms]":
            continue
        if kind == "INTERPRETED" and PYTHON_FRAME.match(fn):
            if not user or user[-1] != (EVALUATOR, PYTHON_RUN):
                user.append((EVALUATOR, PYTHON_RUN))
            continue
        user.append((fn, binary))
    out = []
    for i, (fn, binary) in enumerate(user):
        if binary == PYTHON_RUN:
            out.append(EVALUATOR)
            continue
        m = re.search(r"\+0x([0-9a-fA-F]+)$", fn) if fn.startswith(UNKNOWN) else None
        out.append(frame_name(fn, binary, i == len(user) - 1, binaries, int(m.group(1), 16) if m else None))
    return tuple(out)


def perf_chains(pids: Iterable[int], seconds: float, frequency: int, out_dir: Path,
                dump_size: int = DUMP_SIZE, event: str = "cpu-clock") -> dict[int, Counter[Chain]]:
    """Record every thread of `pids` for `seconds` with `perf record --call-graph dwarf` (cpu-clock at `frequency`,
    as the agent samples; another event, such as a uprobe, at every hit) and count each process's user call chains,
    normalized by frame_name. The processes must still run when this returns (their maps name the files perf
    reads)."""
    pids = list(pids)
    out_dir.mkdir(parents=True, exist_ok=True)
    data = out_dir / "perf.data"
    env = dict(os.environ, PERF_BUILDID_DIR=str(out_dir / "buildid"))  # an empty cache: no file perf kept elsewhere
    rate = ["-F", str(frequency)] if event == "cpu-clock" else ["-c", "1"]
    rec = subprocess.run(["perf", "record", "-q", "-N", "-e", event, *rate, "-m", "16M",
                          "--call-graph", f"dwarf,{dump_size}", "-p", ",".join(map(str, pids)), "-o", str(data),
                          "--", "sleep", str(seconds)], capture_output=True, text=True, env=env)
    if rec.returncode != 0:
        raise RuntimeError(f"perf record failed: {rec.stderr.strip()[-2000:]}")
    binaries = {pid: Binaries.of(pid) for pid in pids}
    symfs = out_dir / "symfs"
    for path in {p for b in binaries.values() for p in b.paths.values()}:
        link = symfs / path.lstrip("/")
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            link.symlink_to(path)
    script = subprocess.run(["perf", "script", "-i", str(data), "--symfs", str(symfs), "--no-inline",
                             "-F", "pid,tid,ip,sym,dso"], capture_output=True, text=True, env=env)
    if script.returncode != 0:
        raise RuntimeError(f"perf script failed: {script.stderr.strip()[-2000:]}")
    return parse_perf_script(script.stdout, binaries)


def parse_perf_script(text: str, binaries: dict[int, Binaries]) -> dict[int, Counter[Chain]]:
    """Chains per pid from `perf script -F pid,tid,ip,sym,dso`: a `pid/tid` line, then one `ip sym (dso)` line
    per frame, leaf first, then a blank line. Kernel frames are dropped."""
    chains: dict[int, Counter[Chain]] = {}
    pid, frames = None, []

    def flush() -> None:
        if pid is not None:
            user = list(reversed(frames))
            chain = tuple(frame_name(sym, dso, i == len(user) - 1, binaries[pid], addr)
                          for i, (addr, sym, dso) in enumerate(user))
            chains.setdefault(pid, Counter())[chain] += 1

    for line in text.splitlines():
        if not line.strip():
            continue
        if not line.startswith("\t"):
            flush()
            pid, frames = int(line.split("/")[0]), []
            continue
        ip, _, rest = line.strip().partition(" ")
        sym, _, dso = rest.rpartition(" (")
        address, dso = int(ip, 16), dso.removesuffix(")")
        if address >= 1 << 63 or dso.startswith("[kernel"):
            continue
        binary = binary_name(dso) if dso.startswith("/") else dso
        frames.append((binaries[pid].to_file_offset(binary, address), sym or UNKNOWN, binary))
    flush()
    return chains


# A chain is judged (counted for or against agreement) once the other tool, sampling as often as it did, would have
# seen it this many times on average: a rarer one it misses by chance (e^-3, 5% of the time for one at 3), and the
# tool that took more samples sees more of those, so counting them would judge sample counts, not unwinding.
LIKELY_SEEN = 3.0
# Chains too rare to judge are a sliver (1-2% of a workload's samples); were many of them ours, they could be wrong
# chains spread thin: at least this share of our samples must be judged.
JUDGED_FLOOR = 0.9


def agreement(ours: Counter[Chain], perf: Counter[Chain], expected: Expected | None = None) -> dict:
    """For each tool: its samples, the share of them on judged chains (LIKELY_SEEN), the share of those whose whole
    chain the other tool also saw, the share of all that reaches a thread root and, with `expected` (a set of correct
    chains, or a test of one), the share of all that is one."""
    def share(counter: Counter[Chain], test: Callable[[Chain], bool]) -> float:
        total = sum(counter.values())
        return sum(n for chain, n in counter.items() if test(chain)) / total if total else 0.0

    def judged(counter: Counter[Chain], other: Counter[Chain]) -> Counter[Chain]:
        scale = sum(other.values()) / max(sum(counter.values()), 1)
        return Counter({chain: n for chain, n in counter.items() if n * scale >= LIKELY_SEEN})

    ours_judged, perf_judged = judged(ours, perf), judged(perf, ours)
    out = {"ours_samples": sum(ours.values()), "perf_samples": sum(perf.values()),
           "ours_judged": share(ours, ours_judged.__contains__), "perf_judged": share(perf, perf_judged.__contains__),
           "ours_in_perf": share(ours_judged, perf.__contains__), "perf_in_ours": share(perf_judged, ours.__contains__),
           "ours_root": share(ours, reaches_root), "perf_root": share(perf, reaches_root)}
    if expected is not None:
        test = expected.__contains__ if isinstance(expected, set) else expected
        out["ours_expected"], out["perf_expected"] = share(ours, test), share(perf, test)
    return out


# Frames between a thread's root and its own first function: the libc start code. __libc_start_call_main and
# start_thread are local symbols, unknown with libc's own tables.
_START_FRAMES = ROOTS | {"__libc_start_main", "__libc_start_call_main", "start_thread", f"{UNKNOWN} libc.so.6"}


def known_paths(*paths: Chain) -> Callable[[Chain], bool]:
    """The correct chains of a program whose samples all sit on a prefix of one of `paths` (each from the thread's
    first function of its own, e.g. main): a thread root, libc's start frames, then such a prefix."""
    prefixes = {p[:i] for p in paths for i in range(1, len(p) + 1)}

    def correct(chain: Chain) -> bool:
        for i, fn in enumerate(chain):
            if fn not in _START_FRAMES:
                return i > 0 and reaches_root(chain) and chain[i:] in prefixes
        return False
    return correct


# --- workloads --------------------------------------------------------------------------------------------------
# Built -O2 -fomit-frame-pointer and not stripped (the symbolizer reads .symtab; -g is not needed, .eh_frame is
# there anyway). KEEP: no inlining, no clones (path_b.constprop.0 would be another name); the `extra` after each call
# keeps it from becoming a tail call, which would drop the caller from the stack for both tools.
_COMMON = r"""
#include <unistd.h>
#define KEEP __attribute__((noinline, noclone))
#define SPIN(n) for (long i = 0; i < (n); i++) sink += i
volatile unsigned long sink, extra;
"""

# 60% / 30% / 10% of the time in hot_a / hot_b / hot_c (same loop body). No function keeps a frame pointer; each
# moves the stack pointer by another amount (local arrays), path_b's variable-length array makes rbp its CFA
# register, hot_c has no frame at all.
NOFP_C = _COMMON + r"""
volatile int vla_len = 24;
KEEP void hot_a(void) { volatile char pad[72]; pad[5] = 1; SPIN(60000); extra += pad[5]; }
KEEP void hot_b(void) { volatile long pad[100]; pad[7] = 1; SPIN(30000); extra += pad[7]; }
KEEP void hot_c(void) { SPIN(10000); }
KEEP void path_a(void) { volatile char pad[520]; pad[1] = 1; hot_a(); extra += pad[1]; }
KEEP void path_b(void) { volatile char vla[vla_len]; vla[0] = 1; hot_b(); extra += vla[0]; }
KEEP void run(void) { path_a(); path_b(); hot_c(); extra++; }
int main(void) { alarm(LIFETIME); for (;;) run(); }
"""
NOFP_PATHS = [("main", "run", "path_a", "hot_a"), ("main", "run", "path_b", "hot_b"), ("main", "run", "hot_c")]

# Four threads, each on its own path with its own frame size; main waits in pause() (no CPU, no samples).
THREADS_C = _COMMON + r"""
#include <pthread.h>
#define WORKER(x, PAD) \
    KEEP void leaf_##x(void) { volatile char pad[PAD]; pad[0] = 1; SPIN(20000); extra += pad[0]; } \
    KEEP void mid_##x(void) { leaf_##x(); extra++; } \
    KEEP void *thread_##x(void *arg) { for (;;) mid_##x(); return arg; }
WORKER(a, 16) WORKER(b, 200) WORKER(c, 1000) WORKER(d, 4000)
int main(void) {
    alarm(LIFETIME);
    void *(*fns[])(void *) = {thread_a, thread_b, thread_c, thread_d};
    pthread_t t;
    for (int i = 0; i < 4; i++)
        if (pthread_create(&t, 0, fns[i], 0)) return 1;
    for (;;) pause();
}
"""
THREADS_PATHS = [(f"thread_{x}", f"mid_{x}", f"leaf_{x}") for x in "abcd"]

# Spins in its own code until SIGUSR1, then dlopens argv[1] and spends its time there, through dlsym's pointer.
DLOPEN_C = _COMMON + r"""
#include <dlfcn.h>
#include <signal.h>
volatile sig_atomic_t go;
static void on_usr1(int sig) { go = sig; }
KEEP void spin_before(void) { volatile char pad[48]; pad[0] = 1; SPIN(100000); extra += pad[0]; }
KEEP void before_load(void) { spin_before(); extra++; }
KEEP void call_lib(void (*fn)(void)) { fn(); extra++; }
int main(int argc, char **argv) {
    alarm(LIFETIME);
    if (argc < 2) return 2;
    signal(SIGUSR1, on_usr1);
    while (!go) before_load();
    void *lib = dlopen(argv[1], RTLD_NOW);
    void (*fn)(void) = lib ? (void (*)(void))dlsym(lib, "lib_entry") : 0;
    if (!fn) return 1;
    for (;;) call_lib(fn);
}
"""
# static: called directly, not through the library's PLT; named from its .symtab
DLOPEN_LIB_C = r"""
#define KEEP __attribute__((noinline, noclone))
volatile unsigned long lib_sink, lib_extra;
KEEP static void lib_leaf(void) { volatile char pad[300]; pad[0] = 1;
                                  for (long i = 0; i < 50000; i++) lib_sink += i; lib_extra += pad[0]; }
KEEP static void lib_mid(void) { volatile long pad[3]; pad[0] = 1; lib_leaf(); lib_extra += pad[0]; }
void lib_entry(void) { lib_mid(); lib_extra++; }
"""
DLOPEN_PATHS = [("main", "before_load", "spin_before"), ("main", "call_lib", "lib_entry", "lib_mid", "lib_leaf")]

PYTHON_WORK = """
import hashlib, random, zlib
words = [bytes(random.Random(i).choices(b"abcdefghijklmnop", k=1 + i % 9)) for i in range(5000)]
data = b" ".join(random.Random(0).choices(words, k=200_000))
while True:
    zlib.compress(data, 6)
    hashlib.sha256(data).digest()
"""


@dataclass
class Workload:
    """A program to profile: its argv, and the correct chains of its samples where they are known."""

    name: str
    argv: list[str]
    expected: Expected | None = None


def _gcc(source: str, out: Path, *flags: str) -> Path:
    src = out.parent / (out.name + ".c")
    src.write_text(source)
    subprocess.run(["gcc", "-O2", "-fomit-frame-pointer", f"-DLIFETIME={LIFETIME_S}", "-o", str(out), str(src),
                    *flags], check=True, capture_output=True, text=True)
    return out


def c_workloads(folder: Path, comm: str) -> list[Workload]:
    """NOFP_C, THREADS_C and DLOPEN_C (with its library) built into `folder`, each binary named `comm`."""
    for name in ("nofp", "threads", "dlopen"):
        (folder / name).mkdir(parents=True, exist_ok=True)
    lib = _gcc(DLOPEN_LIB_C, folder / "dlopen" / "libtruth.so", "-fPIC", "-shared")
    return [Workload("nofp", [str(_gcc(NOFP_C, folder / "nofp" / comm))], known_paths(*NOFP_PATHS)),
            Workload("threads", [str(_gcc(THREADS_C, folder / "threads" / comm, "-pthread"))],
                     known_paths(*THREADS_PATHS)),
            Workload("dlopen", [str(_gcc(DLOPEN_C, folder / "dlopen" / comm)), str(lib)],
                     known_paths(*DLOPEN_PATHS))]


def debian_workloads(folder: Path, comm: str) -> list[Workload]:
    """Debian's own binaries (built without frame pointers) on CPU-bound work, each run through a link named `comm`
    (the command name comes from the path run). Those not installed in /usr/bin are left out."""
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "data.txt"
    data.write_bytes(b"".join(b"%d %x fleetprof %d\n" % (i, i * 7919 % 100_003, i % 97) for i in range(300_000)))

    def link(program: str) -> str | None:
        found = shutil.which(program, path="/usr/bin")  # not a virtualenv's or pyenv's python3
        if found is None:
            return None
        (folder / program).mkdir(parents=True, exist_ok=True)
        path = folder / program / comm
        if not path.is_symlink():
            path.symlink_to(os.path.realpath(found))
        return str(path)

    # one process over the same file many times: CPU bound for longer than any window
    runs = {"python3": ["-c", PYTHON_WORK], "gzip": ["-9", "-c", *[str(data)] * 200],
            "xz": ["-9", "-T1", "-c", *[str(data)] * 200],
            "openssl": ["speed", "-seconds", str(LIFETIME_S), "-bytes", "1048576", "sha256"]}
    out = []
    for program, args in runs.items():
        path = link(program)
        if path is not None:
            out.append(Workload(program, [path, *args]))
    return out


def start(workload: Workload) -> subprocess.Popen:
    """Start a workload at low priority (the profilers and the pipeline run first on a small machine), its output
    discarded. Whatever happens to the test, it ends by itself: SIGALRM after LIFETIME_S (an alarm survives exec),
    or for one that catches SIGALRM (xz shows its progress on it), SIGXCPU after 4 x LIFETIME_S of CPU time (4:
    the threads program may keep four CPUs busy till its alarm)."""
    def child() -> None:
        os.nice(10)
        resource.setrlimit(resource.RLIMIT_CPU, (4 * LIFETIME_S, 4 * LIFETIME_S))
        signal.alarm(LIFETIME_S)
    return subprocess.Popen(workload.argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, preexec_fn=child)
