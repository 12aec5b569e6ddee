-- Generated from sql/migrations/0010_hourly_rollups.sql by `python -m fleetprof.cluster_sql`: do not edit.
-- The migration says why the columns, codecs, keys, partitions, TTL and settings are what they are;
-- sql/cluster/README.md says how a cluster differs from one node.
--
-- Cluster: the rollups are sharded by stack_id like the window tables they sum (0003, 0004), so an hour's rows sit on
-- the shard of the window rows they come from and of their stack's definition. The materialized views run on every
-- node, over the window tables' local parts (cpu_samples_local, gpu_kernel_samples_local) into the local rollups: a
-- block a shard receives is summed into that shard's hourly rows, and the rollup's key holds stack_id, so nothing
-- moves between shards. On Replicated tables the sink's insert_deduplication_token reaches the views' inserts as on
-- one node: a re-inserted batch is dropped from the rollup on every shard, as from the window table. The backfill
-- reads and writes through the Distributed tables (which route by stack_id, the shard the rows come from) before the
-- views exist: stop the sinks while applying the file (Kafka keeps their input), or a batch inserted between the
-- backfill and the views is missing from the rollup.
CREATE TABLE IF NOT EXISTS cpu_samples_1h_local ON CLUSTER '{cluster}'
(
    hour         DateTime               CODEC(DoubleDelta, ZSTD(1)),
    node         LowCardinality(String) CODEC(ZSTD(1)),
    pid          UInt32                 CODEC(T64, ZSTD(1)),
    comm         LowCardinality(String) CODEC(ZSTD(1)),
    container_id LowCardinality(String) CODEC(ZSTD(1)),
    stack_id     UInt64                 CODEC(ZSTD(1)),
    count        UInt64                 CODEC(T64, ZSTD(1))
)
ENGINE = ReplicatedSummingMergeTree('/clickhouse/tables/{shard}/{database}/cpu_samples_1h_local', '{replica}', count)
PARTITION BY toDate(hour)
ORDER BY (node, hour, pid, comm, container_id, stack_id)
TTL hour + INTERVAL 1 HOUR + INTERVAL 30 DAY
SETTINGS replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

CREATE TABLE IF NOT EXISTS cpu_samples_1h ON CLUSTER '{cluster}'
(
    hour         DateTime,
    node         LowCardinality(String),
    pid          UInt32,
    comm         LowCardinality(String),
    container_id LowCardinality(String),
    stack_id     UInt64,
    count        UInt64
)
ENGINE = Distributed('{cluster}', currentDatabase(), cpu_samples_1h_local, stack_id);

INSERT INTO cpu_samples_1h (hour, node, pid, comm, container_id, stack_id, count)
SELECT toStartOfHour(ts, 'UTC') AS hour, node, pid, comm, container_id, stack_id, sum(count) AS count
FROM cpu_samples
GROUP BY hour, node, pid, comm, container_id, stack_id;

CREATE MATERIALIZED VIEW IF NOT EXISTS cpu_samples_1h_mv ON CLUSTER '{cluster}' TO cpu_samples_1h_local AS
SELECT toStartOfHour(ts, 'UTC') AS hour, node, pid, comm, container_id, stack_id, sum(count) AS count
FROM cpu_samples_local
GROUP BY hour, node, pid, comm, container_id, stack_id;

CREATE TABLE IF NOT EXISTS gpu_kernel_samples_1h_local ON CLUSTER '{cluster}'
(
    hour         DateTime               CODEC(DoubleDelta, ZSTD(1)),
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
ENGINE = ReplicatedSummingMergeTree('/clickhouse/tables/{shard}/{database}/gpu_kernel_samples_1h_local', '{replica}',
                                    (duration_ns, launches))
PARTITION BY toDate(hour)
ORDER BY (node, hour, pid, comm, container_id, device, stream, stack_id, kernel_name)
TTL hour + INTERVAL 1 HOUR + INTERVAL 30 DAY
SETTINGS replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

CREATE TABLE IF NOT EXISTS gpu_kernel_samples_1h ON CLUSTER '{cluster}'
(
    hour         DateTime,
    node         LowCardinality(String),
    pid          UInt32,
    comm         LowCardinality(String),
    container_id LowCardinality(String),
    device       UInt16,
    stream       UInt32,
    stack_id     UInt64,
    kernel_name  LowCardinality(String),
    duration_ns  UInt64,
    launches     UInt64
)
ENGINE = Distributed('{cluster}', currentDatabase(), gpu_kernel_samples_1h_local, stack_id);

INSERT INTO gpu_kernel_samples_1h
    (hour, node, pid, comm, container_id, device, stream, stack_id, kernel_name, duration_ns, launches)
SELECT toStartOfHour(ts, 'UTC') AS hour, node, pid, comm, container_id, device, stream, stack_id, kernel_name,
       sum(duration_ns) AS duration_ns, sum(launches) AS launches
FROM gpu_kernel_samples
GROUP BY hour, node, pid, comm, container_id, device, stream, stack_id, kernel_name;

CREATE MATERIALIZED VIEW IF NOT EXISTS gpu_kernel_samples_1h_mv ON CLUSTER '{cluster}' TO gpu_kernel_samples_1h_local AS
SELECT toStartOfHour(ts, 'UTC') AS hour, node, pid, comm, container_id, device, stream, stack_id, kernel_name,
       sum(duration_ns) AS duration_ns, sum(launches) AS launches
FROM gpu_kernel_samples_local
GROUP BY hour, node, pid, comm, container_id, device, stream, stack_id, kernel_name;

INSERT INTO schema_migrations (version, name, applied_at) VALUES (10, '0010_hourly_rollups', now());
