-- Which data in [since, until), optionally on one node ('' means "all"), came from a simulated source: one row per
-- (kind, node), kind 'cpu' (CPU samples of `fleetprof loadgen`'s simulated fleet), 'gpu' (GPU kernel time from the
-- simulated GPU library behind the USDT probes) or 'nvml' (readings of the simulated NVML library). The CLI, the web
-- UI, the cost report and the exports label a kind simulated only when it has rows here: a real eBPF CPU profile on a
-- node whose GPU is simulated is not.
-- @default until = now
-- @default node =
SELECT kind, node
FROM
(
    SELECT DISTINCT kind, toString(node) AS node FROM profile_windows
    WHERE simulated AND ts >= {since:DateTime64(3)} AND ts < {until:DateTime64(3)}
      AND ({node:String} = '' OR node = {node:String})
    UNION ALL
    SELECT DISTINCT 'nvml' AS kind, toString(node) AS node FROM
    (
        -- @include nvml_device_readings
    )
    WHERE simulated AND ts >= {since:DateTime64(3)} AND ts < {until:DateTime64(3)}
      AND ({node:String} = '' OR node = {node:String})
    UNION ALL
    SELECT DISTINCT 'nvml' AS kind, toString(node) AS node FROM
    (
        -- @include nvml_process_readings
    )
    WHERE simulated AND ts >= {since:DateTime64(3)} AND ts < {until:DateTime64(3)}
      AND ({node:String} = '' OR node = {node:String})
)
GROUP BY kind, node
ORDER BY kind, node
