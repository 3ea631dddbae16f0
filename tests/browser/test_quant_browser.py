"""The Quantization page in Chromium against `make run`'s server, on the real SmolLM2.

The activation views come from the live run: stepping the chat-burst scenario fills the absmax
heatmap from the engine's own forward (the recorder on its model runner), SmolLM2's outlier
channels show up above LLM.int8()'s threshold of 6, the histogram marks the threshold, and each
further step grows the token count. The weight views follow the scheme chosen by a click.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser.server import click, load, wait_for_app, wait_for_views_at_step

pytestmark = pytest.mark.browser

VIEWPORT = {"width": 1600, "height": 1200}

PLOT_JS = """
(prefix) => {
  const plot = [...document.querySelectorAll('.js-plotly-plot')]
    .find(p => ((p.layout.title || {}).text || '').startsWith(prefix));
  if (!plot) return null;
  return {step: plot.layout.meta ? plot.layout.meta.step : null, title: plot.layout.title.text,
          rows: plot.data[0].z ? plot.data[0].z.length : null,
          total: plot.data[0].y && !plot.data[0].z ? plot.data[0].y.reduce((a, b) => a + b, 0) : null,
          lines: (plot.layout.shapes || []).map(s => s.x0)};
}
"""


def test_activation_outliers_from_the_live_run(app_url: str, chromium, artifacts: Path) -> None:
    page = chromium.new_context(viewport=VIEWPORT).new_page()
    load(page, f"{app_url}/quantization?live_model=smollm2-135m&live_scenario=chat-burst")
    assert page.get_by_test_id("stException").count() == 0
    page.get_by_role("tab", name="Activations").click()
    wait_for_app(page)
    assert page.get_by_text("Step the run").count() == 1  # nothing computed at step 0

    for n in (1, 2, 3):
        click(page, "step")
        wait_for_views_at_step(page, n, minimum=3, timeout=120_000)
        wait_for_app(page)
    heat = page.evaluate(PLOT_JS, "Input absmax")
    assert heat["step"] == 3 and heat["rows"] == 30  # SmolLM2's 30 layers
    pairs = int(heat["title"].split(" — ")[1].split(" ")[0])
    assert pairs > 0, heat["title"]  # SmolLM2 has input channels above 6 in its qkv inputs
    hist = page.evaluate(PLOT_JS, "Layer ")
    assert hist["lines"] == [-6, 6] and hist["total"] > 0
    floats = page.evaluate(PLOT_JS, "What LLM.int8() keeps in float")
    assert floats is not None and floats["step"] == 3
    page.screenshot(path=str(artifacts / "quantization-activations.png"), full_page=True)

    click(page, "step")
    wait_for_views_at_step(page, 4, minimum=3, timeout=120_000)
    wait_for_app(page)
    assert page.evaluate(PLOT_JS, "Layer ")["total"] > hist["total"]  # the step's tokens were added

    page.get_by_role("tab", name="Weights").click()
    wait_for_app(page)
    page.locator(".st-key-quant_scheme button").filter(has_text="fp8").click()
    wait_for_app(page)
    weights = page.evaluate(PLOT_JS, "fp8")
    assert weights is not None and "layer 0" in weights["title"], weights
    assert page.get_by_test_id("stException").count() == 0
    page.context.close()
