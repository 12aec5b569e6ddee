-- Generated from sql/migrations/0021_timeline_detail_tier.sql by `python -m fleetprof.cluster_sql`: do not edit.
-- The migration says why the columns, codecs, keys, partitions, TTL and settings are what they are;
-- sql/cluster/README.md says how a cluster differs from one node.
ALTER TABLE gpu_timeline_local ON CLUSTER '{cluster}' MODIFY SETTING ttl_only_drop_parts = 0, merge_with_ttl_timeout = 3600;

ALTER TABLE gpu_timeline_local ON CLUSTER '{cluster}' MODIFY TTL ts + INTERVAL 6 HOUR;

INSERT INTO schema_migrations (version, name, applied_at) VALUES (21, '0021_timeline_detail_tier', now());
