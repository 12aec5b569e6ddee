-- The query bench's fill for GPU kernel rows (NVTX range and process id too), as fleet_query_copy_cpu does for
-- CPU samples.
INSERT INTO gpu_kernel_samples (ts, node, pid, proc_id, device, stream, stack_id, kernel_name, nvtx_range,
                                duration_ns, launches)
SELECT ts + toIntervalSecond({shift:Int64}), node, pid, proc_id, device, stream, stack_id, kernel_name, nvtx_range,
       duration_ns, launches
FROM gpu_kernel_samples
WHERE ts >= {from:DateTime} AND ts < {to:DateTime}
