-- bench/ttl_merges.py: one sink batch of NVML device readings (nodes x 8 GPUs x 10 readings, stamped over the
-- batch's span before now), values varying as the simulator's do (utilization, power, memory in 2 MiB pages).
INSERT INTO readings (ts, node, gpu_index, uuid, name, parent_uuid, gpu_util_pct, mem_util_pct, mem_used_bytes,
                      mem_total_bytes, sm_clock_mhz, mem_clock_mhz, power_mw, power_limit_mw, temperature_c,
                      pcie_tx_kbps, pcie_rx_kbps, clock_event_reasons, xid_errors, simulated, identity)
SELECT now64(3) - toIntervalMillisecond((number % 10) * {span_ms:UInt32}) AS ts,
       concat('node-', toString(intDiv(number, 80))) AS node, toUInt16(intDiv(number, 10) % 8) AS gpu_index,
       concat('GPU-', node, '-', toString(gpu_index)) AS uuid, 'NVIDIA H100 80GB HBM3', '',
       toUInt8(60 + rand() % 41), toUInt8(20 + rand() % 31), 40000000000 + (rand() % 100) * 2097152, 85899345920,
       toUInt32(1980), toUInt32(2619), toUInt32(400000 + rand() % 300000), toUInt32(700000),
       toInt16(55 + rand() % 10), toUInt32(rand() % 1000000), toUInt32(rand() % 1000000), toUInt64(0),
       CAST([] AS Array(UInt32)), true, ''
FROM numbers({rows:UInt32})
