-- GPU time per NVTX range path over [since, until), optionally for one node / pid ('' and 0 mean "all") and under one
-- range (nvtx_range, matched as in gpu_kernel_samples_by_stack; '' means all): one row per node, process (pid, comm)
-- and range path (the launching thread's innermost NVTX range path, the outermost range first, ' > ' between them;
-- '' for time launched outside any range), the biggest first, with
-- gpu_ns (kernels', copies' and sets' GPU time: duration x launch weight), kernel_ns and copy_ns (copies and sets,
-- '[memcpy …]' / '[memset]'), launches (sampled launches, weights summed) and share: its part of the process's GPU
-- time in the range that passes the filters. Time per range element (all the time under `forward`, wherever it sits
-- in the path): gpu_time_by_nvtx_element.
-- GPU rows carry no comm yet: a process without one is named by the command the CPU sampler saw it run most in the
-- range ('' when never sampled on CPU), as gpu_collectives names it. Summed, as SummingMergeTree rows of one key may
-- not be merged yet.
-- @default until = now
-- @default node =
-- @default pid = 0
-- @default nvtx_range =
-- @default namespace =
-- @default pod =
-- @default job =
-- @default container =
WITH
    samples AS
    (
        SELECT node, pid, comm, toString(nvtx_range) AS path,
               sum(duration_ns) AS gpu_ns,
               sumIf(duration_ns, NOT (startsWith(kernel_name, '[memcpy ') OR startsWith(kernel_name, '[memset')))
                   AS kernel_ns,
               sum(launches) AS launches
        FROM gpu_kernel_samples
        WHERE ts >= {since:DateTime} AND ts < {until:DateTime}
          AND ({node:String} = '' OR node = {node:String})
          -- @include workload_filter
          AND ({pid:UInt32} = 0 OR pid = {pid:UInt32})
          -- @include nvtx_range_filter
        GROUP BY node, pid, comm, path
    ),
    commands AS
    (
        -- @include busiest_commands
    ),
    named AS
    (
        -- a LEFT JOIN fills a process never sampled on CPU with '' (join_use_nulls is off)
        SELECT toString(s.node) AS node, s.pid AS pid, if(s.comm = '', c.comm, toString(s.comm)) AS comm,
               s.path AS path, s.gpu_ns AS gpu_ns, s.kernel_ns AS kernel_ns, s.launches AS launches
        FROM samples AS s
        LEFT JOIN commands AS c ON c.node = s.node AND c.pid = s.pid
    )
SELECT node, pid, comm, path AS nvtx_range, sum(gpu_ns) AS gpu_ns, sum(kernel_ns) AS kernel_ns,
       gpu_ns - kernel_ns AS copy_ns, sum(launches) AS launches,
       gpu_ns / sum(gpu_ns) OVER (PARTITION BY node, pid) AS share
FROM named
GROUP BY node, pid, comm, path
ORDER BY gpu_ns DESC, node ASC, pid ASC, comm ASC, nvtx_range ASC
