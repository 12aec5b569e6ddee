-- GPU depth: NVTX range paths on GPU time, memory copies and sets with their bytes, and the sampled records one by one
-- for the timeline.
--
-- nvtx_range: the launching thread's innermost NVTX range path (' > ' between ranges, '' outside any), a key column of
-- gpu_kernel_samples and its hourly rollup, so time per `forward` / `backward` / `optimizer.step` sums like any other
-- key. A column added to the end of the sorting key in the same ALTER as the column itself changes metadata only (no
-- part is rewritten); existing rows read ''. The hourly view is recreated with the column: apply this migration
-- while no sink writes (fleetprof applies migrations before it starts one), as for 0010.
--
-- Copies and sets are rows of gpu_kernel_samples too (their GPU time, kernel_name the label '[memcpy HtoD]',
-- '[memset]'), so every GPU flame graph and top list shows them; their bytes cannot sum there (the engine's summed
-- columns are fixed at creation), so gpu_copy_samples keeps time and bytes of the same rows with the copy's memory
-- kinds.
ALTER TABLE gpu_kernel_samples
    ADD COLUMN IF NOT EXISTS nvtx_range LowCardinality(String) CODEC(ZSTD(1)),
    MODIFY ORDER BY (node, ts, pid, comm, container_id, device, stream, stack_id, kernel_name, nvtx_range);

ALTER TABLE gpu_kernel_samples_1h
    ADD COLUMN IF NOT EXISTS nvtx_range LowCardinality(String) CODEC(ZSTD(1)),
    MODIFY ORDER BY (node, hour, pid, comm, container_id, device, stream, stack_id, kernel_name, nvtx_range);

DROP VIEW IF EXISTS gpu_kernel_samples_1h_mv;

CREATE MATERIALIZED VIEW IF NOT EXISTS gpu_kernel_samples_1h_mv TO gpu_kernel_samples_1h AS
SELECT toStartOfHour(ts, 'UTC') AS hour, node, pid, comm, container_id, device, stream, stack_id, kernel_name,
       nvtx_range, sum(duration_ns) AS duration_ns, sum(launches) AS launches
FROM gpu_kernel_samples
GROUP BY hour, node, pid, comm, container_id, device, stream, stack_id, kernel_name, nvtx_range;

-- Memory copies and sets per (window, process, device, stream, launching stack, copy, memory kinds, range): GPU time,
-- bytes (both x the launch's weight) and launches. kernel_name is the label as in gpu_kernel_samples (the stack's
-- leaf); memory_kinds 'pinned>device' and the like. Engine, partitions, TTL, deduplication window and codecs as
-- gpu_kernel_samples (0004).
-- Cluster: sharded by stack_id like gpu_kernel_samples (0004), whose rows these are.
-- @cluster sharded by stack_id
CREATE TABLE IF NOT EXISTS gpu_copy_samples
(
    ts           DateTime               CODEC(DoubleDelta, ZSTD(1)),
    node         LowCardinality(String) CODEC(ZSTD(1)),
    pid          UInt32                 CODEC(T64, ZSTD(1)),
    comm         LowCardinality(String) CODEC(ZSTD(1)),
    container_id LowCardinality(String) CODEC(ZSTD(1)),
    device       UInt16                 CODEC(T64, ZSTD(1)),
    stream       UInt32                 CODEC(T64, ZSTD(1)),
    stack_id     UInt64                 CODEC(ZSTD(1)),
    kernel_name  LowCardinality(String) CODEC(ZSTD(1)),
    memory_kinds LowCardinality(String) CODEC(ZSTD(1)),
    nvtx_range   LowCardinality(String) CODEC(ZSTD(1)),
    duration_ns  UInt64                 CODEC(T64, ZSTD(1)),
    bytes        UInt64                 CODEC(T64, ZSTD(1)),
    launches     UInt64                 CODEC(T64, ZSTD(1))
)
ENGINE = SummingMergeTree((duration_ns, bytes, launches))
PARTITION BY toDate(ts)
ORDER BY (node, ts, pid, comm, container_id, device, stream, stack_id, kernel_name, memory_kinds, nvtx_range)
TTL ts + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

-- The timeline: every sampled kernel, copy and set the correlator matched, one row each, at its own start and end
-- (Unix ns), with the weight it stands for, the stack_id of the sample it is summed into, its NVTX range and graph.
-- Rows are as many as matched records (the sampled launches', and each kernel a sampled graph launch replayed), so the
-- TTL is short: the timeline is for the last days; the sums stay in gpu_kernel_samples for 30.
-- Engine: MergeTree ordered for a time range of one node's GPUs and streams; the sink's insert_deduplication_token
-- (its deduplication window) makes a re-inserted batch a no-op, as in the sample tables.
-- Cluster: sharded by node: one node's timeline is read together.
-- @cluster sharded by cityHash64(node)
CREATE TABLE IF NOT EXISTS gpu_timeline
(
    ts            DateTime               CODEC(DoubleDelta, ZSTD(1)),
    node          LowCardinality(String) CODEC(ZSTD(1)),
    pid           UInt32                 CODEC(T64, ZSTD(1)),
    comm          LowCardinality(String) CODEC(ZSTD(1)),
    device        UInt16                 CODEC(T64, ZSTD(1)),
    stream        UInt32                 CODEC(T64, ZSTD(1)),
    start_ns      UInt64                 CODEC(Delta, ZSTD(1)),
    end_ns        UInt64                 CODEC(Delta, ZSTD(1)),
    activity      Enum8('KERNEL' = 1, 'MEMCPY' = 2, 'MEMSET' = 3) CODEC(ZSTD(1)),
    name          LowCardinality(String) CODEC(ZSTD(1)),
    stack_id      UInt64                 CODEC(ZSTD(1)),
    weight        UInt32                 CODEC(T64, ZSTD(1)),
    bytes         UInt64                 CODEC(T64, ZSTD(1)),
    nvtx_range    LowCardinality(String) CODEC(ZSTD(1)),
    graph_id      UInt32                 CODEC(T64, ZSTD(1)),
    graph_node_id UInt64                 CODEC(ZSTD(1)),
    correlation_id UInt32                CODEC(T64, ZSTD(1))
)
ENGINE = MergeTree
PARTITION BY toDate(ts)
ORDER BY (node, device, stream, start_ns)
TTL ts + INTERVAL 7 DAY
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;
