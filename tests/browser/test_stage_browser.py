"""Giving a talk, in Chromium against `make run`'s server: the recording download, a presentation
link, the speaker's keyboard (app/step_queue.py KEYS) whatever was clicked last, every live view
on one 1920x1080 screen, and a pipeline restart that shows progress at once (issue 19).

Each test fails on the code before these fixes (4f34e65): an empty download, a presentation link
that shows 16 px text and the intro, PageDown ignored after the scenario dropdown or the
presentation toggle, charts up to 1,500 px below the fold, a pipeline restart with a stale
"2 workers running" box and nothing else for the first seconds.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from engine.replay.recording import from_json
from tests.browser.server import (assert_no_exception, click, load, metric, readability_problems, wait_for_app,
                                  wait_for_views_at_step)

pytestmark = pytest.mark.browser

HD = {"width": 1920, "height": 1080}
INTRO_CHARS = 200  # every page's intro paragraph is longer; presentation mode hides them
TINY = "live_model=tiny-random"
# Each live page with a scenario that gives its main view something to draw.
LIVE_PAGES = {"kv-cache": "chat-burst", "batching": "chat-burst", "prefix-cache": "shared-prefix",
              "quantization": "chat-burst", "speculative": "spec-copy", "pipeline": "pipeline"}


def new_page(chromium, url: str, viewport: dict = HD):
    """A page in its own browser context, hence its own Streamlit session, with the keyboard
    listening (the step queue's component mounts a moment after the first run)."""
    page = chromium.new_context(viewport=viewport, accept_downloads=True).new_page()
    load(page, url)
    page.wait_for_selector("body.inferscope-step-queue", state="attached", timeout=30_000)
    return page


def steps_done(page) -> int:
    return int(metric(page, "Steps done"))


def wait_for_steps(page, n: int | str, timeout: float = 30_000) -> None:
    """Wait until "Steps done" shows ``n`` ("5 of 6" while behind the latest step; auto-retrying),
    then for the script to settle."""
    from playwright.sync_api import expect

    expect(page.get_by_test_id("stMetric").filter(has_text="Steps done").get_by_test_id("stMetricValue")) \
        .to_have_text(str(n), timeout=timeout)
    wait_for_app(page)


# -- 1: the recording download --------------------------------------------------------------------

def test_download_saves_a_recording_that_loads_back(app_url: str, chromium, tmp_path: Path) -> None:
    """The browser's download is a valid recording of the run (it was an empty file), and the
    file uploader replays it."""
    page = new_page(chromium, f"{app_url}/kv-cache?{TINY}&live_scenario=chat-burst")
    page.keyboard.press("PageDown")
    page.keyboard.press("PageDown")
    wait_for_steps(page, 2)
    page.get_by_text("Record / replay").click()
    with page.expect_download() as download:
        click(page, "download_recording")
    saved = tmp_path / download.value.suggested_filename
    download.value.save_as(saved)
    recording = from_json(saved.read_bytes())  # ValueError on an empty or invalid file
    assert len(recording.traces) == 2 and recording.meta.scenario == "chat-burst"
    assert recording.meta.model == "tiny-random"

    page.get_by_test_id("stFileUploaderDropzoneInput").set_input_files(str(saved))
    page.get_by_text("REPLAY · recorded run").first.wait_for(timeout=30_000)
    wait_for_app(page)
    assert page.get_by_test_id("stAlertContentError").count() == 0
    assert_no_exception(page)
    page.context.close()


# -- 2 and 5: a presentation link, every live view on one 1080p screen ----------------------------

FIRST_SCREEN_JS = """
() => {
  const main = document.querySelector('[data-testid="stMain"]');
  const chart = main.querySelector('.js-plotly-plot');
  const box = (el) => { const r = el.getBoundingClientRect(); return {top: r.top, bottom: r.bottom}; };
  return {
    font: parseFloat(getComputedStyle(document.documentElement).fontSize),
    scrolled: main.scrollTop,
    chart: chart ? box(chart) : null,
    metrics: [...main.querySelectorAll('[data-testid="stMetric"]')].map(box),
    exports: main.querySelectorAll('[data-testid="stDownloadButton"]').length,
    captions: [...main.querySelectorAll('[data-testid="stCaptionContainer"]')].map(c => c.innerText.length),
  };
}
"""


@pytest.mark.parametrize("path", list(LIVE_PAGES))
def test_presentation_link_fits_one_1080p_screen(app_url: str, chromium, artifacts: Path, path: str) -> None:
    """``?present=true`` on a fresh session applies presentation mode on the page it opens
    (large text, no intro, no exports), and at 1920x1080 the page's main chart (its first) and
    its key numbers lie within the first screen, without scrolling."""
    page = new_page(chromium, f"{app_url}/{path}?{TINY}&live_scenario={LIVE_PAGES[path]}&present=true")
    if path == "pipeline":  # its schedule is drawn from the first step on
        page.keyboard.press("PageDown")
    page.wait_for_function("() => document.querySelector('[data-testid=\"stMain\"] .js-plotly-plot')"
                           " && document.querySelector('[data-testid=\"stMain\"] [data-testid=\"stMetric\"]')",
                           timeout=60_000)  # the chart and the numbers (on a loaded machine the numbers came later)
    try:  # the mode's style arrives with the page's first run; on a loaded machine a moment later
        page.wait_for_function("() => parseFloat(getComputedStyle(document.documentElement).fontSize) === 21",
                               timeout=30_000)
    except Exception:
        pass  # the assertion below says what was shown
    page.wait_for_timeout(300)  # the chart's final size after the first draw
    shown = page.evaluate(FIRST_SCREEN_JS)
    page.screenshot(path=str(artifacts / f"present-{path}.png"))
    assert_no_exception(page)
    assert shown["font"] == 21, "presentation mode's root font size"
    assert all(n < INTRO_CHARS for n in shown["captions"]), f"an intro paragraph is shown: {shown['captions']}"
    assert shown["exports"] == 0, "no export buttons in presentation mode"
    assert shown["scrolled"] == 0
    assert shown["chart"] is not None
    assert 0 <= shown["chart"]["top"] and shown["chart"]["bottom"] <= HD["height"], shown
    assert shown["metrics"] and all(m["bottom"] <= HD["height"] for m in shown["metrics"]), shown
    assert readability_problems(page) == []
    page.context.close()


def test_every_view_is_readable_at_1440(app_url: str, chromium, artifacts: Path) -> None:
    """At 1440x900 (a laptop), after three steps on each live page and on the calculator's tables:
    no legend over an axis title, no title over another, no chart text past the figure's or the
    page's edge, no table that hides columns until scrolled (issue 19, item 9: the KV waste bars'
    labels, the pipeline's legend on its axis title, the prefix statistics past the page's edge,
    the calculator's comparison table)."""
    page = chromium.new_context(viewport={"width": 1440, "height": 900}).new_page()
    problems = []
    for path, scenario in {**LIVE_PAGES, "kv-cache": "memory-pressure"}.items():
        load(page, f"{app_url}/{path}?{TINY}&live_scenario={scenario}")
        for _ in range(3):  # the Step button (the keys have their own test)
            click(page, "step")
            wait_for_app(page)
        wait_for_steps(page, 3)
        page.wait_for_timeout(500)  # the charts' final layout
        problems += [f"{path}: {p}" for p in readability_problems(page)]
        assert_no_exception(page)
    load(page, f"{app_url}/fit")
    for tab in ("Every device", "Other formats"):
        page.get_by_role("tab", name=tab).click()
        page.locator('[data-testid="stDataFrame"]:visible').first.wait_for()
        page.wait_for_timeout(300)
        problems += [f"fit, {tab}: {p}" for p in readability_problems(page)]
    page.screenshot(path=str(artifacts / "readable-1440-fit.png"))
    assert problems == []
    page.context.close()


# -- 3 and the key map: the speaker's keyboard, whatever was clicked last ---------------------------

def press(page, key: str) -> None:
    page.keyboard.press(key)
    page.wait_for_timeout(200)  # the press's rerun request leaves before the wait below looks
    wait_for_app(page)


NOT_YET = "st-key-step-not-drawn"


def test_keys_work_after_sidebar_controls_and_do_what_the_map_says(app_url: str, chromium) -> None:
    """PageDown steps before the Step button is drawn, right after the scenario dropdown and after
    the presentation toggle (each was ignored); then every key of app/step_queue.py's map, and none
    while the speaker types in a number input."""
    from playwright.sync_api import expect

    page = new_page(chromium, f"{app_url}/kv-cache?{TINY}&live_scenario=chat-burst")
    # First a press while the Step button is not drawn yet, as a fresh page can be for a moment
    # after the listener mounts (the press was ignored): the button is hidden from its selector.
    page.evaluate(f"() => document.querySelector('.st-key-step').classList.replace('st-key-step', '{NOT_YET}')")
    press(page, "PageDown")
    wait_for_steps(page, 1)
    page.evaluate(f"() => document.querySelector('.{NOT_YET}')?.classList.replace('{NOT_YET}', 'st-key-step')")
    page.locator(".st-key-live_scenario").click()  # the scenario dropdown: pick another scenario
    # (60 s: late in the browser unit, with every earlier test's sessions alive in the one server,
    # the dropdown took over 30 s to open in two full runs on the 2-core machine; alone, 1 s)
    page.get_by_role("option", name="Memory pressure").click(timeout=60_000)
    wait_for_steps(page, 0)  # a new run
    press(page, "PageDown")
    wait_for_steps(page, 1)

    page.get_by_text("Presentation mode").click()  # the toggle keeps the keyboard focus
    page.wait_for_function("() => parseFloat(getComputedStyle(document.documentElement).fontSize) === 21",
                           timeout=30_000)
    wait_for_app(page)
    press(page, "PageDown")
    wait_for_steps(page, 2)
    press(page, "S")
    wait_for_steps(page, 3)

    steps = page.locator(".st-key-run_n input")  # typing: no key fires, Enter commits and leaves
    steps.click()
    steps.fill("3")
    for key in ("PageDown", "n", "p", "]"):  # (a digit would be typed into the number)
        page.keyboard.press(key)
    page.wait_for_timeout(500)
    wait_for_app(page)
    assert steps_done(page) == 3 and "kv-cache" in page.url
    page.keyboard.press("Enter")
    wait_for_app(page)
    press(page, "N")  # Run N (N = 3)
    wait_for_steps(page, 6)

    press(page, "PageUp")  # the history's Step back button: PageUp and B step back
    wait_for_steps(page, "5 of 6")
    press(page, "B")
    wait_for_steps(page, "4 of 6")
    press(page, "PageDown")  # forward through the history
    press(page, "PageDown")
    wait_for_steps(page, 6)

    press(page, "P")  # Play, then Pause
    expect(page.locator(".st-key-play").get_by_role("button", name="Pause")).to_be_visible(timeout=30_000)
    expect(page.get_by_test_id("stMetric").filter(has_text="Steps done").get_by_test_id("stMetricValue")) \
        .not_to_have_text("6", timeout=30_000)
    press(page, "P")  # (60 s: a step in flight finishes before the pause shows; see the dropdown above)
    expect(page.locator(".st-key-play").get_by_role("button", name="Play")).to_be_visible(timeout=60_000)
    # the button by pointer, counted as P is (a Pause trigger among the Play ticks' reruns could be lost)
    page.locator(".st-key-play button").click()
    expect(page.locator(".st-key-play").get_by_role("button", name="Pause")).to_be_visible(timeout=30_000)
    page.locator(".st-key-play button").click()
    expect(page.locator(".st-key-play").get_by_role("button", name="Play")).to_be_visible(timeout=60_000)
    press(page, "0")  # Reset
    wait_for_steps(page, 0)

    press(page, "]")  # next live page, then back
    page.get_by_role("heading", name="Batch composition").wait_for(timeout=30_000)
    assert "batching" in page.url
    press(page, "[")
    page.get_by_role("heading", name="Paged KV cache").wait_for(timeout=30_000)
    press(page, "[")  # no page before the first: it stays
    assert "kv-cache" in page.url
    assert_no_exception(page)
    page.context.close()


# -- 6: a pipeline restart shows progress at once, and no stale worker box -------------------------

WATCH_RESTART_JS = """
() => {
  const seen = window.__restart = { t0: performance.now(), progress: null, stale: [] };
  const main = document.querySelector('[data-testid="stMain"]');
  const check = () => {
    if (seen.progress === null && main.querySelector('[data-testid="stProgress"]'))
      seen.progress = performance.now() - seen.t0;
    const text = main.innerText;
    const box = text.match(/\\d+ workers running/);
    if (box && seen.stale.length < 5) seen.stale.push(box[0]);
  };
  check();
  new MutationObserver(check).observe(main, { subtree: true, childList: true, characterData: true });
}
"""
PROGRESS_WITHIN_MS = 2_000  # asked: about 1 s; the bound leaves room for a loaded 2-core machine


def test_pipeline_knob_change_shows_progress_at_once(app_url: str, chromium) -> None:
    """Changing m restarts the workers: a progress bar is up right away (it was a stale
    "2 workers running" box and nothing else for the first seconds), none of that box, and the
    new run comes up."""
    page = new_page(chromium, f"{app_url}/pipeline?{TINY}&live_scenario=pipeline")
    micro = page.locator(".st-key-knob_num_microbatches input")
    micro.click()
    micro.fill("2")
    page.evaluate(WATCH_RESTART_JS)
    page.keyboard.press("Enter")
    page.wait_for_timeout(300)
    wait_for_app(page, timeout=120_000)
    seen = page.evaluate("() => window.__restart")
    assert seen["progress"] is not None and seen["progress"] <= PROGRESS_WITHIN_MS, seen
    assert not seen["stale"], f"a worker box was shown during the restart: {seen['stale']}"
    assert page.get_by_test_id("stProgress").count() == 0, "the progress bar goes once the run is up"
    assert steps_done(page) == 0
    press(page, "PageDown")
    wait_for_steps(page, 1, timeout=60_000)
    assert_no_exception(page)
    page.context.close()
