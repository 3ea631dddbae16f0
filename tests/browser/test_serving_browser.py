"""/serving in Chromium (issue #22, item 8): a run draws the SIMULATED badge, the numbers and the
figures; "Step through it" opens the KV cache page on the simulated run, badged, and its steps
fill blocks of the deployment's pool."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser.server import click, load, metric, wait_for_app, wait_for_views_at_step

pytestmark = pytest.mark.browser
BADGE = "SIMULATED — predicted times"


def test_serving_run_then_step_through_on_the_kv_cache_page(app_url: str, chromium, artifacts: Path) -> None:
    page = chromium.new_context(viewport={"width": 1500, "height": 1250}).new_page()
    load(page, f"{app_url}/serving")
    main = page.get_by_test_id("stMain")
    assert BADGE in main.inner_text()
    click(page, "sv_run")
    wait_for_app(page, timeout=120_000)
    assert metric(page, "Finished") == "100 / 100"
    assert metric(page, "KV pool").endswith(" tokens")
    page.locator(".st-key-sv_timeline .js-plotly-plot").wait_for(timeout=60_000)
    assert page.locator(".js-plotly-plot").count() >= 2  # the CDFs and the timeline
    page.screenshot(path=str(artifacts / "serving.png"), full_page=True)

    click(page, "sv_step_through")
    page.wait_for_url("**/kv-cache**", timeout=60_000)
    wait_for_app(page, timeout=120_000)
    for step in range(1, 7):
        click(page, "step")
        wait_for_views_at_step(page, step, timeout=60_000)
        wait_for_app(page)
    text = main.inner_text()
    assert BADGE in text and "Last step (predicted)" in text, text[:1500]
    free, total = (int(x.replace(",", "")) for x in metric(page, "Free blocks").split(" / "))
    assert free < total
    page.screenshot(path=str(artifacts / "kv-cache-simulated.png"), full_page=True)
    page.context.close()
