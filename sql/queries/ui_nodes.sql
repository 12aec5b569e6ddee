-- The nodes with anything stored in [since, until), for the web UI's node filter: CPU samples, GPU kernel time (ns)
-- and the number of distinct GPUs (and MIG instances) NVML reported, per node. simulated: some of its NVML readings
-- came from the simulated library. The sample tables are SummingMergeTrees, so values are summed.
-- @default until = now
SELECT node, sum(cpu) AS cpu_samples, sum(gpu) AS gpu_ns, max(gpus) AS gpus, max(sim) AS simulated
FROM
(
    SELECT node, sum(count) AS cpu, toUInt64(0) AS gpu, toUInt64(0) AS gpus, false AS sim
    FROM cpu_samples
    WHERE ts >= {since:DateTime64(3)} AND ts < {until:DateTime64(3)}
    GROUP BY node
    UNION ALL
    SELECT node, toUInt64(0), sum(duration_ns), toUInt64(0), false
    FROM gpu_kernel_samples
    WHERE ts >= {since:DateTime64(3)} AND ts < {until:DateTime64(3)}
    GROUP BY node
    UNION ALL
    SELECT node, toUInt64(0), toUInt64(0), uniqExact(uuid), max(simulated)
    FROM
    (
        -- @include nvml_device_readings
    )
    WHERE ts >= {since:DateTime64(3)} AND ts < {until:DateTime64(3)}
    GROUP BY node
)
GROUP BY node
ORDER BY node
