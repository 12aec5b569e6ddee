-- Generated from sql/migrations/0009_stack_names.sql by `python -m fleetprof.cluster_sql`: do not edit.
-- The migration says why the columns, codecs, keys, partitions, TTL and settings are what they are;
-- sql/cluster/README.md says how a cluster differs from one node.
--
-- Cluster: the stack views resolve stacks on the shard that holds them. The single-node views over the Distributed
-- `stacks` would give the same answers, but a remote shard receives SQL for the part of a query that reads its
-- tables: here the view's GROUP BY over stacks_local, and whether the caller's `WHERE stack_id IN (…)` is rewritten
-- into that SQL or applied after every shard has sent its whole stacks table depends on the server's predicate
-- push-down. So each stack view is created per node as `<view>_local` over stacks_local (the same SELECT but for the
-- names it reads), and a Distributed table named like the view fronts it. The queries filter that Distributed table
-- itself, `WHERE stack_id IN (SELECT stack_id FROM samples)`, which always goes to the shards (as GLOBAL IN under the
-- fleetprof profile's distributed_product_mode = global: the sampled ids are collected once and sent along), and on
-- each shard it reaches stacks_local's primary key as on one node. Only the sampled stacks' names come back.
-- A shard can answer alone: every definition of a stack is on one shard (stacks is sharded by stack_id, 0002), so
-- argMax over one stack's rows there sees all of them; and frames is whole on every node (0002), so frame_names, a
-- plain view on every node, names every frame of a shard's stacks without leaving the node. The query's own GROUP BY
-- (by function names, kernel, node) then sums the shards' rows on the node that runs it: never set
-- distributed_group_by_no_merge for these queries, or each shard's partial sums would come back unmerged.
CREATE VIEW IF NOT EXISTS stack_frames_local ON CLUSTER '{cluster}' AS
SELECT stack_id, argMax(frame_ids, last_seen) AS frame_ids
FROM stacks_local
GROUP BY stack_id;

CREATE TABLE IF NOT EXISTS stack_frames ON CLUSTER '{cluster}' AS stack_frames_local
ENGINE = Distributed('{cluster}', currentDatabase(), stack_frames_local, stack_id);

-- Cluster: a plain view on every node, over the node's whole copy of frames (0002).
CREATE VIEW IF NOT EXISTS frame_names ON CLUSTER '{cluster}' AS
SELECT frame_id,
       argMax(function, last_seen) AS function,
       argMax(binary, last_seen) AS binary,
       argMax(kind, last_seen) AS kind
FROM frames
GROUP BY frame_id;

CREATE VIEW IF NOT EXISTS stack_frame_names_local ON CLUSTER '{cluster}' AS
SELECT p.stack_id AS stack_id,
       p.position AS position,
       p.depth AS depth,
       p.frame_id AS frame_id,
       if(n.known = 1, n.function, concat('[unknown 0x', lower(hex(p.frame_id)), ']')) AS function,
       if(n.known = 1, toString(n.binary), '') AS binary,
       if(n.known = 1, n.kind, 'UNKNOWN') AS kind
FROM
(
    SELECT stack_id, frame_id, position, length(frame_ids) AS depth
    FROM stack_frames_local
    ARRAY JOIN frame_ids AS frame_id, arrayEnumerate(frame_ids) AS position
) AS p
-- known tells a frame without a definition from one whose function is '' (a LEFT JOIN fills missing rows with '')
LEFT JOIN (SELECT frame_id, function, binary, kind, 1 AS known FROM frame_names) AS n ON n.frame_id = p.frame_id;

CREATE TABLE IF NOT EXISTS stack_frame_names ON CLUSTER '{cluster}' AS stack_frame_names_local
ENGINE = Distributed('{cluster}', currentDatabase(), stack_frame_names_local, stack_id);

CREATE VIEW IF NOT EXISTS stack_names_local ON CLUSTER '{cluster}' AS
SELECT stack_id,
       -- groupArray has no order; sorting by position restores root first, leaf last. One array per column, so a
       -- query that reads only some of them does not build the others.
       arraySort((value, position) -> position, groupArray(function), groupArray(position)) AS functions,
       arraySort((value, position) -> position, groupArray(binary), groupArray(position)) AS binaries,
       arraySort((value, position) -> position, groupArray(kind), groupArray(position)) AS kinds
FROM stack_frame_names_local
GROUP BY stack_id;

CREATE TABLE IF NOT EXISTS stack_names ON CLUSTER '{cluster}' AS stack_names_local
ENGINE = Distributed('{cluster}', currentDatabase(), stack_names_local, stack_id);

INSERT INTO schema_migrations (version, name, applied_at) VALUES (9, '0009_stack_names', now());
