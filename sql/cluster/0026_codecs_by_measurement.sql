-- Generated from sql/migrations/0026_codecs_by_measurement.sql by `python -m fleetprof.cluster_sql`: do not edit.
-- The migration says why the columns, codecs, keys, partitions, TTL and settings are what they are;
-- sql/cluster/README.md says how a cluster differs from one node.
ALTER TABLE cpu_samples_local ON CLUSTER '{cluster}'
    MODIFY COLUMN pid CODEC(ZSTD(1));

ALTER TABLE gpu_kernel_samples_local ON CLUSTER '{cluster}'
    MODIFY COLUMN pid CODEC(ZSTD(1));

ALTER TABLE gpu_timeline_local ON CLUSTER '{cluster}'
    MODIFY COLUMN pid CODEC(ZSTD(1)),
    MODIFY COLUMN start_ns CODEC(Delta(8), T64, ZSTD(1)),
    MODIFY COLUMN correlation_id CODEC(Delta(4), T64, ZSTD(1));

ALTER TABLE gpu_device_metrics_local ON CLUSTER '{cluster}'
    MODIFY COLUMN gpu_util_pct CODEC(ZSTD(1)),
    MODIFY COLUMN mem_util_pct CODEC(ZSTD(1)),
    MODIFY COLUMN mem_used_bytes CODEC(GCD, T64, ZSTD(1)),
    MODIFY COLUMN power_mw CODEC(T64, ZSTD(1)),
    MODIFY COLUMN temperature_c CODEC(ZSTD(1));

ALTER TABLE gpu_process_metrics_local ON CLUSTER '{cluster}'
    MODIFY COLUMN pid CODEC(ZSTD(1)),
    MODIFY COLUMN sm_util_pct CODEC(ZSTD(1)),
    MODIFY COLUMN mem_util_pct CODEC(ZSTD(1)),
    MODIFY COLUMN used_memory_bytes CODEC(GCD, T64, ZSTD(1));

ALTER TABLE gpu_device_metrics_10s_local ON CLUSTER '{cluster}'
    MODIFY COLUMN mem_used_min CODEC(GCD, T64, ZSTD(1)),
    MODIFY COLUMN mem_used_max CODEC(GCD, T64, ZSTD(1)),
    MODIFY COLUMN latest CODEC(GCD, T64, ZSTD(1));

ALTER TABLE gpu_process_metrics_10s_local ON CLUSTER '{cluster}'
    MODIFY COLUMN pid CODEC(ZSTD(1)),
    MODIFY COLUMN used_memory_min CODEC(GCD, T64, ZSTD(1)),
    MODIFY COLUMN used_memory_max CODEC(GCD, T64, ZSTD(1)),
    MODIFY COLUMN latest CODEC(GCD, T64, ZSTD(1));

INSERT INTO schema_migrations (version, name, applied_at) VALUES (26, '0026_codecs_by_measurement', now());
