-- GPU alerts whose state changed in [since, until), newest first: one row per alert and state (FIRING, RESOLVED),
-- optionally for one node. The alerts table is a ReplacingMergeTree keyed by (alert_id, state) whose rows may not
-- be merged yet (a transition written again after a restart), so FINAL collapses them to one. evidence is the JSON
-- list of the top CPU stacks of the GPU's processes during the drop.
-- @default until = now
-- @default node =
-- @default limit = 100
SELECT alert_id, state, kind, node, gpu_index, gpu_uuid, started, time, threshold, observed, message, evidence
FROM alerts FINAL
WHERE time >= {since:DateTime64(3)} AND time < {until:DateTime64(3)}
  AND ({node:String} = '' OR node = {node:String})
ORDER BY time DESC, alert_id ASC, state DESC
LIMIT {limit:UInt32}
