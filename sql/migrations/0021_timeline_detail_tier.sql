-- The timeline joins the detail tier: its per-record rows live 6 hours, as the 1 s NVML readings do (0016), and the
-- 30-day history of the same GPU work is the per-window sums in gpu_kernel_samples (and its hourly rollup).
--
-- Why: the timeline holds one row per sampled kernel, copy and set (16 a second per node at the fleet bench's load),
-- ~12 bytes each after 0020, which is 1.30 bytes per CPU sample over a day: more than cpu_samples and
-- gpu_kernel_samples together, and over a 7-day TTL the largest table of a fleet's store (bench/storage_day.py).
-- It is read bar by bar over at most 5 minutes (the web UI's timeline), for "what ran on this GPU just now";
-- the flame graphs, kernel tops, cost report and alerts read the window tables, which keep their 30 days.
-- The web UI says when a range is older than this TTL (fleetprof/webui/timeline.py, DETAIL_KEEP_S: keep equal).
--
-- Partitions: an hour each, so the TTL drops whole parts (ttl_only_drop_parts) once an hour's last record is 6 h
-- old: records live 6 to 7 hours, and nothing is rewritten to expire them. Daily partitions would need TTL merges
-- that rewrite a day's part each time its oldest hour expires (~6 rewrites per record over 6 h, ~0.27 us each on
-- this project's VM: 0.17 us per stored CPU sample of background merges). A 5-minute read prunes to one or two.
-- merge_with_ttl_timeout: look for expired parts hourly (the default is 4 hours).
--
-- How: a rebuild as in 0020 (a copy filled from the table, EXCHANGE TABLES, the old one dropped), safe to run again
-- from any statement; apply it while no sink writes and after every sink finished its batch (the copy starts with an
-- empty deduplication log). Only the records inside the new TTL are copied. No view reads the timeline.
-- Cluster: copied through the Distributed tables (the same sharding key), the local tables exchanged on every node.
DROP TABLE IF EXISTS gpu_timeline_0021 SYNC;

-- @cluster sharded by cityHash64(node)
-- Cluster: its replication path carries the table's UUID, as 0020's copy.
CREATE TABLE IF NOT EXISTS gpu_timeline_0021
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
PARTITION BY toStartOfHour(ts)
ORDER BY (node, device, stream, start_ns)
TTL ts + INTERVAL 6 HOUR
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1, merge_with_ttl_timeout = 3600,
         merge_selector_base = 20;

INSERT INTO gpu_timeline_0021 (ts, node, pid, comm, device, stream, start_ns, duration_ns, activity, name, stack_id,
                               weight, bytes, nvtx_range, graph_id, graph_node_id, correlation_id, identity)
SELECT ts, node, pid, comm, device, stream, start_ns, duration_ns, activity, name, stack_id, weight, bytes,
       nvtx_range, graph_id, graph_node_id, correlation_id, identity
FROM gpu_timeline
WHERE ts > now() - INTERVAL 6 HOUR
SETTINGS insert_deduplicate = 0, distributed_foreground_insert = 1;

EXCHANGE TABLES gpu_timeline AND gpu_timeline_0021;

DROP TABLE IF EXISTS gpu_timeline_0021 SYNC;
