"""The agent's identity settings (fleetprof/commands/agent_identity.py) and the Slurm environment reader on a real
process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from fleetprof.commands.agent_identity import IdentitySettings, build_resolver, identity_options, kubelet_url
from producers.slurm_env import SlurmEnv, parse_environ, process_uid, read_slurm_env, user_name


@click.command()
@identity_options
def show(identity: IdentitySettings) -> None:
    click.echo(repr(identity))


def test_options_and_their_environment_variables() -> None:
    result = CliRunner().invoke(show, ["--kubelet-url", "http://127.0.0.1:10255", "--kubelet-refresh", "90s",
                                       "--kubelet-insecure-skip-tls-verify"],
                                env={"FLEETPROF_POD_LABELS": "team,app", "FLEETPROF_TEAM_LABEL": "owner",
                                     "FLEETPROF_KUBELET_TOKEN_FILE": "/t", "FLEETPROF_KUBELET_CA_FILE": "/ca",
                                     "FLEETPROF_POD_RESOURCES_SOCKET": "/s.sock"})
    assert result.exit_code == 0, result.output
    assert result.output.strip() == repr(IdentitySettings(
        kubelet_url="http://127.0.0.1:10255", kubelet_ca_file="/ca", kubelet_token_file="/t",
        kubelet_insecure_skip_tls_verify=True, kubelet_refresh=90.0, pod_labels="team,app", team_label="owner",
        pod_resources_socket="/s.sock"))


def test_kubelet_url_auto_off_and_explicit(tmp_path: Path) -> None:
    token = tmp_path / "token"
    absent = IdentitySettings(kubelet_token_file=str(tmp_path / "none"))
    assert kubelet_url(absent, "n1", {}) is None  # no service account: not in Kubernetes
    token.write_text("t")
    present = IdentitySettings(kubelet_token_file=str(token))
    assert kubelet_url(present, "n1", {"NODE_NAME": "worker-3"}) == "https://worker-3:10250"
    assert kubelet_url(present, "n1", {}) == "https://n1:10250"
    assert kubelet_url(IdentitySettings(kubelet_url="off", kubelet_token_file=str(token)), "n1", {}) is None
    with pytest.raises(click.BadParameter):
        kubelet_url(IdentitySettings(kubelet_url="10.0.0.1:10250"), "n1", {})


def test_build_resolver(tmp_path: Path) -> None:
    sock = tmp_path / "kubelet.sock"
    r = build_resolver(IdentitySettings(kubelet_url="http://127.0.0.1:10255", pod_labels=" team , app ,",
                                        pod_resources_socket=str(sock), kubelet_refresh=30), "n1", env={})
    assert (r.kubelet.url, r.kubelet.token_file, r.pod_resources, r.pod_labels, r.refresh_s) == (
        "http://127.0.0.1:10255", None, None, ("team", "app"), 30)  # no token over plain http; no socket: off
    r.close()
    off = build_resolver(IdentitySettings(kubelet_url="off", pod_resources_socket=""), "n1", env={})
    assert off.kubelet is None and off.pod_resources is None
    off.close()


def test_parse_environ() -> None:
    data = b"PATH=/bin\0SLURM_JOB_ID=12\0SLURM_ARRAY_JOB_ID=10\0SLURM_ARRAY_TASK_ID=2\0SLURM_JOB_ACCOUNT=phys\0" \
           b"SLURM_JOB_USER=ana\0SLURM_STEP_ID=0\0SLURM_JOB_UID=1001\0SLURM_JOB_NAME=x=y\0SLURM_JOB_USER\0" \
           b"SLURM_JOB_ACCOUNT=\xff\0"
    assert parse_environ(data) == SlurmEnv(job_id="12", step="0", array_job_id="10", array_task_id="2",
                                           account="phys", user="ana", uid="1001")
    assert not parse_environ(b"HOME=/root\0")


def test_read_slurm_env_of_a_real_process() -> None:
    env = {"PATH": os.environ.get("PATH", "/usr/bin"), "SLURM_JOB_ID": "31337", "SLURM_ARRAY_TASK_ID": "5",
           "SLURM_JOB_ACCOUNT": "bio"}
    # Popen returns once execve has begun, before the kernel has laid out the new environment (environ reads empty
    # until then): the child says when it runs Python
    child = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(30)"], env=env,
                             stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"up\n"
        assert read_slurm_env(child.pid) == SlurmEnv(job_id="31337", array_task_id="5", account="bio")
        assert process_uid(child.pid) == os.getuid()
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    assert read_slurm_env(child.pid) == SlurmEnv()  # gone
    assert process_uid(child.pid) is None
    assert user_name(0) == "root"
    assert user_name(2**31 - 7) == str(2**31 - 7)
