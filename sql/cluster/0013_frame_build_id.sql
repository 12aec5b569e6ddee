-- Generated from sql/migrations/0013_frame_build_id.sql by `python -m fleetprof.cluster_sql`: do not edit.
-- The migration says why the columns, codecs, keys, partitions, TTL and settings are what they are;
-- sql/cluster/README.md says how a cluster differs from one node.
--
-- Cluster: frames is one replicated table on every node (0002): the ALTER runs once, without ON CLUSTER, as in 0011.
ALTER TABLE frames
    ADD COLUMN IF NOT EXISTS build_id LowCardinality(String) DEFAULT '' CODEC(ZSTD(1));

CREATE OR REPLACE VIEW frame_names ON CLUSTER '{cluster}' AS
SELECT frame_id,
       argMax(function, last_seen) AS function,
       argMax(binary, last_seen) AS binary,
       argMax(kind, last_seen) AS kind,
       argMax(language, last_seen) AS language,
       argMax(build_id, last_seen) AS build_id
FROM frames
GROUP BY frame_id;

INSERT INTO schema_migrations (version, name, applied_at) VALUES (13, '0013_frame_build_id', now());
