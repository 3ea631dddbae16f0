"""`make screenshots`: the docs' pictures of each view (docs/img/), taken in Chromium from a real run.

    .venv/bin/python -m tests.browser.screenshots [OUT_DIR] [GROUP...]   (default docs/img, every group)

Starts `make run`'s server, steps the chat-burst scenario on SmolLM2-135M as a viewer would
(clicks), and saves one PNG per view; the Prefix cache page steps its own scenarios
(shared-prefix, and cache-pressure for LRU eviction). Groups: live (KV cache, batching,
Generate, fit), prefix, quant (the Quantization page's five tabs), spec (Speculative decoding),
pipeline (Pipeline parallelism: the Gantt and the calculator view), architectures (the
Attention architectures page: the calculator's table and chart, the three pools after 6 steps), talk (docs/talk.md: presentation
mode at 1920x1080 from a bundled recording, step back, the Pipeline page on its own scenario, the
bundled-recording entry), serving (the Serving under load page after a run, and its simulated run on
the KV cache page), audit (the Audit page on a pasted vLLM log, and on InternVL2-8B / Atlas 300V Pro with
vllm-ascend), audit-engine (its "This engine, measured" tab after a measurement: minutes), flash (the
FlashAttention page: a prefill's tiles, a decode split into 4 segments, the memory traffic).
"""
from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.browser.server import (ROOT, click, launch_chromium, load, open_page, streamlit_server, wait_for_app,
                                  wait_for_views_at_step)

VIEWPORT = {"width": 1500, "height": 1250}
MODEL, SCENARIO, STEPS = "smollm2-135m", "chat-burst", 12
PREFIX_SHOTS = (("prefix-cache", "shared-prefix", 9), ("prefix-cache-eviction", "cache-pressure", 12))


def _shoot(page, out: Path, name: str) -> None:
    page.wait_for_timeout(400)  # let Plotly finish its transitions
    page.screenshot(path=str(out / f"{name}.png"))
    print(f"  {out / (name + '.png')}", flush=True)


def _tab(page, title: str, timeout: float = 60_000) -> None:
    page.get_by_role("tab", name=title).click()
    wait_for_app(page, timeout=timeout)


def _step_to(page, steps: int) -> None:
    for step in range(1, steps + 1):
        click(page, "step")
        wait_for_views_at_step(page, step, timeout=120_000)
        wait_for_app(page)


GROUPS = ("live", "prefix", "quant", "spec", "pipeline", "architectures", "talk", "serving", "audit", "audit-engine",
          "flash")


def main(out: Path, groups: tuple[str, ...] = GROUPS) -> None:
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    with streamlit_server() as url, sync_playwright() as p:
        browser = launch_chromium(p)
        if "live" in groups:
            _live(browser, url, out)
        if "prefix" in groups:
            _prefix(browser, url, out)
        if "quant" in groups:
            _quant(browser, url, out)
        if "spec" in groups:
            _spec(browser, url, out)
        if "pipeline" in groups:
            _pipeline(browser, url, out)
        if "architectures" in groups:
            _architectures(browser, url, out)
        if "talk" in groups:
            _talk(browser, url, out)
        if "serving" in groups:
            _serving(browser, url, out)
        if "audit" in groups:
            _audit(browser, url, out)
        if "audit-engine" in groups:
            _audit_engine(browser, url, out)
        if "flash" in groups:
            _flash(browser, url, out)
        browser.close()


def _live(browser, url: str, out: Path) -> None:
    page = browser.new_page(viewport=VIEWPORT)
    load(page, f"{url}/kv-cache?live_model={MODEL}&live_scenario={SCENARIO}", timeout=300_000)
    _step_to(page, STEPS)
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


@contextmanager
def _session(browser, url: str, path: str, scenario: str) -> Iterator:
    """A fresh browser session (its own Streamlit session) on ``path`` with ``scenario`` from the URL."""
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    load(page, f"{url}/{path}?live_model={MODEL}&live_scenario={scenario}", timeout=300_000)
    try:
        yield page
    finally:
        context.close()


def _press(page, key: str, timeout: float = 300_000) -> None:
    """Click a button that runs something long (a comparison, a measurement) and wait for it."""
    click(page, key)
    wait_for_app(page, timeout=timeout)


def _prefix(browser, url: str, out: Path) -> None:
    for name, scenario, steps in PREFIX_SHOTS:
        with _session(browser, url, "prefix-cache", scenario) as page:
            _step_to(page, steps)
            _shoot(page, out, name)
            if scenario == "shared-prefix":
                _tab(page, "Caching on vs off")
                _press(page, "run_caching_comparison")
                _shoot(page, out, "prefix-cache-comparison")


def _quant(browser, url: str, out: Path) -> None:
    """The Quantization page: weights (int4 g32, layer 0 q_proj), activations after 6 steps of
    chat-burst, SmoothQuant, the trade-offs measured from the button, the KV-cache dtypes."""
    with _session(browser, url, "quantization", SCENARIO) as page:
        _shoot(page, out, "quantization-weights")
        _tab(page, "Activations")
        _step_to(page, 6)
        _shoot(page, out, "quantization-activations")
        _tab(page, "SmoothQuant")
        _shoot(page, out, "quantization-smoothquant")
        _tab(page, "Trade-offs")
        _press(page, "measure_tradeoffs", timeout=600_000)
        _shoot(page, out, "quantization-tradeoffs")
        _tab(page, "KV cache", timeout=300_000)
        _shoot(page, out, "quantization-kv")


def _spec(browser, url: str, out: Path) -> None:
    """The Speculative decoding page on spec-copy (n-gram, k = 4) after 10 steps: the drafts, the
    acceptance and theory, the with/without comparison."""
    with _session(browser, url, "speculative", "spec-copy") as page:
        _step_to(page, 10)
        _shoot(page, out, "speculative")
        _tab(page, "Acceptance & theory")
        _shoot(page, out, "speculative-theory")
        _tab(page, "With vs without")
        _press(page, "run_spec_comparison")
        _shoot(page, out, "speculative-comparison")


def _pipeline(browser, url: str, out: Path) -> None:
    """The Pipeline parallelism page on the pipeline scenario (SmolLM2 on two worker processes,
    GPipe m = 4) after 3 steps: the Gantt of the last step, then the calculator's view; then
    the batch queue after Run N (10 steps back to back; the last 4 drawn on one axis)."""
    with _session(browser, url, "pipeline", "pipeline") as page:
        _step_to(page, 3)
        _shoot(page, out, "pipeline")
        _tab(page, "Calculator")
        _shoot(page, out, "pipeline-calculator")
    with _session(browser, url, "pipeline", "pipeline") as page:  # the batch queue: restarts the workers
        page.locator(".st-key-knob_pipeline_schedule button", has_text="batch queue").click()
        wait_for_app(page, timeout=120_000)
        click(page, "run_n_button")  # 10 steps back to back: batches overlap only between steps that follow
        wait_for_views_at_step(page, 10, timeout=300_000)
        _shoot(page, out, "pipeline-batch-queue")


def _architectures(browser, url: str, out: Path) -> None:
    """The Attention architectures page on an H200 at 4,096 tokens (the table and the log bars),
    then its live part after 6 steps (the three pools, the step table)."""
    page = browser.new_page(viewport=VIEWPORT)
    try:
        load(page, f"{url}/architectures")
        # every chart drawn (the bars, the pools, running per step) before the first picture
        page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .main-svg').length >= 3")
        page.wait_for_timeout(1000)
        _shoot(page, out, "architectures")
        for step in range(1, 7):
            click(page, "arch_step")
            wait_for_views_at_step(page, step, minimum=2)
            wait_for_app(page)
        page.get_by_text("Live: MHA, GQA and MQA on the real engine").scroll_into_view_if_needed()
        page.mouse.wheel(0, 120)  # the heading at the top, the pools and the step table below it
        _shoot(page, out, "architectures-live")
    finally:
        page.context.close()


TALK_VIEWPORT = {"width": 1920, "height": 1080}  # a projector's screen: presentation mode fits it


def _serving(browser, url: str, out: Path) -> None:
    """The Serving under load page after a run (Llama-3-70B on 8 x H100 at 10 req/s, ShareGPT lengths),
    then its step-through on the KV cache page after 8 steps."""
    page = browser.new_page(viewport=VIEWPORT)
    load(page, f"{url}/serving")
    _press(page, "sv_run")
    page.locator(".st-key-sv_timeline .js-plotly-plot").wait_for(timeout=60_000)
    _shoot(page, out, "serving")
    click(page, "sv_step_through")
    page.wait_for_url("**/kv-cache**", timeout=60_000)
    wait_for_app(page, timeout=120_000)
    _step_to(page, 8)
    _shoot(page, out, "kv-cache-simulated")
    page.close()


def _scroll_to(page, heading: str) -> None:
    """Scroll the page so that ``heading`` is at the top of the window."""
    page.get_by_role("heading", name=heading).first.evaluate("e => e.scrollIntoView({block: 'start'})")
    page.mouse.move(5, 5)  # off the charts: no hover toolbar in the picture
    page.wait_for_timeout(300)


def _choose(page, key: str, option: str) -> None:
    """Pick ``option`` in the selectbox with widget key ``key`` (type to filter, Enter)."""
    page.locator(f".st-key-{key} input").click()
    page.keyboard.type(option)
    page.keyboard.press("Enter")
    wait_for_app(page, timeout=120_000)
    page.get_by_role("heading", name="Audit").first.click()  # away from the box: no focus ring in the picture


def _audit(browser, url: str, out: Path) -> None:
    """The Audit page: bench-03 (a vLLM V1 command with --no-enable-prefix-caching and its benchmark
    block, from a public thread) on Llama-3.1-8B / H100: what was read, the checklist, the roofline
    gap and the recommendations; then InternVL2-8B on an Atlas 300V Pro with vllm-ascend 0.11.0 (no
    log: the version's defaults)."""
    page = browser.new_page(viewport=VIEWPORT)
    load(page, f"{url}/audit")
    page.locator(".st-key-au_log textarea").fill((ROOT / "tests" / "data" / "audit_logs" / "bench-03.txt").read_text())
    _press(page, "au_run")
    page.locator(".st-key-au_roofline .js-plotly-plot").wait_for(timeout=60_000)
    _scroll_to(page, "Audit")
    _shoot(page, out, "audit")
    _scroll_to(page, "Checklist")
    _shoot(page, out, "audit-checklist")
    _scroll_to(page, "The roofline gap")
    _shoot(page, out, "audit-roofline")
    page.locator(".st-key-au_log textarea").fill("")
    _choose(page, "au_model", "internvl2-8b")
    _choose(page, "au_hw", "atlas-300v-pro")
    _choose(page, "au_fw", "vllm-ascend")
    _choose(page, "au_version_vllm-ascend", "0.11.0")
    page.locator(".st-key-au_roofline .js-plotly-plot").wait_for(timeout=120_000)
    _scroll_to(page, "Checklist")
    _shoot(page, out, "audit-atlas")
    _scroll_to(page, "What to change first")
    _shoot(page, out, "audit-atlas-changes")
    page.close()


def _audit_engine(browser, url: str, out: Path) -> None:
    """The Audit page's second tab: this engine measured (SmolLM2-135M, the quick workload)."""
    page = browser.new_page(viewport=VIEWPORT)
    load(page, f"{url}/audit")
    page.get_by_role("tab", name="This engine, measured").click()
    _choose(page, "au_engine_workload", "quick")
    _press(page, "au_measure", timeout=600_000)
    page.locator(".st-key-au_ablation_chart .js-plotly-plot").wait_for(timeout=60_000)
    _shoot(page, out, "audit-engine")
    page.close()


@contextmanager
def _talk_page(browser, url: str) -> Iterator:
    page = browser.new_page(viewport=TALK_VIEWPORT)
    try:
        load(page, url, timeout=300_000)
        yield page
    finally:
        page.context.close()


def _talk(browser, url: str, out: Path) -> None:
    """docs/talk.md: a link to step 10 of the bundled speculative recording in presentation mode;
    step back on the KV cache page (three steps, then one back); the Pipeline page opened on its
    own scenario (two SmolLM2 workers) after 3 steps; the Record / replay expander's bundled entry."""
    with _talk_page(browser, f"{url}/speculative?present=true&recording=spec-copy&step=10") as page:
        wait_for_views_at_step(page, 10, timeout=120_000)
        _shoot(page, out, "talk-speculative-present")
    with _talk_page(browser, f"{url}/kv-cache?present=true&live_model={MODEL}") as page:
        _step_to(page, 3)
        page.keyboard.press("B")
        wait_for_views_at_step(page, 2)
        _shoot(page, out, "talk-step-back")
    with _talk_page(browser, f"{url}/pipeline?present=true&live_model={MODEL}") as page:
        _step_to(page, 3)
        _shoot(page, out, "talk-pipeline")
        click(page, "reset")  # the workers stop with the run
        wait_for_app(page)
    with _talk_page(browser, f"{url}/speculative?live_model={MODEL}") as page:
        page.get_by_text("Record / replay", exact=True).first.click()
        page.get_by_role("button", name="Replay the bundled recording").first.click()
        wait_for_app(page, timeout=120_000)
        _step_to(page, 4)
        _shoot(page, out, "talk-replay-bundled")


def _flash(browser, url: str, out: Path) -> None:
    """The FlashAttention page on chat-burst: after step 1 (every prompt prefilled) the first
    request's layer 0, head 0 in tiles of 8; after step 2 its decode split into 4 segments and
    merged; the memory traffic against Llama-3-8B at 32k."""
    with _session(browser, url, "flash-attention", SCENARIO) as page:
        _step_to(page, 1)
        _shoot(page, out, "flash-attention")
        _scroll_to(page, "The tiles, in the order the kernel visits them")
        _shoot(page, out, "flash-attention-tiles")
        _step_to(page, 2)
        thumb = page.locator(".st-key-flash_segments").get_by_role("slider")
        thumb.focus()
        for _ in range(3):  # 1 -> 4 segments
            thumb.press("ArrowRight")
        wait_for_app(page, timeout=120_000)
        _scroll_to(page, "Split-KV: 4 segments and their merge")
        _shoot(page, out, "flash-attention-split")
        _scroll_to(page, "Memory traffic: naive against tiled")
        _shoot(page, out, "flash-attention-traffic")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "img",
         tuple(sys.argv[2:]) or GROUPS)
