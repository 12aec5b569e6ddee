"""The web UI's page on a whole machine, in real headless Chromium (test_webui_page.py's browser and Page): a root
frame per process and the toggle that merges them, the legend's total time per color, the canvas sized to the graph,
the searchable process filter (the busiest first, kernel threads grouped), and simulated labels that follow the kind
of data, per node."""

from __future__ import annotations

from tests.test_webui_page import Page, browser  # noqa: F401  (the module's browser fixture)
from tests.webui_helpers import FIRST_HALF_CPU, add_machine

ROW = 17  # static/flamegraph.js: px per stack level
LOST = ("[stack lost] 3.4%: the agent's stack map was full; raise its --stack-entries "
        "(FLEETPROF_AGENT_STACK_ENTRIES)")


def test_machine_flame_graph_has_a_root_per_process_and_a_legend_of_every_color(browser, served):  # noqa: F811
    add_machine(served)
    page = Page(browser, served, "&node=n1")
    assert page.page.locator("#flame-title").inner_text() == "CPU samples · 117 samples · node n1"  # real eBPF data
    roots = page.js("""(() => { const g = window.fleetprof.flame, m = g.model, out = [];
        for (let i = 1; i < m.count; i = m.end[i]) out.push([g.name(i), m.total[i]]);
        return out; })()""")
    # one root per process, named as the exports name it (one node: without it), in name order
    assert roots == [["ksoftirqd/0 (pid 14)", 2], ["kworker/0:1-events (pid 31)", 3], ["python3 (pid 40)", 24],
                     ["swapper/0 (pid 0)", 40], ["train (pid 10)", 48]]
    folded = page.folded()
    assert folded["python3 (pid 40);_PyEval_EvalFrameDefault;<module> (serve.py:1);jit_stub"] == 6
    assert folded["python3 (pid 40);_PyEval_EvalFrameDefault;[unknown 0x1c]"] == 2
    assert folded["python3 (pid 40);[stack lost: map full, raise agent --stack-entries]"] == 4
    # total time per color, callees included (python3.11's interpreter loop holds 20 of the 117 samples, 17.1%)
    assert page.page.locator("#legend").inner_text().split("\n") == [
        "total time in:", "process 100.0%", "app 41.0%", "kernel ([kernel.kallsyms]) 38.5%", "python3.11 17.1%",
        "libc.so.6 15.4%", "python 15.4%", "[jit] 5.1%", LOST, "[unknown …] 1.7%"]
    # every color drawn is in the legend, with the swatch the legend shows
    drawn = page.js("""(() => { const g = window.fleetprof.flame;
        return [...new Set(g.drawn.node.filter(i => i > 0).map(i => g.category[g.model.frame[i]]))].sort(); })()""")
    legend = page.js("Array.from(document.querySelectorAll('#legend .legend-item')).map(e => e.dataset.category)")
    assert sorted(legend) == drawn
    assert page.js("""(() => { const g = window.fleetprof.flame, m = g.model;
        const i = g.find('python3 (pid 40)', '_PyEval_EvalFrameDefault', '<module> (serve.py:1)', 'jit_stub');
        return [g._color(i) !== g._color(g.find('train (pid 10)', 'main')), g.category[m.frame[i]]]; })()""") == [
        True, "jit"]
    # the canvas holds the deepest row drawn and nothing more: train;main;run;compute is 4 levels under all
    assert page.js("window.fleetprof.flame.canvas.clientHeight") == 5 * ROW + 1
    page.shot("machine")

    renders = page.js("window.fleetprof.flame.renders")
    page.page.check("#merge-processes")
    page.page.wait_for_function(f"window.fleetprof.flame.renders > {renders}")
    assert "merge=1" in page.page.url
    assert "processes=merge" in page.page.get_attribute("#export-folded", "href")
    merged = page.folded()
    assert merged == {**FIRST_HALF_CPU, "main;run;io": 18, "do_idle": 40, "worker_thread": 3, "run_ksoftirqd": 2,
                      "_PyEval_EvalFrameDefault;<module> (serve.py:1);handle (serve.py:9)": 12,
                      "_PyEval_EvalFrameDefault;<module> (serve.py:1);jit_stub": 6,
                      "[stack lost: map full, raise agent --stack-entries]": 4,
                      "_PyEval_EvalFrameDefault;[unknown 0x1c]": 2}
    assert page.js("window.fleetprof.flame.canvas.clientHeight") == 4 * ROW + 1
    assert page.page.locator("#legend").inner_text().split("\n")[1] == "app 41.0%"  # no process frames to color
    page.shot("machine-merged")
    # the toggle is kept in the URL: a reload shows the merged graph
    page.page.reload()
    page.settle(0)
    assert page.page.is_checked("#merge-processes") and page.folded() == merged
    assert page.errors == []


def test_process_filter_is_searchable_busiest_first_kernel_threads_grouped(browser, served):  # noqa: F811
    add_machine(served)
    page = Page(browser, served)
    picker = page.page.locator("#process")
    names = "Array.from(document.querySelectorAll('#process-list li')).map(li => li.textContent)"
    picker.click()
    # CPU shares of the 123 samples of both nodes; train also has all of the GPU time
    assert page.js(names) == ["all processes", "train 10 · n139.0% CPU · 100.0% GPU", "python3 40 · n119.5% CPU",
                              "serve 20 · n24.9% CPU", "▸ kernel threads (3) · 36.6% CPU"]
    page.page.locator("#process-list li.group").click()
    assert page.js(names)[-4:] == ["▾ kernel threads (3) · 36.6% CPU", "swapper/0 0 · n132.5% CPU",
                                   "kworker/0:1-events 31 · n12.4% CPU", "ksoftirqd/0 14 · n11.6% CPU"]
    page.shot("process-filter")
    picker.press_sequentially("kwork")
    assert page.js(names) == ["▾ kernel threads (1) · 2.4% CPU", "kworker/0:1-events 31 · n12.4% CPU"]
    picker.fill("")
    picker.press_sequentially("ser n2")
    assert page.js(names) == ["serve 20 · n24.9% CPU"]
    page.changing(lambda: picker.press("Enter"))
    assert page.js("[window.fleetprof.state.node, window.fleetprof.state.pid]") == ["n2", 20]
    assert picker.input_value() == "serve 20 · n2"
    assert page.folded() == {"serve (pid 20);main;idle": 6}
    # n2: loadgen's simulated CPU samples and no NVML readings: only the activity chart, the flame graph simulated
    assert page.js("window.fleetprof.charts.plots.map(p => p.fleetprofId)") == ["activity"]
    assert page.page.locator("#flame-title").inner_text() == "SIMULATED · CPU samples · 6 samples · node n2 · pid 20"
    assert page.page.locator("#simulated").inner_text() == (
        "SIMULATED: CPU samples from node n2 come from fleetprof loadgen's simulated fleet.")
    picker.click()
    page.changing(lambda: page.page.locator("#process-list li", has_text="all processes").click())
    assert page.js("window.fleetprof.state.pid") == 0 and picker.input_value() == ""
    assert page.errors == []


def test_simulated_labels_follow_the_kind(browser, served):  # noqa: F811
    """n1 is `fleetprof up --simulate-gpu`: its eBPF CPU samples are real, its GPU kernel times and NVML readings
    simulated; the CPU flame graph is not labelled simulated because the charts are."""
    page = Page(browser, served, "&node=n1")
    assert page.page.locator("#flame-title").inner_text() == "CPU samples · 48 samples · node n1"
    assert page.page.locator("#simulated").inner_text() == (
        "SIMULATED: GPU readings from node n1 come from fleetprof's simulated NVML library.")
    page.shot("real-cpu-simulated-gpu")
    page.changing(lambda: page.page.check("input[name=kind][value=gpu]"))
    assert page.page.locator("#flame-title").inner_text().startswith("SIMULATED · GPU kernel time")
    assert page.page.locator("#simulated").inner_text().split("\n") == [
        "SIMULATED: GPU readings from node n1 come from fleetprof's simulated NVML library.",
        "SIMULATED: GPU kernel times from node n1 come from fleetprof's simulated GPU library."]
    assert page.errors == []
