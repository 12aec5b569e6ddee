-- The timeline (0014) stores each record's duration instead of its end: end_ns becomes an ALIAS, start_ns +
-- duration_ns, so every reader of end_ns gets what it got.
--
-- Rows run in start order per GPU stream, so Delta leaves start_ns the gap to the previous sampled record (~29 bits,
-- what it is); end_ns under Delta carried the same gap again. A duration is only as long as the kernel or copy ran
-- (microseconds to milliseconds): bench/storage_day.py's store, 191,370 records, end_ns 4.16 bytes per row under
-- Delta, duration_ns 2.09 under T64 (bench/RESULTS.md), the timeline 14.2 -> ~12.1 bytes per record. UInt64 like
-- end_ns: a kernel may run longer than a UInt32 of ns (4.3 s) holds, T64 drops the unused high bytes anyway.
-- The sink writes duration_ns (an ALIAS column takes no inserts): upgrade every sink with this migration.
--
-- How: a rebuild as in 0019 (a copy filled from the table, EXCHANGE TABLES, the old one dropped), safe to run again
-- from any statement; apply it while no sink writes and after every sink finished its batch (the copy starts with an
-- empty deduplication log). No view reads the timeline.
-- Cluster: copied through the Distributed tables (the same sharding key), the local tables exchanged on every node.
DROP TABLE IF EXISTS gpu_timeline_0020 SYNC;

-- @cluster sharded by cityHash64(node)
-- Cluster: its replication path carries the table's UUID, as 0019's copies.
CREATE TABLE IF NOT EXISTS gpu_timeline_0020
(
    ts             DateTime               CODEC(DoubleDelta, ZSTD(1)),
    node           LowCardinality(String) CODEC(ZSTD(1)),
    pid            UInt32                 CODEC(T64, ZSTD(1)),
    comm           LowCardinality(String) CODEC(ZSTD(1)),
    device         UInt16                 CODEC(T64, ZSTD(1)),
    stream         UInt32                 CODEC(T64, ZSTD(1)),
    start_ns       UInt64                 CODEC(Delta, ZSTD(1)),
    duration_ns    UInt64                 CODEC(T64, ZSTD(1)),
    end_ns         UInt64                 ALIAS start_ns + duration_ns,
    activity       Enum8('KERNEL' = 1, 'MEMCPY' = 2, 'MEMSET' = 3) CODEC(ZSTD(1)),
    name           LowCardinality(String) CODEC(ZSTD(1)),
    stack_id       UInt64                 CODEC(ZSTD(1)),
    weight         UInt32                 CODEC(T64, ZSTD(1)),
    bytes          UInt64                 CODEC(T64, ZSTD(1)),
    nvtx_range     LowCardinality(String) CODEC(ZSTD(1)),
    graph_id       UInt32                 CODEC(T64, ZSTD(1)),
    graph_node_id  UInt64                 CODEC(ZSTD(1)),
    correlation_id UInt32                 CODEC(T64, ZSTD(1)),
    identity       LowCardinality(String) CODEC(ZSTD(1))
)
ENGINE = MergeTree
PARTITION BY toDate(ts)
ORDER BY (node, device, stream, start_ns)
TTL ts + INTERVAL 7 DAY
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1, merge_selector_base = 20;

INSERT INTO gpu_timeline_0020 (ts, node, pid, comm, device, stream, start_ns, duration_ns, activity, name, stack_id,
                               weight, bytes, nvtx_range, graph_id, graph_node_id, correlation_id, identity)
SELECT ts, node, pid, comm, device, stream, start_ns, end_ns - start_ns, activity, name, stack_id, weight, bytes,
       nvtx_range, graph_id, graph_node_id, correlation_id, identity
FROM gpu_timeline
SETTINGS insert_deduplicate = 0, distributed_foreground_insert = 1;

EXCHANGE TABLES gpu_timeline AND gpu_timeline_0020;

DROP TABLE IF EXISTS gpu_timeline_0020 SYNC;
