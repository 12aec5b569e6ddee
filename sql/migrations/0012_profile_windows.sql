-- One row per node, window and kind of profile data the sink stored (cpu: symbolized CPU samples; gpu: GPU kernel
-- time by launching stack), saying where the data came from: whether its source was simulated (`fleetprof loadgen`'s
-- fleet, the simulated GPU library behind the USDT probes) and, for CPU samples, the sampling frequency of the agent
-- that took them. Labels follow the data: the CLI, the web UI, the cost report and the exports say "simulated" for a
-- (kind, node) whose windows in the range say so, and only then (NVML readings carry their own `simulated` column in
-- gpu_device_metrics / gpu_process_metrics). pprof's period (ns between samples) comes from frequency_hz.
--
-- Engine: ReplacingMergeTree keyed by (kind, node, ts): a window's rows are identical however often a record is
-- split, re-sent or re-written after a crash, so duplicates collapse on merge and queries read DISTINCT anyway.
-- Rows: one per node and 10 s window and kind, against hundreds of sample rows per window; the TTL is the samples'.
-- @cluster sharded by cityHash64(node)
CREATE TABLE IF NOT EXISTS profile_windows
(
    ts           DateTime               CODEC(DoubleDelta, ZSTD(1)),
    node         LowCardinality(String) CODEC(ZSTD(1)),
    kind         LowCardinality(String) CODEC(ZSTD(1)),
    simulated    Bool                   CODEC(ZSTD(1)),
    frequency_hz UInt32                 CODEC(T64, ZSTD(1))
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(ts)
ORDER BY (kind, node, ts)
TTL ts + INTERVAL 30 DAY
SETTINGS ttl_only_drop_parts = 1;
