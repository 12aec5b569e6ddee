-- GPU kernel time, attributed to the CPU stack that launched each kernel: one row per (window, process, device,
-- stream, launching stack, kernel), pre-aggregated by the correlator.
--
-- Engine: SummingMergeTree((duration_ns, launches)) for the same reason as cpu_samples: partial aggregates of one key
-- merge into their sum, and queries sum() because merges happen whenever they happen. Same daily partitions, 30-day
-- TTL dropping whole parts, and deduplication window for the sink's insert_deduplication_token.
--
-- Codecs: as in cpu_samples; device and stream are small integers (T64); duration_ns and launches are counters
-- (T64 then ZSTD); kernel_name is a mangled C++ name from a small set per workload, so LowCardinality + ZSTD(1).
--
-- Cluster: sharded by the launching stack's stack_id, like cpu_samples (0003), so a GPU stack's rows and its
-- definition (0002) share a shard; all rows of one sorting key land on one shard and sum there, and a re-inserted
-- batch is dropped shard by shard as in cpu_samples.
-- @cluster sharded by stack_id
CREATE TABLE IF NOT EXISTS gpu_kernel_samples
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
    duration_ns  UInt64                 CODEC(T64, ZSTD(1)),
    launches     UInt64                 CODEC(T64, ZSTD(1))
)
ENGINE = SummingMergeTree((duration_ns, launches))
PARTITION BY toDate(ts)
ORDER BY (node, ts, pid, comm, container_id, device, stream, stack_id, kernel_name)
TTL ts + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;
