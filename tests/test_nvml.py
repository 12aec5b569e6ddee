"""The NVML collector through the real nvidia-ml-py against the simulated libnvidia-ml.so.1, and end to end into chDB.

nvidia-ml-py loads the library once per process, so the collector runs in a subprocess whose LD_LIBRARY_PATH holds
the simulated library; it polls at fixed offsets from the library's time zero (its nvmlInit) and prints what it got.
Polls sit half a second inside the scenario's one-second segments, so every expected value is exact.
"""

from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from fleetprof.settings import REPO_ROOT
from producers.native_build import NativeBuildError
from producers.nvml_collector import NvmlCollector, read_process
from schemas.wire import identity_key
from simulate.nvml import SCENARIO_ENV, Segment, SimDevice, SimProcess, library_dir, sim_env, write_scenario
from tests.elf_helpers import unavailable
from tests.pipeline_helpers import sink, wait_for

GIB = 1024**3
CONTAINER = "4f1c2d3e" * 8  # 64 hex digits, as docker, containerd and cri-o name a container

# Runs in the subprocess: open, poll at each offset (seconds after open) with that exact time, print the results.
DRIVER = r"""
import json, logging, sys, threading, time
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(message)s")
from producers.nvml_collector import NvmlCollector
from schemas.single_object import encode
plan = json.loads(sys.argv[1])
ids = None
if plan.get("gpu_pods") is not None:  # the identities double: a GPU's pod, a process's pod from its cgroup
    from tests.identity_doubles import CgroupIdentities
    ids = CgroupIdentities(plan["node"], gpu_pods=plan["gpu_pods"])
c = NvmlCollector(plan["node"], deadline_s=plan.get("deadline"), proc_root=plan.get("proc_root", "/proc"),
                  identities=ids)
t0 = time.time_ns()
out = {"open": c.open(), "reason": c.reason, "simulated": c.simulated, "driver": c.driver, "polls": []}
publisher = None
if plan.get("kafka"):
    from producers.publisher import Publisher
    publisher = Publisher({"bootstrap.servers": plan["kafka"]})
for at in plan["at"]:
    target = t0 + int(at * 1e9)
    time.sleep(max(0, target - time.time_ns()) / 1e9)
    began = time.monotonic()
    record = c.poll(target)
    seconds = time.monotonic() - began
    threads = sum(1 for t in threading.enumerate() if t.name == "fleetprof-nvml")
    out["polls"].append({"record": record, "seconds": seconds, "threads": threads})
    if publisher is not None and record is not None:
        publisher.publish("gpu.metrics", record["node"], encode("GpuMetrics", record))
if publisher is not None:
    assert publisher.flush(30) == 0
out["counters"] = {"polls": c.polls, "overruns": c.overruns, "skipped": c.skipped, "errors": c.errors}
c.close()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def sim_dir() -> Path:
    try:
        return library_dir()
    except NativeBuildError as exc:
        unavailable(str(exc))


def collect(sim_dir: Path, scenario: Path, at: list[float], timeout: float = 60, **plan) -> tuple[dict, list[str]]:
    """Run the driver against `scenario`; (its result, its log lines)."""
    env = sim_env(scenario)
    done = subprocess.run([sys.executable, "-c", DRIVER, json.dumps({"node": "node-a", "at": at, **plan})],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr.splitlines()


def device(index: int, uuid_: str, name: str, parent_uuid: str = "", xids: tuple[int, ...] = (), identity: int = 0,
           **values) -> dict:
    """An expected DeviceMetrics: the named values, None for the rest."""
    fields = ["gpu_util_pct", "mem_util_pct", "mem_used_bytes", "mem_total_bytes", "sm_clock_mhz", "mem_clock_mhz",
              "power_mw", "power_limit_mw", "temperature_c", "pcie_tx_kbps", "pcie_rx_kbps", "clock_event_reasons"]
    assert set(values) <= set(fields)
    return {"index": index, "uuid": uuid_, "name": name, "parent_uuid": parent_uuid, "identity_id": identity,
            **{f: values.get(f) for f in fields}, "xid_errors": list(xids)}


def proc(device_index: int, pid: int, comm: str, container: str, sm: int | None, mem: int | None,
         used: int | None, identity: int = 0) -> dict:
    return {"device_index": device_index, "pid": pid, "comm": comm, "container_id": container,
            "identity_id": identity, "sm_util_pct": sm, "mem_util_pct": mem, "used_memory_bytes": used}


def fake_proc(root: Path, pids: dict[int, tuple[str, str]]) -> Path:
    """A /proc-like tree with comm and cgroup (v2, as a container runtime writes it) for each pid."""
    for pid, (comm, container) in pids.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "comm").write_text(comm + "\n")
        scope = f"/system.slice/docker-{container}.scope" if container else "/user.slice/session-1.scope"
        (root / str(pid) / "cgroup").write_text(f"0::{scope}\n")
    return root


# --- the timeline ---------------------------------------------------------------------------------------------------

H100 = "fleetprof simulated H100"
A100 = "fleetprof simulated A100"
MIG = "fleetprof simulated A100 MIG 3g.20gb"
G0, G1, M0, M1 = "GPU-00000000-aaaa", "GPU-11111111-bbbb", "MIG-22222222-cccc", "MIG-33333333-dddd"
TRAIN, EVAL, SERVE, BATCH, GONE = 4101, 4102, 4103, 4104, 4199  # GONE has no /proc entry


def timeline_scenario(path: Path) -> Path:
    devices = [SimDevice("g0", G0, H100, 80 * GIB, 700_000),
               SimDevice("g1", G1, A100, 40 * GIB, 400_000),
               SimDevice("m0", M0, MIG, 20 * GIB, None, parent="g1", gpu_instance_id=1),
               SimDevice("m1", M1, MIG, 20 * GIB, None, parent="g1", gpu_instance_id=2)]
    busy = {"gpu_util": 97, "mem_util": 61, "mem_used": 60 * GIB, "sm_clock": 1980, "mem_clock": 2619,
            "power": 650_000, "temp": 71, "pcie_tx": 1_200_000, "pcie_rx": 3_400_000, "clock_events": 0}
    timeline = [
        Segment(0, "g0", busy, [SimProcess(TRAIN, 95, 60, 50 * GIB), SimProcess(GONE, None, None, GIB)]),
        # utilization drops, the GPU idles its clocks, one process is gone, XID 79 is raised once
        Segment(1, "g0", {"gpu_util": 12, "mem_util": 3, "sm_clock": 1410, "power": 150_000, "temp": 60,
                          "clock_events": 0x1}, [SimProcess(TRAIN, 10, 2, 50 * GIB)], xids=[79]),
        # a second process comes
        Segment(2, "g0", {"gpu_util": 88}, [SimProcess(TRAIN, 11, 3, 50 * GIB), SimProcess(EVAL, 80, 40, 10 * GIB)]),
        Segment(3, "g0", {"gpu_util": 0, "mem_util": 0, "mem_used": 0}, []),
        # a GPU in MIG mode: no utilization of its own; its processes are read through its MIG devices
        Segment(0, "g1", {"mem_used": 25 * GIB, "sm_clock": 1410, "mem_clock": 1593, "power": 200_000,
                          "temp": 45, "clock_events": 0}),
        Segment(0, "m0", {"mem_used": 15 * GIB}, [SimProcess(SERVE, None, None, 14 * GIB)]),
        Segment(2, "m0", xids=[48]),
        Segment(0, "m1", {"mem_used": 0}, []),
        Segment(1, "m1", {"mem_used": 5 * GIB}, [SimProcess(BATCH, None, None, 5 * GIB)]),
    ]
    # samples every 2 s: the polls at 1.5 and 3.5 find none newer than the last one used
    return write_scenario(path, devices, timeline, proc_sample_ms=2000)


def expected_timeline() -> list[tuple[list[dict], list[dict]]]:
    """(devices, processes) of the polls at 0.5, 1.5, 2.5 and 3.5 s."""
    g1 = device(1, G1, A100, mem_used_bytes=25 * GIB, mem_total_bytes=40 * GIB, sm_clock_mhz=1410,
                mem_clock_mhz=1593, power_mw=200_000, power_limit_mw=400_000, temperature_c=45, clock_event_reasons=0)
    m0 = dict(mem_used_bytes=15 * GIB, mem_total_bytes=20 * GIB)
    busy = dict(gpu_util_pct=97, mem_util_pct=61, mem_used_bytes=60 * GIB, mem_total_bytes=80 * GIB,
                sm_clock_mhz=1980, mem_clock_mhz=2619, power_mw=650_000, power_limit_mw=700_000, temperature_c=71,
                pcie_tx_kbps=1_200_000, pcie_rx_kbps=3_400_000, clock_event_reasons=0)
    idle = {**busy, "gpu_util_pct": 12, "mem_util_pct": 3, "sm_clock_mhz": 1410, "power_mw": 150_000,
            "temperature_c": 60, "clock_event_reasons": 1}
    serve = proc(1, SERVE, "serve", CONTAINER, None, None, 14 * GIB)
    batch = proc(1, BATCH, "batch", "", None, None, 5 * GIB)
    return [
        ([device(0, G0, H100, **busy), g1, device(1, M0, MIG, G1, **m0),
          device(1, M1, MIG, G1, mem_used_bytes=0, mem_total_bytes=20 * GIB)],
         [proc(0, TRAIN, "train", CONTAINER, 95, 60, 50 * GIB), proc(0, GONE, "", "", None, None, GIB), serve]),
        ([device(0, G0, H100, xids=(79,), **idle), g1, device(1, M0, MIG, G1, **m0),
          device(1, M1, MIG, G1, mem_used_bytes=5 * GIB, mem_total_bytes=20 * GIB)],
         [proc(0, TRAIN, "train", CONTAINER, None, None, 50 * GIB), serve, batch]),
        ([device(0, G0, H100, **{**idle, "gpu_util_pct": 88}), g1, device(1, M0, MIG, G1, xids=(48,), **m0),
          device(1, M1, MIG, G1, mem_used_bytes=5 * GIB, mem_total_bytes=20 * GIB)],
         [proc(0, TRAIN, "train", CONTAINER, 11, 3, 50 * GIB), proc(0, EVAL, "eval", "", 80, 40, 10 * GIB), serve,
          batch]),
        ([device(0, G0, H100, **{**idle, "gpu_util_pct": 0, "mem_util_pct": 0, "mem_used_bytes": 0}), g1,
          device(1, M0, MIG, G1, **m0), device(1, M1, MIG, G1, mem_used_bytes=5 * GIB, mem_total_bytes=20 * GIB)],
         [serve, batch]),
    ]


def test_every_field_follows_the_scenario(sim_dir, tmp_path):
    scenario = timeline_scenario(tmp_path / "scenario.txt")
    root = fake_proc(tmp_path / "proc", {TRAIN: ("train", CONTAINER), EVAL: ("eval", ""),
                                         SERVE: ("serve", CONTAINER), BATCH: ("batch", "")})
    # 0.9: not due yet (one poll per period); the rest sit half a second inside each segment
    out, log = collect(sim_dir, scenario, [0.5, 0.9, 1.5, 2.5, 3.5], proc_root=str(root))
    assert out["open"] is True and out["simulated"] is True
    assert out["driver"] == "fleetprof simulated driver"
    polls = [p["record"] for p in out["polls"]]
    assert polls[1] is None
    del polls[1]
    for i, (record, (devices, processes)) in enumerate(zip(polls, expected_timeline(), strict=True)):
        assert record["node"] == "node-a" and record["simulated"] is True
        assert record["devices"] == devices, f"poll {i}"
        assert record["processes"] == processes, f"poll {i}"
    assert [p["time_ns"] - polls[0]["time_ns"] for p in polls] == [0, 1_000_000_000, 2_000_000_000, 3_000_000_000]
    assert out["counters"] == {"polls": 4, "overruns": 0, "skipped": 0, "errors": 0}
    assert log == ["INFO NVML collector on: 2 GPU(s), 2 MIG device(s), driver fleetprof simulated driver"]


def test_unsupported_and_lost_leave_fields_empty(sim_dir, tmp_path):
    scenario = write_scenario(tmp_path / "s.txt", [SimDevice("g0", G0, H100, 80 * GIB, None)], [
        # pcie, temperature and clock events never supported; memory used not yet supported
        Segment(0, "g0", {"gpu_util": 50, "mem_util": 20, "sm_clock": 1500, "mem_clock": 2600, "power": 300_000},
                [SimProcess(TRAIN, 40, 10, None)]),
        Segment(1, "g0", lost=True),
        Segment(2, "g0", {"mem_used": GIB}, lost=False),
    ])
    out, log = collect(sim_dir, scenario, [0.5, 1.5, 2.5], proc_root=str(fake_proc(tmp_path / "proc", {
        TRAIN: ("train", "")})))
    values = dict(gpu_util_pct=50, mem_util_pct=20, sm_clock_mhz=1500, mem_clock_mhz=2600, power_mw=300_000)
    first, lost, back = (p["record"] for p in out["polls"])
    assert first["devices"] == [device(0, G0, H100, **values)]
    assert first["processes"] == [proc(0, TRAIN, "train", "", 40, 10, None)]
    assert lost["devices"] == [device(0, G0, H100)]
    assert lost["processes"] == []
    assert back["devices"] == [device(0, G0, H100, **values, mem_used_bytes=GIB, mem_total_bytes=80 * GIB)]
    assert back["processes"] == [proc(0, TRAIN, "train", "", 40, 10, None)]
    assert out["counters"]["errors"] == 0  # "not supported" is an answer, not an error
    assert [line for line in log if "lost" in line] == [
        f"WARNING GPU 0 ({G0}) is lost: its metrics stay empty until it answers again"]


def test_a_hanging_call_is_bounded_and_never_stacks_threads(sim_dir, tmp_path):
    scenario = write_scenario(tmp_path / "s.txt", [SimDevice("g0", G0, H100)], [
        Segment(0, "g0", {"gpu_util": 30, "mem_util": 5}),
        Segment(1, "g0", hang=True),  # calls made from 1 s on return at 4 s
        Segment(4, "g0", {"gpu_util": 70}, hang=False),
    ])
    out, log = collect(sim_dir, scenario, [0.5, 1.5, 2.5, 3.5, 4.5], deadline=0.5)
    records = [p["record"] for p in out["polls"]]
    assert [r is not None for r in records] == [True, False, False, False, True]
    assert records[0]["devices"] == [device(0, G0, H100, gpu_util_pct=30, mem_util_pct=5, power_limit_mw=700_000)]
    assert records[4]["devices"] == [device(0, G0, H100, gpu_util_pct=70, mem_util_pct=5, power_limit_mw=700_000)]
    # the stuck call would have held the poll for 2.5 s: it gave up at its 0.5 s deadline instead
    assert out["polls"][1]["seconds"] < 1.5
    assert max(p["threads"] for p in out["polls"]) == 1
    assert out["counters"] == {"polls": 2, "overruns": 1, "skipped": 2, "errors": 0}
    assert log.count("WARNING an NVML call did not return within 0.5 s; skipping polls until it does") == 1
    assert log.count("WARNING NVML answers again") == 1


@pytest.mark.parametrize("init_error, devices, reason", [
    (9, [SimDevice("g0", G0)], "the NVIDIA driver is not loaded"),
    (None, [], "no NVIDIA GPU on this node"),
])
def test_off_with_one_line(sim_dir, tmp_path, init_error, devices, reason):
    scenario = write_scenario(tmp_path / "s.txt", devices, init_error=init_error)
    out, log = collect(sim_dir, scenario, [0.1, 1.2])
    assert out["open"] is False and out["reason"] == reason
    assert [p["record"] for p in out["polls"]] == [None, None]
    assert log == [f"WARNING NVML collector off: {reason}"]


def test_no_library_means_off_with_one_line(tmp_path):
    if ctypes.util.find_library("nvidia-ml"):
        unavailable("this machine has a real libnvidia-ml.so.1, so NVML cannot be missing here")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", SCENARIO_ENV)}
    env["LD_LIBRARY_PATH"] = str(tmp_path)  # nothing there
    done = subprocess.run([sys.executable, "-c", DRIVER, json.dumps({"node": "n", "at": [0.1]})], cwd=REPO_ROOT,
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["polls"][0]["record"] is None
    assert done.stderr.splitlines() == [
        "WARNING NVML collector off: no NVML library (libnvidia-ml.so.1 not found): no NVIDIA driver on this node"]


def test_a_bad_scenario_says_where(sim_dir, tmp_path):
    scenario = tmp_path / "s.txt"
    scenario.write_text(f"device g0 uuid={G0} memory_total=1 power_limit=1 name=x\nat 0 g9 gpu_util=1\n")
    out, log = collect(sim_dir, scenario, [0.1])
    assert out["open"] is False
    assert log == [f"fleetprof simulated NVML: {scenario.resolve()}:2: unknown device: g9",
                   "WARNING NVML collector off: NVML initialization failed: Unknown Error"]


def test_start_time_in_the_file_and_labels(sim_dir, tmp_path):
    import time

    # time zero ten seconds ago: the segment from 9 s holds now; names and driver get the simulated label
    scenario = write_scenario(tmp_path / "s.txt", [SimDevice("g0", G0, "Tesla T4")], [
        Segment(0, "g0", {"gpu_util": 1, "mem_util": 1}), Segment(9, "g0", {"gpu_util": 9})],
        start_ns=time.time_ns() - 10 * 10**9, driver="550.54.15")
    out, _ = collect(sim_dir, scenario, [0.1])
    assert out["driver"] == "550.54.15 (simulated)"
    assert out["polls"][0]["record"]["devices"] == [
        device(0, G0, "Tesla T4 (simulated)", gpu_util_pct=9, mem_util_pct=1, power_limit_mw=700_000)]


def test_command_line_tool(sim_dir, tmp_path):
    scenario = write_scenario(tmp_path / "s.txt", [SimDevice("g0", G0)], [Segment(0, "g0", {"temp": 33})])
    done = subprocess.run([sys.executable, "-m", "producers.nvml_collector", "--once", "--format", "json",
                           "--node", "n7"], cwd=REPO_ROOT, env=sim_env(scenario), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert (record["node"], record["simulated"], record["processes"]) == ("n7", True, [])
    assert record["devices"] == [device(0, G0, H100, temperature_c=33, power_limit_mw=700_000)]
    done = subprocess.run([sys.executable, "-m", "producers.nvml_collector", "--period", "0.5"], cwd=REPO_ROOT,
                          env=sim_env(scenario), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr == ("error: the NVML poll period must be at least 1 s (the driver's utilization window), "
                           "got 0.5 s\n")


def test_period_below_the_utilization_window_is_refused():
    with pytest.raises(ValueError, match="at least 1 s"):
        NvmlCollector("n", period_s=0.2)


def test_read_process_finds_comm_and_container(tmp_path):
    root = fake_proc(tmp_path, {7: ("trainer", CONTAINER), 8: ("sshd", "")})
    assert read_process(7, str(root)) == ("trainer", CONTAINER)
    assert read_process(8, str(root)) == ("sshd", "")
    assert read_process(9, str(root)) == ("", "")
    assert read_process(os.getpid())[0] == Path("/proc/self/comm").read_text().strip()


def test_scenario_writer_refuses_unknown_fields(tmp_path):
    with pytest.raises(ValueError, match="unknown scenario field 'utilization'"):
        write_scenario(tmp_path / "s.txt", [SimDevice("g0", G0)], [Segment(0, "g0", {"utilization": 5})])


# --- end to end -----------------------------------------------------------------------------------------------------


def test_polls_reach_the_store_exactly(sim_dir, tmp_path, kafka_bootstrap, store):
    node = f"nvml-{uuid.uuid4().hex[:8]}"
    scenario = write_scenario(tmp_path / "s.txt", [SimDevice("g0", G0, H100, 80 * GIB, 700_000)], [
        Segment(0, "g0", {"gpu_util": 95, "mem_util": 50, "mem_used": 70 * GIB, "sm_clock": 1980, "mem_clock": 2619,
                          "power": 640_000, "temp": 70, "pcie_tx": 100, "pcie_rx": 200, "clock_events": 0},
                [SimProcess(TRAIN, 90, 45, 60 * GIB)]),
        Segment(1, "g0", {"gpu_util": 20, "power": 180_000, "clock_events": 0x4}, xids=[63]),
        Segment(2, "g0", {"gpu_util": 0, "temp": None}, []),
    ])
    root = fake_proc(tmp_path / "proc", {TRAIN: ("train", CONTAINER)})
    owner = "0a" * 32  # the container of the pod that holds the GPU (the kubelet's pod-resources says so)
    out, _ = collect(sim_dir, scenario, [0.5, 1.5, 2.5], proc_root=str(root), kafka=kafka_bootstrap, node=node,
                     gpu_pods={G0: owner})
    times = [p["record"]["time_ns"] for p in out["polls"]]
    with sink(store, kafka_bootstrap, f"nvml-{node}") as running:
        def stored() -> int:
            sql = "SELECT count() FROM gpu_device_metrics WHERE node = {n:String}"
            return store.query_sql(sql, {"n": node})[1][0][0]
        wait_for(lambda: stored() == 3, what="three polls stored", running=[running])
    _, devices = store.query_sql(
        "SELECT toUnixTimestamp64Milli(ts), gpu_index, uuid, name, parent_uuid, gpu_util_pct, mem_util_pct, "
        "mem_used_bytes, mem_total_bytes, sm_clock_mhz, mem_clock_mhz, power_mw, power_limit_mw, temperature_c, "
        "pcie_tx_kbps, pcie_rx_kbps, clock_event_reasons, xid_errors, simulated FROM gpu_device_metrics "
        "WHERE node = {n:String} ORDER BY ts", {"n": node})
    ms = [t // 1_000_000 for t in times]
    fixed = [0, G0, H100, ""]
    assert [list(r) for r in devices] == [
        [ms[0], *fixed, 95, 50, 70 * GIB, 80 * GIB, 1980, 2619, 640_000, 700_000, 70, 100, 200, 0, [], True],
        [ms[1], *fixed, 20, 50, 70 * GIB, 80 * GIB, 1980, 2619, 180_000, 700_000, 70, 100, 200, 4, [63], True],
        [ms[2], *fixed, 0, 50, 70 * GIB, 80 * GIB, 1980, 2619, 180_000, 700_000, None, 100, 200, 4, [], True],
    ]
    _, processes = store.query_sql(
        "SELECT toUnixTimestamp64Milli(ts), gpu_index, pid, comm, container_id, sm_util_pct, mem_util_pct, "
        "used_memory_bytes, simulated FROM gpu_process_metrics WHERE node = {n:String} ORDER BY ts", {"n": node})
    assert [list(r) for r in processes] == [
        [ms[0], 0, TRAIN, "train", CONTAINER, 90, 45, 60 * GIB, True],
        [ms[1], 0, TRAIN, "train", CONTAINER, 90, 45, 60 * GIB, True],
    ]
    # a device row's identity is the pod holding the GPU, a process row's its own (the double: from its cgroup)
    from tests.identity_doubles import CgroupIdentities

    gpu_key, train_key = (identity_key(CgroupIdentities.pod(c).identity_id) for c in (owner, CONTAINER))
    _, keys = store.query_sql("SELECT 'device', identity FROM gpu_device_metrics WHERE node = {n:String} UNION ALL "
                              "SELECT 'process', identity FROM gpu_process_metrics WHERE node = {n:String}",
                              {"n": node})
    assert sorted(tuple(r) for r in keys) == [("device", gpu_key)] * 3 + [("process", train_key)] * 2
