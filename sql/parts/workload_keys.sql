-- Each identity id of the query's `owners` CTE (a column `owner`) with its workload under the grouping {by}, from
-- workload_identities (duplicates of an id not merged yet are equal definitions: any() picks one):
--   namespace: the Kubernetes namespace;  pod: `namespace/pod`;  team: the team (a pod's team label, a Slurm job's
--   account, as the agent sets it);  container: the container's name, else the first 12 digits of its id;
--   job: a Slurm job's id (`<array job>_<task>` for an array task), else a Kubernetes Job's `namespace/name` (pod label
--   batch.kubernetes.io/job-name or job-name).
-- An identity without that field (a Slurm job by namespace, a systemd unit by pod) has workload ''; so has the '' id
-- (no identity: an older agent), which has no row here: a LEFT JOIN on these fills it with ''. '' reads "unattributed".
SELECT identity, any(multiIf(
    {by:String} = 'namespace', toString(namespace),
    {by:String} = 'pod', if(pod_name = '', '', concat(namespace, '/', pod_name)),
    {by:String} = 'team', toString(team),
    {by:String} = 'container', if(container_name != '', toString(container_name), substring(container_id, 1, 12)),
    slurm_job_id != '', if(slurm_array_task_id != '', concat(slurm_array_job_id, '_', slurm_array_task_id),
                           slurm_job_id),
    if(labels['batch.kubernetes.io/job-name'] != '', labels['batch.kubernetes.io/job-name'], labels['job-name']) != '',
    concat(namespace, '/', if(labels['batch.kubernetes.io/job-name'] != '', labels['batch.kubernetes.io/job-name'],
                              labels['job-name'])),
    '')) AS workload
FROM workload_identities
WHERE identity IN (SELECT owner FROM owners)
GROUP BY identity
