-- The hourly rollups' views (0010, 0015) pass the window tables' rows on instead of grouping them first.
--
-- A sink batch is one window of every node (it is written at the end of the nodes' burst), and a window's rows are
-- already one per key: grouped by hour and the same keys, the block came out as long as it went in. The grouping
-- cost the engine about as much as all the rest of the insert (hashing every row's seven to eleven keys, strings
-- among them): in bench/sink_cost.py the cpu_samples insert took 1.25 µs of chDB per row with the grouping view,
-- 0.60 without it, 0.06 with no view at all (bench/RESULTS.md). The rollups are SummingMergeTree and every query
-- sums them per key already (0010), so rows of one hour and key summed by merges instead of on insert change no
-- answer. A batch that holds several windows of an hour (a backlog caught up) writes a row per window; the merges
-- fold them as they fold the rows of separate batches today.
--
-- Apply this migration while no sink writes (fleetprof applies migrations before it starts one), as 0010 and 0015:
-- a batch inserted between a DROP and its CREATE would be missing from its rollup.
DROP VIEW IF EXISTS cpu_samples_1h_mv;

CREATE MATERIALIZED VIEW IF NOT EXISTS cpu_samples_1h_mv TO cpu_samples_1h AS
SELECT toStartOfHour(ts, 'UTC') AS hour, node, pid, comm, container_id, stack_id, identity, count
FROM cpu_samples;

DROP VIEW IF EXISTS gpu_kernel_samples_1h_mv;

CREATE MATERIALIZED VIEW IF NOT EXISTS gpu_kernel_samples_1h_mv TO gpu_kernel_samples_1h AS
SELECT toStartOfHour(ts, 'UTC') AS hour, node, pid, comm, container_id, device, stream, stack_id, kernel_name,
       nvtx_range, identity, duration_ns, launches
FROM gpu_kernel_samples;
