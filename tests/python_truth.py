"""The truth harness for Python frames: workloads on a stock interpreter, py-spy on the same processes in the same
seconds, and the comparison of both tools' Python call chains.

Both sides are reduced to Python frames only, root first, each named by its function (py-spy names a frame by
`co_name`, we by `co_qualname`: the last dotted part is compared) and, where asked, its line. py-spy runs
--nonblocking (it reads without stopping the process, as our sampler does).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

Chain = tuple[str, ...]
STOCK = Path("/usr/bin/python3.11")  # Debian's own interpreter: no frame pointers, no -X perf


def need_bpf_and_stock_python() -> None:
    """Skip (fail on CI) without BPF or Debian's python3.11."""
    from producers.cpu_sampler import BpfUnavailable, check_bpf
    from tests.elf_helpers import unavailable

    try:
        check_bpf()
    except BpfUnavailable as exc:
        unavailable(f"BPF unavailable: {exc}")
    if not STOCK.exists():
        unavailable(f"no {STOCK} (bash infra/setup.sh installs Debian's python3.11)")

SPLIT = """
import time
def hot():
    x = 0
    for i in range(30000):
        x += i * i
    return x
def warm():
    x = 0
    for i in range(10000):
        x += i * i
    return x
def main():
    # the workload's own clock: once a second, CPU time of 20 hot() and 20 warm() calls in a row (a clock read per
    # call in the loop moved py-spy's reading of 3.11 by 40 points, so the loop itself stays as it was)
    clock, spent, timed = time.thread_time_ns, [0, 0], 0.0
    end = time.monotonic() + LIFETIME
    while time.monotonic() < end:
        hot()
        warm()
        if time.monotonic() - timed > 1:
            t0 = clock()
            for _ in range(20):
                hot()
            t1 = clock()
            for _ in range(20):
                warm()
            spent[0] += t1 - t0
            spent[1] += clock() - t1
            with open(CLOCK, "w") as out:
                out.write(f"{spent[0]} {spent[1]}")
            timed = time.monotonic()
main()
"""

ZLIB = """
import os, time, zlib
data = os.urandom(1 << 16) + bytes(1 << 16)
def compress_loop():
    end = time.monotonic() + LIFETIME
    while time.monotonic() < end:
        zlib.compress(data, 9)
compress_loop()
"""

THREADS = """
import threading, time
def spin_a():
    x = 0
    end = time.monotonic() + LIFETIME
    while time.monotonic() < end:
        x += 1
def spin_b():
    x = 0
    end = time.monotonic() + LIFETIME
    while time.monotonic() < end:
        x -= 1
threads = [threading.Thread(target=spin_a), threading.Thread(target=spin_b)]
for t in threads:
    t.start()
for t in threads:
    t.join()
"""

# 150 Python frames deep, busy at the bottom: more than the walker's 64
DEEP = """
import time
def down(n):
    if n:
        return down(n - 1)
    end = time.monotonic() + LIFETIME
    x = 0
    while time.monotonic() < end:
        x += 1
down(150)
"""

ASYNC = """
import asyncio, time
def numbers(n):
    for i in range(n):
        yield i * i
async def crunch():
    end = time.monotonic() + LIFETIME
    while time.monotonic() < end:
        sum(numbers(200000))
        await asyncio.sleep(0)
async def main():
    await asyncio.gather(crunch(), crunch())
asyncio.run(main())
"""

WORKLOADS = {"split": SPLIT, "zlib": ZLIB, "threads": THREADS, "deep": DEEP, "async": ASYNC, "split313": SPLIT}


@dataclass
class PyWorkload:
    name: str
    script: Path


def write_workloads(folder: Path, lifetime_s: float) -> list[PyWorkload]:
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for name, source in WORKLOADS.items():
        path = folder / f"{name}.py"
        path.write_text(f"LIFETIME = {lifetime_s}\nCLOCK = {str(folder / f'{name}.clock')!r}\n" + source)
        out.append(PyWorkload(name, path))
    return out


def py_spy(pid: int, seconds: float, rate: int, out: Path, blocking: bool = False) -> subprocess.Popen:
    """py-spy recording `pid` for `seconds` (speedscope: each thread's samples in order, with line numbers, into
    `out`); `blocking`: stopping the process for each sample (py-spy's default) instead of reading it as it runs."""
    exe = Path(sys.executable).parent / "py-spy"
    return subprocess.Popen([str(exe), "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate",
                             str(rate), *([] if blocking else ["--nonblocking"]), "--format", "speedscope", "-o",
                             str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


_FRAME = re.compile(r"^(?P<name>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
_OURS = re.compile(r"^.* \(.*:\d+\)$")  # our Python frames: `qualname (file:line)`


def _frame(text: str, lines: bool) -> str:
    """A frame of either tool as `name` or `name:line` (name: the last dotted part of a qualname)."""
    m = _FRAME.match(text.strip())
    if m is None:
        return text.strip()
    name = m.group("name").rsplit(".", 1)[-1]
    return f"{name}:{m.group('line')}" if lines and m.group("line") else name


def spy_sequences(text: str, lines: bool = False) -> list[list[Chain]]:
    """py-spy's speedscope output as each thread's Python chains (root first), in the order it read them."""
    doc = json.loads(text)
    frames = [f"{f['name']} ({f['file']}:{f['line']})" if f.get("line") else f"{f['name']} ({f['file']})"
              for f in doc["shared"]["frames"]]
    return [[tuple(_frame(frames[i], lines) for i in sample) for sample in profile["samples"]]
            for profile in doc["profiles"]]


def spy_chains(text: str, lines: bool = False) -> Counter[Chain]:
    """py-spy's samples as Python chains, root first, with their counts."""
    return Counter(chain for thread in spy_sequences(text, lines) for chain in thread)


def effective_samples(sequences: list[list[Chain]], leaf: str) -> float:
    """How many independent readings py-spy's samples of `leaf` are worth. It samples on the wall clock: a process
    waiting for a CPU is read again and again where it stopped, so neighbours repeat. Per thread n(1-r)/(1+r), r the
    lag-1 autocorrelation of "the leaf is `leaf`" over its samples with a Python leaf (the usual AR(1) estimate)."""
    total = 0.0
    for thread in sequences:
        x = [1.0 if chain[-1] == leaf else 0.0 for chain in thread if chain]
        n = len(x)
        mean = sum(x) / n if n else 0.0
        var = sum((v - mean) ** 2 for v in x)
        if n < 3 or var == 0:
            total += n
            continue
        r = sum((x[i] - mean) * (x[i + 1] - mean) for i in range(n - 1)) / var
        total += n * min(1.0, (1 - r) / (1 + r)) if r > -1 else n
    return total


def our_chains(folded: str, lines: bool = False) -> Counter[Chain]:
    """`fleetprof query flamegraph --format folded` output as Python chains (Python frames only, root first);
    a stack we marked as cut keeps the mark, `[truncated]`, at its root end."""
    out: Counter[Chain] = Counter()
    for row in folded.splitlines():
        stack, _, count = row.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        python = [_frame(f, lines) for f in frames if _OURS.match(f)]
        if "[truncated]" in frames:
            python.insert(0, "[truncated]")
        out[tuple(python)] += int(count)
    return out


def own_clock_hot_share(folder: Path, name: str) -> float:
    """The split workload's own measure: hot()'s share of the CPU time its timed calls of hot() and warm() took."""
    hot, warm = (int(x) for x in (folder / f"{name}.clock").read_text().split())
    return hot / (hot + warm)


def shares(chains: Counter[Chain]) -> dict[str, float]:
    """Share of samples per leaf Python function (chains without Python frames left out)."""
    leaves: Counter[str] = Counter()
    for chain, n in chains.items():
        if chain and chain[-1] != "[truncated]":
            leaves[chain[-1]] += n
    total = sum(leaves.values()) or 1
    return {name: n / total for name, n in leaves.items()}


def chain_agreement(ours: Counter[Chain], theirs: Counter[Chain], depth: int | None = None) -> float:
    """Share of our samples (with Python frames) whose chain py-spy also saw; `depth`: compare the innermost
    `depth` frames only (our walk cuts deeper chains)."""
    def cut(chain: Chain) -> Chain:
        chain = tuple(f for f in chain if f != "[truncated]")
        return chain[-depth:] if depth else chain
    seen = {cut(c) for c in theirs}
    total = sum(n for c, n in ours.items() if cut(c))
    return sum(n for c, n in ours.items() if cut(c) and cut(c) in seen) / total if total else 0.0
