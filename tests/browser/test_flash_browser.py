"""The FlashAttention page in Chromium against `make run`'s server, on `tiny-random`.

Opens /flash-attention on chat-burst, steps once (every prompt prefilled): the score matrix is
drawn with the kernel's tiles outlined and numbered, and the kernel's "max abs difference" to
the float64 reference is tiny; picks another query head (a new trace); steps again (decodes)
and splits the decode into 4 segments: the segments table and their merge appear. Nothing on the
page is cut off or hidden in a sideways-scrolling table.
"""
from __future__ import annotations

import pytest

from tests.browser.server import (assert_no_exception, click, load, metric, readability_problems, wait_for_app,
                                  wait_for_views_at_step)

pytestmark = pytest.mark.browser

VIEWPORT = {"width": 1500, "height": 1200}

TILES_JS = """
() => {
  const plot = [...document.querySelectorAll('.js-plotly-plot')]
    .find(p => ((p.layout.title || {}).text || '').startsWith('Scores'));
  if (!plot) return null;
  return {step: plot.layout.meta.step, tiles: (plot.layout.shapes || []).length,
          numbers: (plot.layout.annotations || []).length, title: plot.layout.title.text};
}
"""


def test_flash_page_shows_the_kernels_tiles_and_the_split_decode(app_url: str, chromium) -> None:
    context = chromium.new_context(viewport=VIEWPORT)
    page = context.new_page()
    load(page, f"{app_url}/flash-attention?live_model=tiny-random&live_scenario=chat-burst")
    page.get_by_text("Step the run").first.wait_for(timeout=60_000)
    assert_no_exception(page)

    click(page, "step")
    wait_for_views_at_step(page, 1, minimum=3, timeout=120_000)
    wait_for_app(page, timeout=120_000)
    page.locator(".st-key-flash_head").click()
    page.get_by_role("option", name="3", exact=True).click(timeout=60_000)
    wait_for_app(page, timeout=120_000)
    tiles = page.evaluate(TILES_JS)
    assert tiles is not None and tiles["step"] == 1, tiles
    assert tiles["tiles"] > 1 and tiles["numbers"] == tiles["tiles"], tiles
    assert "head 3" in tiles["title"], tiles
    assert float(metric(page, "Max abs difference")) <= 1e-6
    assert readability_problems(page) == []

    click(page, "step")
    wait_for_views_at_step(page, 2, minimum=3, timeout=120_000)
    wait_for_app(page, timeout=120_000)
    thumb = page.locator(".st-key-flash_segments").get_by_role("slider")
    thumb.focus()
    for _ in range(3):  # 1 -> 4 segments
        thumb.press("ArrowRight")
    wait_for_app(page, timeout=120_000)
    page.get_by_role("heading", name="Split-KV: 4 segments and their merge").wait_for(timeout=60_000)
    assert page.get_by_text("Max |merged − unsplit|").count() == 1
    assert float(metric(page, "Max abs difference")) <= 1e-6
    assert readability_problems(page) == []
    assert_no_exception(page)
    context.close()
