"""The whole agent at 19 Hz with user stacks unwound from call-frame tables, next to the same agent walking frame
pointers only and to `perf record --call-graph dwarf -a` at the same frequency, all over the same seconds; and what
the tables take: the agent's RSS, rows and bytes per binary. Used by bench/unwind_cost.py.

The two agents (tables, frame pointers) and perf run at once, so that whatever else the machine does (processes
started and ended, each one read, its symbols sent, its tables loaded) falls on all of them alike; each samples the
others too. Workload: one spinning Python process per core, at nice 19 so that whatever else runs keeps its share.
Agents: publishing to a local broker, `--window 5s`, their data directories kept under bench/out/ so that the tables
are compiled once, not on every run (the first run after the cache's format changed compiles them all: run twice).
perf starts once every agent has sent its second window, and the measured seconds begin when every tool took under
5% of a core for two seconds in a row (or after 60 s). CPU over those seconds, for all alike, of every thread (and
child): ns on a CPU from /proc/PID/task/TID/schedstat, and utime+stime from /proc/PID/stat next to it (clock ticks;
no counting tool is started meanwhile, as it would be one more process for the agents to read); perf's whole life
from wait4's rusage too (start-up, and reading its file for build ids after SIGINT), and its file's bytes per second
recorded. The table agent's unwinder counts come from its Prometheus /metrics before and after.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from bench.agent_overhead import SPIN, _descendants, cpu_seconds, rss_mb, stop_all, wait_rusage
from bench.local_ports import free_ports
from fleetprof.broker import LocalBroker, create_topics
from producers.process_info import BuildIdCache, read_mappings
from producers.unwind_cache import UnwindTableCache
from producers.unwind_maps import ELEMENT_BYTES
from producers.unwind_tables import ROW

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "bench" / "out" / "unwind_cost_data"  # the agents': their table cache survives between runs
FREQUENCY = 19
SETTLED_CPU = 0.05  # CPU s per wall s under which a tool counts as steady
PERF_EVENT_PROG = 7  # BPF_PROG_TYPE_PERF_EVENT
# key -> the agent's --unwind and --unwind-rows (None: the default)
AGENTS = {"tables": ("tables", None), "frame_pointers": ("frame-pointers", None)}
TABLE_AGENTS = [k for k, (unwind, _) in AGENTS.items() if unwind == "tables"]


class Agent:
    """One `fleetprof agent` process, its stderr read by a thread."""

    def __init__(self, bootstrap: str, key: str, metrics_port: int) -> None:
        self.key, self.metrics_port = key, metrics_port
        unwind, rows = AGENTS[key]
        # the table agents share a data directory (its table cache), each with a node name (its lock) of its own
        env = dict(os.environ, FLEETPROF_KAFKA=bootstrap, FLEETPROF_DATA_DIR=str(DATA / unwind))
        self.proc = subprocess.Popen([sys.executable, "-m", "fleetprof", "agent", "--window", "5s", "--frequency",
                                      str(FREQUENCY), "--unwind", unwind, "--format", "json", "--node",
                                      f"bench-{key}", "--metrics-port", str(metrics_port)]
                                     + (["--unwind-rows", str(rows)] if rows else []), cwd=ROOT, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        self.second = threading.Event()
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line.rstrip())
            if line.startswith("window 2:"):
                self.second.set()

    def metrics(self) -> dict[str, float]:
        """fleetprof_agent_unwind_* samples of its /metrics: 'name{labels}' -> value."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return {}
        out = {}
        for line in text.splitlines():
            if line.startswith("fleetprof_agent_unwind_"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def stop(self, log_dir: Path) -> dict:
        self.proc.send_signal(signal.SIGTERM)
        ru = wait_rusage(self.proc, 60)
        self.reader.join(5)
        out = self.proc.stdout.read().strip().splitlines()
        (log_dir / f"agent-{self.key}.log").write_text("\n".join(self.lines) + "\n")
        summary = json.loads(out[-1]) if out else {}
        return {"maxrss_mb": round(ru.ru_maxrss / 1e3, 1) if ru else None,
                "life_cpu_s": round(ru.ru_utime + ru.ru_stime, 2) if ru else None,
                "user_stacks_by": summary.get("user_stacks_by"), "unwind": summary.get("unwind", {}),
                "samples": summary.get("samples"), "lost_stacks": summary.get("lost_stacks"),
                "windows": summary.get("windows")}

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def bpf_stats_of(pid: int) -> tuple[int, int] | None:
    """(run_time_ns, run_cnt) of the perf_event BPF programs process `pid` holds, from its /proc fdinfo."""
    ns = runs = found = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:bpf-prog":
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                info = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if int(info.get("prog_type", -1)) == PERF_EVENT_PROG:
            ns, runs, found = ns + int(info.get("run_time_ns", 0)), runs + int(info.get("run_cnt", 0)), found + 1
    return (ns, runs) if found else None


def settle(pids: list[int], limit_s: float = 60.0) -> float:
    """Seconds waited until every pid took under SETTLED_CPU in two 1-second intervals in a row."""
    t0, calm, last = time.monotonic(), 0, [cpu_seconds(p) for p in pids]
    while calm < 2 and time.monotonic() - t0 < limit_s:
        time.sleep(1.0)
        now = [cpu_seconds(p) for p in pids]
        calm = calm + 1 if all(b - a < SETTLED_CPU for a, b in zip(last, now, strict=True)) else 0
        last = now
    return time.monotonic() - t0


def run_ns(pid: int) -> int:
    """ns on a CPU of every thread of pid and its live descendants (/proc/.../schedstat: exact, where utime+stime
    counts clock ticks; a thread that exited meanwhile takes its time with it)."""
    total = 0
    for p in _descendants(pid):
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/schedstat") as f:
                    total += int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                pass
    return total


def measure(pids: dict[str, int], duration: float) -> dict[str, dict]:
    """CPU s per wall s of each pid (with its children) over `duration` seconds, from schedstat and from
    utime+stime, and its RSS every 0.5 s."""
    c0, n0, t0 = {k: cpu_seconds(p) for k, p in pids.items()}, {k: run_ns(p) for k, p in pids.items()}, \
        time.monotonic()
    rss: dict[str, list[float]] = {k: [] for k in pids}
    while time.monotonic() - t0 < duration:
        time.sleep(0.5)
        for k, p in pids.items():
            rss[k].append(rss_mb(p))
    c1, n1 = {k: cpu_seconds(p) for k, p in pids.items()}, {k: run_ns(p) for k, p in pids.items()}
    wall = time.monotonic() - t0
    return {k: {"cpu_s": round((n1[k] - n0[k]) / 1e9, 4), "wall_s": round(wall, 2),
                "cpu_per_wall": (n1[k] - n0[k]) / 1e9 / wall, "stat_cpu_s": round(c1[k] - c0[k], 3),
                "stat_cpu_per_wall": (c1[k] - c0[k]) / wall,
                "rss_mb_max": round(max(rss[k]), 1), "rss_mb_last": round(rss[k][-1], 1)} for k in pids}


def table_bytes(top: int = 5) -> dict:
    """Rows of each binary mapped by a running process whose table is in the tables agent's cache: the largest
    `top`, and all of them together (rows x ROW.size bytes in the cache, x ELEMENT_BYTES in the
    kernel's array; the rules each row names are stored once per distinct rule)."""
    cache = UnwindTableCache(DATA / "tables" / "agent" / "unwind")
    ids, seen = BuildIdCache(), {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            for m in read_mappings(int(entry), ids) or []:
                if m.build_id and m.build_id not in seen:
                    seen[m.build_id] = m.path
    rows = {}
    for build_id, path in seen.items():
        try:
            with open(cache.path_for(build_id), "rb") as f:
                head = f.read(24)
        except OSError:
            continue
        if len(head) == 24:
            rows[build_id] = (path, struct.unpack_from("<Q", head, 16)[0])
    largest = sorted(rows.values(), key=lambda r: -r[1])[:top]
    total = sum(n for _, n in rows.values())
    return {"files": len(rows), "rows": total, "cache_bytes": total * ROW.size, "kernel_bytes": total * ELEMENT_BYTES,
            "largest": [{"file": os.path.basename(p), "rows": n, "cache_bytes": n * ROW.size,
                         "kernel_bytes": n * ELEMENT_BYTES} for p, n in largest]}


def agent_part(duration: float, tmp: Path) -> dict:
    spinners = [subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", SPIN])
                for _ in range(os.cpu_count() or 1)]
    broker, agents, perf = None, {}, None
    data = tmp / "perf-dwarf.data"
    try:
        port, cport, *metrics_ports = free_ports(2 + len(AGENTS))
        broker = LocalBroker(tmp / "kafka", port=port, controller_port=cport)
        broker.start()
        create_topics(broker.bootstrap)
        t0 = time.monotonic()
        agents = {k: Agent(broker.bootstrap, k, mp) for k, mp in zip(AGENTS, metrics_ports, strict=True)}
        for a in agents.values():
            if not a.second.wait(240):
                raise SystemExit(f"agent ({a.key}) sent no second window in 240 s:\n" + "\n".join(a.lines[-20:]))
        startup_s = time.monotonic() - t0
        perf_t0 = time.monotonic()
        perf = subprocess.Popen(["perf", "record", "-F", str(FREQUENCY), "-a", "--call-graph", "dwarf", "-o",
                                 str(data)], stdout=subprocess.DEVNULL, stderr=open(tmp / "perf-dwarf.log", "wb"),
                                start_new_session=True)
        time.sleep(1.0)
        pids = {**{m: a.proc.pid for m, a in agents.items()}, "perf": perf.pid}
        settled_s = settle(list(pids.values()))
        metrics0, bpf0 = {k: a.metrics() for k, a in agents.items()}, {k: bpf_stats_of(a.proc.pid)
                                                                      for k, a in agents.items()}
        steady = measure(pids, duration)
        metrics1, bpf1 = {k: a.metrics() for k, a in agents.items()}, {k: bpf_stats_of(a.proc.pid)
                                                                      for k, a in agents.items()}
        tables = table_bytes()
        perf.send_signal(signal.SIGINT)
        ru = wait_rusage(perf, 180)
        perf_wall = time.monotonic() - perf_t0
        stopped = {m: a.stop(tmp) for m, a in agents.items()}
    finally:
        for a in agents.values():
            a.kill()
        if perf is not None and perf.poll() is None:
            os.killpg(perf.pid, signal.SIGKILL)
            perf.wait()
        stop_all(spinners)
        if broker is not None:
            broker.stop()
    size = data.stat().st_size if data.exists() else 0
    data.unlink(missing_ok=True)
    out: dict = {"frequency_hz": FREQUENCY, "duration_s": duration, "startup_s": round(startup_s, 1),
                 "settle_wait_s": round(settled_s, 1), "tables_cached": tables}
    for k in AGENTS:
        out[k] = {**steady[k], **stopped[k]}
        if bpf0[k] and bpf1[k] and bpf1[k][1] > bpf0[k][1]:  # every CPU's samples: idle ones (returned at once) too
            ns, runs = bpf1[k][0] - bpf0[k][0], bpf1[k][1] - bpf0[k][1]
            out[k].update(bpf_ns_per_run=round(ns / runs), bpf_cpu_per_wall=ns / 1e9 / steady[k]["wall_s"])
        # counters: what the measured seconds added; gauges (rows, files, processes): at their end
        out[k]["metrics"] = {n.removeprefix("fleetprof_agent_unwind_"): v if "_total" not in n
                             else v - metrics0[k].get(n, 0) for n, v in metrics1[k].items()
                             if "_total" not in n or v > metrics0[k].get(n, 0)}
    out["perf_dwarf"] = {**steady["perf"], "life_wall_s": round(perf_wall, 1),
                         "life_cpu_s": round(ru.ru_utime + ru.ru_stime, 2) if ru else None,
                         "maxrss_mb": round(ru.ru_maxrss / 1e3, 1) if ru else None, "data_mb": round(size / 1e6, 2),
                         "data_kb_per_s": round(size / 1e3 / perf_wall, 1)}
    for k in TABLE_AGENTS:
        for peer in ("frame_pointers", "perf_dwarf"):
            cpu = out[peer]["cpu_per_wall"]
            out[f"ratio_{k}_{peer}"] = round(out[k]["cpu_per_wall"] / cpu, 2) if cpu else None
    return out


def print_agent(r: dict) -> None:
    print(f"\nagent at {r['frequency_hz']} Hz, every process, all at once ({r['duration_s']:g} s steady, schedstat ns, "
          f"[utime+stime ticks]; agents' start-up {r['startup_s']} s, then {r['settle_wait_s']} s to settle)")
    print(f"{'':24} {'% of a core':>11} {'[utime+stime]':>13} {'RSS MB max':>11} {'RSS last':>9} {'maxrss MB':>10} "
          f"{'life CPU s':>11}")
    for key in [*AGENTS, "perf_dwarf"]:
        m, name = r[key], ("agent, " + key.replace("_", " ") if key in AGENTS else "perf --call-graph dwarf")
        print(f"{name:24} {100 * m['cpu_per_wall']:10.3f}% {100 * m['stat_cpu_per_wall']:12.3f}% "
              f"{m['rss_mb_max']:11.1f} {m['rss_mb_last']:9.1f} "
              f"{m['maxrss_mb'] or 0:10.1f} {m['life_cpu_s']!s:>11}")
    p = r["perf_dwarf"]
    print(f"perf: {p['data_kb_per_s']} kB/s written, {p['data_mb']} MB in {p['life_wall_s']} s")
    for k in TABLE_AGENTS:
        print(f"ratios: {k} / frame pointers {r[f'ratio_{k}_frame_pointers']}, / perf dwarf "
              f"{r[f'ratio_{k}_perf_dwarf']}")
    for key in AGENTS:
        m = r[key]
        if m.get("bpf_ns_per_run") is not None:
            print(f"{key}: BPF program {m['bpf_ns_per_run']:,} ns per run (idle CPUs' runs included), "
                  f"{100 * m['bpf_cpu_per_wall']:.4f}% of a core")
    for key in TABLE_AGENTS:
        print_unwinder(key, r[key])
    t = r["tables_cached"]
    print(f"tables of running processes' binaries in the cache: {t['files']} files, {t['rows']:,} rows, "
          f"{t['cache_bytes'] / 1e6:.1f} MB cached, {t['kernel_bytes'] / 1e6:.1f} MB of kernel rows if all were loaded")
    for b in t["largest"]:
        print(f"  {b['file']:40} {b['rows']:>10,} rows {b['cache_bytes'] / 1e6:8.2f} MB cached "
              f"{b['kernel_bytes'] / 1e6:8.2f} MB kernel")


def print_unwinder(key: str, m: dict) -> None:
    u = m["unwind"]
    if u:
        rows = u.get("rows_used", 0)
        print(f"{key}, at exit: {u.get('files')} files, {rows:,} of {u.get('rows_capacity', 0):,} rows "
              f"({rows * ELEMENT_BYTES / 1e6:.1f} MB of kernel rows), {u.get('rules')} distinct rules, "
              f"{u.get('processes')} processes, "
              f"{u.get('rows_exhausted')} tables refused (rows full); walks: root {u.get('stacks_reached_root')}, "
              f"frame pointer end {u.get('stacks_ended_by_frame_pointer')}, truncated {u.get('stacks_truncated')}, "
              f"without tables {u.get('stacks_without_tables')}")
    print(f"{key}, over the measured seconds (/metrics; counts added, gauges at the end): "
          + ", ".join(f"{k} {v:g}" for k, v in m["metrics"].items()))
