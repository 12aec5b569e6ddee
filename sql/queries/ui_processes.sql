-- The processes with anything stored in [since, until), for the web UI's process filter, optionally on one node
-- ('' means "all"): per (node, pid), a command name, the CPU samples and the GPU kernel time (ns). GPU rows carry no
-- comm yet, and NVML's process readings have one, so the name is the first non-empty one found. The busiest come
-- first (CPU samples, then GPU time), at most `limit` of them. kernel_thread: pid 0 (the idle task, swapper/N) or a
-- command name the kernel gives its own threads (kworker/*, ksoftirqd/*, migration/*, rcu_*, ...): the store keeps
-- no executable per process, and these are the processes without one; the page lists them as one group.
-- @default until = now
-- @default node =
-- @default limit = 5000
-- @default namespace =
-- @default pod =
-- @default job =
-- @default container =
SELECT node, pid, anyIf(comm, comm != '') AS comm, sum(cpu) AS cpu_samples, sum(gpu) AS gpu_ns,
       pid = 0 OR match(comm, concat('^(kworker/|ksoftirqd/|migration/|rcu_|rcuo|rcub/|cpuhp/|idle_inject/|watchdog',
                                     '|irq/|kswapd|khugepaged|kcompactd|kthreadd$|jbd2/|ksmd$|kauditd$|khungtaskd$',
                                     '|oom_reaper$|kdevtmpfs$|kblockd|scsi_eh_|scsi_tmf_|xfsaild/|nvme-|swapper/',
                                     '|napi/|kintegrityd|kthrotld|writeback$|pool_workqueue|card[0-9]+-crtc)'))
           AS kernel_thread
FROM
(
    SELECT node, pid, toString(comm) AS comm, sum(count) AS cpu, toUInt64(0) AS gpu
    FROM cpu_samples
    WHERE ts >= {since:DateTime64(3)} AND ts < {until:DateTime64(3)} AND ({node:String} = '' OR node = {node:String})
      -- @include workload_filter
    GROUP BY node, pid, comm
    UNION ALL
    SELECT node, pid, toString(comm), toUInt64(0), sum(duration_ns)
    FROM gpu_kernel_samples
    WHERE ts >= {since:DateTime64(3)} AND ts < {until:DateTime64(3)} AND ({node:String} = '' OR node = {node:String})
      -- @include workload_filter
    GROUP BY node, pid, comm
    UNION ALL
    SELECT node, pid, toString(comm), toUInt64(0), toUInt64(0)
    FROM
    (
        -- @include nvml_process_readings
    )
    WHERE ts >= {since:DateTime64(3)} AND ts < {until:DateTime64(3)} AND ({node:String} = '' OR node = {node:String})
      -- @include workload_filter
    GROUP BY node, pid, comm
)
GROUP BY node, pid
ORDER BY cpu_samples DESC, gpu_ns DESC, node, pid
LIMIT {limit:UInt32}
