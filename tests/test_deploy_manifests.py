"""The deployment files, each checked by a tool that reads it the way its consumer will:
infra/k8s by kustomize (the kustomization renders) and kubeconform (every resource against the Kubernetes JSON
schemas, strict); infra/systemd by systemd-analyze verify; every fleetprof command line in both by the real CLI's
parser (types, ranges, choices and FLEETPROF_* fallbacks, without running the command); infra/grafana by running
every panel's SQL, its Grafana macros expanded as the ClickHouse plugin expands them, on a migrated store with known
rows. The validators come from infra/tools.sh (bash infra/setup.sh runs it).
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from unittest import mock

import pytest
import yaml

from tests.elf_helpers import unavailable

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "infra" / "k8s"
SYSTEMD = ROOT / "infra" / "systemd"
DASHBOARD = ROOT / "infra" / "grafana" / "fleetprof-dashboard.json"
TOOLS = ROOT / ".build" / "tools"
KUBERNETES_VERSION = "1.33.0"
SCHEMAS = TOOLS / "kubernetes-json-schema" / f"v{KUBERNETES_VERSION}-standalone-strict"
EXAMPLE_SECRETS = K8S / "secrets.example.yaml"
INSTALLED_FLEETPROF = "/opt/fleetprof/.venv/bin/fleetprof"  # where the systemd units expect the install
STAGES = ("symbolize", "correlate", "alerts", "sink")
SOURCES = ("fleetprof", "processors", "producers")


def tool(name: str) -> Path:
    path = TOOLS / name
    if not path.is_file():
        unavailable(f"{path.relative_to(ROOT)} missing (bash infra/tools.sh installs it)")
    return path


# --- the CLI's parser ----------------------------------------------------------------------------------------------


def parse_fleetprof(argv: list[str], env: dict[str, str]) -> tuple[str, dict]:
    """Parse a fleetprof command line with the real CLI, seeing only `env`, without running anything: the same group
    and subcommands with their callbacks replaced by a recorder. Returns (subcommand, its parsed values); a bad
    option, value, range or choice raises click's usage error."""
    import click

    from fleetprof.cli import cli
    from fleetprof.commands import COMMANDS

    seen: dict = {}
    group = copy.copy(cli)
    group.commands = {}
    for command in COMMANDS:
        stub = copy.copy(command)
        stub.callback = lambda *_, _name=command.name, **values: seen.update(name=_name, values=values)
        group.add_command(stub)
    with mock.patch.dict(os.environ, env, clear=True):
        try:
            group.main(argv, prog_name="fleetprof", standalone_mode=False)
        except click.ClickException as exc:
            raise AssertionError(f"fleetprof {shlex.join(argv)}: {exc.format_message()}") from None
    return seen["name"], seen["values"]


def test_the_parser_rejects_what_the_cli_rejects():
    with pytest.raises(AssertionError, match="--metrics-port"):
        parse_fleetprof(["process", "sink", "--metrics-port", "70000"], {})
    with pytest.raises(AssertionError, match="'transform' is not one of"):
        parse_fleetprof(["process", "transform"], {})
    assert parse_fleetprof(["process", "sink", "--metrics-port", "9464"], {})[1]["metrics_port"] == 9464


def fleetprof_variables_read() -> set[str]:
    """Every FLEETPROF_* name that appears as a whole string literal in the project's code."""
    names = set()
    for package in SOURCES:
        for path in (ROOT / package).rglob("*.py"):
            names.update(re.findall(r"""["'](FLEETPROF_[A-Z0-9_]+)["']""", path.read_text()))
    return names


# --- Kubernetes ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rendered() -> str:
    """`kustomize build infra/k8s`: what `kubectl apply -k` would send."""
    done = subprocess.run([str(tool("kustomize")), "build", str(K8S)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def resources(rendered: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


def kubeconform(*files: Path) -> dict:
    if not SCHEMAS.is_dir():
        unavailable(f"{SCHEMAS.relative_to(ROOT)} missing (bash infra/tools.sh extracts it)")
    location = f"{SCHEMAS.parent}/{{{{ .NormalizedKubernetesVersion }}}}-standalone{{{{ .StrictSuffix }}}}/" \
               "{{ .ResourceKind }}{{ .KindSuffix }}.json"
    done = subprocess.run([str(tool("kubeconform")), "-strict", "-summary", "-output", "json",
                           "-kubernetes-version", KUBERNETES_VERSION, "-schema-location", location, *map(str, files)],
                          capture_output=True, text=True, timeout=60)
    return json.loads(done.stdout)


def test_every_resource_is_valid_against_the_kubernetes_schemas(rendered, tmp_path):
    (tmp_path / "rendered.yaml").write_text(rendered)
    report = kubeconform(tmp_path / "rendered.yaml", EXAMPLE_SECRETS)
    assert report["resources"] == []  # only resources with a problem are listed
    # the rendered kustomization (namespace, ConfigMap, the agent's ServiceAccount, ClusterRole and ClusterRoleBinding,
    # DaemonSet, 4 Deployments) and the 4 example Secrets
    assert report["summary"] == {"valid": 14, "invalid": 0, "errors": 0, "skipped": 0}


def test_kubeconform_catches_a_misspelt_field(tmp_path):
    broken = tmp_path / "agent.yaml"
    broken.write_text((K8S / "agent-daemonset.yaml").read_text().replace("hostPID: true", "hostPid: true"))
    report = kubeconform(broken)
    assert report["summary"]["invalid"] == 1
    assert "hostPid" in report["resources"][0]["msg"]


def test_the_kustomization_lists_every_manifest_but_the_example_secrets():
    listed = yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]
    present = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml", EXAMPLE_SECRETS.name}
    assert sorted(listed) == sorted(present)


def workloads(resources: list[dict]) -> dict[str, dict]:
    """component label -> the pod spec of each DaemonSet and Deployment."""
    return {r["metadata"]["labels"]["app.kubernetes.io/component"]: r["spec"]["template"]
            for r in resources if r["kind"] in ("DaemonSet", "Deployment")}


def container_env(container: dict, config: dict[str, str], secrets: dict[str, dict[str, str]]) -> dict[str, str]:
    """The environment a container starts with: ConfigMap entries, then env, secrets from the example Secrets;
    $(NAME) in a value expands to a variable defined before it, as Kubernetes does."""
    env = dict(config) if container.get("envFrom") else {}
    for var in container.get("env", []):
        ref = var.get("valueFrom", {})
        if "value" in var:
            env[var["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), var["value"])
        elif "configMapKeyRef" in ref:
            env[var["name"]] = config[ref["configMapKeyRef"]["key"]]
        elif "secretKeyRef" in ref:
            env[var["name"]] = secrets[ref["secretKeyRef"]["name"]][ref["secretKeyRef"]["key"]]
        elif "fieldRef" in ref:
            assert ref["fieldRef"]["fieldPath"] == "spec.nodeName", var
            env[var["name"]] = "gpu-node-7"
    return env


def example_secrets() -> dict[str, dict[str, str]]:
    return {doc["metadata"]["name"]: doc["stringData"] for doc in yaml.safe_load_all(EXAMPLE_SECRETS.read_text())}


def config_map(resources: list[dict]) -> dict[str, str]:
    (config,) = [r for r in resources if r["kind"] == "ConfigMap"]
    return config["data"]


def test_every_container_runs_a_fleetprof_command_the_cli_accepts(resources):
    secrets, config = example_secrets(), config_map(resources)
    commands = {}
    for component, pod in workloads(resources).items():
        (container,) = pod["spec"]["containers"]
        env = container_env(container, config, secrets)
        argv = [re.sub(r"\$\((\w+)\)", lambda m, e=env: e[m.group(1)], a) for a in container["args"]]
        assert container["command"] == ["fleetprof"]
        commands[component] = parse_fleetprof(argv, env)
    assert commands["agent"] == ("agent", commands["agent"][1])
    assert commands["agent"][1]["node"] == "gpu-node-7"  # the node's name, not the pod's
    for stage in STAGES:
        assert commands[stage][0] == "process"
        assert commands[stage][1]["stage"] == stage
        assert commands[stage][1]["metrics_port"] == 9464
    # the alerts stage's thresholds come from the ConfigMap through the options' FLEETPROF_ALERT_* fallbacks
    from fleetprof.alerting import alert_config

    alerts = alert_config(commands["alerts"][1])
    assert (alerts.below, alerts.busy_above, alerts.recover_above) == (20.0, 50.0, 40.0)
    assert (alerts.hold_ns, alerts.recover_ns) == (30 * 10**9, 15 * 10**9)


def test_subcommand_help_runs():
    fleetprof = Path(sys.executable).parent / "fleetprof"
    for sub in ("agent", "process"):
        done = subprocess.run([str(fleetprof), sub, "--help"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and "Usage: fleetprof" in done.stdout, done.stderr


def test_containers_get_kafka_and_the_stores_they_need(resources):
    secrets, config = example_secrets(), config_map(resources)
    envs = {c: container_env(p["spec"]["containers"][0], config, secrets) for c, p in workloads(resources).items()}
    for component, env in envs.items():
        assert env["FLEETPROF_KAFKA"] == secrets["fleetprof-kafka"]["bootstrap-servers"], component
    # only the stages that touch ClickHouse get its credentials, each its own user
    assert {c for c, env in envs.items() if "FLEETPROF_CLICKHOUSE" in env} == {"alerts", "sink"}
    assert envs["sink"]["FLEETPROF_CLICKHOUSE_USER"] == "fleetprof_sink"
    assert envs["alerts"]["FLEETPROF_CLICKHOUSE_USER"] == "fleetprof"
    assert "FLEETPROF_ALERT_WEBHOOK_URL" in envs["alerts"]


def test_every_fleetprof_variable_set_is_one_fleetprof_reads(resources):
    read = fleetprof_variables_read()
    assert "FLEETPROF_KAFKA_SASL_PASSWORD" in read  # the scan itself finds names
    set_by_k8s = set(config_map(resources))
    for pod in workloads(resources).values():
        set_by_k8s.update(v["name"] for v in pod["spec"]["containers"][0].get("env", []))
    set_by_systemd = set(re.findall(r"^(FLEETPROF_\w+)=", (SYSTEMD / "fleetprof.env.example").read_text(), re.M))
    for unit in SYSTEMD.glob("*.service"):
        set_by_systemd.update(re.findall(r"^Environment=(FLEETPROF_\w+)=", unit.read_text(), re.M))
    for name in sorted(n for n in set_by_k8s | set_by_systemd if n.startswith("FLEETPROF_")):
        assert name in read, f"{name} is set for fleetprof but nothing reads it"


def test_secret_and_config_references_resolve(resources):
    secrets = example_secrets()
    config_names = {r["metadata"]["name"] for r in resources if r["kind"] == "ConfigMap"}
    for pod in workloads(resources).values():
        container = pod["spec"]["containers"][0]
        for source in container.get("envFrom", []):
            assert source["configMapRef"]["name"] in config_names
        for var in container.get("env", []):
            ref = var.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                assert ref["key"] in secrets.get(ref["name"], {}), ref
            ref = var.get("valueFrom", {}).get("configMapKeyRef")
            if ref:
                assert ref["name"] in config_names and ref["key"] in config_map(resources), ref


def test_the_agent_has_what_bpf_and_nvml_need(resources):
    pod = workloads(resources)["agent"]["spec"]
    (container,) = pod["containers"]
    assert pod["hostPID"] is True
    assert container["securityContext"]["privileged"] is True
    mounts = {m["mountPath"]: m.get("readOnly", False) for m in container["volumeMounts"]}
    assert mounts == {"/sys/kernel/debug": False, "/sys/kernel/tracing": False, "/sys/fs/bpf": False,
                      "/lib/modules": True, "/usr/src": True, "/var/lib/kubelet/pod-resources": True}
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    assert {m["mountPath"] for m in container["volumeMounts"]} == set(host_paths.values())
    env = {v["name"]: v.get("value") for v in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert "nvidia.com/gpu" not in json.dumps(container.get("resources", {}))  # never takes a GPU from workloads


def test_processors_name_their_metrics_port_for_prometheus(resources):
    for stage in STAGES:
        pod = workloads(resources)[stage]
        (container,) = pod["spec"]["containers"]
        port = container["args"][container["args"].index("--metrics-port") + 1]
        assert pod["metadata"]["annotations"]["prometheus.io/port"] == port
        assert [p["containerPort"] for p in container["ports"]] == [int(port)]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True


# --- systemd -------------------------------------------------------------------------------------------------------


def verify_units(units: list[Path], tmp_path: Path) -> subprocess.CompletedProcess:
    """`systemd-analyze verify` of the units in a root directory holding the system's own units and an executable
    where the units expect fleetprof (verify checks that every ExecStart can run)."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        unavailable("systemd-analyze not found (Debian's systemd package; infra/tools.sh installs it)")
    root = tmp_path / "root"
    (root / "etc" / "systemd" / "system").mkdir(parents=True)
    (root / "usr" / "lib" / "systemd").mkdir(parents=True)
    shutil.copytree("/usr/lib/systemd/system", root / "usr" / "lib" / "systemd" / "system", symlinks=True)
    fleetprof = root / INSTALLED_FLEETPROF.lstrip("/")
    fleetprof.parent.mkdir(parents=True)
    fleetprof.write_text(f"#!/bin/sh\nexec {shlex.quote(str(Path(sys.executable).parent / 'fleetprof'))} \"$@\"\n")
    fleetprof.chmod(0o755)
    for unit in units:
        shutil.copy(unit, root / "etc" / "systemd" / "system" / unit.name)
    return subprocess.run([analyze, "verify", "--man=no", f"--root={root}", *(u.name for u in units)],
                          capture_output=True, text=True, timeout=60)


def units() -> list[Path]:
    return sorted(SYSTEMD.glob("*.service"))


def test_units_verify_without_a_warning(tmp_path):
    assert [u.name for u in units()] == sorted(f"fleetprof-{n}.service" for n in ("agent", *STAGES))
    done = verify_units(units(), tmp_path)
    assert done.returncode == 0 and done.stdout + done.stderr == "", done.stdout + done.stderr


def test_verify_reports_a_misspelt_setting(tmp_path):
    broken = tmp_path / "fleetprof-sink.service"
    broken.write_text((SYSTEMD / "fleetprof-sink.service").read_text().replace("Restart=always", "Restart=allways"))
    done = verify_units([broken], tmp_path)
    assert "allways" in done.stdout + done.stderr


def unit_settings(path: Path) -> dict[tuple[str, str], list[str]]:
    """(section, key) -> values of a unit file; keys may repeat, as systemd allows."""
    settings: dict[tuple[str, str], list[str]] = {}
    section = ""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        if re.fullmatch(r"\[\w+\]", line):
            section = line[1:-1]
            continue
        match = re.fullmatch(r"([A-Za-z]+)=(.*)", line)
        assert match and section, f"{path.name}:{number}: not a setting: {line!r}"
        settings.setdefault((section, match.group(1)), []).append(match.group(2))
    return settings


def test_units_run_fleetprof_commands_the_cli_accepts_and_restart():
    env = dict(re.findall(r"^(FLEETPROF_\w+)=(.*)$", (SYSTEMD / "fleetprof.env.example").read_text(), re.M))
    for unit in units():
        settings = unit_settings(unit)
        (exec_start,) = settings[("Service", "ExecStart")]
        argv = shlex.split(exec_start)
        assert argv[0] == INSTALLED_FLEETPROF, unit.name
        name, values = parse_fleetprof(argv[1:], env)
        component = unit.stem.removeprefix("fleetprof-")
        assert (name, values.get("stage")) == (("agent", None) if component == "agent" else ("process", component))
        assert settings[("Service", "Restart")] == ["always"]
        assert settings[("Service", "EnvironmentFile")][0] == "/etc/fleetprof/fleetprof.env"
    ports = [parse_fleetprof(shlex.split(unit_settings(SYSTEMD / f"fleetprof-{s}.service")[("Service", "ExecStart")][0])
                             [1:], env)[1]["metrics_port"] for s in STAGES]
    assert len(set(ports)) == len(STAGES)  # one host may run every stage: each serves metrics on its own port


# --- Grafana -------------------------------------------------------------------------------------------------------

INTERVAL_S = 10


def expand_macros(sql: str, since: datetime, until: datetime, nodes: list[str] | None) -> str:
    """A panel's SQL as the ClickHouse plugin sends it (its README's macro table), for the range [since, until],
    an interval of INTERVAL_S and the node variable set to `nodes` (None: All)."""
    f_s, t_s = int(since.timestamp()), int(until.timestamp())
    start, end = f"fromUnixTimestamp64Milli({f_s * 1000})", f"fromUnixTimestamp64Milli({t_s * 1000})"
    expansions = {
        r"\$__timeFilter_ms\((\w+)\)": rf"\1 >= {start} AND \1 <= {end}",
        r"\$__timeFilter\((\w+)\)": rf"\1 >= toDateTime({f_s}) AND \1 <= toDateTime({t_s})",
        r"\$__timeInterval_ms\((\w+)\)":
            rf"toStartOfInterval(toDateTime64(\1, 3), INTERVAL {INTERVAL_S * 1000} millisecond)",
        r"\$__timeInterval\((\w+)\)": rf"toStartOfInterval(toDateTime(\1), INTERVAL {INTERVAL_S} second)",
        r"\$__interval_s\b": str(INTERVAL_S),
        r"\$__fromTime_ms\b": start,
        r"\$__toTime_ms\b": end,
        r"\$__fromTime\b": f"toDateTime({f_s})",
        r"\$__toTime\b": f"toDateTime({t_s})",
    }
    for pattern, replacement in expansions.items():
        sql = re.sub(pattern, replacement, sql)
    # $__conditionalAll(condition, $var): the condition, or 1=1 when the variable selects everything
    sql = re.sub(r"\$__conditionalAll\((.*?), \$node\)", lambda m: "1=1" if nodes is None else m.group(1), sql)
    sql = sql.replace("${node:singlequote}", ",".join(f"'{n}'" for n in nodes or []))
    assert "$" not in sql, f"a macro or variable left unexpanded: {sql}"
    return sql


def dashboard_queries() -> dict[str, tuple[int, str]]:
    """Panel title -> (its target's format, its SQL), and the variables' queries."""
    model = json.loads(DASHBOARD.read_text())
    out = {}
    for panel in model["panels"]:
        for target in panel.get("targets", []):
            out[panel["title"]] = (target["format"], target["rawSql"])
    for variable in model["templating"]["list"]:
        if variable["type"] == "query":
            out[f"${variable['name']}"] = (1, variable["query"]["rawSql"])
    return out


def test_the_dashboard_is_a_clickhouse_plugin_model():
    model = json.loads(DASHBOARD.read_text())
    plugin = "grafana-clickhouse-datasource"
    assert [i["pluginId"] for i in model["__inputs"]] == [plugin]
    ids = [p["id"] for p in model["panels"]]
    assert len(ids) == len(set(ids))
    for panel in model["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": plugin, "uid": "${datasource}"}, panel["title"]
        (target,) = panel["targets"]
        # the plugin's formats: 0 time series, 1 table; its query types: timeSeries, table
        series = panel["type"] == "timeseries"
        assert (target["editorType"], target["format"], target["queryType"]) == \
            ("sql", 0 if series else 1, "timeSeries" if series else "table"), panel["title"]
    # no two panels overlap on the grid
    cells = set()
    for panel in model["panels"]:
        g = panel["gridPos"]
        area = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & area, panel["title"]
        cells |= area


@pytest.fixture
def fleet_store(store):
    """`store` holding two nodes' NVML readings, CPU samples, GPU kernel time and alerts, all in [since, until)."""
    since = datetime.now(tz=UTC).replace(microsecond=0) - timedelta(hours=1)
    since -= timedelta(seconds=since.second % 10)
    t = [since + timedelta(seconds=10 * i) for i in range(4)]
    device = [[t[i], node, 0, f"GPU-{node}", "H100", "", util, 10, (i + 1) << 30, 80 << 30, 1500, 2600,
               1000 * watts, 700_000, 60, 1, 2, 0, [], False]
              for node, utils, power in (("n1", [90, 80, 5, 3], [600, 550, 120, 110]),
                                         ("n2", [50, 50, 50, 50], [400, 400, 400, 400]))
              for i, (util, watts) in enumerate(zip(utils, power, strict=True))]
    store.insert("gpu_device_metrics", device,
                 ["ts", "node", "gpu_index", "uuid", "name", "parent_uuid", "gpu_util_pct", "mem_util_pct",
                  "mem_used_bytes", "mem_total_bytes", "sm_clock_mhz", "mem_clock_mhz", "power_mw", "power_limit_mw",
                  "temperature_c", "pcie_tx_kbps", "pcie_rx_kbps", "clock_event_reasons", "xid_errors", "simulated"])
    store.insert("frames", [[1, "main", "app", "NATIVE", since], [2, "train_step", "app", "NATIVE", since],
                            [3, "gemm", "cuda", "GPU_KERNEL", since]],
                 ["frame_id", "function", "binary", "kind", "last_seen"])
    store.insert("stacks", [[100, [1, 2], since], [101, [1], since], [102, [1, 2, 3], since]],
                 ["stack_id", "frame_ids", "last_seen"])
    store.insert("cpu_samples", [[t[0], "n1", 10, "train", "", 100, 7], [t[1], "n1", 10, "train", "", 101, 2],
                                 [t[1], "n2", 20, "train", "", 100, 1], [t[2], "n2", 20, "train", "", 999, 4]],
                 ["ts", "node", "pid", "comm", "container_id", "stack_id", "count"])
    store.insert("gpu_kernel_samples", [[t[0], "n1", 10, "", "", 0, 7, 102, "gemm", 3_000_000_000, 30],
                                        [t[1], "n2", 20, "", "", 0, 7, 102, "reduce", 1_000_000_000, 10]],
                 ["ts", "node", "pid", "comm", "container_id", "device", "stream", "stack_id", "kernel_name",
                  "duration_ns", "launches"])
    alert = ["a1", "gpu_util_drop", "FIRING", "n1", 0, "GPU-n1", t[2], t[2], 20.0, 5.0, "GPU 0 idle", "[]"]
    store.insert("alerts", [alert, [*alert[:7], t[2] + timedelta(seconds=1), *alert[8:]]],
                 ["alert_id", "kind", "state", "node", "gpu_index", "gpu_uuid", "started", "time", "threshold",
                  "observed", "message", "evidence"])
    return store, since, since + timedelta(minutes=1)


def test_every_panel_query_runs_on_the_store(fleet_store):
    store, since, until = fleet_store
    queries = dashboard_queries()
    assert len(queries) == 9  # 8 panels and the node variable
    results = {}
    for nodes in (None, ["n1"], ["n1", "n2"]):
        for title, (_, sql) in queries.items():
            _, rows = store.query_sql(expand_macros(sql, since, until, nodes))
            results[(title, tuple(nodes or []))] = rows
    everything = {title: results[(title, ())] for title in queries}
    assert all(everything.values()), [t for t, rows in everything.items() if not rows]
    assert everything["$node"] == [("n1",), ("n2",)]
    # the node variable narrows every panel that shows nodes
    assert results[("$node", ("n1",))] == [("n1",), ("n2",)]  # the variable's own query is not filtered by it
    assert {r[1] for r in results[("GPU utilization", ("n1",))]} == {"n1 / GPU 0"}
    assert results[("GPU utilization", ("n1", "n2"))] == everything["GPU utilization"]


def test_panels_show_the_known_numbers(fleet_store):
    store, since, until = fleet_store

    def panel(title: str) -> list[tuple]:
        return store.query_sql(expand_macros(dashboard_queries()[title][1], since, until, None))[1]

    utilization = panel("GPU utilization")
    assert [(r[1], r[2]) for r in utilization if r[1] == "n1 / GPU 0"] == [("n1 / GPU 0", u) for u in (90, 80, 5, 3)]
    power = [r for r in panel("Power draw vs limit") if r[1] == "n1 / GPU 0"]
    assert [(r[2], r[3]) for r in power] == [(600, 700), (550, 700), (120, 700), (110, 700)]
    # each reading covers 10 s until the next one; the newest covers nothing:
    # n1: 10 s x (10 % + 20 % + 95 %) = 12.5 s, n2: 3 x 10 s x 50 % = 15 s
    (idle,) = panel("Idle GPU-hours")
    assert idle[0] == pytest.approx(27.5 / 3600)
    assert [(n, round(h * 3600, 6)) for n, h in panel("Idle GPU-hours by node")] == [("n2", 15.0), ("n1", 12.5)]
    # main: the leaf of stack 101 (2 samples), in every defined stack (10); stack 999 has no definition
    assert panel("Top CPU functions") == [("train_step", "app", 8, 8), ("[unknown stack 0x03e7]", "", 4, 4),
                                          ("main", "app", 2, 10)]
    assert panel("Top GPU kernels") == [("gemm", 3.0, 30, 0.75), ("reduce", 1.0, 10, 0.25)]
    (alert,) = panel("GPU alerts")  # the transition written twice shows once, the newest
    assert alert[1:4] == ("FIRING", "n1", 0) and alert[-1] == "GPU 0 idle"
    assert alert[0] == since + timedelta(seconds=21)
