"""NCCL kernels in SQL: nccl_kernel_pattern and nccl_kernels read kernel names exactly as fleetprof/collectives.py
reads them (one corpus of names, so the two cannot drift), and gpu_collectives adds up GPU time in collectives per
node and job exactly, on chDB."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from fleetprof.collectives import NCCL_KERNEL, nccl_collective
from tests.nccl_kernel_names import NOT_NCCL, nccl_kernels

COLUMNS = ["ts", "node", "pid", "comm", "container_id", "device", "stream", "stack_id", "kernel_name", "duration_ns",
           "launches"]
ALL_REDUCE = "_Z40ncclDevKernel_AllReduce_Sum_bf16_RING_LL24ncclDevKernelArgsStorageILm4096EE"
ALL_GATHER = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
GENERIC = "_Z23ncclDevKernel_Generic_424ncclDevKernelArgsStorageILm4096EE"
OLD_ALL_REDUCE = "_Z38ncclKernel_AllReduce_RING_LL_Sum_floatP11ncclDevCommmP8ncclWork"


@pytest.fixture(scope="module")
def kernels(module_store) -> SimpleNamespace:
    """module_store with every corpus name (and every other kernel's) run once in one window, 10 ns a launch, and a
    known multi-node job in another:

    n1 pid 10 (no comm on GPU rows; `train` on CPU) container c1: AllReduce bf16 3 ms + 1 ms (two windows, two
        streams; 3 launches), AllGather 2 ms (1), gemm 4 ms (2)
    n1 pid 11 comm eval container c2: NCCL 2.8-2.18 AllReduce float32 1 ms (1), gemm 1 ms (1)
    n2 pid 20 comm serve container '': Generic 5 ms (5), gemm 5 ms (5); and 7 ms of AllReduce after the range
    """
    now = datetime.now(tz=UTC).replace(microsecond=0)
    corpus_at = now - timedelta(hours=2, seconds=now.second % 10)
    names = [name for name, _ in nccl_kernels()] + NOT_NCCL
    module_store.insert("gpu_kernel_samples", [[corpus_at, "n9", 1, "", "", 0, 0, 1, name, 10, 1] for name in names],
                        COLUMNS)
    t0 = now - timedelta(hours=1, seconds=now.second % 10)
    later = t0 + timedelta(seconds=10)
    rows = [[t0, "n1", 10, "", "c1", 0, 1, 200, ALL_REDUCE, 3_000_000, 2],
            [later, "n1", 10, "", "c1", 0, 2, 201, ALL_REDUCE, 1_000_000, 1],
            [t0, "n1", 10, "", "c1", 0, 1, 202, ALL_GATHER, 2_000_000, 1],
            [t0, "n1", 10, "", "c1", 0, 0, 203, "ampere_sgemm_128x64_nn", 4_000_000, 2],
            [t0, "n1", 11, "eval", "c2", 1, 0, 204, OLD_ALL_REDUCE, 1_000_000, 1],
            [t0, "n1", 11, "eval", "c2", 1, 0, 205, "ampere_sgemm_128x64_nn", 1_000_000, 1],
            [t0, "n2", 20, "serve", "", 0, 0, 206, GENERIC, 5_000_000, 5],
            [t0, "n2", 20, "serve", "", 0, 0, 207, "ampere_sgemm_128x64_nn", 5_000_000, 5],
            [t0 + timedelta(seconds=60), "n2", 20, "serve", "", 0, 0, 206, ALL_REDUCE, 7_000_000, 7]]
    module_store.insert("gpu_kernel_samples", rows, COLUMNS)
    module_store.insert("cpu_samples", [[t0, "n1", 10, "train", "", 300, 4], [t0, "n1", 10, "python3", "", 301, 1]],
                        ["ts", "node", "pid", "comm", "container_id", "stack_id", "count"])
    return SimpleNamespace(store=module_store, corpus=(corpus_at, corpus_at + timedelta(seconds=1)),
                           job=(t0, t0 + timedelta(seconds=30)))


def test_the_sql_pattern_is_the_modules(kernels):
    _, rows = kernels.store.query_named("nccl_kernel_pattern", {})
    assert rows == [(NCCL_KERNEL.pattern,)]


def test_sql_reads_every_kernel_name_as_the_module_does(kernels):
    since, until = kernels.corpus
    columns, rows = kernels.store.query_named("nccl_kernels", {"since": since, "until": until})
    assert columns == ["kernel_name", "kernel", "collective", "op", "dtype", "algorithm", "protocol", "gpu_ns",
                       "launches"]
    in_sql = {row[0]: tuple(row[1:7]) for row in rows}
    names = [name for name, _ in nccl_kernels()] + NOT_NCCL
    in_python = {name: (c.kernel, c.collective, c.op, c.dtype, c.algorithm, c.protocol)
                 for name in names if (c := nccl_collective(name))}
    assert in_sql == in_python
    assert len(in_sql) == len(nccl_kernels())  # every NCCL name, none of the others
    assert {(row[7], row[8]) for row in rows} == {(10, 1)}


def test_gpu_time_in_collectives_per_node_and_job(kernels):
    since, until = kernels.job
    columns, rows = kernels.store.query_named("gpu_collectives", {"since": since, "until": until})
    assert columns == ["node", "pid", "comm", "container_id", "collective", "dtype", "gpu_ns", "launches", "share"]
    # n1 ran 12 ms of kernels, n2 10 ms; pid 10's comm comes from the CPU sampler (the busiest command)
    assert rows == [("n2", 20, "serve", "", "", "", 5_000_000, 5, 0.5),
                    ("n1", 10, "train", "c1", "AllReduce", "bfloat16", 4_000_000, 3, 4 / 12),
                    ("n1", 10, "train", "c1", "AllGather", "", 2_000_000, 1, 2 / 12),
                    ("n1", 11, "eval", "c2", "AllReduce", "float32", 1_000_000, 1, 1 / 12)]
    _, n1 = kernels.store.query_named("gpu_collectives", {"since": since, "until": until, "node": "n1"})
    assert n1 == rows[1:]
    _, classes = kernels.store.query_named("nccl_kernels", {"since": since, "until": until})
    assert [(r[0], r[2], r[7], r[8]) for r in classes] == [(GENERIC, "", 5_000_000, 5),
                                                           (ALL_REDUCE, "AllReduce", 4_000_000, 3),
                                                           (ALL_GATHER, "AllGather", 2_000_000, 1),
                                                           (OLD_ALL_REDUCE, "AllReduce", 1_000_000, 1)]


@pytest.mark.parametrize(("collectives", "n1_ns", "n2_ns"), [("all", 12_000_000, 10_000_000),
                                                             ("hide", 5_000_000, 5_000_000),
                                                             ("only", 7_000_000, 5_000_000)])
def test_gpu_totals_hide_or_isolate_collectives(kernels, collectives, n1_ns, n2_ns):
    since, until = kernels.job
    _, rows = kernels.store.query_named("totals_gpu", {"since": since, "until": until, "collectives": collectives})
    assert [(node, ns) for node, ns, _ in rows] == [("n1", n1_ns), ("n2", n2_ns)]
