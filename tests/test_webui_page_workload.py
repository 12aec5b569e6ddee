"""The web UI's workload filters and its "GPU utilization by workload" table, in real headless Chromium
(test_webui_page.py's browser and Page) over tests/workload_rows.py's known rows: the filters reach the flame graph,
the export links and the table, stay in the URL, and the table regroups by namespace."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fleetprof.api import serve_api
from tests.test_webui_page import Page, browser  # noqa: F401  (the module's browser fixture)
from tests.workload_rows import workload_rows


@pytest.fixture
def ui(store):
    rows = workload_rows(store)
    server = serve_api(store, "127.0.0.1", 0)
    try:
        yield SimpleNamespace(store=store, url=server.url, t0=int(rows.nvml_since.timestamp()),
                              t1=int(rows.until.timestamp()))
    finally:
        server.stop()


def table(page: Page) -> list[list[str]]:
    return page.js("[...document.querySelectorAll('#workload-table tr')]"
                   ".map(r => [...r.cells].map(c => c.textContent))")


def test_workload_filters_and_gpu_utilization_table(browser, ui):  # noqa: F811
    page = Page(browser, ui, "&merge=1")
    assert page.folded() == {"main;run;compute": 54, "main;run;io": 12, "main;idle": 120}
    assert table(page) == [["pod", "GPUs", "GPU-hours", "mean utilization", "idle hours"],
                           ["unattributed", "2", "2.00", "32.5 %", "1.35"],
                           ["ml/train-0", "1", "1.00", "75.0 %", "0.25"],
                           ["infra/train-0", "1", "0.25", "50.0 %", "0.13"],
                           ["ml/serve-0", "1", "0.25", "50.0 %", "0.13"]]

    def filter_pod() -> None:
        page.page.fill("#wl-pod", "train-0")
        page.page.fill("#wl-namespace", "ml")
        page.page.click("#workload-form button")

    page.changing(filter_pod)
    assert page.folded() == {"main;run;compute": 6}
    assert "pod=train-0" in page.page.url and "namespace=ml" in page.page.url
    assert "pod=train-0" in page.page.get_attribute("#export-folded", "href")
    assert page.page.locator("#flame-title").inner_text().endswith("namespace ml · pod train-0")
    assert table(page)[1:] == [["ml/train-0", "1", "1.00", "75.0 %", "0.25"]]
    version = page.js("window.fleetprof.workloadsVersion")
    page.page.select_option("#workload-by", "team")
    page.page.wait_for_function(f"window.fleetprof.workloadsVersion > {version} && window.fleetprof.pending === 0")
    assert table(page)[1:] == [["vision", "1", "1.00", "75.0 %", "0.25"]]
    # kept in the URL: a reload shows the same filters and grouping
    page.page.reload()
    page.settle(0)
    assert page.page.input_value("#wl-pod") == "train-0" and page.page.input_value("#workload-by") == "team"
    assert page.folded() == {"main;run;compute": 6}
    # a job filter that names nothing: an empty flame graph and table, no error
    page.page.fill("#wl-pod", "")
    page.page.fill("#wl-namespace", "")
    page.changing(lambda: (page.page.fill("#wl-job", "4240_9"), page.page.click("#workload-form button")))
    assert page.folded() == {}
    assert table(page)[1:] == [] and page.page.is_visible("#workload-empty")
    assert page.errors == []
