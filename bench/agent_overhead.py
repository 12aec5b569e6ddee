"""CPU seconds per wall second and RSS of `fleetprof agent` on a busy machine, next to `perf record -a -g` at the
same frequency on the same workload in the same run. The ratio agent/perf is the figure.

    .venv/bin/python bench/agent_overhead.py [--duration 20] [--frequencies 19,99] [--window 5s]

Needs root (BPF, perf). Starts its own workload (one spinning process per core), a local broker on free ports, the
agent and perf, one at a time, and stops all of them; prints a table and writes bench/out/agent_overhead.json.

Agent: measured between the end of its second window (the BPF program is compiled and the symbols of the processes
already running are sent by then) and `duration` seconds later, from /proc/PID/stat (utime+stime, all threads, plus
any child processes; clock ticks). perf: `perf stat -e task-clock -p PID` (ns-precise: perf record's own CPU is far
below one clock tick) from 1 s after start to `duration` s later (steady), and its whole life from wait4's rusage
(start-up plus writing build ids at the end). Work done in the kernel on the sampling interrupt (the BPF program,
perf's ring buffer writes) is charged to whichever task was interrupted, not to either tool.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fleetprof.broker import LocalBroker, create_topics  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
SPIN = "import os, signal\nsignal.signal(signal.SIGTERM, lambda *_: os._exit(0))\nx = 0\nwhile True:\n    x += 1\n"


def free_ports(n: int) -> list[int]:
    import socket
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return out


def cpu_seconds(pid: int) -> float:
    """utime+stime (+ reaped children's) of pid and its live descendants, seconds."""
    total = 0
    for p in _descendants(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
    return total / TICK


def rss_mb(pid: int) -> float:
    total = 0
    for p in _descendants(pid):
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * PAGE
        except OSError:
            continue
    return total / 1e6


def wait_rusage(proc: subprocess.Popen, timeout: float) -> resource.struct_rusage | None:
    """Reap proc with wait4 (so its rusage comes back), killing it after timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return ru
        time.sleep(0.05)
    proc.kill()
    _, status, ru = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return None


def steady(pid: int, duration: float, task_clock: bool = True) -> dict:
    """CPU s per wall s and RSS of pid over the next `duration` seconds (RSS read every 0.5 s); with task_clock, the
    CPU figure comes from `perf stat -e task-clock -p pid` (ns-precise), else from /proc (clock ticks)."""
    if not task_clock:
        return _steady_proc(pid, duration)
    stat_out = tempfile.NamedTemporaryFile(prefix="fleetprof-perfstat-", suffix=".csv", delete=False).name
    counter = subprocess.Popen(["perf", "stat", "-x", ",", "-e", "task-clock", "-o", stat_out, "-p", str(pid),
                                "--", "sleep", str(duration)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    result = _steady_proc(pid, duration)
    try:
        counter.wait(10)
    except subprocess.TimeoutExpired:
        counter.kill()
        counter.wait()
    clock = None
    for line in Path(stat_out).read_text().splitlines():
        parts = line.split(",")
        if len(parts) > 2 and parts[2].startswith("task-clock") and parts[0].replace(".", "").isdigit():
            clock = float(parts[0]) / 1e3
    os.unlink(stat_out)
    result.update(task_clock_s=clock, cpu_per_wall=clock / duration if clock is not None else None)
    return result


def _steady_proc(pid: int, duration: float) -> dict:
    c0, t0 = cpu_seconds(pid), time.monotonic()
    rss = []
    while time.monotonic() - t0 < duration:
        time.sleep(0.5)
        rss.append(rss_mb(pid))
    c1, t1 = cpu_seconds(pid), time.monotonic()
    return {"proc_cpu_s": round(c1 - c0, 3), "wall_s": round(t1 - t0, 3), "proc_cpu_per_wall": (c1 - c0) / (t1 - t0),
            "task_clock_s": None, "cpu_per_wall": (c1 - c0) / (t1 - t0),
            "rss_mb_max": round(max(rss), 1), "rss_mb_last": round(rss[-1], 1)}


BPF_STATS = Path("/proc/sys/kernel/bpf_stats_enabled")


def bpf_prog_stats(name: str = "on_cpu_clock") -> tuple[int, int] | None:
    """(run_time_ns, run_cnt) of the loaded BPF programs called `name` (bpftool; kernel.bpf_stats_enabled on)."""
    if not shutil.which("bpftool"):
        return None
    out = subprocess.run(["bpftool", "prog", "show", "--json"], capture_output=True, text=True)
    if out.returncode != 0:
        return None
    progs = [p for p in json.loads(out.stdout) if p.get("name") == name and "run_cnt" in p]
    if not progs:
        return None
    return sum(p["run_time_ns"] for p in progs), sum(p["run_cnt"] for p in progs)


def stop_all(procs: list[subprocess.Popen]) -> None:
    """Terminate, then kill what is still there after 5 s."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def run_agent(bootstrap: str, freq: int, duration: float, window: str, tmp: Path, extra: tuple[str, ...] = (),
              root: Path = ROOT, label: str = "") -> dict:
    """The agent (of the checkout at `root`, with `extra` flags) measured over `duration` steady seconds."""
    env = dict(os.environ, FLEETPROF_KAFKA=bootstrap)
    log = tmp / f"agent{freq}{label}.log"
    proc = subprocess.Popen([sys.executable, "-m", "fleetprof", "agent", "--window", window, "--frequency", str(freq),
                             "--format", "json", *extra], cwd=root, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    first = threading.Event()
    lines: list[str] = []

    def read_err() -> None:
        for line in proc.stderr:
            lines.append(line.rstrip())
            if line.startswith("window 2:"):
                first.set()
    reader = threading.Thread(target=read_err, daemon=True)
    reader.start()
    t_start = time.monotonic()
    try:
        if not first.wait(120):
            raise SystemExit("agent produced no window in 120 s:\n" + "\n".join(lines[-20:]))
        startup_s = time.monotonic() - t_start
        startup_cpu = cpu_seconds(proc.pid)
        # no perf stat here: a new process's libraries would be sampled and their symbols sent by the agent
        before = bpf_prog_stats()
        result = steady(proc.pid, duration, task_clock=False)
        after = bpf_prog_stats()
        if before and after and after[1] > before[1]:
            # the BPF program runs in the sampling interrupt, charged to the interrupted task: measured apart
            ns, runs = after[0] - before[0], after[1] - before[1]
            result.update(bpf_ns_per_sample=round(ns / runs), bpf_samples=runs,
                          bpf_cpu_per_wall=ns / 1e9 / result["wall_s"])
        proc.send_signal(signal.SIGTERM)
        ru = wait_rusage(proc, 30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(5)
    summary = proc.stdout.read().strip().splitlines()
    log.write_text("\n".join(lines) + "\n")
    windows = [ln for ln in lines if ln.startswith("window ")]
    result.update(startup_s=round(startup_s, 2), startup_cpu_s=round(startup_cpu, 2),
                  life_cpu_s=round(ru.ru_utime + ru.ru_stime, 2) if ru else None,
                  maxrss_mb=round(ru.ru_maxrss / 1e3, 1) if ru else None,
                  windows=windows, summary=json.loads(summary[-1]) if summary else None)
    return result


def run_perf(freq: int, duration: float, tmp: Path) -> dict:
    data = tmp / f"perf{freq}.data"
    t_start = time.monotonic()
    proc = subprocess.Popen(["perf", "record", "-F", str(freq), "-a", "-g", "-o", str(data), "--",
                             "sleep", str(duration + 2)], stdout=subprocess.DEVNULL,
                            stderr=open(tmp / f"perf{freq}.log", "wb"), start_new_session=True)
    try:
        time.sleep(1.0)
        result = steady(proc.pid, duration)
        ru = wait_rusage(proc, 120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    life = time.monotonic() - t_start
    result.update(life_wall_s=round(life, 2),
                  life_cpu_s=round(ru.ru_utime + ru.ru_stime, 2) if ru else None,
                  maxrss_mb=round(ru.ru_maxrss / 1e3, 1) if ru else None,
                  data_mb=round(data.stat().st_size / 1e6, 2) if data.exists() else None,
                  returncode=proc.returncode)
    data.unlink(missing_ok=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=20.0, help="steady seconds measured per tool and frequency")
    ap.add_argument("--frequencies", default="19,99")
    ap.add_argument("--window", default="5s")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (BPF and perf -a)")
    if not shutil.which("perf"):
        raise SystemExit("perf not found")
    freqs = [int(f) for f in args.frequencies.split(",")]

    stats_was = BPF_STATS.read_text().strip() if BPF_STATS.exists() else None
    if stats_was is not None:
        BPF_STATS.write_text("1")  # BPF programs' run time and count, for the agent's in-kernel cost
    tmp = Path(tempfile.mkdtemp(prefix="fleetprof-agent-bench-"))
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(os.cpu_count() or 1)]
    broker = None
    rows = []
    try:
        port, cport = free_ports(2)
        broker = LocalBroker(tmp / "kafka", port=port, controller_port=cport)
        broker.start()
        create_topics(broker.bootstrap)
        for freq in freqs:
            agent = run_agent(broker.bootstrap, freq, args.duration, args.window, tmp)
            perf = run_perf(freq, args.duration, tmp)
            rows.append({"frequency_hz": freq, "agent": agent, "perf": perf,
                         "ratio_cpu": agent["cpu_per_wall"] / perf["cpu_per_wall"] if perf["cpu_per_wall"] else None,
                         "ratio_rss": agent["rss_mb_max"] / perf["rss_mb_max"] if perf["rss_mb_max"] else None})
    finally:
        stop_all(spinners)
        if broker is not None:
            broker.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        if stats_was is not None:
            BPF_STATS.write_text(stats_was)

    result = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.node()}: {os.cpu_count()} cores, "
              f"{platform.release()}", "duration_s": args.duration, "window": args.window,
              "workload": f"{len(spinners)} spinning Python processes", "rows": rows}
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "agent_overhead.json").write_text(json.dumps(result, indent=2) + "\n")
    print("CPU: perf stat -e task-clock -p PID over the steady interval (ns-precise); /proc CPU in brackets")
    print(f"{'Hz':>4} {'tool':<6} {'CPU s/wall s':>13} {'% of a core':>11} {'RSS MB (max)':>13} {'life CPU s':>11}")
    for r in rows:
        for tool in ("agent", "perf"):
            m = r[tool]
            print(f"{r['frequency_hz']:>4} {tool:<6} {m['cpu_per_wall']:>13.5f} {100 * m['cpu_per_wall']:>10.3f}% "
                  f"[{m['proc_cpu_per_wall']:.4f}] "
                  f"{m['rss_mb_max']:>13.1f} {m['life_cpu_s'] if m['life_cpu_s'] is not None else '-':>11}")
        a = r["agent"]
        if a.get("bpf_ns_per_sample") is not None:
            print(f"{r['frequency_hz']:>4} agent's BPF program (sampling interrupt): {a['bpf_ns_per_sample']} ns "
                  f"per sample, {a['bpf_samples']} samples, {100 * a['bpf_cpu_per_wall']:.4f}% of a core")
        cpu = f"{r['ratio_cpu']:.3f}" if r["ratio_cpu"] is not None else "-"
        print(f"{r['frequency_hz']:>4} ratio agent/perf: CPU {cpu}, RSS {r['ratio_rss']:.2f}; agent start-up "
              f"{r['agent']['startup_s']} s, {r['agent']['startup_cpu_s']} CPU s")


if __name__ == "__main__":
    main()
