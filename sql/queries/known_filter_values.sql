-- The values the filters of `fleetprof query` can take in [since, until), busiest first, for the message of a filter
-- that matched nothing ("no node 'x' in this range (known: n1, n2)"). source picks the data: 'cpu' (CPU samples; busy
-- = samples), 'gpu' (GPU kernel time; busy = ns) or 'nvml' (NVML readings per device and per process; busy =
-- readings). field: node (every node in the range), and on the given node only ('' = all) pid and comm (a GPU
-- process's comm is also the one the CPU sampler saw it under, as top_kernels_gpu matches it) and gpu (the GPU
-- indexes NVML reported). value_count: how many values the field has in all; at most {limit} rows per field come
-- back, but the given value of a field (node, pid, comm, gpu; '', 0 and -1 mean none) comes first where it is there,
-- so whether it is there is answered whatever the limit. The sample tables are SummingMergeTrees: busy is summed.
-- @default source = cpu
-- @default until = now
-- @default node =
-- @default pid = 0
-- @default comm =
-- @default gpu = -1
-- @default limit = 20
WITH
    activity AS
    (
        SELECT node, toString(pid) AS pid, comm, '' AS gpu, sum(count) AS busy
        FROM cpu_samples
        WHERE {source:String} = 'cpu' AND ts >= {since:DateTime64(3)} AND ts < {until:DateTime64(3)}
        GROUP BY node, pid, comm
        UNION ALL
        SELECT g.node, toString(g.pid), if(g.comm != '', g.comm, c.comm), '', g.busy
        FROM
        (
            SELECT node, pid, comm, sum(duration_ns) AS busy
            FROM gpu_kernel_samples
            WHERE {source:String} = 'gpu' AND ts >= {since:DateTime64(3)} AND ts < {until:DateTime64(3)}
            GROUP BY node, pid, comm
        ) AS g
        LEFT JOIN
        (
            SELECT node, pid, any(comm) AS comm
            FROM cpu_samples
            WHERE {source:String} = 'gpu' AND ts >= {since:DateTime64(3)} AND ts < {until:DateTime64(3)}
            GROUP BY node, pid
        ) AS c ON g.node = c.node AND g.pid = c.pid
        UNION ALL
        SELECT node, '', '', toString(gpu_index), count()
        FROM
        (
            -- @include nvml_device_readings
        )
        WHERE {source:String} = 'nvml' AND ts >= {since:DateTime64(3)} AND ts < {until:DateTime64(3)}
        GROUP BY node, gpu_index
        UNION ALL
        SELECT node, toString(pid), comm, toString(gpu_index), count()
        FROM
        (
            -- @include nvml_process_readings
        )
        WHERE {source:String} = 'nvml' AND ts >= {since:DateTime64(3)} AND ts < {until:DateTime64(3)}
        GROUP BY node, pid, comm, gpu_index
    )
SELECT field, value, busy, value_count
FROM
(
    SELECT field, value, sum(busy) AS busy, count() OVER (PARTITION BY field) AS value_count
    FROM activity
    ARRAY JOIN ['node', 'pid', 'comm', 'gpu'] AS field, [toString(node), pid, comm, gpu] AS value
    WHERE value != '' AND (field = 'node' OR {node:String} = '' OR node = {node:String})
    GROUP BY field, value
)
ORDER BY field,
         value = multiIf(field = 'node', {node:String}, field = 'pid', toString({pid:UInt32}),
                         field = 'comm', {comm:String}, toString({gpu:Int32})) DESC,
         busy DESC, value
LIMIT {limit:UInt32} BY field
