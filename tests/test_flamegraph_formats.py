"""Flame graph outputs, each read back by what people use to read it (pprof by `go tool pprof`)."""

from __future__ import annotations

import gzip
import json
import re

import pytest
from click.testing import CliRunner

from fleetprof.cli import cli
from fleetprof.flamegraph_formats import folded, html_page, speedscope, tree
from fleetprof.pprof import Profile, pprof_bytes
from tests.pprof_tool import pprof

STACKS = [(["main", "run", "compute"], 5), (["main", "run", "run", "io"], 3), (["main", "idle"], 2),
          (["main", "odd;name</script>"], 1)]


def test_folded():
    assert folded(STACKS).decode().splitlines() == ["main;run;compute 5", "main;run;run;io 3", "main;idle 2",
                                                    "main;odd:name</script> 1"]


def test_speedscope_samples_and_weights():
    doc = json.loads(speedscope(STACKS, "t"))
    frames = [f["name"] for f in doc["shared"]["frames"]]
    prof = doc["profiles"][0]
    assert prof["type"] == "sampled" and prof["endValue"] == 11
    assert [[frames[i] for i in s] for s in prof["samples"]] == [fs for fs, _ in STACKS]
    assert prof["weights"] == [5, 3, 2, 1]


def test_pprof_decodes_with_our_own_reader():
    prof = Profile()
    prof.ParseFromString(gzip.decompress(pprof_bytes(STACKS)))
    names = {f.id: prof.string_table[f.name] for f in prof.function}
    got = [([names[i] for i in reversed(s.location_id)], s.value[0]) for s in prof.sample]
    assert got == STACKS
    assert [prof.string_table[prof.sample_type[0].type], prof.string_table[prof.sample_type[0].unit]] == \
        ["samples", "count"]


def test_pprof_python_frames_carry_their_file_and_line():
    stacks = [(["_start", "<module> (/srv/train.py:40)", "Model.forward (/srv/model.py:12)", "gemm"], 3)]
    prof = Profile()
    prof.ParseFromString(gzip.decompress(pprof_bytes(stacks)))
    fn = {f.id: (prof.string_table[f.name], prof.string_table[f.filename]) for f in prof.function}
    got = [[(*fn[loc.line[0].function_id], loc.line[0].line) for loc in prof.location if loc.id == i][0]
           for i in reversed(prof.sample[0].location_id)]
    assert got == [("_start", "", 0), ("<module>", "/srv/train.py", 40), ("Model.forward", "/srv/model.py", 12),
                   ("gemm", "", 0)]


def test_pprof_is_read_by_go_tool_pprof(tmp_path):
    path = tmp_path / "cpu.pb.gz"
    plain = STACKS[:3]  # pprof's text output shortens C++-looking names such as "a</b>"
    path.write_bytes(pprof_bytes(plain))
    out = pprof(path, "-traces")
    # each trace: a count line, then frames leaf first
    traces = []
    for block in out.split("-----------+-------------------------------------------------------")[1:]:
        lines = [ln.strip() for ln in block.strip().splitlines() if ln.strip()]
        if not lines or lines[0].startswith("+"):
            continue
        count, leaf = re.match(r"(\d+)\s+(.*)", lines[0]).groups()
        traces.append((list(reversed([leaf] + lines[1:])), int(count)))
    assert sorted(traces) == sorted(plain)


def test_html_page_banner():
    page = html_page(STACKS, "t", banner="SIMULATED: <x>").decode()
    assert "<title>t (SIMULATED: &lt;x&gt;)</title>" in page
    assert '<body>\n<div id="banner">SIMULATED: &lt;x&gt;</div>\n<div id="bar"><b>t</b>' in page
    assert "banner" not in html_page(STACKS, "t").decode().split("</style>")[1]


def test_html_page_embeds_the_tree_safely():
    page = html_page(STACKS, "t <b>").decode()
    assert "<title>t &lt;b&gt;</title>" in page
    data = re.search(r'<script id="data" type="application/json">(.*?)</script>', page, re.S).group(1)
    assert json.loads(data) == tree(STACKS)
    assert tree(STACKS)["v"] == 11
    assert [c["n"] for c in tree(STACKS)["c"][0]["c"]] == ["run", "idle", "odd;name</script>"]


@pytest.mark.parametrize("fmt", ["pprof", "speedscope", "html", "folded", "json"])
def test_query_flamegraph_formats_from_the_store(cpu_store, tmp_path, fmt):
    out = tmp_path / f"flame.{fmt}"
    data_dir = tmp_path / "data"
    result = CliRunner().invoke(cli, [
        "--clickhouse", f"chdb://{cpu_store.store.location}", "--database", cpu_store.store.database,
        "--data-dir", str(data_dir), "query", "flamegraph", "--kind", "cpu",
        "--since", cpu_store.since.isoformat(), "--until", cpu_store.until.isoformat(),
        "--format", fmt, "-o", str(out)])
    assert result.exit_code == 0, result.output
    raw = out.read_bytes()
    if fmt == "pprof":
        prof = Profile()
        prof.ParseFromString(gzip.decompress(raw))
        assert sum(s.value[0] for s in prof.sample) == 10
    elif fmt == "speedscope":
        assert json.loads(raw)["profiles"][0]["endValue"] == 10
    elif fmt == "html":
        data = re.search(rb'<script id="data" type="application/json">(.*?)</script>', raw, re.S).group(1)
        assert json.loads(data)["v"] == 10
    elif fmt == "folded":
        assert raw.decode() == ("train (pid 10 on n1);main;run;compute 5\ntrain (pid 10 on n1);main;run;run;io 3\n"
                                "serve (pid 20 on n2);main;idle 2\n")
    else:
        assert sum(s["count"] for s in json.loads(raw)) == 10
