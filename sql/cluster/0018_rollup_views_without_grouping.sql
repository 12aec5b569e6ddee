-- Generated from sql/migrations/0018_rollup_views_without_grouping.sql by `python -m fleetprof.cluster_sql`: do not edit.
-- The migration says why the columns, codecs, keys, partitions, TTL and settings are what they are;
-- sql/cluster/README.md says how a cluster differs from one node.
DROP VIEW IF EXISTS cpu_samples_1h_mv ON CLUSTER '{cluster}';

CREATE MATERIALIZED VIEW IF NOT EXISTS cpu_samples_1h_mv ON CLUSTER '{cluster}' TO cpu_samples_1h_local AS
SELECT toStartOfHour(ts, 'UTC') AS hour, node, pid, comm, container_id, stack_id, identity, count
FROM cpu_samples_local;

DROP VIEW IF EXISTS gpu_kernel_samples_1h_mv ON CLUSTER '{cluster}';

CREATE MATERIALIZED VIEW IF NOT EXISTS gpu_kernel_samples_1h_mv ON CLUSTER '{cluster}' TO gpu_kernel_samples_1h_local AS
SELECT toStartOfHour(ts, 'UTC') AS hour, node, pid, comm, container_id, device, stream, stack_id, kernel_name,
       nvtx_range, identity, duration_ns, launches
FROM gpu_kernel_samples_local;

INSERT INTO schema_migrations (version, name, applied_at) VALUES (18, '0018_rollup_views_without_grouping', now());
