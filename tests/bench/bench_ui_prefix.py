"""The Prefix cache page in the UI benchmark: a Step click to the redrawn views, minus the engine step.

Same method and target as ``bench_ui`` (Chromium against `make run`'s server; click Step, wait
until every live chart's ``layout.meta.step`` is the new step, subtract the engine's own step
time shown as "Last step (engine)"), on the page's two live charts (the radix tree, and the
pool with the hit-rate panels) and its own scenario: shared-prefix, eight requests behind one
system prompt, whose tree grows to ~30 nodes.

    .venv/bin/python -m tests.bench ui_prefix      (``-m tests.bench ui`` runs it with bench_ui)
"""
from __future__ import annotations

import statistics
from pathlib import Path

from tests.bench.bench_ui import TARGET_MS, WARMUP_STEPS, _measure
from tests.browser.server import click, launch_chromium, load, streamlit_server, wait_for_app, wait_for_views_at_step

SCENARIO = "shared-prefix"
CASES = (("tiny-random", 16), ("smollm2-135m", 12))  # (model, measured steps): the scenario takes ~26 steps
CHARTS = 2  # the tree, and the pool with the hit-rate panels


def _case(browser, url: str, model: str, n: int) -> dict:
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    load(page, f"{url}/prefix-cache?live_model={model}&live_scenario={SCENARIO}")
    for step in range(1, WARMUP_STEPS + 1):
        click(page, "step")
        wait_for_views_at_step(page, step, CHARTS, timeout=180_000)
        wait_for_app(page)
    totals, engine = _measure(page, WARMUP_STEPS, n, CHARTS)
    nodes = page.evaluate("() => [...document.querySelectorAll('.js-plotly-plot')].find(p => "
                          "(p.layout.title.text || '').startsWith('Radix tree')).data.find(t => t.name === 'nodes')"
                          ".x.length")
    page.close()
    return {"model": model, "page": "Prefix cache", "click_to_views_ms": totals, "engine_step_ms": engine,
            "overhead_ms": [t - e for t, e in zip(totals, engine)], "boxes_at_end": nodes}


def run() -> dict:
    from playwright.sync_api import sync_playwright

    rows, details = [], []
    log = Path(__file__).parent / "results" / "bench_ui_prefix_server.log"
    log.parent.mkdir(exist_ok=True)
    with streamlit_server(log) as url, sync_playwright() as p:
        browser = launch_chromium(p)
        for model, n in CASES:
            d = _case(browser, url, model, n)
            med = statistics.median(d["overhead_ms"])
            label = f"{model} ({SCENARIO}), Prefix cache"
            rows.append({"metric": f"{label}: click->views minus step, median", "value": med, "unit": "ms",
                         "target": f"< {TARGET_MS:.0f} ms", "met": med < TARGET_MS})
            rows.append({"metric": f"{label}: click->views minus step, max", "value": max(d["overhead_ms"]),
                         "unit": "ms", "target": "", "met": None})
            rows.append({"metric": f"{label}: engine step itself, median",
                         "value": statistics.median(d["engine_step_ms"]),
                         "unit": "ms", "target": "", "met": None})
            rows.append({"metric": f"{label}: tree boxes drawn at the last step", "value": d["boxes_at_end"],
                         "unit": "boxes", "target": "", "met": None})
            details.append(d)
        browser.close()
    return {"name": "bench_ui_prefix", "method": "as bench_ui: Playwright (Debian Chromium), click on Step -> every "
                                               "live chart's layout.meta.step equals the new step; minus the "
                                               "engine's StepTrace total_ms",
            "scenario": SCENARIO, "rows": rows, "details": details}


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=1))
