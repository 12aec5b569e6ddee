-- The sample tables and their hourly rollups store a process id in place of three strings: `proc_id`, a hash of
-- (comm, container_id, identity); the strings are stored once per process in `process_names`, and `comm`,
-- `container_id` and `identity` stay columns of every table as ALIASes that look them up in the dictionary
-- `process_names_by_id` over it. Every query reads and filters them as before, unchanged.
--
-- Why: the three strings were ~40-50% of what a merge of cpu_samples cost (bench/merge_cost.py --layouts: 1.3-1.5 ->
-- 0.7-0.8 us per row merged): as LowCardinality columns each part has its own dictionaries, so a merge re-encodes
-- every row of each, and in the sorting key right before ts they were compared for every recurrence of a stack in a
-- later window. Measured end to end with the engine's side of this design (bench/sink_cost.py --windows 120): the
-- merge threads -28%, the sink -19% per stored CPU sample; over a scaled day (bench/ttl_merges.py --table cpu) the
-- window table's merges -32% (bench/RESULTS.md). Their bytes were next to nothing: this saves CPU, not storage.
--
-- The id: the first 8 bytes of MD5(comm || NUL || container_id || NUL || identity), little-endian, as a UInt64. The
-- sink computes the same in Python (processors/process_ids.py) and writes a process's names before the first rows
-- that carry its id, so a name is never looked up before it is there. Two processes with the same three strings
-- share an id and a names row (pid stays a column of its own); a collision of two different triples needs ~4e9
-- processes to be likely.
--
-- process_names is a definition like frames and stacks (0002): ReplacingMergeTree(last_seen), 90 days from
-- last_seen, which the sink refreshes by writing a name again once a day while its process is sampled.
-- The dictionary: HASHED, read from process_names. The sink reloads it after writing names it had not written before
-- (one statement, a synchronous reload); on a server, the other readers reload it when process_names' row count
-- changes, checked every 1-5 s (invalidate_query). A lookup of an id with no names row gives '' for all three (no
-- such row is written by fleetprof: every id comes with its names).
-- A reload reads the whole table: ~0.7-0.8 us per name on the bench VM (bench/process_names_reload.py: 7 ms at 10 k
-- names, 65 ms at 100 k, 0.8 s at 1 M), paid by each sink batch that brings a process not written before. Fine for
-- the thousands to ~100 k processes a fleet of steady jobs keeps for 90 days; a fleet whose containers churn by the
-- million needs names loaded incrementally (or looked up by the queries after grouping), not this reload.
-- Queries that group by a name pay a lookup per row (bench/process_ids_query.py: 1.4-1.5x on a per-command total
-- over 20 M rows, filters the same): the price of keeping every query's text.
--
-- How: the names of every row already stored are written first, from the four tables; then each table is rebuilt as
-- 0019 did (a copy filled from it with the id computed, exchanged, the old one dropped; ~0.45 M rows a second on the
-- bench's 2-core VM) and the hourly views are made again over the ids. Safe to run again from any statement: the
-- names table takes the same rows again (ReplacingMergeTree), a copy is dropped before it is made, and a table already
-- rebuilt reads its names through the dictionary into its copy as before. A rebuilt table's deduplication log starts
-- empty: fleetprof refuses this migration while a sink batch is unfinished (fleetprof/rebuild_guard.py).
-- Cluster: the names table is on every node, so every shard looks its rows' ids up locally; the dictionary is made
-- and reloaded on every node.

-- @cluster on every node
CREATE TABLE IF NOT EXISTS process_names
(
    proc_id      UInt64 CODEC(ZSTD(1)),
    comm         String CODEC(ZSTD(1)),
    container_id String CODEC(ZSTD(1)),
    identity     String CODEC(ZSTD(1)),
    last_seen    DateTime CODEC(ZSTD(1))
)
ENGINE = ReplacingMergeTree(last_seen)
ORDER BY proc_id
TTL last_seen + INTERVAL 90 DAY;

INSERT INTO process_names (proc_id, comm, container_id, identity, last_seen)
SELECT reinterpretAsUInt64(MD5(concat(comm, '\0', container_id, '\0', identity))) AS id, comm, container_id, identity,
       max(ts)
FROM cpu_samples
GROUP BY id, comm, container_id, identity;

INSERT INTO process_names (proc_id, comm, container_id, identity, last_seen)
SELECT reinterpretAsUInt64(MD5(concat(comm, '\0', container_id, '\0', identity))) AS id, comm, container_id, identity,
       max(ts)
FROM gpu_kernel_samples
GROUP BY id, comm, container_id, identity;

INSERT INTO process_names (proc_id, comm, container_id, identity, last_seen)
SELECT reinterpretAsUInt64(MD5(concat(comm, '\0', container_id, '\0', identity))) AS id, comm, container_id, identity,
       max(hour)
FROM cpu_samples_1h
GROUP BY id, comm, container_id, identity;

INSERT INTO process_names (proc_id, comm, container_id, identity, last_seen)
SELECT reinterpretAsUInt64(MD5(concat(comm, '\0', container_id, '\0', identity))) AS id, comm, container_id, identity,
       max(hour)
FROM gpu_kernel_samples_1h
GROUP BY id, comm, container_id, identity;

-- @cluster on every node
CREATE DICTIONARY IF NOT EXISTS process_names_by_id
(
    proc_id      UInt64,
    comm         String,
    container_id String,
    identity     String
)
PRIMARY KEY proc_id
SOURCE(CLICKHOUSE(TABLE 'process_names' INVALIDATE_QUERY 'SELECT count() FROM process_names'))
LAYOUT(HASHED())
LIFETIME(MIN 1 MAX 5);

SYSTEM RELOAD DICTIONARY process_names_by_id;

DROP VIEW IF EXISTS cpu_samples_1h_mv;

DROP TABLE IF EXISTS cpu_samples_0025 SYNC;

-- @cluster sharded by stack_id
-- Cluster: its replication path carries the table's UUID, as 0019's and 0023's copies.
CREATE TABLE IF NOT EXISTS cpu_samples_0025
(
    ts           DateTime               CODEC(Delta, ZSTD(1)),
    node         LowCardinality(String) CODEC(ZSTD(1)),
    pid          UInt32                 CODEC(T64, ZSTD(1)),
    proc_id      UInt64                 CODEC(ZSTD(1)),
    comm         String ALIAS dictGet('process_names_by_id', 'comm', proc_id),
    container_id String ALIAS dictGet('process_names_by_id', 'container_id', proc_id),
    stack_id     UInt64                 CODEC(ZSTD(1)),
    count        UInt64                 CODEC(T64, ZSTD(1)),
    identity     String ALIAS dictGet('process_names_by_id', 'identity', proc_id)
)
ENGINE = MergeTree
PARTITION BY toDate(ts)
ORDER BY (node, toStartOfHour(ts), pid, stack_id, proc_id, ts)
TTL ts + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1, merge_selector_base = 20;

INSERT INTO cpu_samples_0025 (ts, node, pid, proc_id, stack_id, count)
SELECT ts, node, pid, reinterpretAsUInt64(MD5(concat(comm, '\0', container_id, '\0', identity))), stack_id, count
FROM cpu_samples
SETTINGS insert_deduplicate = 0, distributed_foreground_insert = 1;

EXCHANGE TABLES cpu_samples AND cpu_samples_0025;

DROP TABLE IF EXISTS cpu_samples_0025 SYNC;

DROP VIEW IF EXISTS gpu_kernel_samples_1h_mv;

DROP TABLE IF EXISTS gpu_kernel_samples_0025 SYNC;

-- @cluster sharded by stack_id
-- Cluster: its replication path carries the table's UUID, as cpu_samples_0025's.
CREATE TABLE IF NOT EXISTS gpu_kernel_samples_0025
(
    ts           DateTime               CODEC(Delta, ZSTD(1)),
    node         LowCardinality(String) CODEC(ZSTD(1)),
    pid          UInt32                 CODEC(T64, ZSTD(1)),
    proc_id      UInt64                 CODEC(ZSTD(1)),
    comm         String ALIAS dictGet('process_names_by_id', 'comm', proc_id),
    container_id String ALIAS dictGet('process_names_by_id', 'container_id', proc_id),
    device       UInt16                 CODEC(T64, ZSTD(1)),
    stream       UInt32                 CODEC(T64, ZSTD(1)),
    stack_id     UInt64                 CODEC(ZSTD(1)),
    kernel_name  LowCardinality(String) CODEC(ZSTD(1)),
    duration_ns  UInt64                 CODEC(T64, ZSTD(1)),
    launches     UInt64                 CODEC(T64, ZSTD(1)),
    nvtx_range   LowCardinality(String) CODEC(ZSTD(1)),
    identity     String ALIAS dictGet('process_names_by_id', 'identity', proc_id)
)
ENGINE = MergeTree
PARTITION BY toDate(ts)
ORDER BY (node, toStartOfHour(ts), pid, stack_id, kernel_name, device, stream, proc_id, nvtx_range, ts)
TTL ts + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1, merge_selector_base = 20;

INSERT INTO gpu_kernel_samples_0025 (ts, node, pid, proc_id, device, stream, stack_id, kernel_name, duration_ns,
                                     launches, nvtx_range)
SELECT ts, node, pid, reinterpretAsUInt64(MD5(concat(comm, '\0', container_id, '\0', identity))), device, stream,
       stack_id, kernel_name, duration_ns, launches, nvtx_range
FROM gpu_kernel_samples
SETTINGS insert_deduplicate = 0, distributed_foreground_insert = 1;

EXCHANGE TABLES gpu_kernel_samples AND gpu_kernel_samples_0025;

DROP TABLE IF EXISTS gpu_kernel_samples_0025 SYNC;

DROP TABLE IF EXISTS cpu_samples_1h_0025 SYNC;

-- @cluster sharded by stack_id
-- Cluster: its replication path carries the table's UUID, as cpu_samples_0025's.
CREATE TABLE IF NOT EXISTS cpu_samples_1h_0025
(
    hour         DateTime               CODEC(DoubleDelta, ZSTD(1)),
    node         LowCardinality(String) CODEC(ZSTD(1)),
    pid          UInt32                 CODEC(T64, ZSTD(1)),
    proc_id      UInt64                 CODEC(ZSTD(1)),
    comm         String ALIAS dictGet('process_names_by_id', 'comm', proc_id),
    container_id String ALIAS dictGet('process_names_by_id', 'container_id', proc_id),
    stack_id     UInt64                 CODEC(ZSTD(1)),
    count        UInt64                 CODEC(T64, ZSTD(1)),
    identity     String ALIAS dictGet('process_names_by_id', 'identity', proc_id)
)
ENGINE = SummingMergeTree(count)
PARTITION BY toDate(hour)
ORDER BY (node, hour, pid, stack_id, proc_id)
TTL hour + INTERVAL 1 HOUR + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1, merge_selector_base = 20;

INSERT INTO cpu_samples_1h_0025 (hour, node, pid, proc_id, stack_id, count)
SELECT hour, node, pid, reinterpretAsUInt64(MD5(concat(comm, '\0', container_id, '\0', identity))), stack_id, count
FROM cpu_samples_1h
SETTINGS insert_deduplicate = 0, distributed_foreground_insert = 1;

EXCHANGE TABLES cpu_samples_1h AND cpu_samples_1h_0025;

DROP TABLE IF EXISTS cpu_samples_1h_0025 SYNC;

DROP TABLE IF EXISTS gpu_kernel_samples_1h_0025 SYNC;

-- @cluster sharded by stack_id
-- Cluster: its replication path carries the table's UUID, as cpu_samples_0025's.
CREATE TABLE IF NOT EXISTS gpu_kernel_samples_1h_0025
(
    hour         DateTime               CODEC(DoubleDelta, ZSTD(1)),
    node         LowCardinality(String) CODEC(ZSTD(1)),
    pid          UInt32                 CODEC(T64, ZSTD(1)),
    proc_id      UInt64                 CODEC(ZSTD(1)),
    comm         String ALIAS dictGet('process_names_by_id', 'comm', proc_id),
    container_id String ALIAS dictGet('process_names_by_id', 'container_id', proc_id),
    device       UInt16                 CODEC(T64, ZSTD(1)),
    stream       UInt32                 CODEC(T64, ZSTD(1)),
    stack_id     UInt64                 CODEC(ZSTD(1)),
    kernel_name  LowCardinality(String) CODEC(ZSTD(1)),
    duration_ns  UInt64                 CODEC(T64, ZSTD(1)),
    launches     UInt64                 CODEC(T64, ZSTD(1)),
    nvtx_range   LowCardinality(String) CODEC(ZSTD(1)),
    identity     String ALIAS dictGet('process_names_by_id', 'identity', proc_id)
)
ENGINE = SummingMergeTree((duration_ns, launches))
PARTITION BY toDate(hour)
ORDER BY (node, hour, pid, stack_id, kernel_name, device, stream, proc_id, nvtx_range)
TTL hour + INTERVAL 1 HOUR + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1, merge_selector_base = 20;

INSERT INTO gpu_kernel_samples_1h_0025 (hour, node, pid, proc_id, device, stream, stack_id, kernel_name, nvtx_range,
                                        duration_ns, launches)
SELECT hour, node, pid, reinterpretAsUInt64(MD5(concat(comm, '\0', container_id, '\0', identity))), device, stream,
       stack_id, kernel_name, nvtx_range, duration_ns, launches
FROM gpu_kernel_samples_1h
SETTINGS insert_deduplicate = 0, distributed_foreground_insert = 1;

EXCHANGE TABLES gpu_kernel_samples_1h AND gpu_kernel_samples_1h_0025;

DROP TABLE IF EXISTS gpu_kernel_samples_1h_0025 SYNC;

CREATE MATERIALIZED VIEW IF NOT EXISTS cpu_samples_1h_mv TO cpu_samples_1h AS
SELECT toStartOfHour(ts, 'UTC') AS hour, node, pid, proc_id, stack_id, count
FROM cpu_samples;

CREATE MATERIALIZED VIEW IF NOT EXISTS gpu_kernel_samples_1h_mv TO gpu_kernel_samples_1h AS
SELECT toStartOfHour(ts, 'UTC') AS hour, node, pid, proc_id, device, stream, stack_id, kernel_name, nvtx_range,
       duration_ns, launches
FROM gpu_kernel_samples;
