-- cpu_samples and gpu_kernel_samples ordered hour first: (node, hour, process, stack, ..., ts) instead of
-- (node, ts, process, stack, ...).
--
-- A node sends the same stacks window after window. Ordered by time first, each 10 s window lists its stacks again
-- as a run of random 64-bit stack ids that ZSTD can only partly match against the window before; ordered by hour
-- first, a stack's rows of the hour lie together, so its stack_id, process and identity repeat and its ts steps by
-- whole windows. bench/storage_day.py's store (10 nodes x 20 minutes, OPTIMIZE FINAL): cpu_samples 0.933 -> 0.639
-- bytes per CPU sample (stack_id 1.95 -> 0.60 bytes per row), gpu_kernel_samples 0.526 -> 0.463 (bench/RESULTS.md).
-- ts moves to Delta: within a stack's run it steps by a multiple of the window, which Delta leaves as a few small
-- values and DoubleDelta does not (0.93 against 1.03 bytes per row measured). stack_id (and kernel_name) come right
-- after pid: a process's comm, container and identity rarely change, so the rows lie as with those first (the same
-- bytes, measured), and two rows compare on integers before strings.
-- The cost: parts of different windows now interleave within each hour and stack, so merges move rows one by one
-- instead of in runs: bench/sink_cost.py --windows 30 measured ~0.2 µs more CPU per stored sample (merges +16%).
-- Queries still prune by time: the key holds toStartOfHour(ts), which the index reads a ts range through, so a range
-- reads at most the hours it touches (for a range of minutes, up to an hour of each node's rows: the hourly rollups
-- (0010) answer anything longer anyway). Rows sum under the same keys as before (ts is still in the key, and the hour
-- is a function of it), so SummingMergeTree folds exactly the rows it folded before.
--
-- How: ORDER BY cannot change but at its end, so each table is rebuilt: a copy with the new order is filled from the
-- table, swapped in with EXCHANGE TABLES (atomic: readers see the old table or the new one, never neither), the old
-- one dropped, and the hourly view made again on the new table. The copy skips block deduplication, which would drop
-- a block of the copy whose rows equal another's. Safe to run again from any statement: the copy is dropped first,
-- so a run stopped before the swap starts over from the table, and one stopped after it copies the new table again.
-- The new table's deduplication log starts empty: apply this migration while no sink writes and after every sink
-- has finished its batch (a sink stopped with SIGTERM or `fleetprof down` finishes it); a sink killed inside a batch
-- and restarted on the new schema would write that batch's rows again where they already are. fleetprof applies
-- migrations before it starts a sink.
-- The copy takes as long as reading and writing the tables once: on the bench's 2-core VM 0.73 M rows of both tables
-- took 1.6 s (~0.45 M rows a second, so ~40 minutes per billion rows there).
-- Cluster: each table is copied through the Distributed tables into the copy's Distributed table (the same sharding
-- key, so each row goes back to the shard it came from) and the local tables are exchanged on every node.
DROP VIEW IF EXISTS cpu_samples_1h_mv;

DROP TABLE IF EXISTS cpu_samples_0019 SYNC;

-- @cluster sharded by stack_id
-- Cluster: its replication path carries the table's UUID, not its name: the exchange below gives the live table
-- this name's path, and a run of this file again makes a new copy under the same name.
CREATE TABLE IF NOT EXISTS cpu_samples_0019
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
ENGINE = SummingMergeTree(count)
PARTITION BY toDate(ts)
ORDER BY (node, toStartOfHour(ts), pid, stack_id, comm, container_id, identity, ts)
TTL ts + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1, merge_selector_base = 20;

INSERT INTO cpu_samples_0019 (ts, node, pid, comm, container_id, stack_id, count, identity)
SELECT ts, node, pid, comm, container_id, stack_id, count, identity FROM cpu_samples
SETTINGS insert_deduplicate = 0, distributed_foreground_insert = 1;

EXCHANGE TABLES cpu_samples AND cpu_samples_0019;

DROP TABLE IF EXISTS cpu_samples_0019 SYNC;

CREATE MATERIALIZED VIEW IF NOT EXISTS cpu_samples_1h_mv TO cpu_samples_1h AS
SELECT toStartOfHour(ts, 'UTC') AS hour, node, pid, comm, container_id, stack_id, identity, count
FROM cpu_samples;

DROP VIEW IF EXISTS gpu_kernel_samples_1h_mv;

DROP TABLE IF EXISTS gpu_kernel_samples_0019 SYNC;

-- @cluster sharded by stack_id
-- Cluster: its replication path carries the table's UUID, as cpu_samples_0019's.
CREATE TABLE IF NOT EXISTS gpu_kernel_samples_0019
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
ENGINE = SummingMergeTree((duration_ns, launches))
PARTITION BY toDate(ts)
ORDER BY (node, toStartOfHour(ts), pid, stack_id, kernel_name, device, stream, comm, container_id, nvtx_range, identity,
          ts)
TTL ts + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1, merge_selector_base = 20;

INSERT INTO gpu_kernel_samples_0019 (ts, node, pid, comm, container_id, device, stream, stack_id, kernel_name,
                                     duration_ns, launches, nvtx_range, identity)
SELECT ts, node, pid, comm, container_id, device, stream, stack_id, kernel_name, duration_ns, launches, nvtx_range,
       identity
FROM gpu_kernel_samples
SETTINGS insert_deduplicate = 0, distributed_foreground_insert = 1;

EXCHANGE TABLES gpu_kernel_samples AND gpu_kernel_samples_0019;

DROP TABLE IF EXISTS gpu_kernel_samples_0019 SYNC;

CREATE MATERIALIZED VIEW IF NOT EXISTS gpu_kernel_samples_1h_mv TO gpu_kernel_samples_1h AS
SELECT toStartOfHour(ts, 'UTC') AS hour, node, pid, comm, container_id, device, stream, stack_id, kernel_name,
       nvtx_range, identity, duration_ns, launches
FROM gpu_kernel_samples;
