-- Fewer background merges of the tables the sink writes every flush.
--
-- The sink writes a part per table about every second or two, and the engine's merges then rewrite each row again
-- and again while the parts grow: with the default merge_selector_base (5), bench/sink_cost.py --windows 30 (300
-- simulated seconds of 100 nodes) merged 1.74 rows per row inserted, and chDB's merge threads spent more CPU than
-- the sink's whole Python side (bench/RESULTS.md, "Fewer merges"). A larger base merges parts only once many of a
-- similar size have gathered: each row is rewritten about log_20(parts) times instead of log_5(parts). 20 took
-- the merges' CPU there from 5.9 to 1.9 µs per stored CPU sample, with about as many active parts for the queries to
-- read (14 instead of 9 after those 300 s; at most 43 instead of 47 over 3,000 inserts into one table). The named
-- queries sum or take the latest row anyway, so their answers do not depend on how far parts are merged.
-- The setting is metadata only: existing parts are merged under it from now on.
ALTER TABLE cpu_samples MODIFY SETTING merge_selector_base = 20;

ALTER TABLE cpu_samples_1h MODIFY SETTING merge_selector_base = 20;

ALTER TABLE gpu_kernel_samples MODIFY SETTING merge_selector_base = 20;

ALTER TABLE gpu_kernel_samples_1h MODIFY SETTING merge_selector_base = 20;

ALTER TABLE gpu_copy_samples MODIFY SETTING merge_selector_base = 20;

ALTER TABLE gpu_unmatched MODIFY SETTING merge_selector_base = 20;

ALTER TABLE gpu_timeline MODIFY SETTING merge_selector_base = 20;

ALTER TABLE gpu_device_metrics MODIFY SETTING merge_selector_base = 20;

ALTER TABLE gpu_process_metrics MODIFY SETTING merge_selector_base = 20;

ALTER TABLE gpu_device_metrics_10s MODIFY SETTING merge_selector_base = 20;

ALTER TABLE gpu_process_metrics_10s MODIFY SETTING merge_selector_base = 20;

ALTER TABLE profile_windows MODIFY SETTING merge_selector_base = 20;
