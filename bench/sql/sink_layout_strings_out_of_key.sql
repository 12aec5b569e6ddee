-- bench/sink_cost.py --alter-file: the sample tables sorted without their string columns, the hourly rollups by a
-- hash of them; the same columns, rows and answers, only the order on disk differs.
-- Why: a merge compares rows by the sorting key, and LowCardinality strings from two parts compare by value: in the
-- window tables comm, container_id and identity are compared whenever (node, hour, pid, stack_id) tie, which is
-- every time a stack recurs in a later window. The window tables are plain MergeTree (0023), so nothing folds by
-- key there; in the SummingMergeTree rollups the key must still tell the strings apart, which the hash does.
DROP VIEW IF EXISTS cpu_samples_1h_mv;
DROP VIEW IF EXISTS gpu_kernel_samples_1h_mv;

CREATE TABLE cpu_samples_layout AS cpu_samples
ENGINE = MergeTree PARTITION BY toDate(ts) ORDER BY (node, toStartOfHour(ts), pid, stack_id, ts)
TTL ts + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1, merge_selector_base = 20;
EXCHANGE TABLES cpu_samples AND cpu_samples_layout;
DROP TABLE cpu_samples_layout SYNC;

CREATE TABLE gpu_kernel_samples_layout AS gpu_kernel_samples
ENGINE = MergeTree PARTITION BY toDate(ts) ORDER BY (node, toStartOfHour(ts), pid, stack_id, device, stream, ts)
TTL ts + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1, merge_selector_base = 20;
EXCHANGE TABLES gpu_kernel_samples AND gpu_kernel_samples_layout;
DROP TABLE gpu_kernel_samples_layout SYNC;

CREATE TABLE cpu_samples_1h_layout AS cpu_samples_1h
ENGINE = SummingMergeTree(count) PARTITION BY toDate(hour) PRIMARY KEY (node, hour, pid, stack_id)
ORDER BY (node, hour, pid, stack_id, cityHash64(comm, container_id, identity))
TTL hour + INTERVAL 1 HOUR + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1, merge_selector_base = 20;
EXCHANGE TABLES cpu_samples_1h AND cpu_samples_1h_layout;
DROP TABLE cpu_samples_1h_layout SYNC;

CREATE TABLE gpu_kernel_samples_1h_layout AS gpu_kernel_samples_1h
ENGINE = SummingMergeTree((duration_ns, launches)) PARTITION BY toDate(hour)
PRIMARY KEY (node, hour, pid, stack_id, device, stream)
ORDER BY (node, hour, pid, stack_id, device, stream, cityHash64(kernel_name, comm, container_id, nvtx_range, identity))
TTL hour + INTERVAL 1 HOUR + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1, merge_selector_base = 20;
EXCHANGE TABLES gpu_kernel_samples_1h AND gpu_kernel_samples_1h_layout;
DROP TABLE gpu_kernel_samples_1h_layout SYNC;

CREATE MATERIALIZED VIEW cpu_samples_1h_mv TO cpu_samples_1h AS
SELECT toStartOfHour(ts, 'UTC') AS hour, node, pid, comm, container_id, stack_id, identity, count
FROM cpu_samples;

CREATE MATERIALIZED VIEW gpu_kernel_samples_1h_mv TO gpu_kernel_samples_1h AS
SELECT toStartOfHour(ts, 'UTC') AS hour, node, pid, comm, container_id, device, stream, stack_id, kernel_name,
       nvtx_range, identity, duration_ns, launches
FROM gpu_kernel_samples;
