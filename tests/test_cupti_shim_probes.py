"""The CUPTI shim's new probes firing for real through bcc (skipped off CI without BPF): kernel_launch for copy, set
and graph launches, launch_range with the NVTX path (pushed through the real NVTX3 library), graph_kernel_executed
for a graph's kernel nodes and memory_executed for copies, peer-to-peer copies and sets, with their arguments as the
ABI says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from producers.cupti_shim import build_shim, nvtx_include_dir
from producers.native_build import NativeBuildError
from simulate.cupti import build_simulated_cupti
from tests.elf_helpers import gcc_build, unavailable
from tests.test_cupti_shim_memory import DEVICE, DTOD, HTOD, PAGEABLE, PINNED, PTOP, SIMULATED_CUPTI, memory_kind
from tests.usdt_probes import built, load_bcc, private_copy

NVTX_HELPER = r"""
#include <nvtx3/nvToolsExt.h>
int push(const char *message) { return nvtxRangePushA(message); }
int pop(void) { return nvtxRangePop(); }
"""

DRIVER = SIMULATED_CUPTI + r"""
shim = ctypes.CDLL(sys.argv[1])
nvtx = ctypes.CDLL(sys.argv[2])
nvtx.push.argtypes = [s]
shim.InitializeInjection()
print("ready", flush=True)
want = int(sys.stdin.readline())
import time
deadline = time.monotonic() + 5
while cupti.simcupti_state() & want != want and time.monotonic() < deadline:
    time.sleep(0.01)
nvtx.push(b"step")
nvtx.push(b"copy in")
ids = [cupti.simcupti_memory(0, 31, b"cudaMemcpy", 0, 1, 1, 3, 4096, 1000, 0, 0)]
nvtx.pop()
ids.append(cupti.simcupti_memory(0, 51, b"cudaMemsetAsync", 1, 0, 0, 3, 256, 300, 2, 0))
ids.append(cupti.simcupti_graph_launch(1, 514, b"cuGraphLaunch", b"k_node", 7, 3, 2, 65536, 100, 5))
nvtx.pop()
ids.append(cupti.simcupti_memory(1, 277, b"cuMemcpyHtoDAsync_v2", 0, 1, 2, 3, 512, 500, 1, 0))
ids.append(cupti.simcupti_peer_copy(0, 160, b"cudaMemcpyPeer", 1, 1, 0, 8192, 400, 0, 0))
print(json.dumps(ids), flush=True)
sys.stdin.readline()
"""

BPF = r"""
struct text_t { char s[96]; };
BPF_ARRAY(counts, u64, 8);  /* launches, ranges, graph kernels, graph node id sum, memory, memory bytes, executed */
BPF_HASH(apis, struct text_t, u64, 16);
BPF_HASH(paths, struct text_t, u64, 16);
BPF_HASH(kinds, u32, u64, 16);
BPF_HASH(graphs, u32, u64, 16);
static void add(int i, u64 v) { u64 *c = counts.lookup(&i); if (c) __sync_fetch_and_add(c, v); }
int on_launch(struct pt_regs *ctx) {
    u64 api = 0, one = 0; struct text_t t = {};
    bpf_usdt_readarg(3, ctx, &api);
    bpf_probe_read_user_str(&t.s, sizeof(t.s), (void *)api);
    u64 *n = apis.lookup_or_try_init(&t, &one);
    if (n) __sync_fetch_and_add(n, 1);
    add(0, 1);
    return 0;
}
int on_range(struct pt_regs *ctx) {
    u64 path = 0, zero = 0; struct text_t t = {};
    bpf_usdt_readarg(2, ctx, &path);
    bpf_probe_read_user_str(&t.s, sizeof(t.s), (void *)path);
    u64 *n = paths.lookup_or_try_init(&t, &zero);
    if (n) __sync_fetch_and_add(n, 1);
    add(1, 1);
    return 0;
}
int on_graph_kernel(struct pt_regs *ctx) {
    u32 graph = 0;  /* a 4-byte argument: bcc's readarg wants a destination of its size */
    u64 node = 0, zero = 0;
    bpf_usdt_readarg(7, ctx, &graph);
    bpf_usdt_readarg(8, ctx, &node);
    u32 key = graph;
    u64 *n = graphs.lookup_or_try_init(&key, &zero);
    if (n) __sync_fetch_and_add(n, 1);
    add(2, 1);
    add(3, node);
    return 0;
}
int on_memory(struct pt_regs *ctx) {
    u64 bytes = 0, zero = 0;
    u32 kind = 0;
    bpf_usdt_readarg(6, ctx, &bytes);
    bpf_usdt_readarg(7, ctx, &kind);
    u32 key = kind;
    u64 *n = kinds.lookup_or_try_init(&key, &zero);
    if (n) __sync_fetch_and_add(n, 1);
    add(4, 1);
    add(5, bytes);
    return 0;
}
int on_executed(struct pt_regs *ctx) { add(6, 1); return 0; }
"""


@pytest.fixture(scope="module")
def nvtx_helper(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        include = nvtx_include_dir()
    except NativeBuildError as exc:
        unavailable(str(exc))
    return gcc_build(tmp_path_factory.mktemp("nvtxlib"), "libnvtx_helper.so", NVTX_HELPER, "-shared", "-fPIC",
                     f"-I{include}", "-ldl")


def test_new_probes_fire_through_bcc(nvtx_helper: Path, tmp_path: Path) -> None:
    bcc = load_bcc()
    shim = private_copy(built(build_shim), tmp_path)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("FLEETPROF_")},
           "FLEETPROF_CUPTI_LIBRARY": str(built(build_simulated_cupti)), "NVTX_INJECTION64_PATH": str(shim),
           "FLEETPROF_LAUNCH_RATE": "0", "FLEETPROF_GRAPH_LAUNCH_RATE": "0"}
    child = subprocess.Popen([sys.executable, "-c", DRIVER, str(shim), str(nvtx_helper)], text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    try:
        assert child.stdout.readline().strip() == "ready"
        usdt = bcc.USDT(pid=child.pid)
        for probe, fn in (("kernel_launch", "on_launch"), ("launch_range", "on_range"),
                          ("graph_kernel_executed", "on_graph_kernel"), ("memory_executed", "on_memory"),
                          ("kernel_executed", "on_executed")):
            usdt.enable_probe(probe=f"fleetprof:{probe}", fn_name=fn)
        bpf = bcc.BPF(text=BPF.encode(), usdt_contexts=[usdt])
        bpf.usdt_context = usdt
        child.stdin.write("31\n")  # wait until the shim has turned CUPTI on: kernels, copies, sets, peer copies
        child.stdin.flush()
        ids = json.loads(child.stdout.readline())
        child.stdin.write("exit\n")
        child.stdin.flush()
        assert child.wait(timeout=30) == 0  # exit flushes the records: the executed probes fire then
        seen = _observed(bpf)
    finally:
        child.kill()
        child.wait()
    assert len(ids) == 5
    assert seen["apis"] == {"cudaMemcpy": 1, "cudaMemsetAsync": 1, "cuGraphLaunch": 1, "cuMemcpyHtoDAsync_v2": 1,
                            "cudaMemcpyPeer": 1}
    assert seen["paths"] == {"step > copy in": 1, "step": 2}  # the last two copies are outside every range
    assert (seen["graph_kernels"], seen["graphs"], seen["node_id_sum"]) == (3, {7: 3}, 1 + 2 + 3)
    assert seen["memory_kinds"] == {memory_kind(HTOD, 0, PAGEABLE, DEVICE): 1, memory_kind(0, 1, 0, DEVICE): 1,
                                    memory_kind(DTOD, 0, DEVICE, DEVICE): 2, memory_kind(HTOD, 0, PINNED, DEVICE): 1,
                                    memory_kind(PTOP, 0, DEVICE, DEVICE): 1}
    assert (seen["memory"], seen["bytes"], seen["kernel_executed"]) == (6, 4096 + 256 + 2 * 65536 + 512 + 8192, 0)


def _observed(bpf: Any) -> dict[str, Any]:
    counts = bpf[b"counts"]
    return {"launches": counts[0].value, "ranges": counts[1].value, "graph_kernels": counts[2].value,
            "node_id_sum": counts[3].value, "memory": counts[4].value, "bytes": counts[5].value,
            "kernel_executed": counts[6].value,
            "apis": {k.s.decode(): v.value for k, v in bpf[b"apis"].items()},
            "paths": {k.s.decode(): v.value for k, v in bpf[b"paths"].items()},
            "graphs": {k.value: v.value for k, v in bpf[b"graphs"].items()},
            "memory_kinds": {k.value: v.value for k, v in bpf[b"kinds"].items()}}
