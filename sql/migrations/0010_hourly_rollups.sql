-- Hourly rollups of the sample tables, so a flame graph over a day or a week does not re-sum every 10 s window.
-- 24 h of 100 nodes is ~8,640 windows per node and hundreds of rows per window in cpu_samples: the flame-graph
-- queries read whole UTC hours of a range from here and only the ragged edges (before the first and after the last
-- whole hour) from the window tables, which gives exactly the window tables' sums (bench/fleet_query.py measures it,
-- tests/test_rollup.py proves it). They do it in one place each, the named queries cpu_samples_by_stack and
-- gpu_kernel_samples_by_stack, which they include.
--
-- Rows: the window tables' rows with ts truncated to its UTC hour (toStartOfHour(ts, 'UTC'): the server's time zone,
-- which may be a half-hour zone, never moves the buckets), every other key column kept, so every filter the queries
-- apply to the window tables (node, pid, comm, and GPU device, stream, kernel) applies here unchanged.
-- Engine: SummingMergeTree, like the window tables: the materialized view inserts one partial sum per inserted block
-- and hour, merges add them up, and queries sum() anyway. ORDER BY as the window tables, with hour for ts.
--
-- Feeding: a materialized view per table turns each block inserted into the window table into its hourly sums, in
-- the same INSERT. Deduplication: the sink's insert_deduplication_token reaches the views' inserts, which derive a
-- token of their own from it (deduplicate_blocks_in_dependent_materialized_views, on by default), so a re-inserted
-- batch is dropped here exactly as in the window table; that takes this table's own deduplication window (without
-- non_replicated_deduplication_window the rollup keeps the retried block and counts it twice). Never turn
-- deduplicate_blocks_in_dependent_materialized_views off for the sink.
--
-- Retention: 30 days like the window tables, not longer. A longer one would outlive the stacks that its rows name
-- (stacks are kept 90 days after last use, 0002, a margin sized for 30 days of samples), and a query over older days
-- would get whole hours from here but no edges from the window tables: no longer the same answer. The TTL runs from
-- the end of the hour, so an hour is dropped with (never before) the window table's day that holds its last window;
-- same daily partitions and ttl_only_drop_parts.
--
-- Existing rows: the statements below fill the rollup from the window tables before the views exist, so nothing is
-- counted twice. Apply this migration while no sink writes (fleetprof applies migrations before it starts one): a
-- batch inserted between the backfill and the view would be missing from the rollup.
--
-- Codecs: as the window tables; hour is a multiple of 3600, DoubleDelta leaves next to nothing of it.
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
-- @cluster sharded by stack_id
CREATE TABLE IF NOT EXISTS cpu_samples_1h
(
    hour         DateTime               CODEC(DoubleDelta, ZSTD(1)),
    node         LowCardinality(String) CODEC(ZSTD(1)),
    pid          UInt32                 CODEC(T64, ZSTD(1)),
    comm         LowCardinality(String) CODEC(ZSTD(1)),
    container_id LowCardinality(String) CODEC(ZSTD(1)),
    stack_id     UInt64                 CODEC(ZSTD(1)),
    count        UInt64                 CODEC(T64, ZSTD(1))
)
ENGINE = SummingMergeTree(count)
PARTITION BY toDate(hour)
ORDER BY (node, hour, pid, comm, container_id, stack_id)
TTL hour + INTERVAL 1 HOUR + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

INSERT INTO cpu_samples_1h (hour, node, pid, comm, container_id, stack_id, count)
SELECT toStartOfHour(ts, 'UTC') AS hour, node, pid, comm, container_id, stack_id, sum(count) AS count
FROM cpu_samples
GROUP BY hour, node, pid, comm, container_id, stack_id;

CREATE MATERIALIZED VIEW IF NOT EXISTS cpu_samples_1h_mv TO cpu_samples_1h AS
SELECT toStartOfHour(ts, 'UTC') AS hour, node, pid, comm, container_id, stack_id, sum(count) AS count
FROM cpu_samples
GROUP BY hour, node, pid, comm, container_id, stack_id;

-- GPU kernel time per hour: the same for gpu_kernel_samples (0004), both counters summed.
-- @cluster sharded by stack_id
CREATE TABLE IF NOT EXISTS gpu_kernel_samples_1h
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
ENGINE = SummingMergeTree((duration_ns, launches))
PARTITION BY toDate(hour)
ORDER BY (node, hour, pid, comm, container_id, device, stream, stack_id, kernel_name)
TTL hour + INTERVAL 1 HOUR + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

INSERT INTO gpu_kernel_samples_1h
    (hour, node, pid, comm, container_id, device, stream, stack_id, kernel_name, duration_ns, launches)
SELECT toStartOfHour(ts, 'UTC') AS hour, node, pid, comm, container_id, device, stream, stack_id, kernel_name,
       sum(duration_ns) AS duration_ns, sum(launches) AS launches
FROM gpu_kernel_samples
GROUP BY hour, node, pid, comm, container_id, device, stream, stack_id, kernel_name;

CREATE MATERIALIZED VIEW IF NOT EXISTS gpu_kernel_samples_1h_mv TO gpu_kernel_samples_1h AS
SELECT toStartOfHour(ts, 'UTC') AS hour, node, pid, comm, container_id, device, stream, stack_id, kernel_name,
       sum(duration_ns) AS duration_ns, sum(launches) AS launches
FROM gpu_kernel_samples
GROUP BY hour, node, pid, comm, container_id, device, stream, stack_id, kernel_name;
