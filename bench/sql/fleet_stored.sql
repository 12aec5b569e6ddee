-- What the store holds after the run: CPU samples, GPU kernel rows with the launches they stand for, NVML rows.
SELECT
    (SELECT sum(count) FROM cpu_samples) AS cpu_samples,
    (SELECT count() FROM cpu_samples) AS cpu_rows,
    (SELECT sum(launches) FROM gpu_kernel_samples) AS gpu_launches_weighted,
    (SELECT count() FROM gpu_kernel_samples) AS gpu_rows,
    (SELECT count() FROM gpu_device_metrics) AS device_metric_rows
