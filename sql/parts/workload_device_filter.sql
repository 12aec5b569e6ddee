-- The workload filters (as workload_filter) over NVML device rows (gpu_device_metrics, with ts, node, gpu_index and
-- identity, read over [since, until) as DateTime64(3)): a reading of the GPU whose holder (its row's identity: the pod
-- that holds the GPU) matches, or, where the row names no holder, whose poll listed a process of a matching workload
-- on that GPU (gpu_process_metrics rows of the same node, GPU index and poll: nvml_poll_key).
AND (({namespace:String} = '' AND {pod:String} = '' AND {job:String} = '' AND {container:String} = '')
     OR identity IN (
        -- @include workload_match
     )
     OR (identity = '' AND (node, gpu_index,
                             -- @include nvml_poll_key
                            ) IN (
        SELECT node, gpu_index,
               -- @include nvml_poll_key
        FROM
        (
            -- @include nvml_process_readings
        )
        WHERE ts >= {since:DateTime64(3)} AND ts < {until:DateTime64(3)}
          AND identity IN (
            -- @include workload_match
          ))))
