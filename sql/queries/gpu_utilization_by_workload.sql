-- GPU utilization and idle time per workload in [since, until): the GPU-hours of each physical GPU (parent_uuid = '')
-- given to the workload that had it, grouped by {by} (namespace, pod, job, team or container: workload_keys says what
-- each reads), optionally for one node / GPU index ('' and -1 mean "all") and for the workloads that the filters
-- namespace, pod, job and container pick (workload_match; '' = no filter).
-- Who has a GPU at a reading: the pod that holds it (the device row's identity, from the kubelet's pod-resources),
-- else the workloads of the processes that the same NVML poll listed on that GPU (gpu_process_metrics rows of the same
-- node, GPU index and poll: nvml_poll_key; past the 1 s tier, of the same 10 s bucket), the reading's time split
-- evenly between them, else nobody: workload '' ("unattributed", as are readings whose owner has no such field, and
-- every reading of an agent older than identities).
-- Time covered by a reading, busy and idle: exactly gpu_idle_time's GPU level (a reading stands for the time to the
-- next one of its GPU within max_gap_s, else the GPU's median gap, never more than max_gap_s nor past until):
--   covered_s = Σ span of readings with gpu_util_pct;  busy_s = Σ span × gpu_util_pct / 100;  idle_s = covered − busy;
--   unknown_s = Σ span of readings without gpu_util_pct;  mean_util_pct = 100 × busy_s / covered_s (NULL when 0);
--   gpus = distinct (node, uuid) the workload had;  readings = the readings it had (a shared one counts for each).
-- The sums of all workloads are gpu_idle_time's GPU-level sums over the same GPUs.
-- @default until = now
-- @default node =
-- @default gpu = -1
-- @default max_gap_s = 60
-- @default by = pod
-- @default namespace =
-- @default pod =
-- @default job =
-- @default container =
WITH
    toInt64(round({max_gap_s:Float64} * 1000)) AS cap_ms,
    device_readings AS
    (
        -- the readings up to until + max_gap_s: those past until only end the spans of the ones before them
        SELECT node, gpu_index, uuid, ts, max(gpu_util_pct) AS util, max(toString(identity)) AS holder
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
    device_spans AS
    (
        SELECT node, gpu_index, uuid, ts, util, holder,
               least(if(gap_ms <= cap_ms, assumeNotNull(gap_ms), median_ms), cap_ms,
                     dateDiff('millisecond', ts, {until:DateTime64(3)})) AS span_ms
        FROM
        (
            -- filtered only now, after every reading in range has found its successor
            SELECT *, toInt64(ifNull(quantileExact(0.5)(gap_ms)
                                     OVER (PARTITION BY node, gpu_index, uuid), 0)) AS median_ms
            FROM
            (
                SELECT node, gpu_index, uuid, ts, util, holder,
                       dateDiff('millisecond', ts, leadInFrame(toNullable(ts)) OVER (PARTITION BY node, gpu_index, uuid
                           ORDER BY ts ROWS BETWEEN CURRENT ROW AND 1 FOLLOWING)) AS gap_ms
                FROM device_readings
            )
            WHERE ts < {until:DateTime64(3)}
        )
    ),
    process_owners AS
    (
        -- the workloads of the processes each poll listed on a GPU
        SELECT node, gpu_index,
               -- @include nvml_poll_key
               AS poll, arraySort(groupUniqArray(toString(identity))) AS identities
        FROM
        (
            -- @include nvml_process_readings
        )
        WHERE ts >= {since:DateTime64(3)} AND ts < {until:DateTime64(3)} AND identity != ''
          AND ({node:String} = '' OR node = {node:String})
          AND ({gpu:Int32} < 0 OR gpu_index = {gpu:Int32})
        GROUP BY node, gpu_index, poll
    ),
    shares AS
    (
        SELECT s.node AS node, s.uuid AS uuid, s.util AS util, s.span_ms AS span_ms, owner,
               1 / length(owned) AS share
        FROM
        (
            -- a LEFT JOIN fills a reading without listed processes with [] (join_use_nulls is off)
            SELECT d.node AS node, d.uuid AS uuid, d.util AS util, d.span_ms AS span_ms,
                   if(d.holder != '', [d.holder], if(empty(p.identities), [''], p.identities)) AS owned
            FROM
            (
                SELECT *,
                       -- @include nvml_poll_key
                       AS poll
                FROM device_spans
            ) AS d
            LEFT JOIN process_owners AS p ON p.node = d.node AND p.gpu_index = d.gpu_index AND p.poll = d.poll
        ) AS s
        ARRAY JOIN owned AS owner
    ),
    owners AS
    (
        SELECT * FROM shares
        WHERE ({namespace:String} = '' AND {pod:String} = '' AND {job:String} = '' AND {container:String} = '')
           OR owner IN (
            -- @include workload_match
           )
    ),
    keys AS
    (
        -- @include workload_keys
    )
SELECT workload, uniqExact(o.node, o.uuid) AS gpus, count() AS readings,
       sumIf(o.span_ms * o.share, o.util IS NOT NULL) / 1000 AS covered_s,
       sumIf(o.span_ms * o.share * o.util, o.util IS NOT NULL) / 100000 AS busy_s,
       covered_s - busy_s AS idle_s,
       sumIf(o.span_ms * o.share, o.util IS NULL) / 1000 AS unknown_s,
       if(covered_s = 0, NULL, 100 * busy_s / covered_s) AS mean_util_pct
FROM owners AS o
-- a LEFT JOIN fills an owner without a definition ('' among them) with '' (join_use_nulls is off)
LEFT JOIN keys AS k ON k.identity = o.owner
GROUP BY k.workload AS workload
ORDER BY covered_s DESC, workload ASC
