"""sink rows of GpuSamples v3 (issue 16): copies and sets in gpu_kernel_samples and gpu_copy_samples, NVTX range
paths, the timeline's records one by one; v2 records still store; a re-inserted batch counts once in each table."""

from __future__ import annotations

import time

from processors.messages import Message
from processors.process_ids import process_id
from processors.sink import gpu_samples_rows, rows_for

# a window start, Unix ns: an hour ago, inside the tables' TTL (older rows are dropped on insert)
T = (int(time.time()) // 10 * 10 - 3600) * 10**9 + 123_456_789
TS = T // 10**9  # DateTime: seconds since 1970


def sample(kernel: str, stack: int, ns: int, launches: int, **more) -> dict:
    return {"pid": 7, "comm": "train", "container_id": "k", "device": 1, "stream": 13, "stack_id": stack,
            "kernel_name": kernel, "duration_ns": ns, "launches": launches, **more}


def v3_record() -> dict:
    samples = [
        sample("gemm", 5, 6000, 3, nvtx_range="step > forward"),
        sample("[memcpy HtoD]", -5, 800, 2, nvtx_range="step > forward", bytes=4096, memory_kinds="pinned>device"),
        sample("[memset]", 6, 100, 1, bytes=512, memory_kinds="device"),
        {**sample("gemm", 5, 10, 1), "pid": 8, "comm": ""},
    ]
    timeline = [
        {"pid": 7, "device": 1, "stream": 13, "start_ns": T + 5, "end_ns": T + 2005, "activity": "KERNEL",
         "name": "gemm", "stack_id": 5, "weight": 3, "bytes": 0, "nvtx_range": "step > forward", "graph_id": 2,
         "graph_node_id": -1, "correlation_id": 99},
        {"pid": 7, "device": 1, "stream": 13, "start_ns": T + 1_000_000_000, "end_ns": T + 1_000_000_400,
         "activity": "MEMCPY", "name": "[memcpy HtoD]", "stack_id": -5, "weight": 2, "bytes": 2048,
         "nvtx_range": "step > forward", "graph_id": 0, "graph_node_id": 0, "correlation_id": 100},
        {"pid": 8, "device": 0, "stream": 7, "start_ns": T, "end_ns": T + 10, "activity": "KERNEL", "name": "gemm",
         "stack_id": 5, "weight": 1, "bytes": 0, "nvtx_range": "", "graph_id": 0, "graph_node_id": 0,
         "correlation_id": 1},
    ]
    return {"node": "n1", "window_start_ns": T, "window_ns": 10**10, "frames": [], "stacks": [],
            "samples": samples, "unmatched": [], "timeline": timeline, "simulated": True}


def test_v3_samples_copies_and_timeline_rows():
    rows = gpu_samples_rows(v3_record())
    train, unnamed = process_id("train", "k", ""), process_id("", "k", "")  # migration 0025: ids, names apart
    assert rows["gpu_kernel_samples"].as_rows() == [
        [TS, "n1", 7, train, 1, 13, 5, "gemm", 6000, 3, "step > forward"],
        [TS, "n1", 7, train, 1, 13, 2**64 - 5, "[memcpy HtoD]", 800, 2, "step > forward"],
        [TS, "n1", 7, train, 1, 13, 6, "[memset]", 100, 1, ""],
        [TS, "n1", 8, unnamed, 1, 13, 5, "gemm", 10, 1, ""]]
    assert rows["process_names"].rows == [[train, "train", "k", "", TS], [unnamed, "", "k", "", TS]]
    copies = rows["gpu_copy_samples"]
    assert copies.columns[-6:] == ["memory_kinds", "nvtx_range", "duration_ns", "bytes", "launches", "identity"]
    assert copies.as_rows() == [
        [TS, "n1", 7, "train", "k", 1, 13, 2**64 - 5, "[memcpy HtoD]", "pinned>device", "step > forward", 800, 4096, 2,
         ""],
        [TS, "n1", 7, "train", "k", 1, 13, 6, "[memset]", "device", "", 100, 512, 1, ""]]
    later = TS + 1
    # comm from the record's samples of the pid (pid 8's say none); ts: the record's own start second
    assert rows["gpu_timeline"].as_rows() == [
        [TS, "n1", 7, "train", 1, 13, T + 5, 2000, "KERNEL", "gemm", 5, 3, 0, "step > forward", 2, 2**64 - 1, 99, ""],
        [later, "n1", 7, "train", 1, 13, T + 10**9, 400, "MEMCPY", "[memcpy HtoD]", 2**64 - 5, 2, 2048,
         "step > forward", 0, 0, 100, ""],
        [TS, "n1", 8, "", 0, 7, T, 10, "KERNEL", "gemm", 5, 1, 0, "", 0, 0, 1, ""]]
    assert rows["gpu_timeline"].columns[6:8] == ["start_ns", "duration_ns"]  # end_ns is the table's ALIAS (0020)


def test_v2_records_store_without_range_copies_or_timeline():
    rec = v3_record()
    rec["samples"] = [{k: v for k, v in s.items() if k not in ("nvtx_range", "bytes", "memory_kinds")}
                      for s in rec["samples"]]
    del rec["timeline"]
    rows = gpu_samples_rows(rec)
    assert [r[-1] for r in rows["gpu_kernel_samples"].as_rows()] == ["", "", "", ""]  # nvtx_range
    assert [r[-6:-1] for r in rows["gpu_copy_samples"].as_rows()] == [["", "", 800, 0, 2], ["", "", 100, 0, 1]]
    assert rows["gpu_timeline"].as_rows() == []


def write(store, rows: dict, token: str) -> None:
    for table in ("process_names", "gpu_kernel_samples", "gpu_copy_samples", "gpu_timeline"):
        store.insert(table, rows[table].as_rows(), rows[table].columns, dedup_token=f"{token}:{table}")


def test_v3_rows_insert_and_a_re_inserted_batch_counts_once(store):
    rows = rows_for([Message("gpu.samples", 0, 4, None, "fleetprof.GpuSamples", v3_record())])
    write(store, rows, "gpu.samples:0:4-4")
    write(store, rows, "gpu.samples:0:4-4")  # the sink's retry after a crash: the same tokens
    _, kernels = store.query_sql("SELECT kernel_name, nvtx_range, sum(duration_ns), sum(launches) "
                                 "FROM gpu_kernel_samples GROUP BY ALL ORDER BY ALL", {})
    assert kernels == [("[memcpy HtoD]", "step > forward", 800, 2), ("[memset]", "", 100, 1),
                       ("gemm", "", 10, 1), ("gemm", "step > forward", 6000, 3)]
    _, copies = store.query_sql("SELECT kernel_name, memory_kinds, nvtx_range, sum(duration_ns), sum(bytes), "
                                "sum(launches) FROM gpu_copy_samples GROUP BY ALL ORDER BY ALL", {})
    assert copies == [("[memcpy HtoD]", "pinned>device", "step > forward", 800, 4096, 2),
                      ("[memset]", "device", "", 100, 512, 1)]
    _, timeline = store.query_sql("SELECT pid, comm, activity, name, start_ns, end_ns, weight, bytes, graph_node_id "
                                  "FROM gpu_timeline ORDER BY start_ns, pid", {})
    assert timeline == [(8, "", "KERNEL", "gemm", T, T + 10, 1, 0, 0),
                        (7, "train", "KERNEL", "gemm", T + 5, T + 2005, 3, 0, 2**64 - 1),
                        (7, "train", "MEMCPY", "[memcpy HtoD]", T + 10**9, T + 10**9 + 400, 2, 2048, 0)]
    _, hourly = store.query_sql("SELECT nvtx_range, sum(duration_ns) FROM gpu_kernel_samples_1h "
                                "GROUP BY ALL ORDER BY ALL", {})
    assert hourly == [("", 110), ("step > forward", 6800)]


class Crash(BaseException):
    """Stands for the sink's process dying at that exact point."""


class StoreDyingBeforeAfter:
    """The real store, except that the sink 'dies' once the node's timeline rows went in, before AFTER is recorded."""

    def __init__(self, store, node: str) -> None:
        self.store = store
        self.node = node
        self.timeline_inserts = 0

    def insert(self, table, rows, column_names, dedup_token=None, column_oriented=False):
        if table == "sink_state" and rows[0][4] == "AFTER" and self.timeline_inserts:
            raise Crash()
        self.store.insert(table, rows, column_names, dedup_token=dedup_token, column_oriented=column_oriented)
        # this test's node: the topic also holds other tests' records, which a new group reads first
        if table == "gpu_timeline":
            at = list(column_names).index("node")
            if self.node in (rows[at] if column_oriented else [r[at] for r in rows]):
                self.timeline_inserts += 1

    def __getattr__(self, name):
        return getattr(self.store, name)


def test_a_sink_dying_after_its_insert_stores_v3_rows_once(kafka_bootstrap, store):
    import threading
    import uuid

    from processors.store_writer import StoreRunner
    from tests.pipeline_helpers import Running, encode, produce, sink, wait_for

    run = uuid.uuid4().hex[:8]
    node = f"eos-gpu-{run}"
    records = [dict(v3_record(), node=node, window_start_ns=T + i * 10**10) for i in range(3)]
    produce(kafka_bootstrap, [("gpu.samples", node, encode("GpuSamples", rec)) for rec in records])

    def counts() -> tuple:
        sql = ("SELECT (SELECT sum(duration_ns) FROM gpu_kernel_samples WHERE node = {n:String}), "
               "(SELECT sum(bytes) FROM gpu_copy_samples WHERE node = {n:String}), "
               "(SELECT count() FROM gpu_timeline WHERE node = {n:String})")
        return tuple(int(v or 0) for v in store.query_sql(sql, {"n": node})[1][0])

    stop = threading.Event()
    dying = Running(StoreRunner(StoreDyingBeforeAfter(store, node), {"bootstrap.servers": kafka_bootstrap},
                                group=f"sink-{run}", stop=stop, flush_interval=0.3), stop)
    with dying:
        wait_for(lambda: dying.error is not None, what="the sink to die")
    assert isinstance(dying.error, Crash) and counts() != (0, 0, 0)  # the rows did go in before the 'crash'
    want = (3 * 6910, 3 * 4608, 3 * 3)
    with sink(store, kafka_bootstrap, f"sink-{run}") as snk:
        wait_for(lambda: counts() == want, what="exact totals", running=[snk])
        time.sleep(1.5)
        assert counts() == want
