-- The timeline joins the detail tier: its per-record rows live 6 hours, as the 1 s NVML readings do (0016), and the
-- 30-day history of the same GPU work is the per-window sums in gpu_kernel_samples (and its hourly rollup).
--
-- Why: the timeline holds one row per sampled kernel, copy and set (16 a second per node at the fleet bench's load),
-- ~12 bytes each after 0020, which is 1.30 bytes per CPU sample over a day: more than cpu_samples and
-- gpu_kernel_samples together, and over a 7-day TTL the largest table of a fleet's store (bench/storage_day.py).
-- It is read bar by bar over at most 5 minutes (the web UI's timeline), for "what ran on this GPU just now";
-- the flame graphs, kernel tops, cost report and alerts read the window tables, which keep their 30 days.
-- The web UI says when a range is older than this TTL (fleetprof/webui/timeline.py, DETAIL_KEEP_S: keep equal).
--
-- How: as 0016 did for the 1 s tables, the daily partitions outlive 6 hours, so rows are deleted by TTL merges
-- (ttl_only_drop_parts off), at most an hour after they expire (merge_with_ttl_timeout). Metadata only: the TTL
-- applies to existing parts as a background mutation.
ALTER TABLE gpu_timeline MODIFY SETTING ttl_only_drop_parts = 0, merge_with_ttl_timeout = 3600;

ALTER TABLE gpu_timeline MODIFY TTL ts + INTERVAL 6 HOUR;
