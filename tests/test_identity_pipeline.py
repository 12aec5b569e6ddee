"""Workload identities end to end on the real broker, the real processors and chDB: the agent's encoder and outbox
send CPU batches, GPU launches and NVML polls with identity ids and the identity definitions before them; the
symbolizer, the correlator and the sink carry the ids into every sample table's `identity` column and the
definitions into workload_identities; a definition whose unit the outbox dropped goes again; records of agents before
identities store ''."""

from __future__ import annotations

import time

from producers.identity_refs import gpu_identity, process_identity
from producers.kafka_link import READY, KafkaLink
from producers.outbox import Outbox
from producers.outbox_encoder import OutboxEncoder
from producers.outbox_units import Unit
from producers.process_info import ProcessInfo
from producers.publisher import Publisher
from schemas import single_object, topics
from schemas.wire import identity_key
from tests.identity_doubles import CgroupIdentities
from tests.pipeline_helpers import cpu_batch, produce, stack, symbolizer, wait_for
from tests.test_correlate import GEMM
from tests.test_correlate_copies import copy
from tests.test_gpu_pipeline import SECOND, SGEMM, Run

CID = "c0" * 32
AWAY = {"bootstrap.servers": "127.0.0.1:1"}
WANTED = [t.name for t in (topics.SYMBOLS, topics.IDENTITIES, topics.CPU_STACKS, topics.GPU_LAUNCHES,
                           topics.GPU_KERNELS, topics.GPU_METRICS)]


def _poll(node: str, t: int, device_identity: int, process_identity_: int) -> dict:
    dev = {"index": 0, "uuid": "GPU-e2e", "name": "H100 (simulated)", "parent_uuid": "", "gpu_util_pct": 10,
           "mem_util_pct": 1, "mem_used_bytes": 1, "mem_total_bytes": 2, "sm_clock_mhz": 1, "mem_clock_mhz": 1,
           "power_mw": 1, "power_limit_mw": 2, "temperature_c": 30, "pcie_tx_kbps": 0, "pcie_rx_kbps": 0,
           "clock_event_reasons": 0, "xid_errors": [], "identity_id": device_identity}
    proc = {"device_index": 0, "pid": 9, "comm": "srun", "container_id": "", "sm_util_pct": 5, "mem_util_pct": 1,
            "used_memory_bytes": 3, "identity_id": process_identity_}
    return {"node": node, "time_ns": t, "simulated": True, "devices": [dev], "processes": [proc]}


def _rows(store, sql: str, node: str) -> set[tuple]:
    return {tuple(r) for r in store.query_sql(sql, {"node": node})[1]}


def test_identities_reach_every_table_and_a_dropped_definition_is_sent_again(kafka_bootstrap, store):
    run = Run(kafka_bootstrap, store)
    run.send_symbols()
    node = run.node
    ids = CgroupIdentities(node, gpu_pods={"GPU-e2e": CID}, simulated=True)
    pod = process_identity(ids, ProcessInfo(7, "train", "", f"/kubepods/podx/{CID}", CID))
    host = process_identity(ids, ProcessInfo(8, "sshd", "", "/system.slice/ssh.service", ""))
    slurm = process_identity(ids, ProcessInfo(9, "srun", "", "/system.slice/slurmstepd.scope/job_42/step_0", ""))
    pod_key, host_key, slurm_key = identity_key(pod), identity_key(host), identity_key(slurm)
    encoder = OutboxEncoder(identities=ids, read_chunks=lambda path, limit: [])  # tables: sent by the test

    t0 = (time.time_ns() // (10 * SECOND) - 30) * 10 * SECOND
    batch = cpu_batch(node, run.build_id, t0, [stack(["main", "run"], 3)], pid=7, identity_id=pod)
    # Kafka away, the bound small: the first window's units, then a larger one; the table unit and the batch that
    # needs it are dropped, and the encoder forgets the pod's definition
    away = Outbox(Publisher(AWAY), KafkaLink(AWAY, WANTED), encoder, max_bytes=2_000)
    away.add(encoder.units("cpu", [batch]))
    away.add([Unit("gpu_kernels", [("t", "k", bytes(1_950), 1)])])
    assert away.dropped["symbols"].units == 1 and away.dropped["cpu"].records == 3
    assert encoder.sent_identities == {}

    config = {"bootstrap.servers": kafka_bootstrap}
    link = KafkaLink(config, WANTED)
    link.state = READY
    box = Outbox(Publisher(config), link, encoder, 64 << 20)
    procs = [dict(batch["processes"][0], pid=pid, identity_id=ident) for pid, ident in ((7, pod), (8, host),
                                                                                        (9, slurm))]
    box.add(encoder.units("cpu", [dict(batch, processes=procs)]))
    launches = [run.launch(1, t0 + 1_000, ["main", "run"], 2, pid=7) | {"identity_id": pod},
                run.launch(2, t0 + 2_000, ["main", "run"], 1, pid=7, maps=False) | {"identity_id": pod}]
    box.add(encoder.units("gpu_launches", launches))
    box.add(encoder.units("gpu_kernels", [run.kernel(1, t0 + 5_000, 10_000, pid=7),
                                           copy(2, t0 + 6_000, 500, 4096, node=node, pid=7)]))
    box.add(encoder.units("gpu_metrics", [_poll(node, t0 + 1_000_000, gpu_identity(ids, "GPU-e2e"), slurm)]))
    assert box.drain(60) and box.unsendable == {k: 0 for k in box.unsendable}
    assert box.sent["symbols"].records == 3  # the pod's definition again, the host's and the Slurm job's, once each

    # agents before identities: a v2 batch, a v3 launch and a v1 poll carry none
    old_batch = cpu_batch(node, run.build_id, t0, [stack(["main", "run"], 4)], pid=10)
    del old_batch["processes"][0]["identity_id"]
    old_launch = run.launch(3, t0 + 3_000, ["main", "run"], 1, pid=10)
    produce(kafka_bootstrap, [
        (topics.CPU_STACKS.name, node, single_object.encode("CpuStackBatch", old_batch, version=2)),
        (topics.GPU_LAUNCHES.name, f"{node}/10", single_object.encode("GpuLaunch", old_launch, version=3)),
        (topics.GPU_KERNELS.name, f"{node}/10", single_object.encode("GpuKernel", run.kernel(3, t0 + 7_000, 2_000,
                                                                                              SGEMM, pid=10))),
        (topics.GPU_METRICS.name, node, single_object.encode("GpuMetrics", _poll(node, t0 + 2_000_000, 0, 0),
                                                             version=1))])

    with symbolizer(kafka_bootstrap, f"sym-{run.id}") as sym, run.correlator() as corr, \
            run.sink() as snk:
        want_cpu = {(7, pod_key, 3), (8, host_key, 3), (9, slurm_key, 3), (10, "", 4)}
        cpu_sql = "SELECT pid, identity, sum(count) FROM cpu_samples WHERE node = {node:String} GROUP BY pid, identity"
        wait_for(lambda: _rows(store, cpu_sql, node) == want_cpu, what="CPU samples by identity",
                 running=[sym, snk])
        gpu_sql = ("SELECT pid, identity, kernel_name, sum(duration_ns) FROM gpu_kernel_samples "
                   "WHERE node = {node:String} GROUP BY pid, identity, kernel_name")
        want_gpu = {(7, pod_key, GEMM, 20_000), (7, pod_key, "[memcpy HtoD]", 500),
                    (10, "", SGEMM, 2_000)}
        wait_for(lambda: _rows(store, gpu_sql, node) == want_gpu, what="GPU samples by identity",
                 running=[corr, snk])
        id_sql = ("SELECT identity, kind, pod_name, namespace, labels['team'], slurm_job_id, slurm_step, team, "
                  "simulated FROM workload_identities FINAL WHERE node = {node:String}")
        want_ids = {(pod_key, "pod", f"pod-{CID[:6]}", "ml", "vision", "", "", "vision", True),
                    (host_key, "host", "", "", "", "", "", "", True),
                    (slurm_key, "slurm", "", "", "", "42", "0", "physics", True)}
        # an old definition (the double's time is 2025's) is written as of now: it outlives the store's TTL
        wait_for(lambda: _rows(store, id_sql, node) == want_ids, what="the identity definitions", running=[snk])
        metric_sql = ("SELECT toUnixTimestamp64Milli(ts), identity FROM gpu_device_metrics "
                      "WHERE node = {node:String}")
        wait_for(lambda: len(_rows(store, metric_sql, node)) == 2, what="the NVML polls", running=[snk])
        time.sleep(1.0)  # anything extra (a duplicate) would show up by now
        assert _rows(store, cpu_sql, node) == want_cpu and _rows(store, gpu_sql, node) == want_gpu

    ms = t0 // 1_000_000
    assert _rows(store, metric_sql, node) == {(ms + 1, pod_key), (ms + 2, "")}  # the pod that holds the GPU
    assert _rows(store, "SELECT pid, identity FROM gpu_process_metrics WHERE node = {node:String}", node) == {
        (9, slurm_key), (9, "")}
    assert _rows(store, "SELECT pid, identity, bytes FROM gpu_copy_samples WHERE node = {node:String}", node) == {
        (7, pod_key, 4096)}
    assert _rows(store, "SELECT pid, identity, count() FROM gpu_timeline WHERE node = {node:String} "
                        "GROUP BY pid, identity", node) == {(7, pod_key, 2), (10, "", 1)}
    # each definition was written once (the pod's only by its second unit)
    got = _rows(store, "SELECT count() FROM workload_identities WHERE node = {node:String}", node)
    assert got == {(3,)}
