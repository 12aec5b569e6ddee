-- Codecs chosen column by column on bench/storage_day.py's merged store (bench/storage_codecs.py: every candidate
-- written and merged in a copy of the table, system.columns read; bench/RESULTS.md): only where one is clearly
-- smaller.
--
-- Why, by kind of column:
--   * pids: a pid repeats for a table's whole run of a process (it is in the sorting key, or follows the node and
--     GPU), and T64 packs each block of values to its widest bit instead of finding the repeats: plain ZSTD stores a
--     run in next to nothing (cpu_samples 0.091 -> 0.005 bytes a row).
--   * the timeline's correlation ids and start times rise within a (node, device, stream): Delta then T64.
--   * memory in bytes moves in 2 MiB allocator pages: GCD finds the step (1.7-2.0 -> 1.4 bytes a reading). Power
--     readings are noise around a level: T64 over the values, not Delta over the noise (2.78 -> 2.26).
--   * percentages (Nullable(UInt8)): ZSTD alone; T64 over one byte only adds its block headers.
--   * the 10 s aggregates' newest reading, a tuple: GCD and T64 on each of its fields (13.6 -> 12.1 bytes a row).
-- All told -0.11 bytes per CPU sample over a day (2.136 -> 2.02). Measured and left: the window tables' ts as GCD,
-- Delta, T64 (cpu_samples 0.93 -> 0.83 bytes a row, -0.03 per CPU sample) made a scan of the windows 13% slower
-- (decoding three codecs instead of one), and the flame graphs of short ranges read the windows.
--
-- How: a codec is metadata: no part is rewritten now. New parts are written with it, and a merge rewrites older
-- parts with it as it merges them, so a store reaches these sizes as its data turns over (30 days at most). Safe to
-- run again. Cluster: the local tables on every node (a Distributed table stores nothing).

ALTER TABLE cpu_samples
    MODIFY COLUMN pid CODEC(ZSTD(1));

ALTER TABLE gpu_kernel_samples
    MODIFY COLUMN pid CODEC(ZSTD(1));

ALTER TABLE gpu_timeline
    MODIFY COLUMN pid CODEC(ZSTD(1)),
    MODIFY COLUMN start_ns CODEC(Delta(8), T64, ZSTD(1)),
    MODIFY COLUMN correlation_id CODEC(Delta(4), T64, ZSTD(1));

ALTER TABLE gpu_device_metrics
    MODIFY COLUMN gpu_util_pct CODEC(ZSTD(1)),
    MODIFY COLUMN mem_util_pct CODEC(ZSTD(1)),
    MODIFY COLUMN mem_used_bytes CODEC(GCD, T64, ZSTD(1)),
    MODIFY COLUMN power_mw CODEC(T64, ZSTD(1)),
    MODIFY COLUMN temperature_c CODEC(ZSTD(1));

ALTER TABLE gpu_process_metrics
    MODIFY COLUMN pid CODEC(ZSTD(1)),
    MODIFY COLUMN sm_util_pct CODEC(ZSTD(1)),
    MODIFY COLUMN mem_util_pct CODEC(ZSTD(1)),
    MODIFY COLUMN used_memory_bytes CODEC(GCD, T64, ZSTD(1));

ALTER TABLE gpu_device_metrics_10s
    MODIFY COLUMN mem_used_min CODEC(GCD, T64, ZSTD(1)),
    MODIFY COLUMN mem_used_max CODEC(GCD, T64, ZSTD(1)),
    MODIFY COLUMN latest CODEC(GCD, T64, ZSTD(1));

ALTER TABLE gpu_process_metrics_10s
    MODIFY COLUMN pid CODEC(ZSTD(1)),
    MODIFY COLUMN used_memory_min CODEC(GCD, T64, ZSTD(1)),
    MODIFY COLUMN used_memory_max CODEC(GCD, T64, ZSTD(1)),
    MODIFY COLUMN latest CODEC(GCD, T64, ZSTD(1));
