-- bench/merge_cost.py --layouts: cpu_samples' rows under another layout (merge_cost.LAYOUTS: its {columns} and
-- sorting {key}), partitioned by day as cpu_samples is.
CREATE TABLE layout_variant ({columns})
ENGINE = MergeTree
PARTITION BY toDate(ts)
ORDER BY {key}
