-- The distribution of NVML's gpu_util_pct per node and GPU in [since, until), optionally for one node / GPU index
-- ('' and -1 mean "all"). Physical GPUs only (parent_uuid = ''), as in gpu_idle_time.
-- readings:      readings with a utilization value (NULL ones are left out of every column but none);
-- min, max:      the extremes (past the 1 s tier, of every reading the 10 s aggregates saw); mean: the plain mean
--                of the readings (not weighted by the time between them);
-- p50, p90, p99: exact quantiles without interpolation (quantileExact): the reading at 0-based position ⌊q·n⌋ of
--                the n readings sorted, so always a value that was read (past the 1 s tier: of the 10 s buckets'
--                means, sql/parts/nvml_device_readings.sql);
-- mem_util_mean: the mean of the non-NULL mem_util_pct readings of the same timestamps (NULL if none).
-- A timestamp stored twice for one GPU is one reading (the max of its values), as in gpu_idle_time. GPUs without a
-- utilization reading in the range are left out.
-- @default until = now
-- @default node =
-- @default gpu = -1
-- @default namespace =
-- @default pod =
-- @default job =
-- @default container =
WITH
    readings AS
    (
        SELECT node, gpu_index, uuid, ts, any(name) AS name, max(gpu_util_pct) AS util, max(mem_util_pct) AS mem,
               min(gpu_util_lo) AS lo, max(gpu_util_hi) AS hi
        FROM
        (
            -- @include nvml_device_readings
        )
        WHERE ts >= {since:DateTime64(3)} AND ts < {until:DateTime64(3)}
          AND parent_uuid = ''
          AND ({node:String} = '' OR node = {node:String})
          -- @include workload_device_filter
          AND ({gpu:Int32} < 0 OR gpu_index = {gpu:Int32})
        GROUP BY node, gpu_index, uuid, ts
    )
SELECT
    toString(node) AS node,
    gpu_index,
    toString(uuid) AS uuid,
    toString(any(name)) AS name,
    count() AS readings,
    min(assumeNotNull(lo)) AS min,
    avg(util) AS mean,
    quantileExact(0.5)(assumeNotNull(util)) AS p50,
    quantileExact(0.9)(assumeNotNull(util)) AS p90,
    quantileExact(0.99)(assumeNotNull(util)) AS p99,
    max(assumeNotNull(hi)) AS max,
    avg(mem) AS mem_util_mean
FROM readings
WHERE util IS NOT NULL
GROUP BY node, gpu_index, uuid
ORDER BY node ASC, gpu_index ASC, uuid ASC
