-- The GPU timeline's records: every sampled kernel, copy and set (gpu_timeline, migration 0014) that overlaps
-- [since, until) (to the microsecond; start_ns and end_ns are Unix ns), optionally of one node / pid ('' and 0 mean
-- "all"). The timeline queries include it (`-- @include timeline_records`), so they read one set of records. ts
-- prunes the daily partitions, with 10 minutes to spare either side, since ts is the record's sample window, not its
-- start; the sorting key (node, device, stream, start_ns) narrows a node's read to the range's granules.
-- collectives: 'all' (the default), 'hide' or 'only' NCCL's kernels, as in gpu_kernel_samples_by_stack (copies and
-- sets are never NCCL's), so the timeline shows what the GPU flame graph shows; so do what ('all', 'kernels' or
-- 'copies': the MEMCPY and MEMSET records) and nvtx_range (the rule of gpu_kernel_samples_by_stack).
-- The columns named, not *: end_ns is an ALIAS (start_ns + duration_ns, migration 0020), which * leaves out.
-- @default node =
-- @default pid = 0
-- @default collectives = all
-- @default what = all
-- @default nvtx_range =
-- @default namespace =
-- @default pod =
-- @default job =
-- @default container =
SELECT ts, node, pid, comm, device, stream, start_ns, end_ns, activity, name, stack_id, weight, bytes, nvtx_range,
       graph_id, graph_node_id, correlation_id, identity
FROM gpu_timeline
WHERE ts >= {since:DateTime64(6)} - INTERVAL 10 MINUTE AND ts < {until:DateTime64(6)} + INTERVAL 10 MINUTE
  AND start_ns < toUnixTimestamp64Nano({until:DateTime64(6)})
  AND end_ns > toUnixTimestamp64Nano({since:DateTime64(6)})
  AND ({node:String} = '' OR node = {node:String})
  -- @include workload_filter
  AND ({pid:UInt32} = 0 OR pid = {pid:UInt32})
  AND ({collectives:String} = 'all' OR match(name, (
          -- @include nccl_kernel_pattern
      )) = ({collectives:String} = 'only'))
  AND ({what:String} = 'all' OR (activity != 'KERNEL') = ({what:String} = 'copies'))
  -- @include nvtx_range_filter
