-- Which NVML tier a query over [since, until) reads (migration 0016): the 1 s readings when the range starts within
-- their 6 h TTL (every reading of the range is still stored), else the 10 s aggregates. True: the 1 s tier. An AND
-- line for the 1 s branch; the 10 s branch takes `AND NOT` of the same. Keep 6 HOUR equal to 0016's and 0022's TTL
-- (tests/test_nvml_tiers.py and tests/test_nvml_hourly_partitions.py check it).
({since:DateTime64(3)} >= now() - INTERVAL 6 HOUR)
