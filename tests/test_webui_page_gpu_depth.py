"""The web UI's GPU flame graph with memory copies and NVTX ranges, in real headless Chromium (test_webui_page.py's
browser and Page): the what (kernels / copies) choice, the NVTX level and the range filter, kept in the URL and the
export links, and gone for CPU flame graphs."""

from __future__ import annotations

from datetime import UTC, datetime

from tests.test_webui_page import Page, browser  # noqa: F401  (the module's browser fixture)
from tests.webui_helpers import FIRST_HALF_GPU, SECOND_HALF_GPU

COPY = "main;launch;[memcpy HtoD]"


def add_copy(ui) -> None:
    """A host-to-device copy launched from main;launch on n1 (pid 10) under NVTX 'step > forward', 3 ms in the first
    window."""
    t0 = datetime.fromtimestamp(ui.t0, tz=UTC)
    ui.store.insert("frames", [[30, "[memcpy HtoD]", "[gpu]", "GPU_KERNEL", t0]],
                    ["frame_id", "function", "binary", "kind", "last_seen"])
    ui.store.insert("stacks", [[210, [1, 6, 30], t0]], ["stack_id", "frame_ids", "last_seen"])
    ui.store.insert("gpu_kernel_samples", [[t0, "n1", 10, "train", "", 0, 9, 210, "[memcpy HtoD]", 3_000_000, 2,
                                            "step > forward"]],
                    ["ts", "node", "pid", "comm", "container_id", "device", "stream", "stack_id", "kernel_name",
                     "duration_ns", "launches", "nvtx_range"])


def test_gpu_flame_graph_picks_copies_and_shows_nvtx_ranges(browser, served):  # noqa: F811
    add_copy(served)
    page = Page(browser, served, "&node=n1&kind=gpu&merge=1")
    kernels = {**FIRST_HALF_GPU, **SECOND_HALF_GPU}
    assert page.folded() == {**kernels, COPY: 3_000_000}
    assert page.page.is_visible("#gpu-what") and page.page.is_visible("#nvtx-level")
    page.changing(lambda: page.page.select_option("#gpu-what", "copies"))
    assert page.folded() == {COPY: 3_000_000}
    assert "what=copies" in page.page.url and "what=copies" in page.page.get_attribute("#export-folded", "href")
    assert page.page.locator("#flame-title").inner_text().endswith("node n1 · memory copies and sets only")
    page.changing(lambda: page.page.check("#nvtx-level"))
    assert page.folded() == {f"[nvtx] step;[nvtx] forward;{COPY}": 3_000_000}
    assert "nvtx_level=1" in page.page.get_attribute("#export-folded", "href")
    page.shot("gpu-copies-nvtx-level")
    page.changing(lambda: page.page.select_option("#gpu-what", "kernels"))
    assert page.folded() == kernels  # outside any range: no NVTX frame
    page.changing(lambda: page.page.select_option("#gpu-what", "all"))

    def filter_range() -> None:
        page.page.fill("#nvtx-range", "forward")
        page.page.press("#nvtx-range", "Enter")

    page.changing(filter_range)
    assert page.folded() == {f"[nvtx] step;[nvtx] forward;{COPY}": 3_000_000}
    assert "nvtx_range=forward" in page.page.url
    # kept in the URL: a reload shows the same choices
    page.page.reload()
    page.settle(0)
    assert page.page.input_value("#nvtx-range") == "forward" and page.page.is_checked("#nvtx-level")
    assert page.folded() == {f"[nvtx] step;[nvtx] forward;{COPY}": 3_000_000}
    # CPU flame graphs have neither: the controls go, and their requests do not carry them
    page.changing(lambda: page.page.check("input[name=kind][value=cpu]"))
    assert not page.page.is_visible("#gpu-what")
    href = page.page.get_attribute("#export-folded", "href")
    assert "nvtx" not in href and "what" not in href
    assert page.errors == []
