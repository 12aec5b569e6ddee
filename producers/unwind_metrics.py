"""The unwinder's counts as Prometheus metrics, read from the loader (and its BPF maps) at each scrape."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from producers.unwind_maps import UnwindLoader

# loader counter -> the `end` label of fleetprof_agent_unwind_stacks_total
ENDS = {"stacks_reached_root": "root", "stacks_ended_by_frame_pointer": "frame_pointer_end",
        "stacks_cut_at_frame_limit": "frame_limit", "stacks_unreadable_frame": "unreadable_frame",
        "stacks_unsupported_rule": "unsupported_rule", "stacks_bad_frame": "bad_frame"}
FRAMES = {"frames_by_table": "table", "frames_by_frame_pointer": "frame_pointer", "frames_signal": "signal"}
EVENTS = {"stacks_without_tables": "process_tables_not_loaded", "stacks_unmapped_pc": "pc_in_no_known_mapping",
          "samples_without_user_stack": "no_user_registers", "tables_failed": "table_unreadable",
          "rows_exhausted": "table_rows_full", "mappings_over_limit": "mappings_over_limit"}


class UnwindMetrics:
    """A prometheus_client collector: register it once per agent process."""

    def __init__(self, loader: UnwindLoader) -> None:
        self.loader = loader

    def collect(self) -> Iterator[Metric]:
        c = self.loader.counters()
        stacks = CounterMetricFamily("fleetprof_agent_unwind_stacks", "User stacks walked, by how the walk ended "
                                     "(all but root and frame_pointer_end are marked [truncated])", labels=["end"])
        for key, label in ENDS.items():
            stacks.add_metric([label], c[key])
        frames = CounterMetricFamily("fleetprof_agent_unwind_frames", "User frames walked, by what found the caller",
                                     labels=["by"])
        for key, label in FRAMES.items():
            frames.add_metric([label], c[key])
        events = CounterMetricFamily("fleetprof_agent_unwind_problems", "What the unwinder could not use",
                                     labels=["what"])
        for key, label in EVENTS.items():
            events.add_metric([label], c[key])
        rows = GaugeMetricFamily("fleetprof_agent_unwind_rows", "Call-frame table rows in the BPF maps",
                                 labels=["state"])
        rows.add_metric(["used"], c["rows_used"])
        rows.add_metric(["capacity"], c["rows_capacity"])
        yield from (stacks, frames, events, rows,
                    GaugeMetricFamily("fleetprof_agent_unwind_files", "Binaries whose tables are loaded",
                                      value=c["files"]),
                    GaugeMetricFamily("fleetprof_agent_unwind_processes", "Processes whose tables are loaded",
                                      value=c["processes"]))
