"""`fleetprof process STAGE` as a real process: it joins, serves metrics, and leaves cleanly on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx

from tests.conftest import free_ports


def test_symbolizer_process_serves_metrics_and_stops_on_sigterm(kafka_bootstrap, tmp_path):
    (port,) = free_ports(1)
    env = dict(os.environ, FLEETPROF_KAFKA=kafka_bootstrap, FLEETPROF_DATA_DIR=str(tmp_path),
               FLEETPROF_INSTANCE="91")
    proc = subprocess.Popen([sys.executable, "-m", "fleetprof", "process", "symbolize", "--metrics-port", str(port)],
                            env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        body = ""
        while time.monotonic() < deadline:
            try:
                body = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
                break
            except httpx.TransportError:
                time.sleep(0.3)
        assert "fleetprof_processor_messages_in_total" in body
        time.sleep(2)  # let it join its group and start polling
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert '"msg": "stage symbolize stopped"' in err


def test_process_rejects_an_unknown_stage():
    out = subprocess.run([sys.executable, "-m", "fleetprof", "process", "nope"], capture_output=True, text=True)
    assert out.returncode == 2
    assert "'nope' is not one of 'symbolize', 'correlate', 'alerts', 'sink'" in out.stderr
