-- GPU time in collectives per node and job over [since, until), optionally on one node ('' means "all"): one row per
-- node, process (pid, comm), container_id and NCCL collective with its element type, as nccl_kernels (included below)
-- reads them from the kernel names: gpu_ns (the GPU time of its kernels in ns, kernel duration x launch weight, as the
-- correlator attributes it), launches, and share, its part of all the GPU time of its node in the range (every
-- kernel's, collectives or not). collective is '' for NCCL's generic kernels (ncclDevKernel_Generic...), whose names
-- say no collective; dtype is '' where the name says no type (copies: AllGather, Broadcast, SendRecv).
-- The job: workloads carry no job identity yet (issue 17), so the container id and the process's command stand for
-- it. GPU rows carry no comm yet either: a process without one is named by the command the CPU sampler saw it run most
-- in the range ('' when never sampled on CPU), as the GPU flame graphs name it.
-- Summed because SummingMergeTree rows of one key may not be merged yet. Kernels on concurrent streams each count
-- their own time, so a node's collectives can take more GPU time than the range is long.
-- @default until = now
-- @default node =
-- @default namespace =
-- @default pod =
-- @default job =
-- @default container =
WITH
    nccl AS
    (
        -- @include nccl_kernels
    ),
    samples AS
    (
        SELECT node, pid, comm, container_id, toString(kernel_name) AS kernel_name, sum(duration_ns) AS gpu_ns,
               sum(launches) AS launches
        FROM gpu_kernel_samples
        WHERE ts >= {since:DateTime} AND ts < {until:DateTime}
          AND ({node:String} = '' OR node = {node:String})
          -- @include workload_filter
        GROUP BY node, pid, comm, container_id, kernel_name
    ),
    node_totals AS
    (
        SELECT node, sum(gpu_ns) AS node_gpu_ns FROM samples GROUP BY node
    ),
    commands AS
    (
        -- @include busiest_commands
    )
SELECT toString(s.node) AS node, s.pid AS pid, if(s.comm = '', c.comm, toString(s.comm)) AS comm,
       toString(s.container_id) AS container_id, k.collective AS collective, k.dtype AS dtype,
       sum(s.gpu_ns) AS gpu_ns, sum(s.launches) AS launches, gpu_ns / any(t.node_gpu_ns) AS share
FROM samples AS s
INNER JOIN nccl AS k ON k.kernel_name = s.kernel_name
INNER JOIN node_totals AS t ON t.node = s.node
-- a LEFT JOIN fills a process never sampled on CPU with '' (join_use_nulls is off)
LEFT JOIN commands AS c ON c.node = s.node AND c.pid = s.pid
GROUP BY node, pid, comm, container_id, collective, dtype
ORDER BY gpu_ns DESC, node ASC, pid ASC, comm ASC, container_id ASC, collective ASC, dtype ASC
