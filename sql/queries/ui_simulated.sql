-- Whether any NVML reading in [since, until) came from the simulated library, optionally on one node ('' means
-- "all"): the web UI labels its charts and flame graphs SIMULATED then. Readings per device and per process count.
-- @default until = now
-- @default node =
SELECT (SELECT countIf(simulated) FROM gpu_device_metrics
        WHERE ts >= {since:DateTime64(3)} AND ts < {until:DateTime64(3)}
          AND ({node:String} = '' OR node = {node:String}))
     + (SELECT countIf(simulated) FROM gpu_process_metrics
        WHERE ts >= {since:DateTime64(3)} AND ts < {until:DateTime64(3)}
          AND ({node:String} = '' OR node = {node:String})) AS simulated_readings
