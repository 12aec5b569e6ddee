"""The web UI's page in real headless Chromium (Debian's chromium driven by playwright): charts, drag-to-select,
flame graph, search, zoom, filters, diff, exports and the call tree, with screenshots kept under
test-artifacts/webui/."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from fleetprof.settings import REPO_ROOT
from fleetprof.webui import model
from tests.elf_helpers import unavailable
from tests.webui_helpers import (
    FIRST_HALF_CPU,
    FIRST_HALF_GPU,
    SECOND_HALF_CPU,
    SECOND_HALF_GPU,
    cli_export,
    pprof_stacks,
)

ARTIFACTS = REPO_ROOT / "test-artifacts" / "webui"
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-dev-shm-usage"]

@pytest.fixture(scope="module")
def browser():
    """Debian's chromium, headless, driven by playwright (which never downloads a browser of its own here)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        unavailable("playwright is not installed (bash infra/setup.sh installs it)")
    chromium = shutil.which("chromium")
    if chromium is None:
        unavailable("chromium not found (bash infra/setup.sh installs Debian's chromium)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


class Page:
    """One page of the UI over `served`, with the waits and gestures the tests need."""

    def __init__(self, browser, ui, query: str = ""):
        self.ui = ui
        self.page = browser.new_page(viewport={"width": 1400, "height": 1200}, accept_downloads=True)
        self.errors: list[str] = []
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        self.page.on("console", lambda msg: msg.type == "error" and self.errors.append(msg.text))
        self.page.goto(f"{ui.url}/?since={ui.t0}&until={ui.t1}{query}")
        self.settle(0)

    def js(self, expression: str):
        return self.page.evaluate(expression)

    def settle(self, after: int) -> None:
        """Wait until the flame graph was drawn from a newer answer than draw `after` and nothing is loading."""
        self.page.wait_for_function(
            f"window.fleetprof && window.fleetprof.flameVersion > {after} && window.fleetprof.pending === 0",
            timeout=20_000)

    def changing(self, action) -> None:
        """Do `action` (which reloads the flame graph), then wait for the new one."""
        version = self.js("window.fleetprof.flameVersion")
        action()
        self.settle(version)

    def folded(self) -> dict[str, int]:
        return {line.rsplit(" ", 1)[0]: int(float(line.rsplit(" ", 1)[1]))
                for line in self.js("window.fleetprof.flame.folded()")}

    def drag(self, chart: str, since_s: float, until_s: float) -> None:
        """Press at since_s on the chart, move to until_s, release: what a person does to select a range."""
        self.page.locator(f"[data-chart={chart}]").scroll_into_view_if_needed()
        a = self.js(f"window.fleetprof.charts.pointOf('{chart}', {since_s * 1000})")
        b = self.js(f"window.fleetprof.charts.pointOf('{chart}', {until_s * 1000})")

        def gesture() -> None:
            # uPlot tracks the cursor once per animation frame: let it see where the press and release happen
            self.page.mouse.move(a["x"], a["y"], steps=5)
            self.next_frame()
            self.page.mouse.down()
            self.page.mouse.move(b["x"], b["y"], steps=10)
            self.next_frame()
            self.page.mouse.up()

        self.changing(gesture)

    def frame_point(self, *path: str) -> tuple[float, float]:
        """The page pixel in the middle of the drawn frame at `path` ("main", "run", ...), scrolled into view."""
        self.page.locator("#flame").scroll_into_view_if_needed()
        canvas = self.page.locator("#flame").bounding_box()
        rect = self.js(f"window.fleetprof.flame.rectOf(window.fleetprof.flame.find(...{json.dumps(path)}))")
        return canvas["x"] + rect["x"] + rect["w"] / 2, canvas["y"] + rect["y"] + rect["h"] / 2

    def next_frame(self) -> None:
        self.page.evaluate("new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))")

    def shot(self, name: str) -> None:
        self.page.evaluate("window.scrollTo(0, 0)")  # else the sticky header lands mid-page in a full-page shot
        self.page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)

    def download(self, selector: str) -> bytes:
        with self.page.expect_download() as info:
            self.page.click(selector)
        return Path(info.value.path()).read_bytes()


def test_page_draws_charts_and_a_dragged_range_drives_the_flame_graph(browser, served):
    ui = served
    page = Page(browser, ui)
    charts = page.js("window.fleetprof.charts.plots.map(p => [p.fleetprofId, p.data.length - 1, p.data[0].length])")
    assert charts == [["activity", 2, 12], ["util", 1, 120], ["memory", 1, 120], ["clocks", 2, 120],
                      ["power", 2, 120], ["temperature", 1, 120], ["pcie", 2, 120], ["process-util", 1, 120],
                      ["process-memory", 1, 120]]
    assert page.js("window.fleetprof.charts.plots[1].data[1].slice(58, 62)") == [90, 90, 20, 20]
    assert page.page.locator("#simulated").is_visible()
    assert page.page.locator("#flame-title").inner_text().startswith("SIMULATED · CPU samples · 54 samples")
    assert page.folded() == {**FIRST_HALF_CPU, **SECOND_HALF_CPU}
    assert page.page.locator("#legend").inner_text().split("\n") == ["app 66.7%", "libc.so.6 33.3%"]
    page.shot("overview")

    # the second half, where GPU utilization dropped: from just before it to past the end of the chart
    page.drag("util", ui.t0 + 55, ui.t1 + 30)
    since, until = page.js("window.fleetprof.state.selection")
    assert ui.t0 + 54 <= since <= ui.t0 + 56 and until == ui.t1
    assert page.folded() == SECOND_HALF_CPU
    assert f"sel={since}%2C{until}" in page.page.url
    page.shot("second-half")

    exported = page.download("#export-folded")
    assert exported == cli_export(ui, "folded", since, until) == b"main;run;io 18\nmain;idle 6\n"
    pprof = page.download("#export-pprof")
    assert pprof == cli_export(ui, "pprof", since, until)
    assert pprof_stacks(pprof) == SECOND_HALF_CPU
    speedscope = page.download("#export-speedscope")
    assert speedscope == cli_export(ui, "speedscope", since, until)
    assert json.loads(speedscope)["profiles"][0]["weights"] == [18, 6]

    page.changing(lambda: page.page.check("input[name=kind][value=gpu]"))
    assert page.folded() == SECOND_HALF_GPU
    assert page.page.locator("#flame-title").inner_text().startswith("SIMULATED · GPU kernel time by launching "
                                                                     "CPU stack · 6.000 ms")
    # colored by language (frames.language): every GPU stack's self time is its kernel's
    page.page.select_option("#color-by", "language")
    assert page.page.locator("#legend").inner_text().split("\n") == ["gpu 100.0%"]
    page.shot("gpu-by-language")
    page.changing(lambda: page.page.check("input[name=kind][value=cpu]"))
    assert page.page.locator("#legend").inner_text().split("\n") == ["native 100.0%"]
    page.page.select_option("#color-by", "binary")
    # the second half's self time: io (libc.so.6) 18, idle (app) 6
    assert page.page.locator("#legend").inner_text().split("\n") == ["libc.so.6 75.0%", "app 25.0%"]
    page.changing(lambda: page.page.check("input[name=kind][value=gpu]"))
    page.changing(lambda: page.page.click("#clear-selection"))
    assert page.folded() == {**FIRST_HALF_GPU, **SECOND_HALF_GPU}
    assert page.errors == []


def test_search_and_zoom(browser, served):
    page = Page(browser, served)
    page.page.fill("#search", "^io$")
    page.page.wait_for_function("document.getElementById('match').textContent !== ''")
    assert page.page.locator("#match").inner_text() == "matched 33.3% (18 samples)"
    assert page.js("Array.from(window.fleetprof.flame.match)") == [
        int(name == "io") for name in page.js("window.fleetprof.flame.model.frames")]
    page.page.mouse.move(*page.frame_point("main", "run", "io"))
    assert page.page.locator("#tooltip").inner_text() == (
        "io  (libc.so.6)\ntotal 18 samples (33.3%)\nself  18 samples (33.3%)")
    page.shot("search")

    run = page.js("window.fleetprof.flame.find('main', 'run')")
    page.page.mouse.click(*page.frame_point("main", "run"))
    assert page.js("window.fleetprof.flame.focus") == run
    assert page.page.locator("#zoom-label").inner_text() == "zoomed: main › run"
    width = page.js("window.fleetprof.flame.canvas.clientWidth")
    after = page.js(f"window.fleetprof.flame.rectOf({run})")
    assert after["x"] == 0 and after["w"] == width  # the zoomed frame spans the graph
    compute = page.js("window.fleetprof.flame.rectOf(window.fleetprof.flame.find('main', 'run', 'compute'))")
    assert compute["w"] == pytest.approx(width * 30 / 48)
    assert page.js("window.fleetprof.flame.rectOf(window.fleetprof.flame.find('main', 'idle'))") is None
    page.shot("zoomed")
    page.page.click("#reset-zoom")
    assert page.js("window.fleetprof.flame.focus") == 0
    assert page.js("window.fleetprof.flame.rectOf(window.fleetprof.flame.find('main', 'idle'))") is not None
    assert page.errors == []


def test_node_and_process_filters(browser, served):
    page = Page(browser, served)
    assert page.page.locator("#node option").all_inner_texts() == ["all nodes", "n1", "n2"]
    assert page.page.locator("#process option").all_inner_texts() == ["all processes", "train 10 · n1",
                                                                      "serve 20 · n2"]
    page.changing(lambda: page.page.select_option("#process", "n2|20"))
    assert page.folded() == {"main;idle": 6}
    assert page.js("[window.fleetprof.state.node, window.fleetprof.state.pid]") == ["n2", 20]
    # n2 has no NVML readings: only the activity chart, and no SIMULATED banner
    assert page.js("window.fleetprof.charts.plots.map(p => p.fleetprofId)") == ["activity"]
    assert not page.page.locator("#simulated").is_visible()
    page.shot("process-filter")
    page.changing(lambda: page.page.select_option("#node", "n1"))
    assert page.folded() == {"main;run;compute": 30, "main;run;io": 18}
    assert page.js("window.fleetprof.state.pid") == 0
    assert page.errors == []


def test_diff_of_two_ranges(browser, served):
    ui = served
    page = Page(browser, ui)
    page.drag("activity", ui.t0 + 55, ui.t0 - 30)  # right to left, past the start: the first half
    assert page.js("window.fleetprof.state.selection")[0] == ui.t0
    assert page.folded() == FIRST_HALF_CPU
    page.page.click("#set-baseline")
    page.drag("activity", ui.t0 + 55, ui.t1 + 30)
    assert page.folded() == SECOND_HALF_CPU
    page.changing(lambda: page.page.check("#diff"))
    assert page.page.locator("#flame-title").inner_text().endswith(
        "diff vs baseline (30 samples): red grew, blue shrank, in share of its range")

    def described(*path: str) -> dict:
        return page.js(f"window.fleetprof.flame.describe(window.fleetprof.flame.find(...{json.dumps(path)}))")

    io = described("main", "run", "io")
    assert (io["total"], io["baseTotal"], io["delta"]) == (18, 0, pytest.approx(0.75))
    run = described("main", "run")
    assert (run["total"], run["baseTotal"], run["delta"]) == (18, 30, pytest.approx(-0.25))
    compute = described("main", "run", "compute")
    assert (compute["total"], compute["baseTotal"], compute["delta"]) == (0, 30, pytest.approx(-1.0))
    assert described("main")["delta"] == 0
    # width by the new range: compute, gone from it, is not drawn; colors: io red (grew), run blue (shrank)
    assert page.js("window.fleetprof.flame.rectOf(window.fleetprof.flame.find('main', 'run', 'compute'))") is None
    io_color = page.js("window.fleetprof.flame._color(window.fleetprof.flame.find('main', 'run', 'io'))")
    run_color = page.js("window.fleetprof.flame._color(window.fleetprof.flame.find('main', 'run'))")
    assert io_color.startswith("hsl(0,") and run_color.startswith("hsl(215,")
    page.shot("diff")
    assert page.errors == []



def test_call_tree_of_stacks(browser, served):
    """The page's call tree (static/flamegraph.js buildTree), on stacks built to trip it: one function name in two
    binaries, a stack that is a prefix of others, a repeated stack; then random stacks, checked against sums here."""
    page = Page(browser, served)
    tricky = {"frames": ["b", "a", "c", "a"], "binaries": ["x", "y"], "frame_binary": [0, 0, 0, 1],
              "stacks": [[1, 0], [1, 0, 2], [1], [3, 0], [1, 0]], "counts": [5, 3, 2, 7, 1]}
    got = page.js(f"""(async () => {{
        const m = await import("./static/flamegraph.js");
        const graph = window.fleetprof.flame;
        graph.setData({json.dumps(tricky)});
        const t = graph.model;
        const nodes = Array.from({{length: t.count}}, (_, i) => [graph.path(i).join(";"), graph.binary(i), t.total[i],
                                                                  t.self[i], t.x[i], t.end[i]]);
        return {{folded: graph.folded(), nodes, built: m.buildTree({json.dumps(tricky)}).count}};
    }})()""")
    assert got["folded"] == ["a 2", "a;b 6", "a;b;c 3", "a;b 7"]  # a in binary x sorts before a in binary y
    assert got["nodes"] == [["", "", 18, 0, 0, 6], ["a", "x", 11, 2, 0, 4], ["a;b", "x", 9, 6, 0, 4],
                            ["a;b;c", "x", 3, 3, 0, 4], ["a", "y", 7, 0, 11, 6], ["a;b", "x", 7, 7, 11, 6]]
    assert got["built"] == 6

    rng = random.Random(5)
    names = [f"fn{i}" for i in range(40)]
    stacks: dict[tuple[str, ...], int] = {}
    while len(stacks) < 3000:
        stacks.setdefault(tuple(rng.choice(names[:8] if d < 3 else names) for d in range(rng.randint(1, 30))),
                          rng.randint(1, 1000))
    rows = [(list(s), [f"lib{int(f[2:]) % 5}.so" for f in s], n) for s, n in stacks.items()]
    payload = model.flamegraph(rows)
    got = page.js(f"""(() => {{
        const graph = window.fleetprof.flame;
        graph.setData({json.dumps(payload)});
        const t = graph.model;
        let ordered = true;  // children in name order, each inside its parent's span
        for (let i = 1; i < t.count; i++) {{
            const p = t.parent[i];
            ordered = ordered && t.x[i] >= t.x[p] && t.x[i] + t.total[i] <= t.x[p] + t.total[p] + 1e-9;
        }}
        return {{folded: graph.folded(), total: t.total[0], ordered, count: t.count}};
    }})()""")
    assert got["total"] == sum(stacks.values()) and got["ordered"]
    assert {line.rsplit(" ", 1)[0]: int(line.rsplit(" ", 1)[1]) for line in got["folded"]} == {
        ";".join(s): n for s, n in stacks.items()}
    assert got["folded"] == sorted(got["folded"], key=lambda line: line.rsplit(" ", 1)[0].split(";"))
    assert got["count"] == 1 + len({s[:d] for s in stacks for d in range(1, len(s) + 1)})
    assert page.errors == []
