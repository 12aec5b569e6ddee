-- bench/ttl_merges.py: the 1 s NVML device readings' table (migration 0022's columns, codecs and key) in one of the
-- layouts it compares, its time scaled: {partition} and {ttl} are filled in by the bench from its layout table.
CREATE TABLE readings
(
    ts                  DateTime64(3)          CODEC(DoubleDelta, ZSTD(1)),
    node                LowCardinality(String) CODEC(ZSTD(1)),
    gpu_index           UInt16                 CODEC(T64, ZSTD(1)),
    uuid                LowCardinality(String) CODEC(ZSTD(1)),
    name                LowCardinality(String) CODEC(ZSTD(1)),
    parent_uuid         LowCardinality(String) CODEC(ZSTD(1)),
    gpu_util_pct        Nullable(UInt8)        CODEC(T64, ZSTD(1)),
    mem_util_pct        Nullable(UInt8)        CODEC(T64, ZSTD(1)),
    mem_used_bytes      Nullable(UInt64)       CODEC(Delta, ZSTD(1)),
    mem_total_bytes     Nullable(UInt64)       CODEC(Delta, ZSTD(1)),
    sm_clock_mhz        Nullable(UInt32)       CODEC(Delta, ZSTD(1)),
    mem_clock_mhz       Nullable(UInt32)       CODEC(Delta, ZSTD(1)),
    power_mw            Nullable(UInt32)       CODEC(Delta, ZSTD(1)),
    power_limit_mw      Nullable(UInt32)       CODEC(Delta, ZSTD(1)),
    temperature_c       Nullable(Int16)        CODEC(Delta, ZSTD(1)),
    pcie_tx_kbps        Nullable(UInt32)       CODEC(T64, ZSTD(1)),
    pcie_rx_kbps        Nullable(UInt32)       CODEC(T64, ZSTD(1)),
    clock_event_reasons Nullable(UInt64)       CODEC(ZSTD(1)),
    xid_errors          Array(UInt32)          CODEC(ZSTD(1)),
    simulated           Bool                   CODEC(ZSTD(1)),
    identity            LowCardinality(String) CODEC(ZSTD(1))
)
ENGINE = MergeTree
PARTITION BY {partition}
ORDER BY (node, gpu_index, ts)
TTL toDateTime(ts) + {ttl}
SETTINGS non_replicated_deduplication_window = 10000, merge_selector_base = 20, {settings}
