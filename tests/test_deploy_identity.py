"""The agent's deployment for workload identity, on what `kustomize build infra/k8s` renders (the fixtures of
test_deploy_manifests.py): the RBAC its ServiceAccount is granted, the kubelet's pod-resources socket mounted
read-only, the kubelet's address, CA and token file, and every setting the manifests give the agent checked against
the options of the real `fleetprof agent` command (their names, their environment variables, how they parse)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import click
import pytest
import yaml

from tests.test_deploy_manifests import (
    K8S,
    SYSTEMD,
    config_map,
    container_env,
    example_secrets,
    parse_fleetprof,
    tool,
    workloads,
)

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"  # where Kubernetes mounts the token and CA
POD_RESOURCES_DIR = "/var/lib/kubelet/pod-resources"
# the agent's settings for workload identity, as issue 17's contract names them: option -> environment variable
IDENTITY_OPTIONS = {
    "--node": "FLEETPROF_NODE",
    "--kubelet-url": "FLEETPROF_KUBELET_URL",
    "--kubelet-ca-file": "FLEETPROF_KUBELET_CA_FILE",
    "--kubelet-token-file": "FLEETPROF_KUBELET_TOKEN_FILE",
    "--kubelet-refresh": "FLEETPROF_KUBELET_REFRESH",
    "--pod-labels": "FLEETPROF_POD_LABELS",
    "--team-label": "FLEETPROF_TEAM_LABEL",
    "--pod-resources-socket": "FLEETPROF_POD_RESOURCES_SOCKET",
}
SKIP_VERIFY = "--kubelet-insecure-skip-tls-verify"


@pytest.fixture(scope="module")
def resources() -> list[dict]:
    done = subprocess.run([str(tool("kustomize")), "build", str(K8S)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def agent_options() -> dict[str, click.Option]:
    """Every option of the real `fleetprof agent`, by each of its flags."""
    from fleetprof.commands.agent import agent

    return {flag: param for param in agent.params if isinstance(param, click.Option) for flag in param.opts}


def envvars(option: click.Option) -> set[str]:
    if not option.envvar:
        return set()
    return {option.envvar} if isinstance(option.envvar, str) else set(option.envvar)


def agent_container(resources: list[dict]) -> dict:
    (container,) = workloads(resources)["agent"]["spec"]["containers"]
    return container


def agent_env(resources: list[dict]) -> dict[str, str]:
    return container_env(agent_container(resources), config_map(resources), example_secrets())


def test_the_agent_command_has_the_identity_options_with_their_variables():
    options = agent_options()
    missing = sorted(set(IDENTITY_OPTIONS) - set(options))
    assert not missing, f"fleetprof agent lacks {missing} (issue 17's resolver adds them)"
    assert {flag: envvars(options[flag]) for flag in IDENTITY_OPTIONS} == \
        {flag: {name} for flag, name in IDENTITY_OPTIONS.items()}
    skip = options[SKIP_VERIFY]
    assert skip.is_flag and parse_fleetprof(["agent"], {})[1][skip.name] is False  # TLS verified unless asked
    # the token is only ever a file: no option takes a token's value
    assert [f for f in options if "token" in f and not f.endswith("-file")] == []


def test_every_fleetprof_variable_the_agent_gets_is_one_the_agent_reads(resources):
    read = set().union(*(envvars(o) for o in agent_options().values()))
    # the Kafka settings are read by fleetprof's shared settings, not by the agent's options
    shared = set(re.findall(r"""["'](FLEETPROF_[A-Z0-9_]+)["']""",
                            (Path(__file__).resolve().parent.parent / "fleetprof" / "settings.py").read_text()))
    given = {v["name"] for v in agent_container(resources)["env"] if v["name"].startswith("FLEETPROF_")}
    assert given >= {"FLEETPROF_NODE", "FLEETPROF_KUBELET_URL", "FLEETPROF_KUBELET_CA_FILE",
                     "FLEETPROF_KUBELET_TOKEN_FILE", "FLEETPROF_POD_LABELS", "FLEETPROF_TEAM_LABEL"}
    assert sorted(given - read - shared) == []
    assert given & set(IDENTITY_OPTIONS.values()) <= read


def test_the_agent_account_may_read_pods_and_nothing_more(resources):
    by_kind: dict[str, list[dict]] = {}
    for r in resources:
        by_kind.setdefault(r["kind"], []).append(r)
    assert "Role" not in by_kind and "RoleBinding" not in by_kind
    (account,), (role,), (binding,) = by_kind["ServiceAccount"], by_kind["ClusterRole"], by_kind["ClusterRoleBinding"]
    grants = {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
              for resource in rule["resources"] for verb in rule["verbs"]}
    assert grants == {("", "nodes/proxy", "get"), ("", "pods", "get"), ("", "pods", "list"), ("", "pods", "watch")}
    assert all(set(rule) == {"apiGroups", "resources", "verbs"} for rule in role["rules"])  # no URLs, no wildcards
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": account["metadata"]["namespace"]}]
    assert account["metadata"]["namespace"] == "fleetprof"
    pods = workloads(resources)
    assert pods["agent"]["spec"]["serviceAccountName"] == account["metadata"]["name"]
    # only the agent carries a token; the processors talk to no Kubernetes API
    assert {c: p["spec"]["automountServiceAccountToken"] for c, p in pods.items()} == \
        {c: c == "agent" for c in pods}


def test_the_pod_resources_socket_is_mounted_read_only(resources):
    pod = workloads(resources)["agent"]["spec"]
    (mount,) = [m for m in agent_container(resources)["volumeMounts"] if m["mountPath"] == POD_RESOURCES_DIR]
    assert mount.get("readOnly") is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["hostPath"]["path"] == POD_RESOURCES_DIR
    # the socket the agent dials lies in that mount
    socket = agent_env(resources).get("FLEETPROF_POD_RESOURCES_SOCKET") or \
        agent_options()["--pod-resources-socket"].default
    assert Path(socket).parent == Path(POD_RESOURCES_DIR)


def test_the_kubelet_is_reached_by_the_node_name_with_tls_and_the_token_file(resources):
    container = agent_container(resources)
    names = [v["name"] for v in container["env"]]
    raw = {v["name"]: v.get("value") for v in container["env"]}
    assert raw["FLEETPROF_KUBELET_URL"] == "https://$(NODE_NAME):10250"
    # Kubernetes expands $(NODE_NAME) only in the variables after it
    assert all(names.index("NODE_NAME") < names.index(n) for n, value in raw.items() if "$(NODE_NAME)" in (value or ""))
    env = agent_env(resources)
    assert (env["FLEETPROF_NODE"], env["FLEETPROF_KUBELET_URL"]) == ("gpu-node-7", "https://gpu-node-7:10250")
    assert env["FLEETPROF_KUBELET_CA_FILE"] == f"{SERVICE_ACCOUNT_DIR}/ca.crt"
    assert env["FLEETPROF_KUBELET_TOKEN_FILE"] == f"{SERVICE_ACCOUNT_DIR}/token"
    assert SKIP_VERIFY not in container["args"]
    config = config_map(resources)
    assert (env["FLEETPROF_POD_LABELS"], env["FLEETPROF_TEAM_LABEL"]) == \
        (config["FLEETPROF_POD_LABELS"], config["FLEETPROF_TEAM_LABEL"]) == ("app.kubernetes.io/name,job-name,team",
                                                                             "team")
    # the real command line parses them from the environment alone
    name, values = parse_fleetprof(container["args"], env)
    options = agent_options()
    parsed = {flag: values[options[flag].name] for flag in ("--node", "--kubelet-url", "--kubelet-ca-file",
                                                              "--kubelet-token-file", "--team-label")}
    assert (name, {flag: str(v) for flag, v in parsed.items()}) == ("agent", {
        "--node": "gpu-node-7", "--kubelet-url": "https://gpu-node-7:10250",
        "--kubelet-ca-file": f"{SERVICE_ACCOUNT_DIR}/ca.crt", "--kubelet-token-file": f"{SERVICE_ACCOUNT_DIR}/token",
        "--team-label": "team"})
    labels = values[options["--pod-labels"].name]
    assert (labels if isinstance(labels, str) else ",".join(labels)) == "app.kubernetes.io/name,job-name,team"
    assert values[options[SKIP_VERIFY].name] is False


def test_no_command_line_carries_a_token(resources):
    for component, pod in workloads(resources).items():
        (container,) = pod["spec"]["containers"]
        assert not [a for a in container["command"] + container["args"] if "token" in a.lower()], component
        for var in container.get("env", []):
            if "TOKEN" in var["name"]:  # a path to the token, never its value or a Secret holding it
                assert var["name"].endswith("_FILE") and var["value"].startswith("/"), var
    for unit in SYSTEMD.glob("*.service"):
        assert not re.search(r"^ExecStart=.*token", unit.read_text(), re.M | re.I), unit.name
