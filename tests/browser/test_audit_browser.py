"""/audit in Chromium (issue #23, item 6): a real vLLM command + benchmark block pasted (bench-03,
from a public thread), audited; the checklist shows prefix caching off from the log's line, the
recommendations include turning it on, and the JSON export is a real download that parses into
the CLI's keys."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.browser.server import assert_no_exception, click, load, readability_problems, wait_for_app

pytestmark = pytest.mark.browser
LOG = Path(__file__).resolve().parents[1] / "data" / "audit_logs" / "bench-03.txt"


def grid_text(page, key: str) -> str:
    """The cells a dataframe shows (its grid's accessible cells: the canvas draws the same text)."""
    box = page.locator(f".st-key-{key}")
    box.locator("[role=gridcell]").first.wait_for(state="attached", timeout=60_000)
    return "\n".join(box.locator("[role=gridcell]").all_text_contents())


def test_audit_a_pasted_log_then_download_the_json(app_url: str, chromium, artifacts: Path, tmp_path: Path) -> None:
    page = chromium.new_context(viewport={"width": 1440, "height": 1400}, accept_downloads=True).new_page()
    load(page, f"{app_url}/audit")
    page.locator(".st-key-au_log textarea").fill(LOG.read_text())
    click(page, "au_run")
    wait_for_app(page, timeout=180_000)
    page.locator(".st-key-au_roofline .js-plotly-plot").wait_for(timeout=60_000)
    assert_no_exception(page)
    text = page.get_by_test_id("stMain").inner_text()
    assert "understood 15 of 33 line(s)" in text, text[:1500]

    checklist = grid_text(page, "au_checklist")
    assert "Prefix caching (automatic / radix)" in checklist and "⭕ off" in checklist, checklist[:2000]
    assert "log line 1: enable_prefix_caching = False" in checklist
    assert "Prefix caching (automatic / radix)" in grid_text(page, "au_recommendations")
    assert readability_problems(page) == []  # no table hides columns until scrolled, no chart text cut
    page.screenshot(path=str(artifacts / "audit.png"), full_page=True)

    with page.expect_download() as download:
        click(page, "au_export_json")
    saved = tmp_path / download.value.suggested_filename
    download.value.save_as(saved)
    assert saved.name == "audit-llama-3.1-8b-h100-sxm-vllm-0.11.0.json"
    report = json.loads(saved.read_text())
    assert set(report) >= {"detected", "checklist", "roofline", "recommendations"}
    assert report["detected"]["enable_prefix_caching"]["source"] == "log"
    assert report["detected"]["enable_prefix_caching"]["value"] is False
    prefix = next(i for i in report["checklist"] if i["name"] == "prefix_caching")
    assert prefix["status"] == "off" and prefix["how"] == "--enable-prefix-caching"
    assert report["roofline"]["decode_measured_tokens_per_s"] == pytest.approx(1000 / 33.15)
    page.context.close()
