-- CPU samples per node in [since, until), with the same optional filters as top_functions_cpu ('' and 0 mean
-- "all"): the denominator for a function's share. Summed because SummingMergeTree rows may not be merged yet.
-- @default until = now
-- @default node =
-- @default pid = 0
-- @default comm =
-- @default namespace =
-- @default pod =
-- @default job =
-- @default container =
SELECT node, sum(count) AS samples
FROM cpu_samples
WHERE ts >= {since:DateTime} AND ts < {until:DateTime}
  AND ({node:String} = '' OR node = {node:String})
  -- @include workload_filter
  AND ({pid:UInt32} = 0 OR pid = {pid:UInt32})
  AND ({comm:String} = '' OR comm = {comm:String})
GROUP BY node
ORDER BY node
