-- GPU time per NVTX range (one element of a range path, wherever it sits) over [since, until), optionally for one
-- node / pid ('' and 0 mean "all") and under one range (nvtx_range, matched as in gpu_kernel_samples_by_stack; ''
-- means all): one row per node, process (pid, comm) and range name, the biggest total first, with
-- total_ns: the GPU time (kernels, copies and sets: duration x launch weight) launched anywhere under the range: in
--           it or in a range inside it ('forward' in 'step > forward' and 'step > forward > attention'); a range
--           that recurs within one path counts that path once;
-- self_ns:  of that, the time launched while it was the innermost range;
-- launches: sampled launches under it (weights summed); share: total_ns / all the process's GPU time in the range
--           that passes the filters (ranges or none: nested ranges overlap, so shares of one process add up to more).
-- Time outside any range has no row here (gpu_time_by_nvtx_range shows it, path ''). Processes named as there.
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
        SELECT node, pid, comm, toString(nvtx_range) AS path, sum(duration_ns) AS gpu_ns, sum(launches) AS launches
        FROM gpu_kernel_samples
        WHERE ts >= {since:DateTime} AND ts < {until:DateTime}
          AND ({node:String} = '' OR node = {node:String})
          -- @include workload_filter
          AND ({pid:UInt32} = 0 OR pid = {pid:UInt32})
          -- @include nvtx_range_filter
        GROUP BY node, pid, comm, path
    ),
    process_totals AS
    (
        SELECT node, pid, sum(gpu_ns) AS process_ns FROM samples GROUP BY node, pid
    ),
    commands AS
    (
        -- @include busiest_commands
    ),
    elements AS
    (
        SELECT node, pid, comm, range, gpu_ns, launches, range = ranges[-1] AS innermost
        FROM (SELECT *, splitByString(' > ', path) AS ranges FROM samples WHERE path != '')
        ARRAY JOIN arrayDistinct(ranges) AS range
    )
SELECT toString(e.node) AS node, e.pid AS pid, if(e.comm = '', c.comm, toString(e.comm)) AS comm,
       e.range AS nvtx_range, sum(e.gpu_ns) AS total_ns, sumIf(e.gpu_ns, e.innermost) AS self_ns,
       sum(e.launches) AS launches, total_ns / any(t.process_ns) AS share
FROM elements AS e
INNER JOIN process_totals AS t ON t.node = e.node AND t.pid = e.pid
LEFT JOIN commands AS c ON c.node = e.node AND c.pid = e.pid
GROUP BY node, pid, comm, nvtx_range
ORDER BY total_ns DESC, node ASC, pid ASC, comm ASC, nvtx_range ASC
