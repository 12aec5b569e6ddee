-- Views that turn stack ids into root-first lists of function names, so every named query resolves stacks the same
-- way instead of repeating the same SQL. Plain views: a view is a stored SELECT that ClickHouse inlines into the
-- query that reads it, so nothing is stored and the deduplication still happens at read time, as 0002 requires.
--
-- Callers MUST filter a view by the ids they need, as `WHERE stack_id IN (SELECT stack_id FROM …)` on the view
-- itself: ClickHouse pushes that filter through the views' GROUP BY, ARRAY JOIN and joins down to the stacks table's
-- primary key (EXPLAIN indexes=1 shows `stack_id in N-element set`), whereas a JOIN alone does not, and would
-- aggregate every stack in the store. stack_frame_names reads frame_names whole: no caller's filter reaches it through
-- the join, and narrowing it to the wanted frame ids would take a second pass over the caller's stacks, which a view
-- cannot see. frames holds one row per distinct (function, binary, kind), far fewer than stacks, so that stays cheap
-- while frames is small; with a million frames it adds some 50-100 ms (on two cores) to every query that resolves
-- stacks.
--
-- Naming rules: a frame without a definition is "[unknown 0x<frame id>]" with binary '' and kind UNKNOWN. A stack
-- without a definition, or whose newest definition is empty, has no rows in stack_frame_names and stack_names: the
-- caller names it "[unknown stack 0x<stack id>]", since only the caller knows which stack ids it sampled.
-- IF NOT EXISTS keeps a view's first definition: changing one later takes a new migration with CREATE OR REPLACE VIEW.
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

-- One definition per stack: ReplacingMergeTree rows may not be merged yet, argMax keeps the newest (0002).
-- @cluster sharded by stack_id
CREATE VIEW IF NOT EXISTS stack_frames AS
SELECT stack_id, argMax(frame_ids, last_seen) AS frame_ids
FROM stacks
GROUP BY stack_id;

-- One definition per frame, likewise. Each column is its own argMax over last_seen: a frame id hashes (function,
-- binary, kind), so the rows of one id agree on them anyway.
-- Cluster: a plain view on every node, over the node's whole copy of frames (0002).
-- @cluster on every node
CREATE VIEW IF NOT EXISTS frame_names AS
SELECT frame_id,
       argMax(function, last_seen) AS function,
       argMax(binary, last_seen) AS binary,
       argMax(kind, last_seen) AS kind
FROM frames
GROUP BY frame_id;

-- One row per frame of every defined stack: position 1 is the root, position = depth the leaf. For queries that
-- count per function (top functions) without rebuilding whole stacks.
-- @cluster sharded by stack_id
CREATE VIEW IF NOT EXISTS stack_frame_names AS
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
    FROM stack_frames
    ARRAY JOIN frame_ids AS frame_id, arrayEnumerate(frame_ids) AS position
) AS p
-- known tells a frame without a definition from one whose function is '' (a LEFT JOIN fills missing rows with '')
LEFT JOIN (SELECT frame_id, function, binary, kind, 1 AS known FROM frame_names) AS n ON n.frame_id = p.frame_id;

-- One row per defined stack: its frames' functions, binaries and kinds, root first, leaf last (the same positions).
-- @cluster sharded by stack_id
CREATE VIEW IF NOT EXISTS stack_names AS
SELECT stack_id,
       -- groupArray has no order; sorting by position restores root first, leaf last. One array per column, so a
       -- query that reads only some of them does not build the others.
       arraySort((value, position) -> position, groupArray(function), groupArray(position)) AS functions,
       arraySort((value, position) -> position, groupArray(binary), groupArray(position)) AS binaries,
       arraySort((value, position) -> position, groupArray(kind), groupArray(position)) AS kinds
FROM stack_frame_names
GROUP BY stack_id;
