"""The columns of every table the sink writes, in the order it writes them: the sink and `fleetprof query metrics`
(its empty results' header) share them, and importing them costs nothing."""

from processors.process_ids import PROCESS_NAME_COLUMNS  # noqa: F401 - written before the rows carrying their ids

FRAME_COLUMNS = ["frame_id", "function", "binary", "kind", "last_seen", "build_id"]
STACK_COLUMNS = ["stack_id", "frame_ids", "last_seen"]
CPU_SAMPLE_COLUMNS = ["ts", "node", "pid", "proc_id", "stack_id", "count"]
DEVICE_COLUMNS = ["ts", "node", "gpu_index", "uuid", "name", "parent_uuid", "gpu_util_pct", "mem_util_pct",
                  "mem_used_bytes", "mem_total_bytes", "sm_clock_mhz", "mem_clock_mhz", "power_mw",
                  "power_limit_mw", "temperature_c", "pcie_tx_kbps", "pcie_rx_kbps", "clock_event_reasons",
                  "xid_errors", "simulated", "identity"]
PROCESS_COLUMNS = ["ts", "node", "gpu_index", "pid", "comm", "container_id", "sm_util_pct", "mem_util_pct",
                   "used_memory_bytes", "simulated", "identity"]
GPU_SAMPLE_COLUMNS = ["ts", "node", "pid", "proc_id", "device", "stream", "stack_id", "kernel_name", "duration_ns",
                      "launches", "nvtx_range"]
GPU_COPY_COLUMNS = ["ts", "node", "pid", "comm", "container_id", "device", "stream", "stack_id", "kernel_name",
                    "memory_kinds", "nvtx_range", "duration_ns", "bytes", "launches", "identity"]
GPU_TIMELINE_COLUMNS = ["ts", "node", "pid", "comm", "device", "stream", "start_ns", "duration_ns", "activity", "name",
                        "stack_id", "weight", "bytes", "nvtx_range", "graph_id", "graph_node_id", "correlation_id",
                        "identity"]
IDENTITY_COLUMNS = ["identity", "node", "updated", "kind", "container_runtime", "container_id", "container_name",
                    "pod_name", "namespace", "pod_uid", "labels", "slurm_job_id", "slurm_step", "slurm_user",
                    "slurm_array_job_id", "slurm_array_task_id", "slurm_account", "systemd_unit", "team", "simulated"]
ALERT_COLUMNS = ["alert_id", "kind", "state", "node", "gpu_index", "gpu_uuid", "started", "time", "threshold",
                 "observed", "message", "evidence"]
GPU_UNMATCHED_COLUMNS = ["ts", "node", "pid", "side", "reason", "events", "duration_ns", "launches"]
PROFILE_WINDOW_COLUMNS = ["ts", "node", "kind", "simulated", "frequency_hz"]
