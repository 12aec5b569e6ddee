-- What the query bench stored: the span of the CPU windows, rows and samples of both window tables and of their
-- hourly rollups, and the distinct stacks sampled.
SELECT
    (SELECT min(ts) FROM cpu_samples) AS first_window,
    (SELECT max(ts) FROM cpu_samples) AS last_window,
    (SELECT count() FROM cpu_samples) AS cpu_rows,
    (SELECT sum(count) FROM cpu_samples) AS cpu_samples,
    (SELECT uniqExact(stack_id) FROM cpu_samples) AS cpu_stacks,
    (SELECT count() FROM cpu_samples_1h) AS cpu_rollup_rows,
    (SELECT sum(count) FROM cpu_samples_1h) AS cpu_rollup_samples,
    (SELECT count() FROM gpu_kernel_samples) AS gpu_rows,
    (SELECT sum(duration_ns) FROM gpu_kernel_samples) AS gpu_ns,
    (SELECT uniqExact(stack_id) FROM gpu_kernel_samples) AS gpu_stacks,
    (SELECT count() FROM gpu_kernel_samples_1h) AS gpu_rollup_rows,
    (SELECT sum(duration_ns) FROM gpu_kernel_samples_1h) AS gpu_rollup_ns,
    (SELECT count() FROM stacks) AS stack_definitions,
    (SELECT count() FROM frames) AS frame_definitions
