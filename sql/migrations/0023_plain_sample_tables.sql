-- cpu_samples and gpu_kernel_samples as plain MergeTree tables instead of SummingMergeTree: the same columns, codecs,
-- key, partitions, TTL and settings.
--
-- Why: a SummingMergeTree merge goes row by row, comparing each row's key with the last one's to sum the rows of one
-- key; a plain merge has nothing to fold. Measured (bench/RESULTS.md): the sink's own cpu_samples rows of 30 windows,
-- written four times over through its insert path into each engine, merged the same way (10.6 M rows x levels) in
-- 22.0-24.4 s of the engine's merge threads as SummingMergeTree and 9.6-9.8 s as MergeTree; bench/sink_cost.py
-- --windows 120, every table: merges 53.8 -> 35.4 s; bench/ttl_merges.py --table cpu (26 scaled hours, 90 M rows in
-- daily partitions): 9.34 -> 3.56 us of background CPU per row, 717 -> 707 MB at the end, the scans alike. Over a day
-- a row is merged about three times, so those merges were most of what a stored CPU sample costs the sink at steady
-- state. They folded next to nothing: a node's window reaches the sink as one row per key (the symbolizer sums a
-- message's counts per process and stack, the correlator its GPU time per key), and a batch written again after a
-- crash is dropped by its deduplication token. Every query sums per key, as it must across parts anyway, so no answer
-- changes; rows of one key from two messages of one window (an agent's window split across messages) now stay two
-- rows on disk.
-- The hourly rollups (0010) stay SummingMergeTree: there many windows' rows of one key do fold, 360 into one.
--
-- How: a table's engine cannot be altered, so each table is rebuilt as 0019 did, but its rows are not copied: the new
-- table takes the old one's parts with ATTACH PARTITION ALL FROM (hard links: seconds whatever the table's size), is
-- swapped in with EXCHANGE TABLES, the old one dropped, and the hourly view made again. Safe to run again from any
-- statement: the copy is dropped first, so a run stopped before the swap starts over from the table, and one stopped
-- after it takes the new table's parts again. The new table's deduplication log starts empty: fleetprof refuses the
-- migration while a sink batch is unfinished (fleetprof/rebuild_guard.py), as for 0019.
-- Cluster: ATTACH PARTITION ... FROM is not replicated safely ON CLUSTER (each replica would attach its own parts), so
-- the cluster form copies the rows through the Distributed tables, as 0019's did.
DROP VIEW IF EXISTS cpu_samples_1h_mv;

DROP TABLE IF EXISTS cpu_samples_0023 SYNC;

-- @cluster sharded by stack_id
-- Cluster: its replication path carries the table's UUID, not its name: the exchange below gives the live table
-- this name's path, and a run of this file again makes a new copy under the same name.
CREATE TABLE IF NOT EXISTS cpu_samples_0023
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
ENGINE = MergeTree
PARTITION BY toDate(ts)
ORDER BY (node, toStartOfHour(ts), pid, stack_id, comm, container_id, identity, ts)
TTL ts + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1, merge_selector_base = 20;

ALTER TABLE cpu_samples_0023 ATTACH PARTITION ALL FROM cpu_samples;

EXCHANGE TABLES cpu_samples AND cpu_samples_0023;

DROP TABLE IF EXISTS cpu_samples_0023 SYNC;

CREATE MATERIALIZED VIEW IF NOT EXISTS cpu_samples_1h_mv TO cpu_samples_1h AS
SELECT toStartOfHour(ts, 'UTC') AS hour, node, pid, comm, container_id, stack_id, identity, count
FROM cpu_samples;

DROP VIEW IF EXISTS gpu_kernel_samples_1h_mv;

DROP TABLE IF EXISTS gpu_kernel_samples_0023 SYNC;

-- @cluster sharded by stack_id
-- Cluster: its replication path carries the table's UUID, as cpu_samples_0023's.
CREATE TABLE IF NOT EXISTS gpu_kernel_samples_0023
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
ENGINE = MergeTree
PARTITION BY toDate(ts)
ORDER BY (node, toStartOfHour(ts), pid, stack_id, kernel_name, device, stream, comm, container_id, nvtx_range, identity,
          ts)
TTL ts + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1, merge_selector_base = 20;

ALTER TABLE gpu_kernel_samples_0023 ATTACH PARTITION ALL FROM gpu_kernel_samples;

EXCHANGE TABLES gpu_kernel_samples AND gpu_kernel_samples_0023;

DROP TABLE IF EXISTS gpu_kernel_samples_0023 SYNC;

CREATE MATERIALIZED VIEW IF NOT EXISTS gpu_kernel_samples_1h_mv TO gpu_kernel_samples_1h AS
SELECT toStartOfHour(ts, 'UTC') AS hour, node, pid, comm, container_id, device, stream, stack_id, kernel_name,
       nvtx_range, identity, duration_ns, launches
FROM gpu_kernel_samples;
