"""CPU cost of the symbolize stage per CPU sample, in process (no broker): loadgen's CpuStackBatch messages for
`--nodes` simulated nodes and `--windows` 10 s windows, at the fleet bench's 152 samples/s per node, go through what
the runner does per message (columnar decode, before_batch, process, encode of every output record), in batches of
`--batch` messages as a consumer with a backlog sees them (the runner's batch_size is 200). The Kafka transaction
itself is not here.

    .venv/bin/python bench/symbolize_cost.py [--nodes 20] [--windows 21] [--batch 100] [--profile out.prof]

Prints CPU µs per CPU sample and CPU ms per node-second (the load's 152 samples/s per node), the first window
(every stack new) apart from the rest.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import resource
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from processors.messages import Message  # noqa: E402
from processors.runner import encode_produced  # noqa: E402
from processors.symbol_tables import SymbolTables  # noqa: E402
from processors.symbolize_stage import SymbolizeStage  # noqa: E402
from schemas import single_object, topics  # noqa: E402
from schemas.cpu_batch_reader import decode_columnar  # noqa: E402
from schemas.wire import DEFAULT_MAX_BYTES  # noqa: E402
from simulate.loadgen import _Run  # noqa: E402
from simulate.synthetic_fleet import SyntheticFleet  # noqa: E402

RATE = 152  # CPU samples per second per node (the fleet bench's)
WINDOW_NS = 10_000_000_000


class _Capture:
    """A stand-in publisher keeping what loadgen sends."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, bytes]] = []

    def publish(self, topic: str, key: str, value: bytes) -> None:
        self.sent.append((topic, key, value))


def generate(nodes: int, windows: int, seed: int = 0) -> tuple[list[bytes], list[list[bytes]]]:
    """(symbol chunks, per window the CpuStackBatch messages of every node)."""
    fleet = SyntheticFleet(seed=seed)
    sim = [fleet.node(i) for i in range(nodes)]
    cap = _Capture()
    run = _Run(fleet, cap, WINDOW_NS, DEFAULT_MAX_BYTES)  # type: ignore[arg-type]
    run.symbols()
    chunks = [v for t, _, v in cap.sent if t == topics.SYMBOLS.name]
    out = []
    for w in range(windows):
        cap.sent.clear()
        for n, node in enumerate(sim):
            run.cpu(n, node, 1_700_000_000_000_000_000 + w * WINDOW_NS, RATE * WINDOW_NS // 1_000_000_000)
        out.append([v for t, _, v in cap.sent if t == topics.CPU_STACKS.name])
    return chunks, out


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


DIGEST = hashlib.sha256()  # of every output message, to compare two versions of the stage


def run_batch(stage: SymbolizeStage, values: list[bytes], offset: int) -> int:
    """Messages as one batch: decode, before_batch, process, encode. Returns output bytes."""
    msgs = []
    for i, v in enumerate(values):
        name, rec = decode_columnar(v, expect=topics.CPU_STACKS.schema)
        msgs.append(Message(topics.CPU_STACKS.name, 0, offset + i, None, name, rec, v))
    stage.before_batch(msgs)
    out = stage.process(msgs)
    size = 0
    for p in out:
        value = encode_produced(p)[1]
        DIGEST.update(value)
        size += len(value)
    stage.after_commit()
    return size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=20)
    ap.add_argument("--windows", type=int, default=21)
    ap.add_argument("--batch", type=int, default=100, help="messages per batch after the first window")
    ap.add_argument("--profile", help="write a cProfile of the steady windows here")
    args = ap.parse_args()
    chunks, windows = generate(args.nodes, args.windows)
    tables = SymbolTables()
    for c in chunks:
        tables.add_chunk(single_object.decode(c)[1])
    stage = SymbolizeStage(tables)
    samples = args.nodes * RATE * WINDOW_NS // 1_000_000_000
    t = cpu_s()
    first_bytes = run_batch(stage, windows[0], 0)
    first = cpu_s() - t
    prof = cProfile.Profile() if args.profile else None
    t = cpu_s()
    if prof:
        prof.enable()
    out_bytes = 0
    rest = [v for values in windows[1:] for v in values]
    for lo in range(0, len(rest), args.batch):
        out_bytes += run_batch(stage, rest[lo:lo + args.batch], len(windows[0]) + lo)
    if prof:
        prof.disable()
        prof.dump_stats(args.profile)
    steady = cpu_s() - t
    n = len(windows) - 1
    per_sample = steady / (n * samples)
    print(f"first window: {1e6 * first / samples:.2f} µs/sample ({first_bytes} B out); "
          f"steady ({n} windows x {args.nodes} nodes): {1e6 * per_sample:.2f} µs/sample = "
          f"{1e3 * per_sample * RATE:.3f} ms per node-second ({out_bytes / n / args.nodes:.0f} B out per node-window); "
          f"output sha256 {DIGEST.hexdigest()[:16]}")


if __name__ == "__main__":
    main()
