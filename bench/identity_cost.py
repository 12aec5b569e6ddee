"""What workload identity costs the agent: its CPU at 19 Hz on the same busy workload in the same run, resolving
identities from a kubelet (a double of its HTTPS /pods with `--pods` pods, and of pod-resources) for processes in
containerd-shaped pod cgroups, next to the same agent with the kubelet off (cgroup paths only) and, with
`--baseline-root`, the agent of a checkout from before identities (the peer: what it cost before).

    .venv/bin/python bench/identity_cost.py [--duration 30] [--rounds 2] [--pods 5000] [--baseline-root DIR]

Needs root (BPF, cgroups). Variants alternate, `rounds` times each, so a drift of the machine's load shows in all of
them. CPU from /proc/PID/stat between the end of the agent's second window and `duration` s later (clock ticks).
Prints a table and writes bench/out/identity_cost.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from agent_overhead import SPIN, free_ports, run_agent, stop_all  # noqa: E402

from fleetprof.broker import LocalBroker, create_topics  # noqa: E402
from tests.cgroup_helpers import cgroup_tree  # noqa: E402
from tests.kubelet_double import KubeletDouble, PodResourcesDouble, make_tls, pod, pod_list, pod_uid  # noqa: E402


def _pods(n: int, containers: dict[int, str]) -> list[dict]:
    """n pods of 2 containers; pod i's first container has the id containers[i] where given."""
    out = []
    for i in range(n):
        first = containers.get(i, uuid.uuid4().hex * 2)
        out.append(pod(f"worker-{i}", f"ns-{i % 40}", pod_uid(i), {"team": f"team-{i % 7}", "job-name": f"job-{i}"},
                       [("main", f"containerd://{first}"), ("sidecar", f"containerd://{uuid.uuid4().hex * 2}")]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--pods", type=int, default=5000, help="pods in the kubelet's answer")
    ap.add_argument("--frequency", type=int, default=19)
    ap.add_argument("--window", default="5s")
    ap.add_argument("--refresh", default="10s", help="--kubelet-refresh of the agent under test")
    ap.add_argument("--baseline-root", type=Path, default=None,
                    help="a checkout from before workload identity, run as a third variant")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (BPF, cgroups)")
    tmp = Path(tempfile.mkdtemp(prefix="fleetprof-identity-bench-"))
    run = uuid.uuid4().hex[:8]
    spinners, ids = [], {}
    broker = kubelet = holders = None
    results: dict[str, list[dict]] = {}
    try:
        with cgroup_tree(f"fleetprof-bench-{run}") as tree:
            for i in range(os.cpu_count() or 1):  # one spinner per core, each a pod's container
                cid = ids[i] = uuid.uuid4().hex * 2
                cgroup = (f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
                          f"{pod_uid(i).replace('-', '_')}.slice/cri-containerd-{cid}.scope")
                spinners.append(tree.run(cgroup, [sys.executable, "-c", SPIN]))
            tls = make_tls(tmp)
            (tmp / "token").write_text("bench-token\n")
            kubelet = KubeletDouble(pod_list(_pods(args.pods, ids)), token="bench-token", tls=tls).start()
            holders = PodResourcesDouble(tmp / "pr.sock", [(f"ns-{i % 40}", f"worker-{i}", [
                ("main", [("nvidia.com/gpu", [f"GPU-{i:08d}-0000-4000-8000-000000000000"])])]) for i in range(8)])
            holders.start()
            port, cport = free_ports(2)
            broker = LocalBroker(tmp / "kafka", port=port, controller_port=cport)
            broker.start()
            create_topics(broker.bootstrap)
            variants = {
                "kubelet": (ROOT, ("--kubelet-url", kubelet.url, "--kubelet-ca-file", str(tls.ca_file),
                                   "--kubelet-token-file", str(tmp / "token"), "--kubelet-refresh", args.refresh,
                                   "--pod-resources-socket", str(tmp / "pr.sock"))),
                "cgroups only": (ROOT, ("--kubelet-url", "off", "--pod-resources-socket", str(tmp / "none.sock"))),
            }
            if args.baseline_root is not None:
                variants["before identity"] = (args.baseline_root.resolve(), ())
            for r in range(args.rounds):
                for name, (root, extra) in variants.items():
                    label = f"-{name.replace(' ', '_')}-{r}"
                    results.setdefault(name, []).append(
                        run_agent(broker.bootstrap, args.frequency, args.duration, args.window, tmp, extra, root,
                                  label))
                    print(f"round {r + 1} {name}: {100 * results[name][-1]['cpu_per_wall']:.3f}% of a core",
                          flush=True)
            kubelet_requests = len(kubelet.requests)
    finally:
        stop_all([s for s in spinners if s.poll() is None])
        for part in (kubelet, holders, broker):
            if part is not None:
                part.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    rows = {name: {"cpu_per_wall": [m["cpu_per_wall"] for m in ms],
                   "mean_pct_of_a_core": round(100 * statistics.mean(m["cpu_per_wall"] for m in ms), 3),
                   "rss_mb_max": max(m["rss_mb_max"] for m in ms), "startup_s": [m["startup_s"] for m in ms]}
            for name, ms in results.items()}
    out = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.node()}: {os.cpu_count()} cores, "
           f"{platform.release()}", "frequency_hz": args.frequency, "duration_s": args.duration,
           "pods_in_kubelet_answer": args.pods, "kubelet_requests": kubelet_requests, "variants": rows}
    (ROOT / "bench" / "out").mkdir(exist_ok=True)
    (ROOT / "bench" / "out" / "identity_cost.json").write_text(json.dumps(out, indent=2) + "\n")
    print(f"agent at {args.frequency} Hz, {len(spinners)} spinners in pod cgroups, kubelet double with {args.pods} "
          f"pods ({kubelet_requests} requests in all)")
    base = rows.get("before identity") or rows["cgroups only"]
    for name, row in rows.items():
        ratio = row["mean_pct_of_a_core"] / base["mean_pct_of_a_core"] if base["mean_pct_of_a_core"] else None
        print(f"{name:<16} {row['mean_pct_of_a_core']:>7.3f}% of a core  per run "
              f"{[round(100 * v, 3) for v in row['cpu_per_wall']]}  RSS {row['rss_mb_max']} MB  "
              f"ratio {ratio:.2f}" if ratio else f"{name:<16} {row['mean_pct_of_a_core']:>7.3f}%")


if __name__ == "__main__":
    main()
