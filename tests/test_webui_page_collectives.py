"""The web UI's GPU flame graph with NCCL collectives, in real headless Chromium (test_webui_page.py's browser and
Page): kernels labelled with their collective, and the control that hides or isolates them, kept in the URL and the
export links."""

from __future__ import annotations

from datetime import UTC, datetime

from tests.test_webui_page import Page, browser  # noqa: F401  (the module's browser fixture)
from tests.webui_helpers import FIRST_HALF_GPU, SECOND_HALF_GPU

ALL_REDUCE = "[nccl AllReduce bfloat16] ncclDevKernel_AllReduce_Sum_bf16_RING_LL"


def add_collective(ui) -> None:
    """An NCCL all-reduce launched from main;launch on n1 (pid 10), 2 ms in the first window, stored mangled."""
    t0 = datetime.fromtimestamp(ui.t0, tz=UTC)
    ui.store.insert("frames", [[9, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                                "[gpu]", "GPU_KERNEL", t0]], ["frame_id", "function", "binary", "kind", "last_seen"])
    ui.store.insert("stacks", [[202, [1, 6, 9], t0]], ["stack_id", "frame_ids", "last_seen"])
    ui.store.insert("gpu_kernel_samples", [[t0, "n1", 10, "train", "", 0, 8, 202,
                                            "_Z40ncclDevKernel_AllReduce_Sum_bf16_RING_LL24ncclDevKernelArgsStorageILm"
                                            "4096EE", 2_000_000, 2]],
                    ["ts", "node", "pid", "comm", "container_id", "device", "stream", "stack_id", "kernel_name",
                     "duration_ns", "launches"])


def test_gpu_flame_graph_hides_or_isolates_collectives(browser, served):  # noqa: F811
    add_collective(served)
    page = Page(browser, served, "&node=n1&kind=gpu&merge=1")
    others = {**FIRST_HALF_GPU, **SECOND_HALF_GPU}
    assert page.folded() == {**others, f"main;launch;{ALL_REDUCE}": 2_000_000}
    assert page.page.is_visible("#collectives")
    page.changing(lambda: page.page.select_option("#collectives", "only"))
    assert page.folded() == {f"main;launch;{ALL_REDUCE}": 2_000_000}
    assert "collectives=only" in page.page.url
    assert "collectives=only" in page.page.get_attribute("#export-folded", "href")
    assert page.page.locator("#flame-title").inner_text().endswith("node n1 · NCCL collectives only")
    page.shot("gpu-collectives-only")
    page.changing(lambda: page.page.select_option("#collectives", "hide"))
    assert page.folded() == others
    # kept in the URL: a reload shows the same choice
    page.page.reload()
    page.settle(0)
    assert page.page.input_value("#collectives") == "hide" and page.folded() == others
    # CPU flame graphs have no collectives: the control goes, and their requests do not carry it
    page.changing(lambda: page.page.check("input[name=kind][value=cpu]"))
    assert not page.page.is_visible("#collectives")
    assert "collectives" not in page.page.get_attribute("#export-folded", "href")
    assert page.errors == []
