"""The pages that step their own scenario, in the UI benchmark: a Step click to the redrawn
views, minus the engine step.

Same method and target as ``bench_ui`` (Chromium against `make run`'s server; click Step, wait
until every live chart's ``layout.meta.step`` is the new step, subtract the engine's own step
time shown as "Last step (engine)"), each page on its own scenario:

    Prefix cache           shared-prefix: eight requests behind one system prompt, the radix tree
                           grows to ~30 nodes; two live charts (the tree; the pool with the
                           hit-rate panels)
    Speculative decoding   spec-chat: open chat with n-gram drafts (k = 4); one live chart (the
                           drafts of the last step), the drafting inside the engine step
    Pipeline parallelism   pipeline: eight equal requests on two worker processes (p = 2, GPipe,
                           m = 4); one live chart (the Gantt of the last step's timeline); the
                           workers' messages are inside the engine step

    .venv/bin/python -m tests.bench ui_pages      (``-m tests.bench ui`` runs it with bench_ui)
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from tests.bench.bench_ui import TARGET_MS, WARMUP_STEPS, _measure
from tests.browser.server import click, launch_chromium, load, streamlit_server, wait_for_app, wait_for_views_at_step

MODELS = (("tiny-random", 16), ("smollm2-135m", 12))  # (model, measured steps)


@dataclass(frozen=True)
class PageCase:
    title: str
    url_path: str
    scenario: str
    charts: int  # live charts (layout.meta.step) on the page


PAGES = (PageCase("Prefix cache", "prefix-cache", "shared-prefix", 2),
         PageCase("Speculative decoding", "speculative", "spec-chat", 1),
         PageCase("Pipeline parallelism", "pipeline", "pipeline", 1))  # 24 steps: 3 warm-up + 16 fit


def _case(browser, url: str, case: PageCase, model: str, n: int) -> dict:
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    load(page, f"{url}/{case.url_path}?live_model={model}&live_scenario={case.scenario}")
    for step in range(1, WARMUP_STEPS + 1):
        click(page, "step")
        wait_for_views_at_step(page, step, case.charts, timeout=180_000)
        wait_for_app(page)
    totals, engine = _measure(page, WARMUP_STEPS, n, case.charts)
    page.close()
    return {"model": model, "page": case.title, "scenario": case.scenario, "click_to_views_ms": totals,
            "engine_step_ms": engine, "overhead_ms": [t - e for t, e in zip(totals, engine)]}


def run() -> dict:
    from playwright.sync_api import sync_playwright

    rows, details = [], []
    log = Path(__file__).parent / "results" / "bench_ui_pages_server.log"
    log.parent.mkdir(exist_ok=True)
    with streamlit_server(log) as url, sync_playwright() as p:
        browser = launch_chromium(p)
        for case in PAGES:
            for model, n in MODELS:
                d = _case(browser, url, case, model, n)
                med = statistics.median(d["overhead_ms"])
                label = f"{model} ({case.scenario}), {case.title}"
                rows.append({"metric": f"{label}: click->views minus step, median", "value": med, "unit": "ms",
                             "target": f"< {TARGET_MS:.0f} ms", "met": med < TARGET_MS})
                rows.append({"metric": f"{label}: click->views minus step, max", "value": max(d["overhead_ms"]),
                             "unit": "ms", "target": "", "met": None})
                rows.append({"metric": f"{label}: engine step itself, median",
                             "value": statistics.median(d["engine_step_ms"]), "unit": "ms", "target": "",
                             "met": None})
                details.append(d)
        browser.close()
    return {"name": "bench_ui_pages", "method": "as bench_ui: Playwright (Debian Chromium), click on Step -> every "
                                              "live chart's layout.meta.step equals the new step; minus the "
                                              "engine's StepTrace total_ms",
            "rows": rows, "details": details}


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=1))
