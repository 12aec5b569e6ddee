"""The agent's workload-identity settings (the kubelet, its pod-resources socket, pod labels) as click options, and
the IdentityResolver built from them. The kubelet's token is only ever read from its file, never a flag, never
logged."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import click

from fleetprof.durations import Duration
from producers.identity_resolver import DEFAULT_POD_LABELS, IdentityResolver
from producers.kubelet_pods import DEFAULT_CA_FILE, DEFAULT_TOKEN_FILE, KubeletClient
from producers.pod_resources import DEFAULT_SOCKET, PodResourcesClient

log = logging.getLogger("fleetprof.agent")
KUBELET_PORT = 10250


@dataclass(frozen=True)
class IdentitySettings:
    kubelet_url: str = ""
    kubelet_ca_file: str | None = None
    kubelet_token_file: str = DEFAULT_TOKEN_FILE
    kubelet_insecure_skip_tls_verify: bool = False
    kubelet_refresh: float = 60.0
    pod_labels: str = ",".join(DEFAULT_POD_LABELS)
    team_label: str = "team"
    pod_resources_socket: str = DEFAULT_SOCKET


_OPTIONS = [
    click.option("--kubelet-url", envvar="FLEETPROF_KUBELET_URL", default="", show_default=False,
                 help="The kubelet whose pod list names the containers: https://HOST:10250 (the service account's "
                      "token), http://127.0.0.1:10255 (the read-only port), or off. [env FLEETPROF_KUBELET_URL; "
                      "default: https://$NODE_NAME:10250 when a service-account token file exists, else off]"),
    click.option("--kubelet-ca-file", envvar="FLEETPROF_KUBELET_CA_FILE", default=None,
                 help="CA bundle the kubelet's serving certificate is checked against. [env "
                      f"FLEETPROF_KUBELET_CA_FILE; default: {DEFAULT_CA_FILE} when present, else the system's]"),
    click.option("--kubelet-token-file", envvar="FLEETPROF_KUBELET_TOKEN_FILE", default=DEFAULT_TOKEN_FILE,
                 show_default=True, help="Bearer token for the kubelet, read again at every refresh (tokens "
                                         "rotate); sent over https only. [env FLEETPROF_KUBELET_TOKEN_FILE]"),
    click.option("--kubelet-insecure-skip-tls-verify", is_flag=True, default=False,
                 help="Do not check the kubelet's certificate (a self-signed serving certificate); anyone on the "
                      "path can then read the token."),
    click.option("--kubelet-refresh", envvar="FLEETPROF_KUBELET_REFRESH", type=Duration(), default="60s",
                 show_default=True, help="Read the kubelet's pod list at most this often, unless an unknown "
                                         "container id appears (then within seconds). [env "
                                         "FLEETPROF_KUBELET_REFRESH]"),
    click.option("--pod-labels", envvar="FLEETPROF_POD_LABELS", default=",".join(DEFAULT_POD_LABELS),
                 show_default=True, help="Pod labels carried with identities (comma list; others are dropped, "
                                         "values cut at 64 characters). [env FLEETPROF_POD_LABELS]"),
    click.option("--team-label", envvar="FLEETPROF_TEAM_LABEL", default="team", show_default=True,
                 help="The pod label naming the team a pod's cost goes to (a Slurm job's is its account). [env "
                      "FLEETPROF_TEAM_LABEL]"),
    click.option("--pod-resources-socket", envvar="FLEETPROF_POD_RESOURCES_SOCKET", default=DEFAULT_SOCKET,
                 show_default=True, help="The kubelet's pod-resources gRPC socket: which pod holds which GPU (off "
                                         "when absent). [env FLEETPROF_POD_RESOURCES_SOCKET]"),
]
_FIELDS = tuple(IdentitySettings.__dataclass_fields__)


def identity_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add the identity options to a click command; it receives them as one `identity: IdentitySettings`."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        identity = IdentitySettings(**{name: kwargs.pop(name) for name in _FIELDS})
        return command(*args, identity=identity, **kwargs)

    for option in reversed(_OPTIONS):
        wrapper = option(wrapper)
    return wrapper


def kubelet_url(settings: IdentitySettings, node: str, env: Mapping[str, str] = os.environ) -> str | None:
    """The kubelet to ask, None for none: "" is https://$NODE_NAME:10250 where a service-account token exists."""
    url = settings.kubelet_url.strip()
    if url == "off":
        return None
    if url:
        if not url.startswith(("http://", "https://")):
            raise click.BadParameter(f"{url!r} is not http(s)://HOST:PORT or off", param_hint="--kubelet-url")
        return url
    if not os.path.isfile(settings.kubelet_token_file):
        return None
    return f"https://{env.get('NODE_NAME') or node}:{KUBELET_PORT}"


def build_resolver(settings: IdentitySettings, node: str, simulated: bool = False,
                   env: Mapping[str, str] = os.environ) -> IdentityResolver:
    """The resolver these settings describe (not started)."""
    url = kubelet_url(settings, node, env)
    kubelet = None
    if url is not None:
        https = url.startswith("https:")
        ca = settings.kubelet_ca_file
        if ca is None and os.path.isfile(DEFAULT_CA_FILE):
            ca = DEFAULT_CA_FILE
        if https and settings.kubelet_insecure_skip_tls_verify:
            log.warning("the kubelet's certificate is not checked (--kubelet-insecure-skip-tls-verify): anyone on "
                        "the path to %s can read the service account's token", url)
        kubelet = KubeletClient(url, token_file=settings.kubelet_token_file if https else None, ca_file=ca,
                                insecure=settings.kubelet_insecure_skip_tls_verify)
    socket = settings.pod_resources_socket
    pod_resources = PodResourcesClient(socket) if socket and os.path.exists(socket) else None
    labels = tuple(label.strip() for label in settings.pod_labels.split(",") if label.strip())
    return IdentityResolver(node, kubelet, pod_resources, pod_labels=labels, team_label=settings.team_label,
                            refresh_s=settings.kubelet_refresh, simulated=simulated)
