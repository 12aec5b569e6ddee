-- Generated from sql/migrations/0015_workload_identity.sql by `python -m fleetprof.cluster_sql`: do not edit.
-- The migration says why the columns, codecs, keys, partitions, TTL and settings are what they are;
-- sql/cluster/README.md says how a cluster differs from one node.
ALTER TABLE cpu_samples_local ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS identity LowCardinality(String) CODEC(ZSTD(1)),
    MODIFY ORDER BY (node, ts, pid, comm, container_id, stack_id, identity);

ALTER TABLE cpu_samples ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS identity LowCardinality(String);

ALTER TABLE cpu_samples_1h_local ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS identity LowCardinality(String) CODEC(ZSTD(1)),
    MODIFY ORDER BY (node, hour, pid, comm, container_id, stack_id, identity);

ALTER TABLE cpu_samples_1h ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS identity LowCardinality(String);

DROP VIEW IF EXISTS cpu_samples_1h_mv ON CLUSTER '{cluster}';

CREATE MATERIALIZED VIEW IF NOT EXISTS cpu_samples_1h_mv ON CLUSTER '{cluster}' TO cpu_samples_1h_local AS
SELECT toStartOfHour(ts, 'UTC') AS hour, node, pid, comm, container_id, stack_id, identity, sum(count) AS count
FROM cpu_samples_local
GROUP BY hour, node, pid, comm, container_id, stack_id, identity;

ALTER TABLE gpu_kernel_samples_local ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS identity LowCardinality(String) CODEC(ZSTD(1)),
    MODIFY ORDER BY (node, ts, pid, comm, container_id, device, stream, stack_id, kernel_name, nvtx_range, identity);

ALTER TABLE gpu_kernel_samples ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS identity LowCardinality(String);

ALTER TABLE gpu_kernel_samples_1h_local ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS identity LowCardinality(String) CODEC(ZSTD(1)),
    MODIFY ORDER BY (node, hour, pid, comm, container_id, device, stream, stack_id, kernel_name, nvtx_range, identity);

ALTER TABLE gpu_kernel_samples_1h ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS identity LowCardinality(String);

DROP VIEW IF EXISTS gpu_kernel_samples_1h_mv ON CLUSTER '{cluster}';

CREATE MATERIALIZED VIEW IF NOT EXISTS gpu_kernel_samples_1h_mv ON CLUSTER '{cluster}' TO gpu_kernel_samples_1h_local AS
SELECT toStartOfHour(ts, 'UTC') AS hour, node, pid, comm, container_id, device, stream, stack_id, kernel_name,
       nvtx_range, identity, sum(duration_ns) AS duration_ns, sum(launches) AS launches
FROM gpu_kernel_samples_local
GROUP BY hour, node, pid, comm, container_id, device, stream, stack_id, kernel_name, nvtx_range, identity;

ALTER TABLE gpu_copy_samples_local ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS identity LowCardinality(String) CODEC(ZSTD(1)),
    MODIFY ORDER BY (node, ts, pid, comm, container_id, device, stream, stack_id, kernel_name, memory_kinds, nvtx_range, identity);

ALTER TABLE gpu_copy_samples ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS identity LowCardinality(String);

ALTER TABLE gpu_timeline_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS identity LowCardinality(String) CODEC(ZSTD(1));

ALTER TABLE gpu_timeline ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS identity LowCardinality(String);

ALTER TABLE gpu_device_metrics_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS identity LowCardinality(String) CODEC(ZSTD(1));

ALTER TABLE gpu_device_metrics ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS identity LowCardinality(String);

ALTER TABLE gpu_process_metrics_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS identity LowCardinality(String) CODEC(ZSTD(1));

ALTER TABLE gpu_process_metrics ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS identity LowCardinality(String);

-- Cluster: sharded by identity and read through its Distributed table, like stacks: a query's IN subquery over it
-- reads every shard's few rows.
CREATE TABLE IF NOT EXISTS workload_identities_local ON CLUSTER '{cluster}'
(
    identity            String                 CODEC(ZSTD(1)),
    node                LowCardinality(String) CODEC(ZSTD(1)),
    updated             DateTime64(3)          CODEC(ZSTD(1)),
    kind                LowCardinality(String) CODEC(ZSTD(1)),
    container_runtime   LowCardinality(String) CODEC(ZSTD(1)),
    container_id        String                 CODEC(ZSTD(1)),
    container_name      LowCardinality(String) CODEC(ZSTD(1)),
    pod_name            String                 CODEC(ZSTD(1)),
    namespace           LowCardinality(String) CODEC(ZSTD(1)),
    pod_uid             String                 CODEC(ZSTD(1)),
    labels              Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    slurm_job_id        String                 CODEC(ZSTD(1)),
    slurm_step          LowCardinality(String) CODEC(ZSTD(1)),
    slurm_user          LowCardinality(String) CODEC(ZSTD(1)),
    slurm_array_job_id  String                 CODEC(ZSTD(1)),
    slurm_array_task_id String                 CODEC(ZSTD(1)),
    slurm_account       LowCardinality(String) CODEC(ZSTD(1)),
    systemd_unit        LowCardinality(String) CODEC(ZSTD(1)),
    team                LowCardinality(String) CODEC(ZSTD(1)),
    simulated           Bool                   CODEC(ZSTD(1))
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/workload_identities_local', '{replica}',
                                      updated)
ORDER BY identity
TTL toDateTime(updated) + INTERVAL 90 DAY;

CREATE TABLE IF NOT EXISTS workload_identities ON CLUSTER '{cluster}'
(
    identity            String,
    node                LowCardinality(String),
    updated             DateTime64(3),
    kind                LowCardinality(String),
    container_runtime   LowCardinality(String),
    container_id        String,
    container_name      LowCardinality(String),
    pod_name            String,
    namespace           LowCardinality(String),
    pod_uid             String,
    labels              Map(LowCardinality(String), String),
    slurm_job_id        String,
    slurm_step          LowCardinality(String),
    slurm_user          LowCardinality(String),
    slurm_array_job_id  String,
    slurm_array_task_id String,
    slurm_account       LowCardinality(String),
    systemd_unit        LowCardinality(String),
    team                LowCardinality(String),
    simulated           Bool
)
ENGINE = Distributed('{cluster}', currentDatabase(), workload_identities_local, cityHash64(identity));

INSERT INTO schema_migrations (version, name, applied_at) VALUES (15, '0015_workload_identity', now());
