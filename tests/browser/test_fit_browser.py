"""The calculator's verdict as a person sees it in Chromium (issue #19, item 8).

The speaker read the orange "Fits with more devices" as a fit. Rendered, the headline must now say
"Does not fit on 2 × H100 SXM 80GB — needs 4", with how far over; no speed shown as if it ran on 2;
the serve command never asks for more positions than the model has.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.browser.server import load, metric

pytestmark = pytest.mark.browser


def test_over_by_a_little_reads_as_does_not_fit(app_url: str, chromium, artifacts: Path) -> None:
    page = chromium.new_context(viewport={"width": 1600, "height": 1000}).new_page()
    load(page, f"{app_url}/fit?model=llama-3-70b&hw=h100-sxm&tp=2&ctx=32768&fwv=0.7")  # V0 rule
    headline = page.get_by_test_id("stMain").locator("h2").first
    headline.wait_for()
    text = headline.inner_text()
    assert text.startswith("Does not fit on 2 × H100 SXM 80GB — needs 4"), text
    assert "over by 1.38 GiB per device" in text
    main = page.get_by_test_id("stMain").inner_text()
    assert not re.search(r"\bFits\b", main) and "fits with" not in main.lower(), main[:2000]
    assert metric(page, "Decode on 2 (asked)") == "does not fit"
    assert metric(page, "Decode on 4, fewest that fit").endswith("tok/s")
    serve = page.get_by_test_id("stCode").first.inner_text()
    assert "--max-model-len 8192" in serve and "32768" not in serve
    page.screenshot(path=str(artifacts / "fit-does-not-fit.png"), full_page=True)
    page.context.close()
