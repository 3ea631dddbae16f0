"""The Prefix cache page in Chromium against `make run`'s server, on the real engine (tiny-random).

Steps the multi-turn scenario by clicks, reading the drawn figures back from the browser
(Plotly's graph divs): the tree gains the shared nodes, the second turn's admission is drawn as
a hit on the path it matched, and the hit rate rises with each later turn.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser.server import click, load, metric, wait_for_app, wait_for_views_at_step

pytestmark = pytest.mark.browser

VIEWPORT = {"width": 1600, "height": 1000}

TREE_JS = """
() => {
  const plot = [...document.querySelectorAll('.js-plotly-plot')]
    .find(p => ((p.layout.title || {}).text || '').startsWith('Radix tree'));
  if (!plot) return null;
  const trace = (name) => plot.data.find(t => t.name === name);
  const boxes = (name) => { const t = trace(name); return t && t.x[0] !== null ? t.x.length / 6 : 0; };
  return {step: plot.layout.meta.step, nodes: trace('nodes').customdata.map(c => c[0]),
          hits: boxes('hit this step'), inserted: boxes('inserted this step'), title: plot.layout.title.text};
}
"""
HIT_RATE_JS = """
() => {
  const plot = [...document.querySelectorAll('.js-plotly-plot')]
    .find(p => ((p.layout.title || {}).text || '').startsWith('Prefix cache after'));
  const line = plot && plot.data.find(t => t.name === 'hit rate, so far');
  return line ? line.y.filter(v => v !== null).at(-1) ?? null : null;
}
"""


def step_to(page, current: int, target: int) -> int:
    for n in range(current + 1, target + 1):
        click(page, "step")
        wait_for_views_at_step(page, n, minimum=2)
        wait_for_app(page)
    return target


def test_multi_turn_fills_the_tree_and_the_hit_rate_rises(app_url: str, chromium, artifacts: Path) -> None:
    page = chromium.new_context(viewport=VIEWPORT).new_page()
    load(page, f"{app_url}/prefix-cache?live_model=tiny-random&live_scenario=multi-turn")
    wait_for_views_at_step(page, 0, minimum=2)
    assert page.get_by_test_id("stException").count() == 0
    tree = page.evaluate(TREE_JS)
    assert tree["step"] == 0 and tree["nodes"] == [0] and metric(page, "Hit rate") == "—"

    step = step_to(page, 0, 3)  # both chats' first turns are in (they share only "<|im_start|>syst", one block)
    first = page.evaluate(TREE_JS)
    assert len(first["nodes"]) >= 3
    rate_1 = page.evaluate(HIT_RATE_JS)
    assert rate_1 < 0.1

    step = step_to(page, step, 13)  # the travel chat's second turn was admitted in step 12
    second = page.evaluate(TREE_JS)
    assert second["step"] == 13 and second["hits"] >= 1, second
    assert set(first["nodes"]) <= set(second["nodes"]) and len(second["nodes"]) > len(first["nodes"])
    rate_2 = page.evaluate(HIT_RATE_JS)
    assert rate_2 > rate_1 + 0.1 and metric(page, "Hit rate") == f"{rate_2:.0%}"
    page.screenshot(path=str(artifacts / "prefix-cache.png"), full_page=True)

    step = step_to(page, step, 15)  # the cooking chat's second turn (step 14) hits its own branch
    assert page.evaluate(HIT_RATE_JS) > rate_2
    assert page.get_by_test_id("stException").count() == 0
    page.context.close()
