-- The identity ids (workload_identities, migration 0015) that the workload filters pick, as a SELECT for an IN; each
-- filter '' takes every identity, and the filters AND together:
--   namespace: the Kubernetes namespace, exactly;
--   pod:       the pod's name exactly, or `namespace/pod`;
--   container: the container's name, or a prefix of its id (a runtime prefix such as 'containerd://' is dropped);
--   job:       a Slurm job id (the job's own, or its array's: every task of the array), `<array job>_<task>` for one
--              task of an array, or a Kubernetes Job's name (the pod label batch.kubernetes.io/job-name or job-name,
--              where the agent keeps it), also as `namespace/name`.
-- A row whose identity is '' (an older agent, a process gone before it was read) is in no identity: a filter
-- excludes it. Re-sent definitions of an id are equal, so duplicates not merged yet change nothing here.
SELECT identity
FROM workload_identities
WHERE ({namespace:String} = '' OR namespace = {namespace:String})
  AND ({pod:String} = '' OR pod_name = {pod:String} OR concat(namespace, '/', pod_name) = {pod:String})
  AND ({container:String} = '' OR container_name = {container:String}
       OR (container_id != '' AND startsWith(container_id, replaceRegexpOne({container:String}, '^[a-z-]+://', ''))))
  AND ({job:String} = ''
       OR (slurm_job_id != '' AND (slurm_job_id = {job:String} OR slurm_array_job_id = {job:String}
           OR concat(slurm_array_job_id, '_', slurm_array_task_id) = {job:String}))
       OR arrayExists(name -> name != '' AND (name = {job:String} OR concat(namespace, '/', name) = {job:String}),
                      [labels['batch.kubernetes.io/job-name'], labels['job-name']]))
