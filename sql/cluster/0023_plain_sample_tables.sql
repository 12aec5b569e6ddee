-- Generated from sql/migrations/0023_plain_sample_tables.sql by `python -m fleetprof.cluster_sql`: do not edit.
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

-- Cluster: ATTACH PARTITION ... FROM is not replicated safely ON CLUSTER (each replica would attach its own parts), so
-- the cluster form copies the rows through the Distributed tables, as 0019's did.
DROP VIEW IF EXISTS cpu_samples_1h_mv ON CLUSTER '{cluster}';

DROP TABLE IF EXISTS cpu_samples_0023 ON CLUSTER '{cluster}' SYNC;

DROP TABLE IF EXISTS cpu_samples_0023_local ON CLUSTER '{cluster}' SYNC;

-- Cluster: its replication path carries the table's UUID, not its name: the exchange below gives the live table
-- this name's path, and a run of this file again makes a new copy under the same name.
CREATE TABLE IF NOT EXISTS cpu_samples_0023_local ON CLUSTER '{cluster}'
(
    ts           DateTime               CODEC(Delta, ZSTD(1)),
    node         LowCardinality(String) CODEC(ZSTD(1)),
    pid          UInt32                 CODEC(T64, ZSTD(1)),
    comm         LowCardinality(String) CODEC(ZSTD(1)),
    container_id LowCardinality(String) CODEC(ZSTD(1)),
    stack_id     UInt64                 CODEC(ZSTD(1)),
    count        UInt64                 CODEC(T64, ZSTD(1)),
    identity     LowCardinality(String) CODEC(ZSTD(1))
)
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{uuid}/{shard}', '{replica}')
PARTITION BY toDate(ts)
ORDER BY (node, toStartOfHour(ts), pid, stack_id, comm, container_id, identity, ts)
TTL ts + INTERVAL 30 DAY
SETTINGS replicated_deduplication_window = 10000, ttl_only_drop_parts = 1, merge_selector_base = 20;

CREATE TABLE IF NOT EXISTS cpu_samples_0023 ON CLUSTER '{cluster}'
(
    ts           DateTime,
    node         LowCardinality(String),
    pid          UInt32,
    comm         LowCardinality(String),
    container_id LowCardinality(String),
    stack_id     UInt64,
    count        UInt64,
    identity     LowCardinality(String)
)
ENGINE = Distributed('{cluster}', currentDatabase(), cpu_samples_0023_local, stack_id);

INSERT INTO cpu_samples_0023 SELECT * FROM cpu_samples
SETTINGS insert_deduplicate = 0, distributed_foreground_insert = 1;

EXCHANGE TABLES cpu_samples_local AND cpu_samples_0023_local ON CLUSTER '{cluster}';

CREATE OR REPLACE TABLE cpu_samples ON CLUSTER '{cluster}'
(
    ts           DateTime,
    node         LowCardinality(String),
    pid          UInt32,
    comm         LowCardinality(String),
    container_id LowCardinality(String),
    stack_id     UInt64,
    count        UInt64,
    identity     LowCardinality(String)
)
ENGINE = Distributed('{cluster}', currentDatabase(), cpu_samples_local, stack_id);

DROP TABLE IF EXISTS cpu_samples_0023 ON CLUSTER '{cluster}' SYNC;

DROP TABLE IF EXISTS cpu_samples_0023_local ON CLUSTER '{cluster}' SYNC;

CREATE MATERIALIZED VIEW IF NOT EXISTS cpu_samples_1h_mv ON CLUSTER '{cluster}' TO cpu_samples_1h_local AS
SELECT toStartOfHour(ts, 'UTC') AS hour, node, pid, comm, container_id, stack_id, identity, count
FROM cpu_samples_local;

DROP VIEW IF EXISTS gpu_kernel_samples_1h_mv ON CLUSTER '{cluster}';

DROP TABLE IF EXISTS gpu_kernel_samples_0023 ON CLUSTER '{cluster}' SYNC;

DROP TABLE IF EXISTS gpu_kernel_samples_0023_local ON CLUSTER '{cluster}' SYNC;

-- Cluster: its replication path carries the table's UUID, as cpu_samples_0023's.
CREATE TABLE IF NOT EXISTS gpu_kernel_samples_0023_local ON CLUSTER '{cluster}'
(
    ts           DateTime               CODEC(Delta, ZSTD(1)),
    node         LowCardinality(String) CODEC(ZSTD(1)),
    pid          UInt32                 CODEC(T64, ZSTD(1)),
    comm         LowCardinality(String) CODEC(ZSTD(1)),
    container_id LowCardinality(String) CODEC(ZSTD(1)),
    device       UInt16                 CODEC(T64, ZSTD(1)),
    stream       UInt32                 CODEC(T64, ZSTD(1)),
    stack_id     UInt64                 CODEC(ZSTD(1)),
    kernel_name  LowCardinality(String) CODEC(ZSTD(1)),
    duration_ns  UInt64                 CODEC(T64, ZSTD(1)),
    launches     UInt64                 CODEC(T64, ZSTD(1)),
    nvtx_range   LowCardinality(String) CODEC(ZSTD(1)),
    identity     LowCardinality(String) CODEC(ZSTD(1))
)
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{uuid}/{shard}', '{replica}')
PARTITION BY toDate(ts)
ORDER BY (node, toStartOfHour(ts), pid, stack_id, kernel_name, device, stream, comm, container_id, nvtx_range, identity,
          ts)
TTL ts + INTERVAL 30 DAY
SETTINGS replicated_deduplication_window = 10000, ttl_only_drop_parts = 1, merge_selector_base = 20;

CREATE TABLE IF NOT EXISTS gpu_kernel_samples_0023 ON CLUSTER '{cluster}'
(
    ts           DateTime,
    node         LowCardinality(String),
    pid          UInt32,
    comm         LowCardinality(String),
    container_id LowCardinality(String),
    device       UInt16,
    stream       UInt32,
    stack_id     UInt64,
    kernel_name  LowCardinality(String),
    duration_ns  UInt64,
    launches     UInt64,
    nvtx_range   LowCardinality(String),
    identity     LowCardinality(String)
)
ENGINE = Distributed('{cluster}', currentDatabase(), gpu_kernel_samples_0023_local, stack_id);

INSERT INTO gpu_kernel_samples_0023 SELECT * FROM gpu_kernel_samples
SETTINGS insert_deduplicate = 0, distributed_foreground_insert = 1;

EXCHANGE TABLES gpu_kernel_samples_local AND gpu_kernel_samples_0023_local ON CLUSTER '{cluster}';

CREATE OR REPLACE TABLE gpu_kernel_samples ON CLUSTER '{cluster}'
(
    ts           DateTime,
    node         LowCardinality(String),
    pid          UInt32,
    comm         LowCardinality(String),
    container_id LowCardinality(String),
    device       UInt16,
    stream       UInt32,
    stack_id     UInt64,
    kernel_name  LowCardinality(String),
    duration_ns  UInt64,
    launches     UInt64,
    nvtx_range   LowCardinality(String),
    identity     LowCardinality(String)
)
ENGINE = Distributed('{cluster}', currentDatabase(), gpu_kernel_samples_local, stack_id);

DROP TABLE IF EXISTS gpu_kernel_samples_0023 ON CLUSTER '{cluster}' SYNC;

DROP TABLE IF EXISTS gpu_kernel_samples_0023_local ON CLUSTER '{cluster}' SYNC;

CREATE MATERIALIZED VIEW IF NOT EXISTS gpu_kernel_samples_1h_mv ON CLUSTER '{cluster}' TO gpu_kernel_samples_1h_local AS
SELECT toStartOfHour(ts, 'UTC') AS hour, node, pid, comm, container_id, device, stream, stack_id, kernel_name,
       nvtx_range, identity, duration_ns, launches
FROM gpu_kernel_samples_local;

INSERT INTO schema_migrations (version, name, applied_at) VALUES (23, '0023_plain_sample_tables', now());
