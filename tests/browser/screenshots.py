"""`make screenshots`: the README's pictures of each view, taken in Chromium from a real run.

    .venv/bin/python -m tests.browser.screenshots [OUT_DIR]     (default docs/img)

Starts `make run`'s server, steps the chat-burst scenario on SmolLM2-135M as a viewer would
(clicks), and saves one PNG per view.
"""
from __future__ import annotations

import sys
from pathlib import Path

from tests.browser.server import (ROOT, click, launch_chromium, load, open_page, streamlit_server, wait_for_app,
                                  wait_for_views_at_step)

VIEWPORT = {"width": 1500, "height": 1250}
MODEL, SCENARIO, STEPS = "smollm2-135m", "chat-burst", 12


def _shoot(page, out: Path, name: str) -> None:
    page.wait_for_timeout(400)  # let Plotly finish its transitions
    page.screenshot(path=str(out / f"{name}.png"))
    print(f"  {out / (name + '.png')}", flush=True)


def _tab(page, title: str) -> None:
    page.get_by_role("tab", name=title).click()
    wait_for_app(page)


def main(out: Path) -> None:
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    with streamlit_server() as url, sync_playwright() as p:
        browser = launch_chromium(p)
        page = browser.new_page(viewport=VIEWPORT)
        load(page, f"{url}/kv-cache?live_model={MODEL}&live_scenario={SCENARIO}", timeout=300_000)
        for step in range(1, STEPS + 1):
            click(page, "step")
            wait_for_views_at_step(page, step, timeout=120_000)
            wait_for_app(page)
        _shoot(page, out, "kv-cache")
        open_page(page, url, "Batch composition")
        _shoot(page, out, "batching")
        _tab(page, "Latency per request")
        _shoot(page, out, "latency")
        _tab(page, "Static vs continuous")
        click(page, "run_comparison")
        wait_for_app(page, timeout=300_000)
        _shoot(page, out, "static-vs-continuous")
        load(page, url)
        click(page, "generate")
        wait_for_app(page, timeout=120_000)
        _shoot(page, out, "generate")
        load(page, f"{url}/fit?model=internvl2-8b&hw=atlas-300v-pro")
        _shoot(page, out, "fit")
        browser.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "img")
