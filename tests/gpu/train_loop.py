"""A small, deterministic PyTorch training loop for tests/gpu/validate.sh (needs a CUDA GPU and torch).

    python3 tests/gpu/train_loop.py --steps 200 --markers m.json [--profile trace.json] [--no-graphs]
                                    [--no-copies] [--nvtx]

It writes the Unix-ns bounds of the measured steps to --markers (the shim's kernel records are cut to them), and
with --profile runs the measured steps under torch.profiler and exports its Chrome trace there. Each step is an
MLP forward/backward/AdamW step plus a replay of a captured CUDA graph (graph launches), and host<->device copies:
a batch in from pageable and from pinned memory, a result out to pinned memory (asynchronous) and to pageable memory,
and a memset (zero_) of a device buffer. With --nvtx the measured steps run under torch.autograd.profiler.emit_nvtx
(an NVTX range per operator) inside "step" / "forward" / "backward" / "optimizer.step" ranges, so the shim, as NVTX
injection library (NVTX_INJECTION64_PATH), attaches range paths to the launches.
"""

from __future__ import annotations

import argparse
import json
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="A small deterministic CUDA training loop.")
    parser.add_argument("--steps", type=int, default=200, help="measured steps")
    parser.add_argument("--warmup", type=int, default=20, help="steps before the measured ones")
    parser.add_argument("--markers", type=Path, required=True, help="JSON file for the measured window")
    parser.add_argument("--profile", type=Path, default=None, help="run the measured steps under torch.profiler")
    parser.add_argument("--no-graphs", action="store_true", help="leave out the CUDA graph replay")
    parser.add_argument("--no-copies", action="store_true", help="leave out the host<->device copies")
    parser.add_argument("--nvtx", action="store_true", help="NVTX ranges: emit_nvtx and named step ranges")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 1:
        parser.error("--steps and --warmup must be at least 1")
    return args


def build(torch: Any, copies: bool = True, nvtx: bool = False) -> tuple[Any, Any]:
    """The training step and the captured graph, warmed up."""
    nn, functional = torch.nn, torch.nn.functional
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 2048), nn.GELU(), nn.LayerNorm(2048), nn.Linear(2048, 1024)).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(256, 1024, device="cuda")
    y = torch.randn(256, 1024, device="cuda")

    host_pageable = torch.randn(256, 1024)
    host_pinned = torch.randn(256, 1024).pin_memory()
    out_pinned = torch.empty(256, 1024).pin_memory()
    scratch = torch.empty(1 << 20, device="cuda")
    rng = torch.cuda.nvtx.range if nvtx else (lambda _name: nullcontext())

    def step() -> None:
        with rng("step"):
            if copies:
                x.copy_(host_pageable)  # HtoD from pageable memory
                x.copy_(host_pinned, non_blocking=True)  # HtoD from pinned memory
                scratch.zero_()  # a memset (or a fill kernel, as torch decides)
            optimizer.zero_grad(set_to_none=True)
            with rng("forward"):
                loss = functional.mse_loss(model(x), y)
            with rng("backward"):
                loss.backward()
            with rng("optimizer.step"):
                optimizer.step()
            if copies:
                out_pinned.copy_(x, non_blocking=True)  # DtoH into pinned memory
                loss.detach().cpu()  # DtoH into pageable memory (synchronizes)

    head = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512)).cuda().eval()
    static_in = torch.randn(64, 512, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(3):
            head(static_in)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        head(static_in)
    return step, graph


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("train_loop: torch sees no CUDA device")
    step, graph = build(torch, copies=not args.no_copies, nvtx=args.nvtx)
    for _ in range(args.warmup):
        step()
        graph.replay()
    torch.cuda.synchronize()
    profiler = None
    if args.profile is not None:
        from torch.profiler import ProfilerActivity, profile

        profiler = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    ranges = torch.autograd.profiler.emit_nvtx() if args.nvtx else nullcontext()
    start_ns = time.time_ns()
    with profiler if profiler is not None else nullcontext(), ranges:
        for _ in range(args.steps):
            step()
            if not args.no_graphs:
                with torch.cuda.nvtx.range("graph.replay") if args.nvtx else nullcontext():
                    graph.replay()
        torch.cuda.synchronize()
    end_ns = time.time_ns()
    if profiler is not None:
        profiler.export_chrome_trace(str(args.profile))
    args.markers.write_text(json.dumps({"start_ns": start_ns, "end_ns": end_ns, "steps": args.steps,
                                        "seconds_per_step": (end_ns - start_ns) / 1e9 / args.steps,
                                        "torch": torch.__version__, "cuda": torch.version.cuda,
                                        "device": torch.cuda.get_device_name(0)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
