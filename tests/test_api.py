"""The query API over a real uvicorn on a free port: named queries, read-only SQL, and its errors."""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import httpx
import pytest

from fleetprof.api import serve_api


@pytest.fixture
def api(cpu_store):
    server = serve_api(cpu_store.store, "127.0.0.1", 0)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            yield http, cpu_store, server
    finally:
        server.stop()


def window(cpu_store) -> dict[str, str]:
    return {"since": cpu_store.since.isoformat(), "until": cpu_store.until.isoformat()}


def test_healthz_names_the_database(api):
    http, cpu, server = api
    assert server.host == "127.0.0.1" and server.port > 0
    assert http.get("/healthz").json() == {"status": "ok", "service": "fleetprof", "database": cpu.store.database}


def test_named_query(api):
    http, cpu, _ = api
    response = http.get("/api/query/top_functions_cpu", params=window(cpu))
    assert response.status_code == 200
    body = response.json()
    assert body["columns"] == ["function", "binary", "self", "total"]
    assert body["rows"] == [["compute", "app", 5, 5], ["io", "libc.so.6", 3, 3], ["idle", "app", 2, 2],
                            ["main", "app", 0, 10], ["run", "app", 0, 8]]
    # text parameters typed by the placeholders: epoch seconds, relative times, integers
    params = {"since": str(int(cpu.since.timestamp())), "until": cpu.until.isoformat(), "node": "n1", "pid": "10"}
    assert http.get("/api/query/totals_cpu", params=params).json() == {"columns": ["node", "samples"],
                                                                       "rows": [["n1", 8]]}
    assert http.get("/api/query/totals_cpu", params={"since": "1d"}).json()["rows"] == [["n1", 8], ["n2", 2]]


def test_flamegraph_rows_are_json_arrays(api):
    http, cpu, _ = api
    body = http.get("/api/query/flamegraph_cpu", params=window(cpu)).json()
    assert body["rows"] == [[["main", "run", "compute"], 5], [["main", "run", "run", "io"], 3], [["main", "idle"], 2]]


def test_named_query_errors(api):
    http, cpu, _ = api
    missing = http.get("/api/query/no_such_query")
    assert missing.status_code == 404 and "no named query" in missing.json()["error"]
    assert http.get("/api/query/..%2Fstore%2Fcreate_database").status_code == 404
    for params, needle in [({**window(cpu), "pid": "abc"}, "pid"), ({**window(cpu), "limit": "-3"}, "limit"),
                           ({"since": "yesterday", "until": "now"}, "not a time"),
                           ({**window(cpu), "bogus": "1"}, "bogus"), ({"until": "now"}, "since")]:
        response = http.get("/api/query/top_functions_cpu", params=params)
        assert response.status_code == 400, params
        error = response.json()["error"]
        assert needle in error and "\n" not in error


def test_sql_with_parameters(api):
    http, cpu, _ = api
    response = http.post("/api/sql", json={
        "sql": "SELECT node, sum(count) AS samples, min(ts) AS first FROM cpu_samples WHERE pid = {pid:UInt32} "
               "GROUP BY node", "params": {"pid": 20}})
    assert response.status_code == 200
    first = (cpu.since + timedelta(seconds=20)).isoformat()
    assert response.json() == {"columns": ["node", "samples", "first"], "rows": [["n2", 2, first]]}
    for statement in ["SHOW TABLES", "DESCRIBE TABLE frames", "EXPLAIN SELECT 1", "WITH 2 AS x SELECT x"]:
        assert http.post("/api/sql", json={"sql": statement}).status_code == 200, statement


@pytest.mark.parametrize("statement", [
    "INSERT INTO cpu_samples (node, count) VALUES ('n9', 1)",
    "DROP TABLE cpu_samples",
    "TRUNCATE TABLE cpu_samples",
    "CREATE TABLE evil (a UInt8) ENGINE = Memory",
    "ALTER TABLE cpu_samples DELETE WHERE 1",
    "SELECT 1 SETTINGS readonly = 0",
    "INSERT INTO FUNCTION file('out.csv') SELECT 1",
])
def test_sql_refuses_writes(api, statement):
    http, cpu, _ = api
    response = http.post("/api/sql", json={"sql": statement})
    assert response.status_code == 403, response.text
    assert "readonly" in response.json()["error"].lower()
    after = http.post("/api/sql", json={"sql": "SELECT sum(count) FROM cpu_samples"}).json()
    assert after["rows"] == [[10]]


def test_sql_errors_are_one_line(api):
    http, _, _ = api
    for body in [None, {"sql": ""}, {"sql": "SELECT 1", "params": [1]}, {"query": "SELECT 1"}]:
        response = http.post("/api/sql", json=body) if body is not None else http.post("/api/sql", content=b"{")
        assert response.status_code == 400, body
    response = http.post("/api/sql", json={"sql": "SELECT nope FROM cpu_samples"})
    assert response.status_code == 400
    assert "UNKNOWN_IDENTIFIER" in response.json()["error"] and "\n" not in response.json()["error"]


def test_concurrent_requests(api):
    http, cpu, _ = api

    def one(i: int) -> int:
        if i % 2:
            return http.get("/api/query/totals_cpu", params=window(cpu)).json()["rows"][0][1]
        return http.post("/api/sql", json={"sql": "SELECT sum(count) FROM cpu_samples WHERE node = 'n1'"}).json()[
            "rows"][0][0]

    with ThreadPoolExecutor(8) as pool:
        assert set(pool.map(one, range(40))) == {8}


def test_stop_releases_the_port(cpu_store):
    server = serve_api(cpu_store.store, "127.0.0.1", 0)
    port = server.port
    with pytest.raises(OSError):
        serve_api(cpu_store.store, "127.0.0.1", port)  # taken: an OSError here, not a sys.exit in a thread
    server.stop()
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0


def test_metrics_endpoint_serves_the_processors_counters(api):
    from processors import metrics

    http, _, _ = api
    metrics.COMMITS.labels("sink").inc()
    response = http.get("/metrics")
    assert response.status_code == 200
    assert 'fleetprof_processor_commits_total{stage="sink"}' in response.text
