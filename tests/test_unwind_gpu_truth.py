"""GPU launch stacks against perf's DWARF unwinding of the same launches (tests/unwind_truth.py).

The GPU simulator built -fomit-frame-pointer, launched from a C program built the same way (a Python-like chain of
its own and the simulator's native chains through a PLT call) and from Python through ctypes/libffi (an
interpreter built without frame pointers). `fleetprof agent` records each sampled launch's stack at the probe;
`perf record --call-graph dwarf` on a uprobe at `gpusim_launch` records the stack of every launch in the same
seconds. Our launch stacks go the whole GPU path (agent → Kafka → symbolizer → correlator → sink → store) and come
back as call chains, cut at `gpusim_launch` (the probe fires inside it; perf's leaf is its entry). For each
process: at least 95% of the launches on a chain perf also saw (the C program: on a correct chain too) and
reaching the thread's root, and no lower than perf's own shares (each run of Python frames compared as the evaluator
frame perf sees there). The Python launches also carry the Python function and line of each frame, read from the
interpreter: at least 95% on the script's known chain. One JSON line per process is printed (run with -s).

Needs root, BPF, perf, gcc and readelf: skipped with the reason without them, a failure on CI.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

from producers.cpu_sampler import BpfUnavailable, check_bpf
from producers.native_build import build
from simulate.gpu import GPU_SIM
from tests.elf_helpers import need, unavailable
from tests.gpu_job import correlator
from tests.pipeline_helpers import agent_started, sink, symbolizer, wait_for
from tests.unwind_truth import (
    JUDGED_FLOOR,
    PYTHON_FRAME,
    Binaries,
    Chain,
    agreement,
    known_paths,
    our_chain,
    perf_chains,
)

COMM = "fpgputruth"
PERF_SECONDS = 8
WINDOW_S = PERF_SECONDS + 4
MIN_SHARE = 0.95
SLACK = 0.02  # as in tests/test_unwind_truth.py (chains the other tool would likely have missed are not judged)
LAUNCH = "gpusim_launch"

# A C launcher built -O2 -fomit-frame-pointer: its own chain to gpusim_launch (through a function pointer), and the
# simulator's native chains (gpusim_native_train_step → native_forward → native_gemm → gpusim_launch).
LAUNCHER_C = r"""
#include <dlfcn.h>
#include <stdint.h>
#include <unistd.h>
typedef uint32_t (*launch_fn)(const char *, uint64_t, uint32_t);
typedef void (*native_fn)(int);
static launch_fn launch;
static native_fn native_step;
volatile unsigned long extra;
__attribute__((noinline)) void attention(int i) {
    volatile char pad[96];
    pad[i % 96] = 1;
    launch("c_attention", 1000, 0);
    extra += pad[0];
}
__attribute__((noinline)) void forward(int i) { attention(i); extra++; }
__attribute__((noinline)) void train_step(int i) { forward(i); extra++; if (i % 2) native_step(1); extra++; }
int main(int argc, char **argv) {
    alarm(120);
    void *lib = argc > 1 ? dlopen(argv[1], RTLD_NOW) : 0;
    if (!lib) return 2;
    launch = (launch_fn)dlsym(lib, "gpusim_launch");
    native_step = (native_fn)dlsym(lib, "gpusim_native_train_step");
    for (int i = 0;; i++) { train_step(i); usleep(3000); }
}
"""
C_PATHS = [("main", "train_step", "forward", "attention", LAUNCH),
           ("main", "train_step", "gpusim_native_train_step", "native_forward", "native_gemm", LAUNCH),
           ("main", "train_step", "gpusim_native_train_step", "native_backward", "native_gemm_bwd", LAUNCH)]
C_KERNELS = {"c_attention", "_Z11native_gemmPKfS0_Pfi", "_Z15native_gemm_bwdPKfS0_Pfi"}

PYTHON_WORK = """
import ctypes, sys, time
lib = ctypes.CDLL(sys.argv[1])
lib.gpusim_launch.argtypes = [ctypes.c_char_p, ctypes.c_uint64, ctypes.c_uint32]
def attention():
    lib.gpusim_launch(b"py_attention", 1000, 0)
def forward():
    attention()
def train_step():
    forward()
end = time.monotonic() + 120
while time.monotonic() < end:
    train_step()
    time.sleep(0.003)
"""
PY_KERNELS = {"py_attention"}
# the Python frames read from the interpreter at each launch, root first, as `qualname:line` (the lines of PYTHON_WORK)
PY_CHAIN = ("<module>:13", "train_step:10", "forward:8", "attention:6")


def _uprobe(lib: Path) -> str:
    """A perf uprobe event at gpusim_launch's entry in `lib`; its name."""
    out = subprocess.run(["perf", "probe", "-x", str(lib), "--add", LAUNCH], capture_output=True, text=True)
    found = re.search(r"(probe_\w+:\w+)", out.stdout + out.stderr)
    if out.returncode != 0 or found is None:
        raise RuntimeError(f"perf probe failed: {(out.stderr or out.stdout).strip()[-1000:]}")
    return found.group(1)


def _cut(chain: Chain) -> Chain:
    """Up to gpusim_launch: where perf's uprobe stands, the probe's site being a few instructions further."""
    return chain[:chain.index(LAUNCH) + 1] if LAUNCH in chain else chain


def _our_launch_chains(store, node: str, binaries: dict[str, Binaries]) -> dict[str, Counter[Chain]]:
    """Per workload ("c", "python"), launches per chain from the store, the kernel leaf left out."""
    _, rows = store.query_sql("""
        SELECT g.kernel_name, st.frame_ids, sum(g.launches)
        FROM gpu_kernel_samples AS g
        INNER JOIN (SELECT stack_id, any(frame_ids) AS frame_ids FROM stacks GROUP BY stack_id) AS st
            ON g.stack_id = st.stack_id
        WHERE g.node = {n:String}
        GROUP BY g.kernel_name, st.frame_ids""", {"n": node})
    _, frames = store.query_sql("SELECT frame_id, any(function), any(binary), any(kind) FROM frames "
                                "WHERE frame_id IN {ids:Array(UInt64)} GROUP BY frame_id",
                                {"ids": sorted({f for _, ids, _ in rows for f in ids})})
    names = {fid: (fn, binary, kind) for fid, fn, binary, kind in frames}
    out: dict[str, Counter[Chain]] = {"c": Counter(), "python": Counter(), "python_frames": Counter()}
    for kernel, ids, launches in rows:
        which = "c" if kernel in C_KERNELS else "python" if kernel in PY_KERNELS else None
        if which is None:
            continue
        user = [names.get(f, ("?", "?", "?")) for f in ids]
        user = [f for f in user if f[2] != "GPU_KERNEL"]
        out[which][_cut(our_chain(user, binaries[which]))] += int(launches)
        if which == "python":
            python = [re.sub(r" \(.*:(\d+)\)$", r":\1", fn) for fn, _, kind in user
                      if kind == "INTERPRETED" and PYTHON_FRAME.match(fn)]
            out["python_frames"][tuple(python)] += int(launches)
    return out


def test_gpu_launch_stacks_match_perf_through_code_without_frame_pointers(kafka_bootstrap, store, tmp_path) -> None:
    try:
        check_bpf()
    except BpfUnavailable as exc:
        unavailable(f"BPF unavailable: {exc}")
    need("perf")
    need("readelf")
    lib = build(dataclasses.replace(GPU_SIM, name="gpu_sim_nofp", cflags=(*GPU_SIM.cflags, "-fomit-frame-pointer")))
    (tmp_path / "launcher.c").write_text(LAUNCHER_C)
    launcher = tmp_path / "c" / COMM
    launcher.parent.mkdir()
    subprocess.run([need("gcc"), "-O2", "-fomit-frame-pointer", "-o", str(launcher), str(tmp_path / "launcher.c"),
                    "-ldl"], check=True)
    python = tmp_path / "py" / COMM  # the interpreter under the test's command name
    python.parent.mkdir()
    python.symlink_to(os.path.realpath(sys.executable))
    (tmp_path / "work.py").write_text(PYTHON_WORK)
    node = f"gpu-truth-{uuid.uuid4().hex[:8]}"
    procs = {"c": subprocess.Popen([str(launcher), str(lib)]),
             "python": subprocess.Popen([str(python), "-S", str(tmp_path / "work.py"), str(lib)])}
    agent = None
    event = None
    try:
        agent = subprocess.Popen([sys.executable, "-m", "fleetprof", "agent", "--once", "--window", f"{WINDOW_S}s",
                                  "--node", node, "--comm", COMM, "--frequency", "19", "--format", "json"],
                                 env=dict(os.environ, FLEETPROF_KAFKA=kafka_bootstrap),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines = agent_started(agent)
        assert any("CUDA kernels" in line for line in lines if line.startswith("collecting")), "".join(lines)
        binaries = {name: Binaries.of(p.pid) for name, p in procs.items()}
        event = _uprobe(lib)
        perf = perf_chains([p.pid for p in procs.values()], PERF_SECONDS, 0, tmp_path / "perf", event=event)
        out, err = agent.communicate(timeout=120)
    finally:
        if event is not None:
            subprocess.run(["perf", "probe", "-d", event], capture_output=True)
        for p in (*procs.values(), agent):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    assert agent.returncode == 0, err
    summary = json.loads(out.splitlines()[-1])
    assert summary["gpu_launches"] > 0, summary

    run = uuid.uuid4().hex[:8]
    with symbolizer(kafka_bootstrap, f"sym-{run}") as sym, correlator(kafka_bootstrap, f"cor-{run}") as cor, \
            sink(store, kafka_bootstrap, f"sink-{run}") as snk:
        def stored() -> int:
            _, rows = store.query_sql("SELECT sum(launches) FROM gpu_kernel_samples WHERE node = {n:String}",
                                      {"n": node})
            return int(rows[0][0] or 0)

        def both() -> bool:
            _, rows = store.query_sql("SELECT DISTINCT kernel_name FROM gpu_kernel_samples WHERE node = {n:String}",
                                      {"n": node})
            names = {r[0] for r in rows}
            return bool(names & C_KERNELS) and bool(names & PY_KERNELS)
        # a launch whose kernel ran after the window closed is never joined: wait until the store stops growing
        wait_for(both, timeout=120, what="both workloads' launch stacks in the store", running=[sym, cor, snk])
        last, now = -1, stored()
        while now != last:  # bounded: the window's launches are finite
            time.sleep(3.0)
            last, now = now, stored()
    ours = _our_launch_chains(store, node, binaries)
    failures = []
    for name, expected in (("c", known_paths(*C_PATHS)), ("python", None)):
        theirs = Counter({_cut(chain): n for chain, n in perf[procs[name].pid].items()})
        a = agreement(ours[name], theirs, expected)
        print(json.dumps({"workload": f"gpu-launch-{name}", "perf_seconds": PERF_SECONDS,
                          **{k: round(v, 4) if isinstance(v, float) else v for k, v in a.items()}}))
        if a["ours_samples"] < 50 or a["perf_samples"] < 50:
            failures.append(f"{name}: too few launches to judge: {a}")
            continue
        if a["ours_judged"] < JUDGED_FLOOR:
            failures.append(f"{name}: only {a['ours_judged']:.3f} of our launches on chains perf would likely have "
                            f"seen: {a}")
        pairs = [("ours_root", "perf_root"), ("ours_in_perf", "perf_in_ours")]
        if expected is not None:
            pairs.append(("ours_expected", "perf_expected"))
        for mine, peer in pairs:
            if not (a[mine] >= MIN_SHARE and a[mine] >= a[peer] - SLACK):
                failures.append(f"{name}: {mine} {a[mine]:.3f}, {peer} {a[peer]:.3f}; ours: "
                                f"{ours[name].most_common(3)}; perf: {theirs.most_common(3)}")
    # the Python function and line that launched each kernel, read from the interpreter (a shared libpython here)
    frames = ours["python_frames"]
    print(json.dumps({"workload": "gpu-launch-python-frames", "launches": sum(frames.values()),
                      "on_the_known_chain": frames[PY_CHAIN], "chains": frames.most_common(3)}))
    if frames[PY_CHAIN] < MIN_SHARE * max(sum(frames.values()), 1) or frames[PY_CHAIN] < 50:
        failures.append(f"python: {frames[PY_CHAIN]} of {sum(frames.values())} launches under "
                        f"{' > '.join(PY_CHAIN)}: {frames.most_common(3)}")
    assert not failures, "\n".join(failures)
