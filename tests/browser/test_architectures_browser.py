"""The Attention architectures page in Chromium (issue #21 item 6): it opens without an exception,
the calculator's chart is drawn, and stepping the live part moves the three pools, the running
chart and the "Steps done" label together, their numbers agreeing with one another."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.browser.server import assert_no_exception, click, load, readability_problems, wait_for_app, \
    wait_for_views_at_step

pytestmark = pytest.mark.browser

#: per live chart (layout.meta.step set): its title annotations and its traces' (name, x, y)
LIVE_CHARTS_JS = """
() => [...document.querySelectorAll('.js-plotly-plot')]
  .filter(p => p.layout && p.layout.meta && p.layout.meta.step !== undefined && p.layout.meta.step !== null)
  .map(p => ({step: p.layout.meta.step,
              notes: (p.layout.annotations || []).map(a => a.text),
              traces: p.data.filter(t => t.type === 'scatter' && t.mode === 'lines')
                            .map(t => ({name: t.name, x: Array.from(t.x), y: Array.from(t.y)}))}))
"""


def test_architectures_page_steps_the_three_engines_together(app_url: str, chromium, artifacts: Path) -> None:
    page = chromium.new_context(viewport={"width": 1600, "height": 1000}).new_page()
    load(page, f"{app_url}/architectures")
    assert_no_exception(page)
    main = page.get_by_test_id("stMain")
    assert "Attention architectures" in main.inner_text()
    # the calculator's bars, the pools, running per step (the first run also runs the three engines:
    # on a loaded machine the charts come a while after the title)
    page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot').length >= 3", timeout=60_000)
    for step in (1, 2, 3):
        click(page, "arch_step")
        wait_for_views_at_step(page, step, minimum=2)
        wait_for_app(page)
    assert_no_exception(page)
    assert "Steps done: 3 of" in main.inner_text()
    charts = page.evaluate(LIVE_CHARTS_JS)
    pools = next(c for c in charts if len(c["notes"]) == 3)
    running = next(c for c in charts if c["traces"])
    assert pools["step"] == running["step"] == 3
    for note, trace in zip(pools["notes"], running["traces"]):
        layout = re.search(r"<b>(\w+)</b>", note).group(1)
        assert trace["name"].startswith(layout)
        shown = int(re.search(r"(\d+) running", note).group(1))
        assert shown == trace["y"][trace["x"].index(3)], (layout, note)
        used, total = map(int, re.search(r"(\d+)/(\d+) used", note).groups())
        assert 0 < used <= total
    totals = [int(re.search(r"/(\d+) used", n).group(1)) for n in pools["notes"]]
    assert totals[0] < totals[1] < totals[2]  # the same bytes: MHA < GQA < MQA blocks
    click(page, "arch_end")
    wait_for_app(page)
    last = int(re.search(r"Steps done: (\d+) of (\d+)", main.inner_text()).group(2))
    wait_for_views_at_step(page, last, minimum=2)
    assert f"Steps done: {last} of {last}" in main.inner_text()
    assert readability_problems(page) == []
    page.screenshot(path=str(artifacts / "architectures.png"), full_page=True)
    page.context.close()
