"""The web UI's page in real headless Chromium (Debian's chromium driven by playwright): charts, drag-to-select,
flame graph, search, zoom, filters, diff, exports and the call tree, with screenshots kept under
test-artifacts/webui/."""

from __future__ import annotations

import json
import random
import re
import shutil
from datetime import UTC, datetime
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
    SERVE,
    TRAIN,
    cli_export,
    pprof_stacks,
    rooted,
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
    # labels follow the data, per kind and node: n1's NVML readings are simulated, and n2's CPU samples (loadgen's)
    assert page.page.locator("#simulated").inner_text().split("\n") == [
        "SIMULATED: GPU readings from node n1 come from fleetprof's simulated NVML library.",
        "SIMULATED: CPU samples from node n2 come from fleetprof loadgen's simulated fleet."]
    assert page.page.locator("#flame-title").inner_text() == "SIMULATED · CPU samples · 54 samples"
    assert page.folded() == {**rooted(FIRST_HALF_CPU, TRAIN), f"{TRAIN};main;run;io": 18, f"{SERVE};main;idle": 6}
    # total time, callees included: every sample has a process frame and app's main; a third is in libc's io
    assert page.page.locator("#legend").inner_text().split("\n") == ["total time in:", "app 100.0%",
                                                                      "process 100.0%", "libc.so.6 33.3%"]
    page.shot("overview")

    # the second half, where GPU utilization dropped: from just before it to past the end of the chart
    page.drag("util", ui.t0 + 55, ui.t1 + 30)
    since, until = page.js("window.fleetprof.state.selection")
    assert ui.t0 + 54 <= since <= ui.t0 + 56 and until == ui.t1
    assert page.folded() == {f"{TRAIN};main;run;io": 18, f"{SERVE};main;idle": 6}
    assert f"sel={since}%2C{until}" in page.page.url
    page.shot("second-half")

    exported = page.download("#export-folded")
    assert exported == cli_export(ui, "folded", since, until) == (
        f"{TRAIN};main;run;io 18\n{SERVE};main;idle 6\n".encode())
    pprof = page.download("#export-pprof")
    assert pprof == cli_export(ui, "pprof", since, until)
    assert pprof_stacks(pprof) == SECOND_HALF_CPU  # pprof keeps the processes in labels
    speedscope = page.download("#export-speedscope")
    assert speedscope == cli_export(ui, "speedscope", since, until)
    assert json.loads(speedscope)["profiles"][0]["weights"] == [18, 6]

    page.changing(lambda: page.page.check("input[name=kind][value=gpu]"))
    assert page.folded() == rooted(SECOND_HALF_GPU, TRAIN)
    assert page.page.locator("#flame-title").inner_text() == ("SIMULATED · GPU kernel time by launching CPU stack · "
                                                              "6.000 ms")
    assert page.page.locator("#simulated").inner_text().split("\n")[1] == (
        "SIMULATED: GPU kernel times from node n1 come from fleetprof's simulated GPU library.")
    # colored by language (frames.language): every GPU stack holds its kernel, its CPU frames and its process
    page.page.select_option("#color-by", "language")
    assert page.page.locator("#legend").inner_text().split("\n") == ["total time in:", "GPU kernels 100.0%",
                                                                      "native 100.0%", "process 100.0%"]
    page.shot("gpu-by-language")
    page.changing(lambda: page.page.check("input[name=kind][value=cpu]"))
    assert page.page.locator("#legend").inner_text().split("\n") == ["total time in:", "native 100.0%",
                                                                      "process 100.0%"]
    page.page.select_option("#color-by", "binary")
    # the second half: io (libc.so.6) 18 of 24, under app's main like idle
    assert page.page.locator("#legend").inner_text().split("\n") == ["total time in:", "app 100.0%",
                                                                      "process 100.0%", "libc.so.6 75.0%"]
    page.changing(lambda: page.page.check("input[name=kind][value=gpu]"))
    page.changing(lambda: page.page.click("#clear-selection"))
    assert page.folded() == rooted({**FIRST_HALF_GPU, **SECOND_HALF_GPU}, TRAIN)
    assert page.errors == []


def test_one_time_format_and_round_axis_ticks(browser, served):
    """24-hour UTC, 'YYYY-MM-DD HH:MM:SS', in the range inputs (wide enough for it), the labels and the charts' hover
    legend, the time axis cut from it; value axes from 0 on round ticks, labelled with their units."""
    ui = served
    page = Page(browser, ui)
    start, end = (datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%d %H:%M:%S") for t in (ui.t0, ui.t1))
    assert page.js("[document.getElementById('since').value, document.getElementById('until').value]") == [start, end]
    assert page.js("['since', 'until'].every(id => { const el = document.getElementById(id); "
                   "return el.scrollWidth <= el.clientWidth; })")
    assert page.page.locator("#range-label").inner_text() == f"whole range: {start} – {end} (120 s)"
    page.page.click("#set-baseline")
    assert page.page.locator("#baseline-label").inner_text() == f"baseline {start} – {end}"
    # hover the utilization chart 30 s in: its legend names that time in the same format
    page.page.locator("[data-chart=util]").scroll_into_view_if_needed()
    point = page.js(f"window.fleetprof.charts.pointOf('util', {(ui.t0 + 30) * 1000})")
    page.page.mouse.move(point["x"], point["y"], steps=3)
    page.next_frame()
    legend = page.page.locator("[data-chart=util] .u-legend .u-series").first
    at = datetime.fromtimestamp(ui.t0 + 30, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")
    assert (legend.locator(".u-label").inner_text(), legend.locator(".u-value").inner_text()) == ("time (UTC)", at)
    axes = page.js("""Object.fromEntries(window.fleetprof.charts.plots.map(p => [p.fleetprofId,
        p.axes.map(a => [a.label || null, a._splits, a._values])]))""")
    ticks = axes["util"][0][2]
    assert ticks and all(re.fullmatch(r"\d\d:\d\d:\d\d", t) for t in ticks)
    tick_times = [datetime.fromtimestamp(s, tz=UTC).strftime("%H:%M:%S") for s in axes["util"][0][1]]
    assert ticks == tick_times and all(s % 15 == 0 for s in axes["util"][0][1])  # round times, UTC
    assert axes["util"][1] == ["%", [0, 50, 100], ["0", "50", "100"]]
    assert axes["memory"][1] == ["GiB", [0, 10, 20, 30, 40], ["0", "10", "20", "30", "40"]]
    assert axes["clocks"][1] == ["MHz", [0, 1000, 2000, 3000], ["0", "1000", "2000", "3000"]]
    assert axes["power"][1] == ["W", [0, 100, 200, 300, 400], ["0", "100", "200", "300", "400"]]
    # the activity chart: two units on two labelled axes (CPU 0.5 samples/s at most, GPU 0.4 ms/s)
    assert axes["activity"][1] == ["CPU samples/s", [0, 0.2, 0.4, 0.6], ["0.0", "0.2", "0.4", "0.6"]]
    assert axes["activity"][2] == ["GPU ms/s", [0, 0.1, 0.2, 0.3, 0.4], ["0.0", "0.1", "0.2", "0.3", "0.4"]]
    page.shot("time-and-axes")
    assert page.errors == []


def test_search_and_zoom(browser, served):
    page = Page(browser, served)
    page.page.fill("#search", "^io$")
    page.page.wait_for_function("document.getElementById('match').textContent !== ''")
    assert page.page.locator("#match").inner_text() == "matched 33.3% (18 samples)"
    assert page.js("Array.from(window.fleetprof.flame.match)") == [
        int(name == "io") for name in page.js("window.fleetprof.flame.model.frames")]
    page.page.mouse.move(*page.frame_point(TRAIN, "main", "run", "io"))
    assert page.page.locator("#tooltip").inner_text() == (
        "io  (libc.so.6)\ntotal 18 samples (33.3%)\nself  18 samples (33.3%)")
    assert page.page.locator("#legend .legend-item").last.inner_text() == "search match 33.3%"
    page.page.mouse.move(*page.frame_point(TRAIN))
    assert page.page.locator("#tooltip").inner_text() == (
        f"{TRAIN}  (process)\ntotal 48 samples (88.9%)\nself  0 samples (0.0%)")
    page.shot("search")

    run = page.js(f"window.fleetprof.flame.find('{TRAIN}', 'main', 'run')")
    page.page.mouse.click(*page.frame_point(TRAIN, "main", "run"))
    assert page.js("window.fleetprof.flame.focus") == run
    assert page.page.locator("#zoom-label").inner_text() == f"zoomed: {TRAIN} › main › run"
    width = page.js("window.fleetprof.flame.canvas.clientWidth")
    after = page.js(f"window.fleetprof.flame.rectOf({run})")
    assert after["x"] == 0 and after["w"] == width  # the zoomed frame spans the graph
    compute = page.js(f"window.fleetprof.flame.rectOf(window.fleetprof.flame.find('{TRAIN}', 'main', 'run', "
                      "'compute'))")
    assert compute["w"] == pytest.approx(width * 30 / 48)
    assert page.js(f"window.fleetprof.flame.rectOf(window.fleetprof.flame.find('{SERVE}', 'main', 'idle'))") is None
    page.shot("zoomed")
    page.page.click("#reset-zoom")
    assert page.js("window.fleetprof.flame.focus") == 0
    assert page.js(f"window.fleetprof.flame.rectOf(window.fleetprof.flame.find('{SERVE}', 'main', 'idle'))") \
        is not None
    assert page.errors == []


def test_diff_of_two_ranges(browser, served):
    ui = served
    page = Page(browser, ui)
    page.drag("activity", ui.t0 + 55, ui.t0 - 30)  # right to left, past the start: the first half
    assert page.js("window.fleetprof.state.selection")[0] == ui.t0
    assert page.folded() == rooted(FIRST_HALF_CPU, TRAIN)
    page.page.click("#set-baseline")
    page.drag("activity", ui.t0 + 55, ui.t1 + 30)
    assert page.folded() == {f"{TRAIN};main;run;io": 18, f"{SERVE};main;idle": 6}
    page.changing(lambda: page.page.check("#diff"))
    assert page.page.locator("#flame-title").inner_text().endswith(
        "diff vs baseline (30 samples): red grew, blue shrank, in share of its range")

    def described(*path: str) -> dict:
        return page.js(f"window.fleetprof.flame.describe(window.fleetprof.flame.find(...{json.dumps(path)}))")

    io = described(TRAIN, "main", "run", "io")
    assert (io["total"], io["baseTotal"], io["delta"]) == (18, 0, pytest.approx(0.75))
    run = described(TRAIN, "main", "run")
    assert (run["total"], run["baseTotal"], run["delta"]) == (18, 30, pytest.approx(-0.25))
    compute = described(TRAIN, "main", "run", "compute")
    assert (compute["total"], compute["baseTotal"], compute["delta"]) == (0, 30, pytest.approx(-1.0))
    assert described(SERVE)["delta"] == pytest.approx(0.25)
    # width by the new range: compute, gone from it, is not drawn; colors: io red (grew), run blue (shrank)
    assert page.js(f"window.fleetprof.flame.rectOf(window.fleetprof.flame.find('{TRAIN}', 'main', 'run', "
                   "'compute'))") is None
    io_color = page.js(f"window.fleetprof.flame._color(window.fleetprof.flame.find('{TRAIN}', 'main', 'run', 'io'))")
    run_color = page.js(f"window.fleetprof.flame._color(window.fleetprof.flame.find('{TRAIN}', 'main', 'run'))")
    assert (io_color, run_color) == ("hsl(0, 85%, 61.5%)", "hsl(215, 85%, 84.5%)")
    # the color scale: its ends are the largest change (compute: -100 points), from full blue to full red
    assert page.page.locator("#legend").inner_text().split("\n") == [
        "change in share of its range:", "−100.0 points (shrank)", "+100.0 points (grew)",
        "width: the range shown; a changed frame is drawn at least 3 px wide; frames gone from it are not drawn"]
    gradient = page.js("document.querySelector('#legend .scale-bar').style.background")
    assert gradient.startswith("linear-gradient(to right, rgb(") and gradient.count("rgb(") == 21
    assert page.js("getComputedStyle(document.querySelector('#legend .scale-bar')).backgroundImage") == gradient
    page.shot("diff")

    # a frame too narrow to see that changed is still drawn, 3 px wide; one that did not change is not
    got = page.js("""(() => {
        const graph = window.fleetprof.flame;
        graph.setData({frames: ["a", "big", "tiny", "same"], binaries: ["x"], frame_binary: [0, 0, 0, 0],
                       stacks: [[0, 1], [0, 2], [0, 3]], counts: [20000, 2, 2], base_counts: [10000, 0, 1],
                       total: 20004, base_total: 10001, unit: "samples"});
        const rect = (name) => graph.rectOf(graph.find("a", name));
        return {tiny: rect("tiny"), same: rect("same"), changed: graph.changed(graph.find("a", "tiny")),
                width: graph.canvas.clientWidth};
    })()""")
    assert got["changed"] and got["tiny"]["w"] == 3 and got["same"] is None
    # where it is, past big, but kept inside the graph: at the right edge
    assert got["width"] * 20000 / 20004 > got["tiny"]["x"] == got["width"] - 3
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
