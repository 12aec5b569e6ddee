-- GPU busy and idle time in [since, until), per GPU (level 'gpu') and per process on each GPU (level 'process'),
-- optionally for one node / GPU index ('' and -1 mean "all"). `fleetprof report cost` prices exactly these numbers.
--
-- Time covered by a reading. NVML readings are point samples, so each stands for a stretch of time:
--   * from its ts to the next reading of the same series (a GPU: node, gpu_index, uuid; a process: node, gpu_index,
--     pid) if that comes within max_gap_s (default 60 s), looked up past until too;
--   * otherwise (the series stopped reporting for longer, or this is its newest reading) for the series' median
--     gap: quantileExact(0.5) of the gaps that follow its readings in the range (a gap that ends past
--     until + max_gap_s is not seen), 0 if it has none (a lone reading covers nothing);
--   * and never more than max_gap_s, nor past until.
--   Only readings with since <= ts < until count, so the time between since and a series' first reading is not
--   covered. A timestamp stored twice in a series is one reading (max of its values).
-- GPU level: physical GPUs only (parent_uuid = ''; NVML gives MIG instances no utilization of their own).
--   covered_s = Σ span of readings with gpu_util_pct not NULL;  busy_s = Σ span × gpu_util_pct / 100;
--   idle_s = covered_s − busy_s;  unknown_s = Σ span of readings whose gpu_util_pct is NULL (not covered).
-- Process level: the process's rows in gpu_process_metrics (NVML lists it on that GPU), with sm_util_pct:
--   covered_s = time present on the GPU with a utilization sample; busy_s = Σ span × sm_util_pct / 100;
--   idle_s = covered_s − busy_s; unknown_s = time present without a sample (sm_util_pct NULL: no new NVML sample
--   in that poll), which is not covered. comm and container_id are the process's newest.
-- Tier (sql/parts/nvml_tier.sql): a range that starts more than 6 h ago reads the 10 s aggregates (migration 0016),
--   one reading per bucket at its first poll with the bucket's mean utilization, standing for the time to the next
--   bucket: for polls evenly spaced within max_gap_s that is the same sum as the 1 s readings' (Σ mean × 10 s =
--   Σ util × 1 s), within the polls' jitter otherwise; readings then counts buckets.
-- readings: the distinct timestamps in the range (NULL ones included). Seconds have millisecond resolution (ts is
-- DateTime64(3)); spans are whole milliseconds, so the sums are exact before the final division.
-- @default until = now
-- @default node =
-- @default gpu = -1
-- @default max_gap_s = 60
WITH
    toInt64(round({max_gap_s:Float64} * 1000)) AS cap_ms,
    device_readings AS
    (
        -- the readings up to until + max_gap_s: those past until only end the spans of the ones before them
        SELECT node, gpu_index, uuid, ts, max(gpu_util_pct) AS util
        FROM
        (
            -- @include nvml_device_readings
        )
        WHERE ts >= {since:DateTime64(3)} AND ts < {until:DateTime64(3)} + toIntervalMillisecond(cap_ms)
          AND parent_uuid = ''
          AND ({node:String} = '' OR node = {node:String})
          AND ({gpu:Int32} < 0 OR gpu_index = {gpu:Int32})
        GROUP BY node, gpu_index, uuid, ts
    ),
    device_gaps AS
    (
        SELECT node, gpu_index, uuid, ts, util,
               dateDiff('millisecond', ts, leadInFrame(toNullable(ts)) OVER (PARTITION BY node, gpu_index, uuid
                   ORDER BY ts ROWS BETWEEN CURRENT ROW AND 1 FOLLOWING)) AS gap_ms
        FROM device_readings
    ),
    device_spans AS
    (
        SELECT node, gpu_index, uuid, util,
               least(if(gap_ms <= cap_ms, assumeNotNull(gap_ms), median_ms), cap_ms,
                     dateDiff('millisecond', ts, {until:DateTime64(3)})) AS span_ms
        FROM
        (
            -- filtered only now, after every reading in range has found its successor
            SELECT *, toInt64(ifNull(quantileExact(0.5)(gap_ms)
                                     OVER (PARTITION BY node, gpu_index, uuid), 0)) AS median_ms
            FROM device_gaps
            WHERE ts < {until:DateTime64(3)}
        )
    ),
    process_readings AS
    (
        SELECT node, gpu_index, pid, ts, max(sm_util_pct) AS util, any(comm) AS comm,
               any(container_id) AS container_id
        FROM
        (
            -- @include nvml_process_readings
        )
        WHERE ts >= {since:DateTime64(3)} AND ts < {until:DateTime64(3)} + toIntervalMillisecond(cap_ms)
          AND ({node:String} = '' OR node = {node:String})
          AND ({gpu:Int32} < 0 OR gpu_index = {gpu:Int32})
        GROUP BY node, gpu_index, pid, ts
    ),
    process_gaps AS
    (
        SELECT node, gpu_index, pid, ts, util, comm, container_id,
               dateDiff('millisecond', ts, leadInFrame(toNullable(ts)) OVER (PARTITION BY node, gpu_index, pid
                   ORDER BY ts ROWS BETWEEN CURRENT ROW AND 1 FOLLOWING)) AS gap_ms
        FROM process_readings
    ),
    process_spans AS
    (
        SELECT node, gpu_index, pid, ts, util, comm, container_id,
               least(if(gap_ms <= cap_ms, assumeNotNull(gap_ms), median_ms), cap_ms,
                     dateDiff('millisecond', ts, {until:DateTime64(3)})) AS span_ms
        FROM
        (
            SELECT *, toInt64(ifNull(quantileExact(0.5)(gap_ms)
                                     OVER (PARTITION BY node, gpu_index, pid), 0)) AS median_ms
            FROM process_gaps
            WHERE ts < {until:DateTime64(3)}
        )
    )
SELECT level, node, gpu_index, uuid, pid, comm, container_id, readings, covered_s, busy_s, idle_s, unknown_s
FROM
(
    SELECT 'gpu' AS level, toString(node) AS node, gpu_index, toString(uuid) AS uuid, toUInt32(0) AS pid,
           '' AS comm, '' AS container_id, count() AS readings,
           sumIf(span_ms, util IS NOT NULL) AS covered_ms,
           sumIf(span_ms * util, util IS NOT NULL) AS busy_pct_ms,
           covered_ms / 1000 AS covered_s,
           busy_pct_ms / 100000 AS busy_s,
           (covered_ms * 100 - busy_pct_ms) / 100000 AS idle_s,
           sumIf(span_ms, util IS NULL) / 1000 AS unknown_s
    FROM device_spans
    GROUP BY node, gpu_index, uuid
    UNION ALL
    SELECT 'process' AS level, toString(node) AS node, gpu_index, '' AS uuid, pid,
           toString(argMax(comm, ts)) AS comm, toString(argMax(container_id, ts)) AS container_id, count() AS readings,
           sumIf(span_ms, util IS NOT NULL) AS covered_ms,
           sumIf(span_ms * util, util IS NOT NULL) AS busy_pct_ms,
           covered_ms / 1000 AS covered_s,
           busy_pct_ms / 100000 AS busy_s,
           (covered_ms * 100 - busy_pct_ms) / 100000 AS idle_s,
           sumIf(span_ms, util IS NULL) / 1000 AS unknown_s
    FROM process_spans
    GROUP BY node, gpu_index, pid
)
ORDER BY node ASC, gpu_index ASC, level ASC, uuid ASC, pid ASC
