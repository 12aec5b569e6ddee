-- GPU time per kernel in [since, until), optionally for one node ('' means "all"), for `fleetprof report cost`:
-- kernel (gpu_kernel_samples.kernel_name), gpu_ns (its summed GPU time in ns: kernel duration x launch weight, as
-- the correlator attributes it) and launches; every kernel, most GPU time first, ties by name. Summed because
-- SummingMergeTree rows of one key may not be merged yet. Kernels on concurrent streams each count their own time,
-- so this can exceed the wall-clock time of the GPUs that ran them.
-- @default until = now
-- @default node =
SELECT toString(kernel_name) AS kernel, sum(duration_ns) AS gpu_ns, sum(launches) AS launches
FROM gpu_kernel_samples
WHERE ts >= {since:DateTime} AND ts < {until:DateTime}
  AND ({node:String} = '' OR node = {node:String})
GROUP BY kernel
ORDER BY gpu_ns DESC, kernel ASC
