"""Start `make run`'s server command on a free port and drive it with Debian's Chromium.

Shared by the browser tests (tests/browser/), the docs screenshots (tests/browser/screenshots.py)
and the UI benchmark (tests/bench/bench_ui.py). The server is stopped through its own process handle,
and the kernel ends it if the process that started it dies first (a crash or a kill skips ``finally``).
"""
from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[2]
STREAMLIT = ROOT / ".venv" / "bin" / "streamlit"
CHROMIUM = os.environ.get("INFERSCOPE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(port: int) -> list[str]:
    """The Makefile's `run` command, headless, on ``port``."""
    exe = str(STREAMLIT) if STREAMLIT.exists() else "streamlit"
    return [exe, "run", "app/main.py", "--server.port", str(port), "--browser.gatherUsageStats", "false",
            "--server.headless", "true", "--server.address", "127.0.0.1", "--server.fileWatcherType", "none",
            "--global.developmentMode", "false"]


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the parent dies (Linux PR_SET_PDEATHSIG)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


@contextmanager
def streamlit_server(log_path: Path | None = None, timeout: float = 90.0) -> Iterator[str]:
    """Yield the base URL of a running server; fail (never skip) when it does not come up."""
    port = free_port()
    log = open(log_path, "w") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen(server_command(port), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            preexec_fn=_die_with_parent)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + timeout
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"streamlit exited with code {proc.returncode} (log: {log_path})")
            try:
                if urllib.request.urlopen(url + "/_stcore/health", timeout=1).read() == b"ok":
                    break
            except OSError:
                pass
            if time.time() > deadline:
                raise RuntimeError(f"streamlit did not answer /_stcore/health within {timeout:.0f} s (log: {log_path})")
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if log_path:
            log.close()


def launch_chromium(playwright):
    """Debian's Chromium through Playwright; raises (so tests fail) when it cannot start."""
    if not Path(CHROMIUM).exists():
        raise RuntimeError(f"Chromium not found at {CHROMIUM}: run `make browser` (apt-get install chromium)")
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


def wait_for_app(page, timeout: float = 60_000) -> None:
    """Wait until the app is connected and its script has finished running."""
    page.wait_for_timeout(150)
    page.locator("[data-testid='stApp'][data-test-connection-state='CONNECTED']").wait_for(state="attached",
                                                                                            timeout=timeout)
    page.locator("[data-testid='stApp'][data-test-script-state='notRunning']").wait_for(state="attached",
                                                                                         timeout=timeout)


VIEWS_AT_STEP_JS = """
([n, minimum]) => {
  const plots = [...document.querySelectorAll('.js-plotly-plot')]
    .filter(p => p.layout && p.layout.meta && p.layout.meta.step !== undefined && p.layout.meta.step !== null);
  return plots.length >= minimum && plots.every(p => p.layout.meta.step === n);
}
"""


def wait_for_views_at_step(page, step: int, minimum: int = 1, timeout: float = 60_000) -> None:
    """Wait until every live chart on the page has been redrawn for ``step`` (layout.meta.step)."""
    page.wait_for_function(VIEWS_AT_STEP_JS, arg=[step, minimum], polling="raf", timeout=timeout)


def load(page, url: str, timeout: float = 180_000) -> None:
    """Go to ``url`` and wait for the app's first run (the first load of a model takes a while)."""
    page.goto(url)
    page.get_by_test_id("stAppViewContainer").wait_for(timeout=timeout)
    wait_for_app(page, timeout=timeout)


def click(page, key: str) -> None:
    """Click the button with widget key ``key`` (Streamlit marks its container with st-key-KEY).

    A click, not the button's keyboard shortcut: a freshly loaded page has no keyboard focus.
    """
    page.locator(f".st-key-{key} button").click()


def metric(page, label: str) -> str:
    """The shown value of the ``st.metric`` labelled ``label``."""
    box = page.get_by_test_id("stMetric").filter(has_text=label).first
    return box.get_by_test_id("stMetricValue").inner_text().strip()


def open_page(page, url: str, title: str) -> None:
    """In-app navigation (keeps the session): open the "Engine" menu, click the page link."""
    page.get_by_text("Engine", exact=True).first.click()
    page.locator("[data-testid='stTopNavDropdownLink']", has_text=title).first.click()
    wait_for_app(page)


def assert_no_exception(page) -> None:
    """No Streamlit exception box on the page (a traceback is never what a user should meet)."""
    boxes = page.get_by_test_id("stException")
    assert boxes.count() == 0, f"exception shown: {boxes.first.inner_text()[:500]}"


READABILITY_JS = """
() => {
  const box = (el) => el.getBoundingClientRect();
  const overlap = (a, b) => a.width > 0 && b.width > 0 && a.left < b.right - 1 && b.left < a.right - 1
    && a.top < b.bottom - 1 && b.top < a.bottom - 1;
  const main = box(document.querySelector('[data-testid="stMain"]') || document.body);
  const found = [];
  document.querySelectorAll('.js-plotly-plot').forEach((plot, i) => {
    const name = (plot.querySelector('.gtitle') || {}).textContent || `chart ${i}`;
    const svg = plot.querySelector('.main-svg');
    if (!svg) return;
    const s = box(svg);  // what shows of the figure: inside it and inside the page's main area
    const shown = {left: Math.max(s.left, main.left), right: Math.min(s.right, main.right, innerWidth),
                   top: s.top, bottom: s.bottom};
    const titles = [...plot.querySelectorAll('.g-gtitle, [class^="g-x"][class$="title"], [class^="g-y"][class$="title"]')];
    const legend = plot.querySelector('.legend');
    for (const t of legend ? titles : [])
      if (overlap(box(legend), box(t))) found.push(`${name}: the legend covers "${t.textContent}"`);
    titles.forEach((a, j) => titles.slice(j + 1).forEach((b) => {
      if (overlap(box(a), box(b))) found.push(`${name}: "${a.textContent}" overlaps "${b.textContent}"`);
    }));
    plot.querySelectorAll('text').forEach((t) => {
      const r = box(t);
      if (r.width && t.textContent.trim() && (r.left < shown.left - 1 || r.right > shown.right + 1
          || r.top < shown.top - 1 || r.bottom > shown.bottom + 1))
        found.push(`${name}: "${t.textContent.slice(0, 60)}" is cut off`);
    });
  });
  document.querySelectorAll('[data-testid="stDataFrame"]').forEach((table) => {
    const scroller = table.querySelector('.dvn-scroller');
    if (scroller && scroller.scrollWidth > scroller.clientWidth + 1) {
      const head = [...table.querySelectorAll('[role=columnheader]')].map((c) => c.textContent).join(' | ');
      found.push(`a table scrolls sideways (${scroller.scrollWidth} > ${scroller.clientWidth} px): ${head}`);
    }
  });
  return found;
}
"""


def readability_problems(page) -> list[str]:
    """What a reader cannot read on the page as shown: a chart's legend over an axis or chart
    title, titles over each other, chart text cut off by the figure's or the page's edge, a table
    wider than its frame (columns hidden until scrolled)."""
    return page.evaluate(READABILITY_JS)
