-- bench/merge_cost.py --layouts: one window's cpu_samples rows into the layout's table, one part, as the sink wrote
-- them ({select}: the layout's columns from cpu_samples').
INSERT INTO layout_variant
SELECT {select}
FROM cpu_samples
WHERE ts = {{ts:DateTime}}
SETTINGS max_threads = 1, optimize_on_insert = 0
