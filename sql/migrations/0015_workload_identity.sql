-- Workload identity: who each sample, GPU reading and timeline bar belongs to (a Kubernetes pod's container, a Slurm
-- job step, a plain container, a systemd unit, the host).
--
-- The sample tables carry `identity`, the identity id in 16 hex digits ('' when none was known: an old agent, a
-- process gone before it was read), a LowCardinality key: a node runs tens to hundreds of workloads, so the column
-- is a dictionary of that many strings and an index stream that ZSTD folds to almost nothing within one process's
-- rows. The fields behind an id live once in workload_identities, the dimension table: queries filter and group with
-- `identity IN (SELECT identity FROM workload_identities WHERE namespace = …)` or a join on it.
--
-- On the summing tables the column ends the sorting key (added in the same ALTER as the column: metadata only, no
-- part rewritten; existing rows read ''), so rows of two identities of one process (the kubelet answered later and
-- the pod's name made a new id) never sum into one. The hourly views are recreated with the column: apply this
-- migration while no sink writes (fleetprof applies migrations before it starts one), as for 0010 and 0014.
-- On the NVML tables a device row's identity is the pod that holds the GPU (kubelet pod-resources), so a GPU's idle
-- time and cost belong to it even while none of its processes runs there; a process row's is the process's.
ALTER TABLE cpu_samples
    ADD COLUMN IF NOT EXISTS identity LowCardinality(String) CODEC(ZSTD(1)),
    MODIFY ORDER BY (node, ts, pid, comm, container_id, stack_id, identity);

ALTER TABLE cpu_samples_1h
    ADD COLUMN IF NOT EXISTS identity LowCardinality(String) CODEC(ZSTD(1)),
    MODIFY ORDER BY (node, hour, pid, comm, container_id, stack_id, identity);

DROP VIEW IF EXISTS cpu_samples_1h_mv;

CREATE MATERIALIZED VIEW IF NOT EXISTS cpu_samples_1h_mv TO cpu_samples_1h AS
SELECT toStartOfHour(ts, 'UTC') AS hour, node, pid, comm, container_id, stack_id, identity, sum(count) AS count
FROM cpu_samples
GROUP BY hour, node, pid, comm, container_id, stack_id, identity;

ALTER TABLE gpu_kernel_samples
    ADD COLUMN IF NOT EXISTS identity LowCardinality(String) CODEC(ZSTD(1)),
    MODIFY ORDER BY (node, ts, pid, comm, container_id, device, stream, stack_id, kernel_name, nvtx_range, identity);

ALTER TABLE gpu_kernel_samples_1h
    ADD COLUMN IF NOT EXISTS identity LowCardinality(String) CODEC(ZSTD(1)),
    MODIFY ORDER BY (node, hour, pid, comm, container_id, device, stream, stack_id, kernel_name, nvtx_range, identity);

DROP VIEW IF EXISTS gpu_kernel_samples_1h_mv;

CREATE MATERIALIZED VIEW IF NOT EXISTS gpu_kernel_samples_1h_mv TO gpu_kernel_samples_1h AS
SELECT toStartOfHour(ts, 'UTC') AS hour, node, pid, comm, container_id, device, stream, stack_id, kernel_name,
       nvtx_range, identity, sum(duration_ns) AS duration_ns, sum(launches) AS launches
FROM gpu_kernel_samples
GROUP BY hour, node, pid, comm, container_id, device, stream, stack_id, kernel_name, nvtx_range, identity;

ALTER TABLE gpu_copy_samples
    ADD COLUMN IF NOT EXISTS identity LowCardinality(String) CODEC(ZSTD(1)),
    MODIFY ORDER BY (node, ts, pid, comm, container_id, device, stream, stack_id, kernel_name, memory_kinds, nvtx_range, identity);

ALTER TABLE gpu_timeline ADD COLUMN IF NOT EXISTS identity LowCardinality(String) CODEC(ZSTD(1));

ALTER TABLE gpu_device_metrics ADD COLUMN IF NOT EXISTS identity LowCardinality(String) CODEC(ZSTD(1));

ALTER TABLE gpu_process_metrics ADD COLUMN IF NOT EXISTS identity LowCardinality(String) CODEC(ZSTD(1));

-- The dimension table: one row per identity id (WorkloadIdentity records from the compacted `identities` topic; a
-- re-sent definition replaces the row, the definition never changes for an id). Small: a node's workloads over the
-- retention. Kept 90 days after it was last sent (agents send an id again after they restart), like stacks (0002).
-- labels holds only the allow-listed pod labels (the agent cuts values at a length).
-- Cluster: sharded by identity and read through its Distributed table, like stacks: a query's IN subquery over it
-- reads every shard's few rows.
-- @cluster sharded by cityHash64(identity)
CREATE TABLE IF NOT EXISTS workload_identities
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
ENGINE = ReplacingMergeTree(updated)
ORDER BY identity
TTL toDateTime(updated) + INTERVAL 90 DAY;
