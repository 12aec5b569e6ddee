-- bench/sink_cost.py --alter-file: what the engine would spend if the sample tables and their rollups kept a process
-- id instead of the process's strings (comm, container_id, identity), the strings stored once per process in a
-- table of their own. A measurement of the engine's side only: the sink inserts as today, the strings arrive in
-- EPHEMERAL columns (not stored) and proc_id is computed from them; no query here can name a process's strings (the
-- process table and the queries' joins are not part of it), so only bench/sink_cost.py should run on this layout.
-- Its cost to the sink is a lower bound: writing the process table (a row per new process) is not in it.
DROP VIEW IF EXISTS cpu_samples_1h_mv;
DROP VIEW IF EXISTS gpu_kernel_samples_1h_mv;

CREATE TABLE cpu_samples_layout
(
    ts           DateTime               CODEC(Delta, ZSTD(1)),
    node         LowCardinality(String) CODEC(ZSTD(1)),
    pid          UInt32                 CODEC(T64, ZSTD(1)),
    comm         LowCardinality(String) EPHEMERAL '',
    container_id LowCardinality(String) EPHEMERAL '',
    stack_id     UInt64                 CODEC(ZSTD(1)),
    count        UInt64                 CODEC(T64, ZSTD(1)),
    identity     LowCardinality(String) EPHEMERAL '',
    proc_id      UInt64                 DEFAULT cityHash64(comm, container_id, identity) CODEC(ZSTD(1))
)
ENGINE = MergeTree PARTITION BY toDate(ts) ORDER BY (node, toStartOfHour(ts), pid, stack_id, ts)
TTL ts + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1, merge_selector_base = 20;
EXCHANGE TABLES cpu_samples AND cpu_samples_layout;
DROP TABLE cpu_samples_layout SYNC;

CREATE TABLE gpu_kernel_samples_layout
(
    ts           DateTime               CODEC(Delta, ZSTD(1)),
    node         LowCardinality(String) CODEC(ZSTD(1)),
    pid          UInt32                 CODEC(T64, ZSTD(1)),
    comm         LowCardinality(String) EPHEMERAL '',
    container_id LowCardinality(String) EPHEMERAL '',
    device       UInt16                 CODEC(T64, ZSTD(1)),
    stream       UInt32                 CODEC(T64, ZSTD(1)),
    stack_id     UInt64                 CODEC(ZSTD(1)),
    kernel_name  LowCardinality(String) CODEC(ZSTD(1)),
    duration_ns  UInt64                 CODEC(T64, ZSTD(1)),
    launches     UInt64                 CODEC(T64, ZSTD(1)),
    nvtx_range   LowCardinality(String) CODEC(ZSTD(1)),
    identity     LowCardinality(String) EPHEMERAL '',
    proc_id      UInt64                 DEFAULT cityHash64(comm, container_id, identity) CODEC(ZSTD(1))
)
ENGINE = MergeTree PARTITION BY toDate(ts) ORDER BY (node, toStartOfHour(ts), pid, stack_id, device, stream, ts)
TTL ts + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1, merge_selector_base = 20;
EXCHANGE TABLES gpu_kernel_samples AND gpu_kernel_samples_layout;
DROP TABLE gpu_kernel_samples_layout SYNC;

CREATE TABLE cpu_samples_1h_layout
(
    hour     DateTime               CODEC(DoubleDelta, ZSTD(1)),
    node     LowCardinality(String) CODEC(ZSTD(1)),
    pid      UInt32                 CODEC(T64, ZSTD(1)),
    proc_id  UInt64                 CODEC(ZSTD(1)),
    stack_id UInt64                 CODEC(ZSTD(1)),
    count    UInt64                 CODEC(T64, ZSTD(1))
)
ENGINE = SummingMergeTree(count) PARTITION BY toDate(hour) ORDER BY (node, hour, pid, stack_id, proc_id)
TTL hour + INTERVAL 1 HOUR + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1, merge_selector_base = 20;
EXCHANGE TABLES cpu_samples_1h AND cpu_samples_1h_layout;
DROP TABLE cpu_samples_1h_layout SYNC;

CREATE TABLE gpu_kernel_samples_1h_layout
(
    hour        DateTime               CODEC(DoubleDelta, ZSTD(1)),
    node        LowCardinality(String) CODEC(ZSTD(1)),
    pid         UInt32                 CODEC(T64, ZSTD(1)),
    proc_id     UInt64                 CODEC(ZSTD(1)),
    device      UInt16                 CODEC(T64, ZSTD(1)),
    stream      UInt32                 CODEC(T64, ZSTD(1)),
    stack_id    UInt64                 CODEC(ZSTD(1)),
    kernel_name LowCardinality(String) CODEC(ZSTD(1)),
    nvtx_range  LowCardinality(String) CODEC(ZSTD(1)),
    duration_ns UInt64                 CODEC(T64, ZSTD(1)),
    launches    UInt64                 CODEC(T64, ZSTD(1))
)
ENGINE = SummingMergeTree((duration_ns, launches)) PARTITION BY toDate(hour)
ORDER BY (node, hour, pid, stack_id, device, stream, proc_id, kernel_name, nvtx_range)
TTL hour + INTERVAL 1 HOUR + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1, merge_selector_base = 20;
EXCHANGE TABLES gpu_kernel_samples_1h AND gpu_kernel_samples_1h_layout;
DROP TABLE gpu_kernel_samples_1h_layout SYNC;

CREATE MATERIALIZED VIEW cpu_samples_1h_mv TO cpu_samples_1h AS
SELECT toStartOfHour(ts, 'UTC') AS hour, node, pid, proc_id, stack_id, count
FROM cpu_samples;

CREATE MATERIALIZED VIEW gpu_kernel_samples_1h_mv TO gpu_kernel_samples_1h AS
SELECT toStartOfHour(ts, 'UTC') AS hour, node, pid, proc_id, device, stream, stack_id, kernel_name, nvtx_range,
       duration_ns, launches
FROM gpu_kernel_samples;
