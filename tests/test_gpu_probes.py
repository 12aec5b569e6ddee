"""The GPU probe collector against real processes that fire the fleetprof USDT probes: small C emitters emitters here
with gcc from native/include/fleetprof_probes.h (a shared library called from a PIE executable, and an -O0 non-PIE
executable whose probe arguments live in memory). BPF tests need root, bcc and kernel headers: skipped with the
reason without them, a failure on CI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from processors.symbol_tables import table_from_chunks
from producers.agent import Records
from producers.elf_symbols import read_build_id
from producers.gpu_probes import COUNTERS, GpuProbeCollector
from producers.gpu_records import (
    KERNEL_FIELDS,
    KERNEL_HEADER,
    LAUNCH_FIELDS,
    LAUNCH_HEADER,
    MAX_STACK,
    NATIVE_STACK,
    RANGE_FIELDS,
    RANGE_HEADER,
    RANGE_PATH_MAX,
)
from producers.kafka_link import KafkaLink
from producers.kernel_records import KERNEL_NAME_MAX, UNREADABLE_NAME
from producers.outbox import Outbox
from producers.outbox_encoder import OutboxEncoder
from producers.publisher import Publisher
from schemas.single_object import decode
from tests.pipeline_helpers import read_topic
from tests.probe_emitters import (
    Procs,
    _boot_ns,
    _chain,
    _check_launches,
    _collector,
    _drain,
    _kernels,
    _launches,
    _tables,
    attached_to,
    fresh,
    own_gpusim,
)


@pytest.fixture(scope="module")
def loaded(bpf_ok: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GpuProbeCollector]:
    """One started collector, compiled once, for the tests that need no program of their own: each takes it through
    fresh(). The tests of a ring of one page and of what close() does start their own."""
    c = _collector(Procs(tmp_path_factory.mktemp("proc")))
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def collector(loaded: GpuProbeCollector, procs: Procs) -> GpuProbeCollector:
    """`loaded`, as fresh as a collector just started on this test's processes."""
    return fresh(loaded, procs)


def test_record_layouts_match_the_bpf_structs(collector: GpuProbeCollector) -> None:
    c = collector
    for table, header, names in ((b"launch_scratch", LAUNCH_HEADER, LAUNCH_FIELDS),
                                 (b"kernel_scratch", KERNEL_HEADER, KERNEL_FIELDS),
                                 (b"range_scratch", RANGE_HEADER, RANGE_FIELDS)):
        leaf = c._bpf[table].Leaf._type_  # per-CPU: an array of the struct
        fields = [f[0] for f in leaf._fields_][:len(names)]
        assert fields == list(names)
        offsets = [getattr(leaf, n).offset for n in names]
        sizes = [getattr(leaf, n).size for n in names]
        assert [o + s for o, s in zip(offsets, sizes, strict=True)][-1] == header.size
        assert offsets == [header.size - sum(sizes[i:]) for i in range(len(names))]  # packed in this order
    launch, kernel, ranges = (dict(c._bpf[t].Leaf._type_._fields_)
                              for t in (b"launch_scratch", b"kernel_scratch", b"range_scratch"))
    assert launch["stack"]._length_ == MAX_STACK
    assert kernel["name"]._length_ == KERNEL_NAME_MAX + 2  # one more than kept, and the NUL
    assert ranges["path"]._length_ == RANGE_PATH_MAX
    assert c._bpf[b"sites"].Leaf._fields_[0][1]._length_ == 9  # memory_executed's nine arguments
    assert len(c._bpf[b"counters"]) == len(COUNTERS)


def test_launches_and_kernels_are_seen_once_with_exact_values(emitters: dict[str, Path], procs: Procs,
                                                              bpf_ok: None) -> None:
    c = _collector(procs)
    try:
        before_boot = _boot_ns()
        e = procs.start(emitters["emitter"])  # started after the collector
        assert e.semaphores() == (0, 0, 0)
        assert c.rescan() == [str(emitters["libfpemit.so"])]
        assert c.attached() == {str(emitters["libfpemit.so"]): ["kernel_executed", "kernel_launch", "launch_weight"]}
        assert e.semaphores() == (1, 1, 1)  # raised by the kernel: nothing wrote to the process
        t0 = time.time_ns()
        e.cmd("launch 20 100")
        e.cmd("kernel 10 100")
        t1 = time.time_ns()
        launches, kernels = _drain(c, {e.pid}, 20, 10)
        _check_launches(launches, e, _launches(20, 100))
        assert all(t0 <= r["time_ns"] <= t1 for r in launches)
        assert len({r["process_start_ns"] for r in launches + kernels}) == 1
        start = launches[0]["process_start_ns"]
        tick = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
        assert before_boot - tick <= start <= _boot_ns()
        assert sorted((k["start_ns"], k["end_ns"], k["correlation_id"], k["device_id"], k["stream_id"],
                       k["kernel_name"]) for k in kernels) == _kernels(10, 100)
        assert {k["pid"] for k in kernels} == {e.pid} and not any(k["simulated"] for k in kernels)

        e.cmd("launch 2 200")  # same window: no mappings again
        more, _ = _drain(c, {e.pid}, 2, 0)
        assert [r["mappings"] for r in more] == [[], []]
        c.end_window(None)
        e.cmd("launch 2 300")
        more, _ = _drain(c, {e.pid}, 2, 0)
        assert [r["mappings"] != [] for r in sorted(more, key=lambda r: r["correlation_id"])] == [True, False]
        counts = c.counters()
        assert counts["lost_launches"] == counts["lost_kernels"] == counts["weights_unused"] == 0
        assert counts["stacks_missing"] == counts["names_truncated"] == counts["records_malformed"] == 0
    finally:
        c.close()
    assert e.semaphores() == (0, 0, 0)  # detached: the kernel lowered them again


def test_later_processes_are_covered_and_memory_arguments_read(emitters: dict[str, Path], procs: Procs,
                                                              collector: GpuProbeCollector) -> None:
    c = collector
    procs.start(emitters["emitter"])
    assert c.rescan() == [str(emitters["libfpemit.so"])]
    o0 = procs.start(emitters["emitter_o0"])  # not attached until the next rescan: its probes stay off
    second = procs.start(emitters["emitter"])  # maps the attached library: covered without a rescan
    assert o0.semaphores() == (0, 0, 0) and second.semaphores() == (1, 1, 1)
    o0.cmd("launch 3 10")
    second.cmd("launch 3 20")
    second.cmd("kernel 2 20")
    launches, kernels = _drain(c, {second.pid, o0.pid}, 3, 2)  # o0 fired too: unseen
    _check_launches(launches, second, _launches(3, 20))
    assert len(kernels) == 2 and {k["pid"] for k in kernels} == {second.pid}

    assert c.rescan() == [str(emitters["emitter_o0"])]  # within one rescan
    o0.cmd("launch 6 30")
    o0.cmd("kernel 3 30")
    launches, kernels = _drain(c, {o0.pid}, 6, 3)
    _check_launches(launches, o0, _launches(6, 30))
    assert sorted((k["start_ns"], k["end_ns"], k["correlation_id"], k["device_id"], k["stream_id"],
                   k["kernel_name"]) for k in kernels) == _kernels(3, 30)


def test_deep_stacks_are_walked_whole_up_to_the_bound(emitters: dict[str, Path], procs: Procs,
                                                     collector: GpuProbeCollector) -> None:
    c = collector
    e = procs.start(emitters["emitter"])
    c.rescan()
    e.cmd("deep 60 1")  # 61 frames of ~230 bytes: the walk crosses several stack pages
    e.cmd("deep 200 2")  # more frames than the bound
    launches, _ = _drain(c, {e.pid}, 2, 0)
    by_corr = {r["correlation_id"]: r for r in launches}
    assert sorted(by_corr) == [1, 2]
    mappings = next(r["mappings"] for r in launches if r["mappings"])
    tables = _tables(mappings)
    chain = _chain(by_corr[1], mappings, tables)
    assert chain[-63:] == ["main"] + ["deep"] * 61 + ["emit_launch"]
    assert len(by_corr[2]["user_addrs"]) == NATIVE_STACK  # the innermost frames, leaf first, and the mark
    assert _chain(by_corr[2], mappings, tables) == ["[truncated]"] + ["deep"] * (NATIVE_STACK - 2) + ["emit_launch"]
    assert c.counters()["stacks_missing"] == 0


def test_kernel_names_are_bounded_and_cuts_counted(emitters: dict[str, Path], procs: Procs,
                                                   collector: GpuProbeCollector) -> None:
    c = collector
    e = procs.start(emitters["emitter"])
    c.rescan()
    for n in (KERNEL_NAME_MAX - 1, KERNEL_NAME_MAX, KERNEL_NAME_MAX + 1, 5000):
        e.cmd(f"name {n}")
    _, kernels = _drain(c, {e.pid}, 0, 4)
    assert sorted((k["correlation_id"], len(k["kernel_name"])) for k in kernels) == [
        (KERNEL_NAME_MAX - 1, KERNEL_NAME_MAX - 1), (KERNEL_NAME_MAX, KERNEL_NAME_MAX),
        (KERNEL_NAME_MAX + 1, KERNEL_NAME_MAX), (5000, KERNEL_NAME_MAX)]
    assert all(set(k["kernel_name"]) == {"k"} for k in kernels)
    assert c.counters()["names_truncated"] == 2


def test_bad_probe_arguments_are_counted_not_fatal(emitters: dict[str, Path], procs: Procs,
                                                   collector: GpuProbeCollector) -> None:
    c = collector
    e = procs.start(emitters["emitter"])
    c.rescan()
    e.cmd("bad")
    launches, kernels = _drain(c, {e.pid}, 1, 1)
    assert [(r["api_name"], r["weight"]) for r in launches] == [("", 1)]
    assert [(k["kernel_name"], k["correlation_id"], k["stream_id"]) for k in kernels] == [
        (UNREADABLE_NAME, 5, 7)]
    counts = c.counters()
    assert (counts["api_names_unreadable"], counts["weights_invalid"], counts["names_unreadable"]) == (1, 1, 1)


def test_names_in_untouched_pages_are_read_from_the_process_and_bad_times_dead_lettered(
        emitters: dict[str, Path], procs: Procs, collector: GpuProbeCollector) -> None:
    c = collector
    e = procs.start(emitters["emitter"])
    c.rescan()
    now = time.time_ns()
    for command in ("untouched", "gone", f"times {now} {now + 5000}", "times 1000 2000",
                    f"times {now} {now - 1}", f"times {now + 2 * 86_400 * 10**9} {now + 2 * 86_400 * 10**9 + 1}",
                    f"times {now - 2 * 86_400 * 10**9} {now}"):
        e.cmd(command)
    _, kernels = _drain(c, {e.pid}, 0, 3)
    t0 = 1_700_000_000_000_000_000  # the emitter's T0
    assert sorted((k["correlation_id"], k["kernel_name"], k["start_ns"], k["end_ns"]) for k in kernels) == [
        (41, "kernel_in_an_untouched_page", t0 + 10, t0 + 20), (42, UNREADABLE_NAME, t0 + 30, t0 + 40),
        (43, "kernel_with_these_times", now, now + 5000)]
    counts = c.counters()
    assert (counts["names_read_from_process"], counts["names_unreadable"], counts["kernel_times_implausible"]) \
        == (1, 1, 4), counts
    letters = c.take_dead_letters()
    assert [d["source_topic"] for d in letters] == ["gpu.kernels"] * 4
    assert all(d["stage"] == "agent" and d["key"] == f"{c.node}/{e.pid}".encode() for d in letters)
    assert [decode(d["value"])[1]["kernel_name"] for d in letters] == ["kernel_with_these_times"] * 4
    assert len(letters) == 4 and any("before 2000-01-01" in d["reason"] for d in letters) \
        and any("is before start_ns" in d["reason"] for d in letters) \
        and any("more than a day after now" in d["reason"] for d in letters) \
        and any("over a day" in d["reason"] for d in letters), [d["reason"] for d in letters]
    assert c.take_dead_letters() == []


def test_ring_buffer_overflow_is_counted_exactly(emitters: dict[str, Path], procs: Procs,
                                                 bpf_ok: None) -> None:
    c = _collector(procs, ring_pages=1)  # one page: a few dozen launch records
    try:
        e = procs.start(emitters["emitter"])
        c.rescan()
        e.cmd("launch 500 0")
        launches, _ = _drain(c, {e.pid}, 500, 0, timeout=1)
        lost = c.counters()["lost_launches"]
        assert lost > 0 and len(launches) + lost == 500
        assert len({r["correlation_id"] for r in launches}) == len(launches)
    finally:
        c.close()


def test_a_poll_reads_at_most_its_budget_and_leaves_the_rest(emitters: dict[str, Path], procs: Procs,
                                                              loaded: GpuProbeCollector) -> None:
    c = fresh(loaded, procs, max_pending=5)
    e = procs.start(emitters["emitter"])
    c.rescan()
    e.cmd("launch 12 0")
    sizes = [len(c.poll(0)[0]) for _ in range(4)]
    assert sizes == [5, 5, 2, 0]
    assert c.counters()["polls_cut"] == 2 and c.counters()["lost_launches"] == 0


def test_objects_without_slots_and_unmapped_objects(emitters: dict[str, Path], procs: Procs,
                                                    loaded: GpuProbeCollector) -> None:
    small = fresh(loaded, procs, max_sites=2)  # the library has three probe sites
    lib_user = procs.start(emitters["emitter"])
    assert small.rescan() == [] and small.attached() == {}
    assert small.counters()["objects_without_slots"] == 1
    assert small.rescan() == [] and small.counters()["objects_without_slots"] == 1  # not tried every second
    lib_user.close()
    c = fresh(loaded, procs, idle_scans=1, full_scan_every=1)
    o0 = procs.start(emitters["emitter_o0"])
    assert c.rescan() == [str(emitters["emitter_o0"])]
    o0.close()  # the object is mapped nowhere now
    c.rescan()
    assert list(c.attached()) == [str(emitters["emitter_o0"])]  # one idle rescan is allowed
    c.rescan()
    assert c.attached() == {} and c.counters()["objects_detached"] == 1
    again = procs.start(emitters["emitter_o0"])  # its slots were freed: it attaches again
    assert c.rescan() == [str(emitters["emitter_o0"])]
    again.cmd("launch 2 40")
    launches, _ = _drain(c, {again.pid}, 2, 0)
    assert sorted(r["correlation_id"] for r in launches) == [40, 41]


def test_records_reach_the_broker_keyed_node_and_pid_after_their_symbols(
        kafka_bootstrap: str, emitters: dict[str, Path], procs: Procs, loaded: GpuProbeCollector) -> None:
    node = f"gpu-{uuid.uuid4().hex[:8]}"
    c = fresh(loaded, procs, node)
    e = procs.start(emitters["emitter"])
    c.rescan()
    e.cmd("launch 6 50")
    e.cmd("kernel 4 50")
    e.cmd("times 1000 2000")  # not Unix ns: a dead letter
    launches, kernels = _drain(c, {e.pid}, 6, 4)
    letters = c.take_dead_letters()
    assert len(launches) == 6 and len(kernels) == 4 and len(letters) == 1
    config = {"bootstrap.servers": kafka_bootstrap}
    link = KafkaLink(config, ["symbols", "gpu.launches", "gpu.kernels", "deadletter"])
    link.start()
    try:
        assert link.wait_ready(30), link.reason
        box = Outbox(Publisher(config), link, OutboxEncoder(), 64 << 20)
        box.put(Records("gpu_launches", launches))
        box.put(Records("gpu_kernels", kernels))
        box.put(Records("dead_letters", letters))
        assert box.drain(30) and box.sent["gpu_launches"].records == 6 and box.sent["gpu_kernels"].records == 4
        assert box.sent["dead_letters"].records == 1
        assert box.sent["symbols"].units == 1  # the tables of the launching binaries, ahead of the launches
    finally:
        link.stop()
    key = f"{node}/{e.pid}".encode()
    got_l = read_topic(kafka_bootstrap, "gpu.launches", lambda m: m.key() == key, 6)
    got_k = read_topic(kafka_bootstrap, "gpu.kernels", lambda m: m.key() == key, 4)
    dec_l = sorted((decode(m.value(), "GpuLaunch")[1] for m in got_l), key=lambda r: r["correlation_id"])
    dec_k = sorted((decode(m.value(), "GpuKernel")[1] for m in got_k), key=lambda r: r["correlation_id"])
    assert dec_l == sorted(launches, key=lambda r: r["correlation_id"])
    assert dec_k == sorted(kernels, key=lambda r: r["correlation_id"])
    assert len({m.partition() for m in got_l + got_k}) == 1  # one process: one partition, in order
    dead = decode(read_topic(kafka_bootstrap, "deadletter", lambda m: m.key() == key, 1)[0].value(), "DeadLetter")[1]
    assert (dead["stage"], dead["source_topic"], decode(dead["value"], "GpuKernel")[1]["start_ns"]) == (
        "agent", "gpu.kernels", 1000) and "before 2000-01-01" in dead["reason"]

    # the tables the symbolizer needs were published, and they name the call chains
    mappings = next(r["mappings"] for r in dec_l if r["mappings"])
    lib_id, exe_id = read_build_id(emitters["libfpemit.so"]), read_build_id(emitters["emitter"])
    assert {lib_id, exe_id} <= {m["build_id"] for m in mappings}
    tables = {}
    for bid in (lib_id, exe_id):
        chunks = read_topic(kafka_bootstrap, "symbols", lambda m, b=bid: m.key().decode().startswith(b + "/"), 1)
        tables[bid] = table_from_chunks([decode(m.value(), "SymbolChunk")[1] for m in chunks])
    callers = {x[0]: x[4] for x in _launches(6, 50)}
    for r in dec_l:
        assert _chain(r, mappings, tables)[-3:] == ["main", callers[r["correlation_id"]], "emit_launch"]


def test_simulated_workload_every_sampled_launch_and_fired_kernel_once(procs: Procs, tmp_path: Path,
                                                                         loaded: GpuProbeCollector) -> None:
    """The GPU simulator and its workload (simulate/gpu_workload.py): the records match the simulator's
    own counts exactly, weights add up to the launches they stand for, and native launches symbolize to the C path
    the simulator names."""
    # the workload loads the simulator of this test's own (FLEETPROF_NATIVE_BUILD)
    env = dict(os.environ, FLEETPROF_NATIVE_BUILD=str(tmp_path / "native"), FLEETPROF_LAUNCH_RATE="40")
    lib = own_gpusim(tmp_path / "native")
    # attached before the workload starts: every launch it makes is decided with all three probes on
    with attached_to(procs, lib, shared=loaded) as c:
        work = subprocess.Popen([sys.executable, "-m", "simulate.gpu_workload", "--seconds", "3",
                                 "--launches-per-s", "400"], stdout=subprocess.PIPE, text=True, env=env)
        launches, kernels = [], []
        while work.poll() is None:
            more_l, more_k = c.poll(100)
            launches += [r for r in more_l if r["pid"] == work.pid]
            kernels += [r for r in more_k if r["pid"] == work.pid]
        report = json.loads(work.stdout.read())
        launches2, kernels2 = _drain(c, {work.pid}, 0, 0)
        launches += launches2
        kernels += kernels2
        counts = c.counters()
    stats = report["simulator"]
    assert stats["launches_decided"] == stats["launches"]  # nothing was launched before the probes were on
    assert len(launches) == stats["launches_sampled"] > 0
    assert sum(r["weight"] for r in launches) == stats["weight_sum"]  # less skips pending at exit
    assert len(kernels) == stats["kernels_fired"]
    assert counts["lost_launches"] == counts["lost_kernels"] == counts["stacks_missing"] == 0
    assert all(r["simulated"] for r in launches + kernels)
    assert {(r["api_name"], r["callback_id"]) for r in launches} == {("gpusimLaunchKernel (simulated)", 211)}
    assert {k["kernel_name"] for k in kernels} <= set(report["by_kernel"])
    name_of = {k["correlation_id"]: k["kernel_name"] for k in kernels}
    assert len(name_of) == len(kernels) and {r["correlation_id"] for r in launches} <= set(name_of)

    native = {x["kernel"]: x["path"].split(";")[-3:] for x in report["launched"] if "gpusim_native" in x["path"]}
    mappings = next(r["mappings"] for r in launches if r["mappings"])
    tables = _tables(mappings)
    checked = 0
    for r in launches:
        path = native.get(name_of[r["correlation_id"]])
        if path is not None:
            chain = _chain(r, mappings, tables)
            at = chain.index(path[0])
            assert chain[at:at + 3] == path, chain
            checked += 1
    assert checked > 0


def test_stale_uprobe_events_of_dead_agents_are_removed_and_live_ones_kept(tmp_path) -> None:
    from producers.gpu_probes import remove_stale_events

    dead = 2**22 + 12345  # above any pid_max default: never a live process
    events = tmp_path / "uprobe_events"
    events.write_text(f"p:uprobes/fleetprof_{dead}_3_182e_bcc_{dead} /lib/x.so:0x182e\n"
                      f"p:uprobes/fleetprof_{os.getpid()}_0_1c47_bcc_1 /lib/x.so:0x1c47\n"
                      "p:uprobes/other_tool_1 /lib/y.so:0x10\n")
    assert remove_stale_events((events,)) == 1
    assert events.read_text().splitlines()[-1] == f"-:uprobes/fleetprof_{dead}_3_182e_bcc_{dead}"
