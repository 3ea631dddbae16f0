"""Talk mode in a real browser (Chromium): the "Switch to the pipeline scenario" button (issue #19
defect 4), Step back redrawing the previous step, and deep links typed into the address bar
(``?step=5``; ``?recording=<bundled>&step=6``). Cursor details are AppTests (tests/test_talk.py).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser.server import assert_no_exception, click, load, metric, wait_for_app, wait_for_views_at_step

pytestmark = pytest.mark.browser

VIEWPORT = {"width": 1440, "height": 900}
LIVE = "live_model=tiny-random"

CHART_TITLE_JS = """
(prefix) => {
  const plot = [...document.querySelectorAll('.js-plotly-plot')]
    .find(p => ((p.layout.title || {}).text || '').startsWith(prefix));
  return plot ? plot.layout.title.text : null;
}
"""


def new_page(chromium, url: str):
    page = chromium.new_context(viewport=VIEWPORT).new_page()
    load(page, url, timeout=300_000)
    return page


def wait_metric(page, label: str, value: str, timeout: float = 60_000) -> None:
    """Wait until the metric labelled ``label`` shows ``value``."""
    page.get_by_test_id("stMetric").filter(has_text=label).first.get_by_test_id("stMetricValue") \
        .filter(has_text=value).wait_for(timeout=timeout)
    assert metric(page, label) == value


def test_switch_to_the_pipeline_scenario_button_switches(app_url: str, chromium, artifacts: Path) -> None:
    """Defect 4: one click replaces the single-process run with the pipeline scenario's workers."""
    page = new_page(chromium, f"{app_url}/pipeline?{LIVE}&live_scenario=chat-burst")
    try:
        off = page.get_by_text("This run is a single process")
        assert off.count() == 1
        click(page, "switch_pipeline")
        off.wait_for(state="detached", timeout=240_000)
        wait_for_app(page, timeout=240_000)
        assert_no_exception(page)
        assert page.get_by_text("Pipeline parallelism: eight equal requests").count() >= 1  # the status badge
        assert page.get_by_text("Step the run").count() >= 1  # the pipeline views, before a step
        click(page, "step")
        wait_for_views_at_step(page, 1, timeout=120_000)
        assert metric(page, "Steps done") == "1"
        page.screenshot(path=str(artifacts / "talk-switch-pipeline.png"))
        click(page, "reset")  # stop the workers with the run
        wait_for_app(page)
    finally:
        page.context.close()


def test_step_back_redraws_the_previous_step(app_url: str, chromium, artifacts: Path) -> None:
    page = new_page(chromium, f"{app_url}/kv-cache?{LIVE}&live_scenario=chat-burst")
    try:
        for n in (1, 2, 3):
            click(page, "step")
            wait_for_views_at_step(page, n)
        assert metric(page, "Steps done") == "3"
        assert "after 3 steps" in page.evaluate(CHART_TITLE_JS, "Paged KV cache")
        click(page, "step_back")
        wait_for_views_at_step(page, 2)
        wait_metric(page, "Steps done", "2 of 3")
        assert "after 2 steps" in page.evaluate(CHART_TITLE_JS, "Paged KV cache")
        page.screenshot(path=str(artifacts / "talk-step-back.png"))
        click(page, "step")  # forward through the history
        wait_for_views_at_step(page, 3)
        wait_metric(page, "Steps done", "3")
        assert_no_exception(page)
    finally:
        page.context.close()


def test_a_link_to_step_5_opens_at_step_5(app_url: str, chromium) -> None:
    page = new_page(chromium, f"{app_url}/kv-cache?{LIVE}&live_scenario=chat-burst&step=5")
    try:
        wait_for_views_at_step(page, 5, timeout=120_000)
        wait_metric(page, "Steps done", "5")
        assert_no_exception(page)
    finally:
        page.context.close()


def test_a_link_to_a_step_of_a_bundled_recording(app_url: str, chromium, artifacts: Path) -> None:
    page = new_page(chromium, f"{app_url}/speculative?recording=spec-copy&step=6")
    try:
        wait_for_views_at_step(page, 6, timeout=120_000)
        wait_metric(page, "Steps done", "6")
        assert page.get_by_text("REPLAY", exact=False).count() >= 1
        assert_no_exception(page)
        page.screenshot(path=str(artifacts / "talk-recording-link.png"))
    finally:
        page.context.close()
