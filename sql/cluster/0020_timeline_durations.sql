-- Generated from sql/migrations/0020_timeline_durations.sql by `python -m fleetprof.cluster_sql`: do not edit.
-- The migration says why the columns, codecs, keys, partitions, TTL and settings are what they are;
-- sql/cluster/README.md says how a cluster differs from one node.
--
-- Cluster: this file rebuilds tables, whose deduplication logs start empty: a sink batch left unfinished would be
-- stored twice once a sink writes it again (fleetprof/rebuild_guard.py). So it stops here while one is unfinished:
-- start the sink of the version that began it (it finishes the batch by itself), stop the sinks, run the file again;
-- or, accepting those rows twice, run it from the next statement.
SELECT throwIf(count() > 0, 'fleetprof: a sink batch is unfinished, which this rebuild would store twice: see above')
           AS unfinished_sink_batches
FROM
(
    SELECT
        topic,
        partition,
        argMax(min_offset, updated) AS min_offset,
        argMax(max_offset, updated) AS max_offset,
        argMax(state, updated) AS state,
        max(updated) AS stamp
    FROM sink_state
    WHERE empty([]) OR topic IN []
    GROUP BY topic, partition
)
WHERE state = 'BEFORE';

-- Cluster: copied through the Distributed tables (the same sharding key), the local tables exchanged on every node.
DROP TABLE IF EXISTS gpu_timeline_0020 ON CLUSTER '{cluster}' SYNC;

DROP TABLE IF EXISTS gpu_timeline_0020_local ON CLUSTER '{cluster}' SYNC;

-- Cluster: its replication path carries the table's UUID, as 0019's copies.
CREATE TABLE IF NOT EXISTS gpu_timeline_0020_local ON CLUSTER '{cluster}'
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
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{uuid}/{shard}', '{replica}')
PARTITION BY toDate(ts)
ORDER BY (node, device, stream, start_ns)
TTL ts + INTERVAL 7 DAY
SETTINGS replicated_deduplication_window = 10000, ttl_only_drop_parts = 1, merge_selector_base = 20;

CREATE TABLE IF NOT EXISTS gpu_timeline_0020 ON CLUSTER '{cluster}'
(
    ts             DateTime,
    node           LowCardinality(String),
    pid            UInt32,
    comm           LowCardinality(String),
    device         UInt16,
    stream         UInt32,
    start_ns       UInt64,
    duration_ns    UInt64,
    end_ns         UInt64                 ALIAS start_ns + duration_ns,
    activity       Enum8('KERNEL' = 1, 'MEMCPY' = 2, 'MEMSET' = 3),
    name           LowCardinality(String),
    stack_id       UInt64,
    weight         UInt32,
    bytes          UInt64,
    nvtx_range     LowCardinality(String),
    graph_id       UInt32,
    graph_node_id  UInt64,
    correlation_id UInt32,
    identity       LowCardinality(String)
)
ENGINE = Distributed('{cluster}', currentDatabase(), gpu_timeline_0020_local, cityHash64(node));

INSERT INTO gpu_timeline_0020 (ts, node, pid, comm, device, stream, start_ns, duration_ns, activity, name, stack_id,
                               weight, bytes, nvtx_range, graph_id, graph_node_id, correlation_id, identity)
SELECT ts, node, pid, comm, device, stream, start_ns, end_ns - start_ns, activity, name, stack_id, weight, bytes,
       nvtx_range, graph_id, graph_node_id, correlation_id, identity
FROM gpu_timeline
SETTINGS insert_deduplicate = 0, distributed_foreground_insert = 1;

EXCHANGE TABLES gpu_timeline_local AND gpu_timeline_0020_local ON CLUSTER '{cluster}';

CREATE OR REPLACE TABLE gpu_timeline ON CLUSTER '{cluster}'
(
    ts             DateTime,
    node           LowCardinality(String),
    pid            UInt32,
    comm           LowCardinality(String),
    device         UInt16,
    stream         UInt32,
    start_ns       UInt64,
    duration_ns    UInt64,
    end_ns         UInt64                 ALIAS start_ns + duration_ns,
    activity       Enum8('KERNEL' = 1, 'MEMCPY' = 2, 'MEMSET' = 3),
    name           LowCardinality(String),
    stack_id       UInt64,
    weight         UInt32,
    bytes          UInt64,
    nvtx_range     LowCardinality(String),
    graph_id       UInt32,
    graph_node_id  UInt64,
    correlation_id UInt32,
    identity       LowCardinality(String)
)
ENGINE = Distributed('{cluster}', currentDatabase(), gpu_timeline_local, cityHash64(node));

DROP TABLE IF EXISTS gpu_timeline_0020 ON CLUSTER '{cluster}' SYNC;

DROP TABLE IF EXISTS gpu_timeline_0020_local ON CLUSTER '{cluster}' SYNC;

INSERT INTO schema_migrations (version, name, applied_at) VALUES (20, '0020_timeline_durations', now());
