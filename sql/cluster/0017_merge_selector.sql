-- Generated from sql/migrations/0017_merge_selector.sql by `python -m fleetprof.cluster_sql`: do not edit.
-- The migration says why the columns, codecs, keys, partitions, TTL and settings are what they are;
-- sql/cluster/README.md says how a cluster differs from one node.
ALTER TABLE cpu_samples_local ON CLUSTER '{cluster}' MODIFY SETTING merge_selector_base = 20;

ALTER TABLE cpu_samples_1h_local ON CLUSTER '{cluster}' MODIFY SETTING merge_selector_base = 20;

ALTER TABLE gpu_kernel_samples_local ON CLUSTER '{cluster}' MODIFY SETTING merge_selector_base = 20;

ALTER TABLE gpu_kernel_samples_1h_local ON CLUSTER '{cluster}' MODIFY SETTING merge_selector_base = 20;

ALTER TABLE gpu_copy_samples_local ON CLUSTER '{cluster}' MODIFY SETTING merge_selector_base = 20;

ALTER TABLE gpu_unmatched_local ON CLUSTER '{cluster}' MODIFY SETTING merge_selector_base = 20;

ALTER TABLE gpu_timeline_local ON CLUSTER '{cluster}' MODIFY SETTING merge_selector_base = 20;

ALTER TABLE gpu_device_metrics_local ON CLUSTER '{cluster}' MODIFY SETTING merge_selector_base = 20;

ALTER TABLE gpu_process_metrics_local ON CLUSTER '{cluster}' MODIFY SETTING merge_selector_base = 20;

ALTER TABLE gpu_device_metrics_10s_local ON CLUSTER '{cluster}' MODIFY SETTING merge_selector_base = 20;

ALTER TABLE gpu_process_metrics_10s_local ON CLUSTER '{cluster}' MODIFY SETTING merge_selector_base = 20;

ALTER TABLE profile_windows_local ON CLUSTER '{cluster}' MODIFY SETTING merge_selector_base = 20;

INSERT INTO schema_migrations (version, name, applied_at) VALUES (17, '0017_merge_selector', now());
