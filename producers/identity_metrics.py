"""The identity resolver's counts as Prometheus metrics (fleetprof_agent_identity_*), read at each scrape."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from producers.identity_resolver import IdentityResolver

FAILED = "kubelet_refreshes_failed_"


class IdentityMetrics:
    """A prometheus_client collector: register it once per agent process."""

    def __init__(self, resolver: IdentityResolver) -> None:
        self.resolver = resolver

    def collect(self) -> Iterator[Metric]:
        c = self.resolver.counters()
        refreshes = CounterMetricFamily("fleetprof_agent_identity_kubelet_refreshes",
                                        "Kubelet pod-list refreshes, by result (ok or why it failed)",
                                        labels=["result"])
        refreshes.add_metric(["ok"], c["kubelet_refreshes_ok"])
        for key, value in sorted(c.items()):
            if key.startswith(FAILED):
                refreshes.add_metric([key.removeprefix(FAILED)], value)
        polls = CounterMetricFamily("fleetprof_agent_identity_pod_resources_polls",
                                    "Kubelet pod-resources List calls, by result", labels=["result"])
        polls.add_metric(["ok"], c["pod_resources_polls_ok"])
        polls.add_metric(["failed"], c["pod_resources_polls_failed"])
        yield from (
            refreshes, polls,
            CounterMetricFamily("fleetprof_agent_identity_label_values_cut",
                                "Pod label values cut to the length limit", value=c["label_values_cut"]),
            CounterMetricFamily("fleetprof_agent_identity_unknown_containers",
                                "Container ids the kubelet had not reported when first seen",
                                value=c["unknown_containers"]),
            CounterMetricFamily("fleetprof_agent_identity_slurm_env_reads", "Slurm job environments read",
                                value=c["slurm_env_reads"]),
            GaugeMetricFamily("fleetprof_agent_identity_identities", "Identities this agent has named",
                              value=c["identities"]),
            GaugeMetricFamily("fleetprof_agent_identity_kubelet_pods", "Pods in the kubelet's last answer",
                              value=c["kubelet_pods"]),
            GaugeMetricFamily("fleetprof_agent_identity_gpus_held", "GPUs (and MIG devices) the kubelet assigns to "
                              "pods", value=c["gpus_held"]))
