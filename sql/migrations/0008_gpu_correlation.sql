-- The correlator's results: GPU kernel frames, and the records it could not pair.
--
-- frames.kind gains GPU_KERNEL, the leaf of every GPU stack (the kernel the CPU stack launched). Appending a value to
-- an Enum8 changes metadata only: existing parts are not rewritten, and running the statement again changes nothing.
--
-- Cluster: frames is one replicated table on every node (0002), so the ALTER runs once, without ON CLUSTER: a
-- replicated table's ALTER goes through Keeper to every replica.
ALTER TABLE frames
    MODIFY COLUMN kind Enum8('NATIVE' = 1, 'KERNEL' = 2, 'INTERPRETED' = 3, 'UNKNOWN' = 4, 'GPU_KERNEL' = 5)
    CODEC(ZSTD(1));

-- Launches whose kernel never came and kernels whose launch was never seen, counted per (window, process, side,
-- reason) by the correlator: GPU time that could not be attributed stays visible instead of vanishing.
-- side LAUNCH carries the launches' weights (their kernels' durations are unknown), side KERNEL the kernels' own
-- durations (their weights are unknown). Reasons: EXPIRED (waited past the horizon), LATE (arrived past it), EVICTED
-- (the pending state was full), SUPERSEDED (another record took its key: a duplicate, a reused pid).
--
-- Engine, partitions, TTL, deduplication window and codecs as gpu_kernel_samples (0004): partial counts of one key
-- sum, and the sink's insert_deduplication_token makes a re-inserted batch a no-op.
--
-- Cluster: sharded by node like the NVML tables (0005): the counts of one node's processes; every row of one sorting
-- key (it starts with node) lands on one shard and sums there.
-- @cluster sharded by cityHash64(node)
CREATE TABLE IF NOT EXISTS gpu_unmatched
(
    ts          DateTime                                                        CODEC(DoubleDelta, ZSTD(1)),
    node        LowCardinality(String)                                          CODEC(ZSTD(1)),
    pid         UInt32                                                          CODEC(T64, ZSTD(1)),
    side        Enum8('LAUNCH' = 1, 'KERNEL' = 2)                               CODEC(ZSTD(1)),
    reason      Enum8('EXPIRED' = 1, 'LATE' = 2, 'EVICTED' = 3, 'SUPERSEDED' = 4) CODEC(ZSTD(1)),
    events      UInt64                                                          CODEC(T64, ZSTD(1)),
    duration_ns UInt64                                                          CODEC(T64, ZSTD(1)),
    launches    UInt64                                                          CODEC(T64, ZSTD(1))
)
ENGINE = SummingMergeTree((events, duration_ns, launches))
PARTITION BY toDate(ts)
ORDER BY (node, ts, pid, side, reason)
TTL ts + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;
