"""`fleetprof query flamegraph` exports with context: pprof read back by pprof itself (period, mappings, labels, Python
files and lines, comments), per-process roots and --merge-processes, and the SIMULATED labels."""

from __future__ import annotations

import gzip
import json
import re
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from fleetprof.cli import cli
from fleetprof.pprof import Profile, Sample, pprof_bytes
from tests.pprof_tool import lines, pprof

PY = ["_start", "<module> (/srv/train.py:7)", "Model.forward (/srv/model.py:12)"]
CPU_STACK = ";".join([*PY, "gemm"])
GPU_STACK = ";".join([*PY, "gemm_kernel"])


APP_ID, TORCH_ID = "5f0c" + "a1" * 18, "77be" + "02" * 18  # GNU build ids as the symbolizer stores them


@pytest.fixture
def py_store(store):
    """n1: pid 10 and pid 11, both python3, in Python code down to gemm (5 and 2 samples at 99 Hz), pid 10 also
    launching gemm_kernel (4 ms of GPU time, from the simulated GPU library; GPU rows carry no comm); n2: pid 20
    serve, idle (3 samples, its sampling frequency not stored)."""
    from datetime import UTC, datetime

    now = datetime.now(tz=UTC).replace(microsecond=0)
    since = now - timedelta(hours=1, seconds=now.second % 10)
    frames = [[1, "_start", "app", "NATIVE", since, APP_ID], [2, PY[1], "/srv/train.py", "INTERPRETED", since, ""],
              [3, PY[2], "/srv/model.py", "INTERPRETED", since, ""],
              [4, "gemm", "libtorch.so", "NATIVE", since, TORCH_ID], [5, "idle", "app", "NATIVE", since, APP_ID],
              [6, "gemm_kernel", "[gpu]", "GPU_KERNEL", since, ""]]
    stacks = [[100, [1, 2, 3, 4], since], [101, [1, 5], since], [200, [1, 2, 3, 6], since]]
    at = [since + timedelta(seconds=10 * i) for i in range(3)]
    store.insert("frames", frames, ["frame_id", "function", "binary", "kind", "last_seen", "build_id"])
    store.insert("stacks", stacks, ["stack_id", "frame_ids", "last_seen"])
    store.insert("cpu_samples", [[at[0], "n1", 10, "python3", "", 100, 5], [at[1], "n1", 11, "python3", "", 100, 2],
                                 [at[2], "n2", 20, "serve", "", 101, 3]],
                 ["ts", "node", "pid", "comm", "container_id", "stack_id", "count"])
    store.insert("gpu_kernel_samples", [[at[0], "n1", 10, "", "", 0, 7, 200, "gemm_kernel", 4_000_000, 4]],
                 ["ts", "node", "pid", "comm", "container_id", "device", "stream", "stack_id", "kernel_name",
                  "duration_ns", "launches"])
    store.insert("profile_windows", [[at[0], "n1", "cpu", False, 99], [at[1], "n1", "cpu", False, 99],
                                     [at[0], "n1", "gpu", True, 0]],
                 ["ts", "node", "kind", "simulated", "frequency_hz"])
    return SimpleNamespace(store=store, since=since, until=since + timedelta(seconds=30))


def export(st, tmp_path: Path, fmt: str, *extra: str) -> bytes:
    out = tmp_path / f"flame.{fmt}"
    result = CliRunner().invoke(cli, [
        "--clickhouse", f"chdb://{st.store.location}", "--database", st.store.database,
        "--data-dir", str(tmp_path / "data"), "query", "flamegraph", "--since", st.since.isoformat(),
        "--until", st.until.isoformat(), "--format", fmt, "-o", str(out), *extra])
    assert result.exit_code == 0, result.output
    return out.read_bytes()


def test_pprof_raw_has_period_mappings_labels_and_python_lines(py_store, tmp_path):
    path = tmp_path / "cpu.pb.gz"
    path.write_bytes(export(py_store, tmp_path, "pprof"))
    n1, n2 = 1_000_000_000 // 99, 1_000_000_000 // 19  # ns between two samples at each node's frequency
    assert lines(pprof(path, "-raw")) == [
        "Comment: sampling frequency not stored for node n2: cpu time assumes the agent's default 19 Hz",
        "Comment: nodes sampled at different frequencies: n1 99 Hz, n2 19 Hz; cpu time uses each node's",
        "PeriodType: cpu nanoseconds",
        f"Period: {n1}",  # the frequency most samples were taken at
        f"Time: {py_store.since:%Y-%m-%d %H:%M:%S} +0000 UTC",
        "Duration: 30s",
        "Samples:",
        "samples/count cpu/nanoseconds[dflt]",
        f"          5   {5 * n1}: 4 3 2 1",  # leaf first
        "                comm:[python3] node:[n1] pid:[10]",
        f"          3  {3 * n2}: 5 1",
        "                comm:[serve] node:[n2] pid:[20]",
        f"          2   {2 * n1}: 4 3 2 1",
        "                comm:[python3] node:[n1] pid:[11]",
        "Locations",  # one per (function, binary), each in its binary's mapping; Python frames with file and line
        "     1: 0x0 M=1 _start :0:0 s=0",
        "     2: 0x0 M=2 <module> /srv/train.py:7:0 s=0()",
        "     3: 0x0 M=3 Model.forward /srv/model.py:12:0 s=0()",
        "     4: 0x0 M=4 gemm :0:0 s=0",
        "     5: 0x0 M=1 idle :0:0 s=0",
        "Mappings",  # one per binary with its build id, the first the one stacks start in
        f"1: 0x0/0x0/0x0 app {APP_ID} [FN]",
        "2: 0x0/0x0/0x0 /srv/train.py  [FN]",
        "3: 0x0/0x0/0x0 /srv/model.py  [FN]",
        f"4: 0x0/0x0/0x0 libtorch.so {TORCH_ID} [FN]",
    ]
    # what pprof tools group and filter by (string labels, as Go's own: a bare number would be read as a range)
    focused = pprof(path, "-traces", "-tagfocus", "pid=^11$")
    assert re.findall(r"^ +(\S+)ms +(\S+)$", focused, re.M) == [(f"{2 * n1 / 1e6:.2f}", "gemm")]
    tags = lines(pprof(path, "-tags"))
    assert tags[tags.index(" pid: Total 228.60ms of 228.60ms (  100%)"):] == [
        " pid: Total 228.60ms of 228.60ms (  100%)",
        "      157.89ms (69.07%): 20",
        "       50.51ms (22.09%): 10",
        "       20.20ms ( 8.84%): 11", ""]


def test_pprof_writer_keeps_build_ids_and_one_mapping_per_binary(tmp_path):
    path = tmp_path / "p.pb.gz"
    path.write_bytes(pprof_bytes([Sample(["main", "f", "g"], [3], ["app", "libx.so", "app"], ["b1d", "ff", "b1d"]),
                                  Sample(["main", "g"], [1], ["app", "app"], ["b1d", "b1d"], [("pid", 7)])]))
    raw = lines(pprof(path, "-raw"))
    assert raw[raw.index("Locations"):] == [
        "Locations",
        "     1: 0x0 M=1 main :0:0 s=0",
        "     2: 0x0 M=2 f :0:0 s=0",
        "     3: 0x0 M=1 g :0:0 s=0",
        "Mappings",
        "1: 0x0/0x0/0x0 app b1d [FN]",
        "2: 0x0/0x0/0x0 libx.so ff [FN]",
    ]
    assert raw[raw.index("Samples:"):raw.index("Locations")] == [
        "Samples:", "samples/count", "          3: 3 2 1", "          1: 3 1", "                pid:[7]"]


def test_per_process_roots_and_merge_processes(py_store, tmp_path):
    assert export(py_store, tmp_path, "folded").decode() == (
        f"python3 (pid 10 on n1);{CPU_STACK} 5\n"
        "serve (pid 20 on n2);_start;idle 3\n"
        f"python3 (pid 11 on n1);{CPU_STACK} 2\n")
    # one node: its processes need no node name
    assert export(py_store, tmp_path, "folded", "--node", "n1").decode() == (
        f"python3 (pid 10);{CPU_STACK} 5\n"
        f"python3 (pid 11);{CPU_STACK} 2\n")
    assert export(py_store, tmp_path, "folded", "--merge-processes").decode() == (
        f"{CPU_STACK} 7\n"
        "_start;idle 3\n")
    # GPU rows carry no comm: the process is named by what the CPU sampler saw it run
    assert export(py_store, tmp_path, "folded", "--kind", "gpu", "--node", "n1").decode() == (
        f"python3 (pid 10);{GPU_STACK} 4000000\n")
    assert json.loads(export(py_store, tmp_path, "json", "--pid", "20")) == [
        {"stack": ["serve (pid 20 on n2)", "_start", "idle"], "count": 3}]


def test_pprof_merge_processes_drops_the_labels(py_store, tmp_path):
    prof = Profile()
    prof.ParseFromString(gzip.decompress(export(py_store, tmp_path, "pprof", "--merge-processes")))
    names = {f.id: prof.string_table[f.name] for f in prof.function}
    got = {(";".join(names[i] for i in reversed(s.location_id)), tuple(s.value), len(s.label)) for s in prof.sample}
    n1, n2 = 1_000_000_000 // 99, 1_000_000_000 // 19
    assert got == {(";".join(["_start", "<module>", "Model.forward", "gemm"]), (7, 7 * n1), 0),
                   ("_start;idle", (3, 3 * n2), 0)}


def test_simulated_gpu_data_is_labelled_in_every_format_that_can_say_so(py_store, tmp_path):
    note = "SIMULATED: GPU kernel times from node n1 come from fleetprof's simulated GPU library"
    path = tmp_path / "gpu.pb.gz"
    path.write_bytes(export(py_store, tmp_path, "pprof", "--kind", "gpu"))
    raw = lines(pprof(path, "-raw"))
    assert raw[:3] == [f"Comment: {note}", "PeriodType: gpu_time nanoseconds", "Period: 1"]
    assert raw[raw.index("Samples:") + 1:raw.index("Samples:") + 4] == [
        "gpu_time/nanoseconds[dflt]", "    4000000: 4 3 2 1", "                comm:[python3] node:[n1] pid:[10]"]
    doc = json.loads(export(py_store, tmp_path, "speedscope", "--kind", "gpu"))
    assert doc["name"] == doc["profiles"][0]["name"]
    assert doc["name"].endswith(f" ({note})") and doc["profiles"][0]["unit"] == "nanoseconds"
    page = export(py_store, tmp_path, "html", "--kind", "gpu").decode()
    shown = note.replace("'", "&#x27;")
    assert re.search(rf"<title>fleetprof gpu [^<]* \({re.escape(shown)}\)</title>", page)
    assert f'<div id="banner">{shown}</div>' in page
    # the CPU samples of the same node are real: nothing says otherwise
    cpu = export(py_store, tmp_path, "html")
    assert b"SIMULATED" not in cpu and b"SIMULATED" not in export(py_store, tmp_path, "speedscope")
    path.write_bytes(export(py_store, tmp_path, "pprof"))
    assert not [line for line in lines(pprof(path, "-raw")) if "SIMULATED" in line]
    # once n2's CPU samples are loadgen's, its pprof says so first
    py_store.store.insert("profile_windows", [[py_store.since, "n2", "cpu", True, 0]],
                          ["ts", "node", "kind", "simulated", "frequency_hz"])
    path.write_bytes(export(py_store, tmp_path, "pprof"))
    assert lines(pprof(path, "-raw"))[0] == \
        "Comment: SIMULATED: CPU samples from node n2 come from fleetprof loadgen's simulated fleet"


def test_agent_default_frequency_is_the_agents():
    # profile_kinds keeps its own copy: the query side does not import the agent's collectors (0.3 s at start-up)
    from fleetprof.profile_kinds import AGENT_DEFAULT_HZ
    from producers.collectors import CollectorOptions

    assert CollectorOptions(node="n").frequency_hz == AGENT_DEFAULT_HZ
