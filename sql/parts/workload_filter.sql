-- The workload filters (namespace, pod, job, container; '' = no filter, workload_match says what each takes), an AND
-- line of a WHERE over rows with an `identity` column: the sample tables, their hourly rollups, gpu_timeline and
-- gpu_process_metrics. A query that includes it declares the four `-- @default name =` lines itself.
AND (({namespace:String} = '' AND {pod:String} = '' AND {job:String} = '' AND {container:String} = '')
     OR identity IN (
        -- @include workload_match
     ))
