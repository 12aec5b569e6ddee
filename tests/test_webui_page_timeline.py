"""The web UI's GPU timeline in real headless Chromium (test_webui_page.py's browser and Page) over the known records of
test_webui_timeline.py: bars drawn in their lanes (the canvas's pixels and its data attributes), the hover's name,
duration, weight, NVTX range, CUDA graph and launching stack, the link both ways with the GPU flame graph's
selection, the refusal of a long range and the note on a range older than its records. Screenshots under
test-artifacts/webui/."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime

from fleetprof.webui import timeline
from tests.test_webui_page import ARTIFACTS, Page, browser  # noqa: F401  (the module's browser fixture)
from tests.test_webui_timeline import ALL_REDUCE, MANGLED_ALL_REDUCE, NS, add_timeline

N1 = "train (pid 10)"  # the process frame of n1's train, as the flame graph of one node names it
GRID = [228, 228, 228]  # a time tick's line across the lanes
COLORS = {"kernel": [39, 174, 96], "copy": [41, 128, 185], "set": [230, 126, 34], "collective": [142, 68, 173]}
# the first window's bars on n1, by start (test_webui_timeline.add_timeline), and the one at t0 + 30 s
GEMM, COPY, GEMM_GRAPH, ALL_REDUCE_BAR, SET, LATE_GEMM = range(6)


def open_timeline(browser, ui, query: str = "&node=n1&kind=gpu") -> Page:  # noqa: F811
    page = Page(browser, ui, query)
    settle_timeline(page, 0)
    return page


def settle_timeline(page: Page, after: int) -> None:
    page.page.wait_for_function(f"window.fleetprof.timeline.version > {after} && !window.fleetprof.timeline.pending",
                                timeout=20_000)


def zoom_to(page: Page, bar: int) -> None:
    """Show bar `bar` a third of the width wide, in the middle."""
    page.js(f"(() => {{ const v = window.fleetprof.timeline.view; const d = v.end[{bar}] - v.start[{bar}];"
            f" v.setView(v.start[{bar}] - d, v.end[{bar}] + d); }})()")


def click_frame(page: Page, *path: str) -> None:
    """A click in the middle of the flame graph's frame at `path` (through the canvas's locator, which scrolls it
    into view: the timeline above moves the flame graph down the page)."""
    rect = page.js(f"window.fleetprof.flame.rectOf(window.fleetprof.flame.find(...{json.dumps(path)}))")
    page.page.locator("#flame").click(position={"x": rect["x"] + rect["w"] / 2, "y": rect["y"] + rect["h"] / 2})


def click_bar(page: Page, bar: int) -> None:
    point = page.js(f"window.fleetprof.timeline.view.barPoint({bar})")
    page.page.locator("#timeline").click(position=point)


def pixel(page: Page, x: float, y: float) -> list[int]:
    return page.js(f"Array.from(document.getElementById('timeline').getContext('2d')"
                   f".getImageData({x} * devicePixelRatio, {y} * devicePixelRatio, 1, 1).data.slice(0, 3))")


def lane_colors(page: Page, bar: int) -> list[list[int]]:
    """The canvas's color at bar `bar`'s middle in each lane, top to bottom (the lane rows' middles)."""
    point = page.js(f"window.fleetprof.timeline.view.barPoint({bar})")
    rows = page.js("(() => { const v = window.fleetprof.timeline.view;"
                   " return v.rows.map((r, k) => r.group ? null : v.rowY[k] + 9).filter(y => y !== null); })()")
    return [pixel(page, point["x"], y) for y in rows]


def test_timeline_draws_bars_in_their_lanes(browser, served):  # noqa: F811
    add_timeline(served)
    page = open_timeline(browser, served)
    canvas = page.page.locator("#timeline")
    assert canvas.get_attribute("data-bars") == "6"
    assert json.loads(canvas.get_attribute("data-lanes")) == [["n1/0/7", 3], ["n1/0/8", 1], ["n1/1/0", 2]]
    assert page.page.locator("[data-timeline=info]").inner_text() == (
        "SIMULATED · 6 sampled records, standing for 14 launches (their weights)")
    # each bar, zoomed to, is its kind's color in its own lane and nowhere else (lanes: GPU 0 streams 7 and 8, GPU 1
    # stream 0)
    empty = [0, 0, 0]  # the canvas is transparent where nothing is drawn
    for bar, kind, lane in ((GEMM, "kernel", 0), (COPY, "copy", 2), (GEMM_GRAPH, "kernel", 0),
                            (ALL_REDUCE_BAR, "collective", 1), (SET, "set", 2), (LATE_GEMM, "kernel", 0)):
        zoom_to(page, bar)
        colors = lane_colors(page, bar)
        assert colors[lane] == COLORS[kind], (bar, colors)
        # the other lanes: background or a grid line there, no bar
        assert [c in (empty, GRID) for k, c in enumerate(colors) if k != lane] == [True, True], (bar, colors)
    zoom_to(page, GEMM)
    page.shot("timeline")
    # the whole range again: 120 s, where the ms-long bars are a pixel wide each
    page.page.click("[data-timeline=reset]")
    assert page.js("window.fleetprof.timeline.view.view") == [0, 120 * NS]
    assert page.errors == []


def test_timeline_zooms_with_the_wheel_and_pans_with_a_drag(browser, served):  # noqa: F811
    add_timeline(served)
    page = open_timeline(browser, served)
    canvas = page.page.locator("#timeline")
    canvas.scroll_into_view_if_needed()
    box = canvas.bounding_box()
    gutter, width = 130, page.js("window.fleetprof.timeline.view.width")
    x, y = box["x"] + gutter + (width - gutter) * 0.25, box["y"] + 40

    def time_at(view: list[float]) -> float:  # the time under the pointer
        return view[0] + (x - box["x"] - gutter) / (width - gutter) * (view[1] - view[0])

    page.page.mouse.move(x, y)
    before = page.js("window.fleetprof.timeline.view.view")
    page.page.mouse.wheel(0, -300)  # zoom in by e around the pointer
    page.page.wait_for_function("window.fleetprof.timeline.view.view[0] > 0")
    after = page.js("window.fleetprof.timeline.view.view")
    assert abs((after[1] - after[0]) / (before[1] - before[0]) - math.exp(-1)) < 1e-9
    # the time under the pointer stays there, to the pixel (events give whole pixels)
    assert abs(time_at(after) - time_at(before)) < (before[1] - before[0]) / (width - gutter)
    # a drag of 100 px to the right shows what was 100 px to the left, and selects nothing
    page.page.mouse.down()
    page.page.mouse.move(x + 50, y, steps=5)
    page.page.mouse.move(x + 100, y, steps=5)
    page.page.mouse.up()
    panned = page.js("window.fleetprof.timeline.view.view")
    shift = 100 / (width - gutter) * (after[1] - after[0])
    pixel_ns = (after[1] - after[0]) / (width - gutter)
    assert abs(panned[0] - (after[0] - shift)) <= pixel_ns and abs(panned[1] - (after[1] - shift)) <= pixel_ns
    assert page.js("window.fleetprof.flame.focus") == 0
    # a double click shows the whole range again
    page.page.mouse.dblclick(x, y)
    assert page.js("window.fleetprof.timeline.view.view") == [0, 120 * NS]
    assert page.errors == []


def test_timeline_hover_names_the_bar_its_range_and_stack(browser, served):  # noqa: F811
    add_timeline(served)
    page = open_timeline(browser, served)
    zoom_to(page, GEMM_GRAPH)
    page.page.locator("#timeline").scroll_into_view_if_needed()
    box = page.page.locator("#timeline").bounding_box()
    point = page.js(f"window.fleetprof.timeline.view.barPoint({GEMM_GRAPH})")
    page.page.mouse.move(box["x"] + point["x"], box["y"] + point["y"])
    tooltip = page.page.locator("[data-timeline=tooltip]")
    start = datetime.fromtimestamp(served.t0 + 2, tz=UTC).strftime("%H:%M:%S")
    assert tooltip.inner_text().split("\n") == [
        "gemm_kernel  (kernel)", f"duration 3.000 ms   start {start}.000000 UTC",
        "weight 4: stands for 4 launches", "NVTX range train_step > backward", "CUDA graph 3 node 17",
        f"{N1} · GPU 0 stream 7", "launching stack (root first):", "  main", "  launch", "  gemm_kernel"]
    # a copy: its bytes and rate; the set's stack the store never got is named as the flame graph names it
    assert page.js(f"window.fleetprof.timeline.view.tooltipText({COPY})").split("\n")[2:5] == [
        "weight 2: stands for 2 launches", "bytes 4.00 MiB  (16.78 GB/s)", "NVTX range train_step"]
    assert page.js(f"window.fleetprof.timeline.view.describe({SET}).stack") == ["[unknown stack 0xcd]"]
    # the collective: stored mangled, named as the flame graph names it
    assert page.js(f"window.fleetprof.timeline.view.describe({ALL_REDUCE_BAR}).name") == ALL_REDUCE
    page.page.screenshot(path=str(ARTIFACTS / "timeline-hover.png"))  # the viewport: the tooltip is fixed in it
    assert page.errors == []


def test_timeline_and_flame_graph_select_each_other(browser, served):  # noqa: F811
    add_timeline(served)
    # the all-reduce's GPU time, so that its stack is in the flame graph too
    t0 = datetime.fromtimestamp(served.t0, tz=UTC)
    served.store.insert("gpu_kernel_samples", [[t0, "n1", 10, "", "", 0, 8, 202, MANGLED_ALL_REDUCE, 2_000_000, 1]],
                        ["ts", "node", "pid", "comm", "container_id", "device", "stream", "stack_id", "kernel_name",
                         "duration_ns", "launches"])
    page = open_timeline(browser, served)
    canvas = page.page.locator("#timeline")
    assert canvas.get_attribute("data-highlighted") == "0"
    # a frame selected in the flame graph highlights the bars whose stack runs through it
    click_frame(page, N1, "main", "launch", "gemm_kernel")
    assert page.js("window.fleetprof.flame.path(window.fleetprof.flame.focus)") == [N1, "main", "launch",
                                                                                    "gemm_kernel"]
    assert canvas.get_attribute("data-highlighted") == "3"
    click_frame(page, N1, "main", "launch")
    assert canvas.get_attribute("data-highlighted") == "5"  # all but the set, whose stack is unknown
    assert page.page.locator("[data-timeline=selection]").inner_text() == (
        "5 bars launched through the flame graph's selected frame (outlined): launch")
    zoom_to(page, GEMM)
    page.shot("timeline-highlight")
    page.page.click("#reset-zoom")
    assert canvas.get_attribute("data-highlighted") == "0"
    assert not page.page.is_visible("[data-timeline=selection]")
    # a click on a bar selects its stack in the flame graph
    zoom_to(page, ALL_REDUCE_BAR)
    click_bar(page, ALL_REDUCE_BAR)
    assert page.js("window.fleetprof.flame.path(window.fleetprof.flame.focus)") == [N1, "main", "launch", ALL_REDUCE]
    assert canvas.get_attribute("data-highlighted") == "1"
    # with the processes merged, paths have no process frame, and the link still holds
    assert page.errors == []
    page.page.close()
    merged = open_timeline(browser, served, "&node=n1&kind=gpu&merge=1")
    click_frame(merged, "main", "launch", "gemm_kernel")
    canvas = merged.page.locator("#timeline")
    assert canvas.get_attribute("data-highlighted") == "3"
    click_bar(merged, ALL_REDUCE_BAR)
    assert merged.js("window.fleetprof.flame.path(window.fleetprof.flame.focus)") == ["main", "launch", ALL_REDUCE]
    assert merged.errors == []


def test_timeline_follows_the_flame_graph_kind_collectives_and_range(browser, served):  # noqa: F811
    add_timeline(served)
    page = open_timeline(browser, served, "&node=n1")
    assert not page.page.is_visible("#timeline-panel")  # the CPU flame graph has no timeline
    version = page.js("window.fleetprof.timeline.version")
    page.changing(lambda: page.page.check("input[name=kind][value=gpu]"))
    settle_timeline(page, version)
    assert page.page.locator("#timeline").get_attribute("data-bars") == "6"
    # the flame graph's NCCL choice holds for the timeline too
    version = page.js("window.fleetprof.timeline.version")
    page.changing(lambda: page.page.select_option("#collectives", "only"))
    settle_timeline(page, version)
    assert page.page.locator("#timeline").get_attribute("data-bars") == "1"
    page.page.goto(f"{served.url}/?since={served.t0 - 3600}&until={served.t1}&node=n1&kind=gpu")
    page.settle(0)
    settle_timeline(page, 0)
    assert page.page.locator("[data-timeline=message]").inner_text() == (
        "the timeline shows at most 5 minutes: select a shorter range (this one is 3720 s)")
    assert not page.page.is_visible("#timeline")
    # the refusal is the server's 400, which Chromium logs; nothing else went wrong
    assert page.errors == ["Failed to load resource: the server responded with a status of 400 (Bad Request)"]


def test_timeline_says_when_its_range_is_older_than_its_records(browser, served):  # noqa: F811
    add_timeline(served)
    since = int(datetime.now(tz=UTC).timestamp()) - timeline.DETAIL_KEEP_S - 600
    page = open_timeline(browser, served, "&node=n1&kind=gpu")
    page.page.goto(f"{served.url}/?since={since}&until={since + 60}&node=n1&kind=gpu")
    page.settle(0)
    settle_timeline(page, 0)
    assert page.page.locator("[data-timeline=message]").inner_text() == (
        "The timeline keeps sampled records for 6 hours and this range starts before that: its bars are deleted or "
        "being deleted. Its GPU time stays in the flame graph (30 days).")
    assert not page.page.is_visible("#timeline") and page.errors == []
