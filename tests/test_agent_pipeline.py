"""The whole CPU path for real: `fleetprof agent` samples a C workload with BPF and publishes to a real broker, the
real symbolizer and sink store it in chDB, and the stored profile matches what the agent reports it sent, with the
workload's hot function named from the symbol tables the agent published (needs root, bcc and kernel headers:
skipped with the reason without them, a failure on CI)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter

from tests.pipeline_helpers import messages_to_end, sink, symbolizer, wait_for
from tests.test_cpu_sampler import workload, workload_binary  # noqa: F401 - fixtures

TOP_LEAF_SQL = """
SELECT f.function, sum(s.count) AS n
FROM cpu_samples AS s
INNER JOIN (SELECT stack_id, any(frame_ids) AS frame_ids FROM stacks GROUP BY stack_id) AS st
    ON s.stack_id = st.stack_id
INNER JOIN (SELECT frame_id, any(function) AS function FROM frames GROUP BY frame_id) AS f
    ON f.frame_id = arrayElement(st.frame_ids, -1)
WHERE s.node = {node:String} AND s.pid = {pid:UInt32}
GROUP BY f.function ORDER BY n DESC LIMIT 3
"""


def _stored(store, node: str, pid: int) -> int:
    _, rows = store.query_sql("SELECT sum(count) FROM cpu_samples WHERE node = {node:String} AND pid = {pid:UInt32}",
                              {"node": node, "pid": pid})
    return int(rows[0][0] or 0)


def test_agent_once_publishes_what_the_pipeline_stores_and_symbolizes(kafka_bootstrap, store, workload,  # noqa: F811
                                                                       workload_binary) -> None:  # noqa: F811
    run = uuid.uuid4().hex[:8]
    node = f"agent-{run}"
    out = subprocess.run([sys.executable, "-m", "fleetprof", "agent", "--once", "--window", "2s", "--frequency", "99",
                          "--pid", str(workload.pid), "--node", node, "--format", "json"],
                         env=dict(os.environ, FLEETPROF_KAFKA=kafka_bootstrap), capture_output=True, text=True,
                         timeout=90)  # the hang guard: bcc compiling beside the other test worker took 33-66 s
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.splitlines()[-1])
    assert summary["node"] == node and summary["windows"] == 1
    assert summary["lost_stacks"] == 0 and summary["dropped_samples"] == 0
    assert summary["samples"] > 0 and summary["kernel_build_id"].startswith("kernel-"), out.stderr
    assert summary["symbol_chunks"] >= 2  # the workload's table and the kernel's, at least
    assert "window 1:" in out.stderr

    with symbolizer(kafka_bootstrap, f"sym-{run}") as sym, sink(store, kafka_bootstrap, f"sink-{run}") as snk:
        wait_for(lambda: _stored(store, node, workload.pid) >= summary["samples"], timeout=60,
                 what="the agent's samples in the store", running=[sym, snk])
        time.sleep(0.5)  # nothing more may arrive
    assert _stored(store, node, workload.pid) == summary["samples"]
    _, rows = store.query_sql(TOP_LEAF_SQL, {"node": node, "pid": workload.pid})
    assert rows and rows[0][0] in ("leaf", "tick"), f"top leaf functions: {rows}"


def test_agent_loops_until_sigterm_and_sends_each_table_once(kafka_bootstrap, workload) -> None:  # noqa: F811
    started_ms = int(time.time() * 1000)  # tests run one at a time: later symbols are this agent's
    agent = subprocess.Popen([sys.executable, "-m", "fleetprof", "agent", "--window", "1s", "--frequency", "99",
                              "--pid", str(workload.pid), "--node", f"agent-{uuid.uuid4().hex[:8]}", "--format",
                              "json", "--no-gpu"],  # a CPU workload: no GPU probe compile (~12 s) before window 1
                             env=dict(os.environ, FLEETPROF_KAFKA=kafka_bootstrap),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(line.startswith("window 2:") for line in lines):
            line = agent.stderr.readline()
            if not line and agent.poll() is not None:
                break
            lines.append(line)
        agent.send_signal(signal.SIGTERM)
        out, err = agent.communicate(timeout=30)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    lines += err.splitlines(keepends=True)
    assert agent.returncode == 0, "".join(lines)
    windows = [line for line in lines if line.startswith("window ")]
    assert len(windows) >= 2
    # a table goes out with the first window whose samples hit its file (the kernel's with the first kernel frame,
    # which a busy loop may take windows to show), and never again
    sent = sum(int(re.search(r" (\d+) symbol chunks", line).group(1)) for line in windows)
    assert " 0 symbol chunks" not in windows[0] and sent > 0
    # the tables: symbol chunks, and the workload identities the batches reference (issue 17)
    keys = [m.key() for topic in ("symbols", "identities") for m in messages_to_end(kafka_bootstrap, topic, started_ms)]
    assert len(keys) == sent and Counter(keys).most_common(1)[0][1] == 1, "".join(windows)
    summary = json.loads(out.splitlines()[-1])
    assert summary["windows"] == len(windows) and summary["samples"] > 0

