"""The Pipeline parallelism page in Chromium against `make run`'s server, on the real SmolLM2 with
real worker processes: they exist while the page runs (children of the server process), Reset
replaces them (the old ones stop, no leak), a browser session that ends takes its workers with
it (app/session_reaper.py, grace shortened to 2 s) while the server runs on, and they are gone
once the server stops.

This test starts its own server (not the session's) so that it can stop it and look.
"""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.browser.server import click, load, streamlit_server, wait_for_app, wait_for_views_at_step

pytestmark = pytest.mark.browser

VIEWPORT = {"width": 1600, "height": 1200}
GRACE_S = 2  # a disconnected session's workers stop this long after it left

GANTT_JS = """
() => {
  const plot = [...document.querySelectorAll('.js-plotly-plot')]
    .find(p => ((p.layout.title || {}).text || '').startsWith('Bubble measured'));
  if (!plot) return null;
  return {step: plot.layout.meta.step, lanes: plot.layout.meta.lanes, bubble: plot.layout.meta.bubble,
          traces: plot.data.map(t => t.name)};
}
"""


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process /proc shows."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] != "Z":  # a zombie has exited
            out[int(entry.name)] = (int(fields[1]), cmd)
    return out


def server_pid(url: str) -> int:
    port = url.rsplit(":", 1)[1]
    procs = _processes()
    return next(pid for pid, (_, cmd) in procs.items() if "streamlit" in cmd and f"--server.port {port}" in cmd)


def worker_pids(root: int) -> set[int]:
    """The engine workers under ``root`` (engine/parallel/worker.py names each in its command line)."""
    procs = _processes()
    found, frontier = set(), {root}
    while frontier:
        children = {pid for pid, (ppid, _) in procs.items() if ppid in frontier}
        found |= children
        frontier = children
    return {pid for pid in found if "inferscope-worker" in procs[pid][1]}


def alive(pids: set[int]) -> set[int]:
    return pids & set(_processes())


def wait_until(predicate, timeout: float = 60.0) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.5)
    return predicate()


def test_workers_run_with_the_page_and_stop_with_reset_the_session_and_the_server(
        chromium, artifacts: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERSCOPE_SESSION_GRACE_S", str(GRACE_S))  # the server reads it (app/session_reaper.py)
    with streamlit_server(artifacts / "pipeline-server.log") as url:
        root = server_pid(url)
        page = chromium.new_context(viewport=VIEWPORT).new_page()
        load(page, f"{url}/pipeline?live_model=smollm2-135m&live_scenario=pipeline", timeout=300_000)
        wait_for_app(page, timeout=300_000)
        assert page.get_by_test_id("stException").count() == 0
        first = worker_pids(root)
        assert len(first) == 2, "p = 2, t = 1: two worker processes under the server"
        for n in (1, 2):
            click(page, "step")
            wait_for_views_at_step(page, n, timeout=120_000)
            wait_for_app(page)
        gantt = page.evaluate(GANTT_JS)
        assert gantt["step"] == 2 and [lane.split(" (")[0] for lane in gantt["lanes"]] == ["stage 0 · tp 0",
                                                                                          "stage 1 · tp 0"]
        assert {"mb 0", "mb 1", "mb 2", "mb 3"} <= set(gantt["traces"])
        page.screenshot(path=str(artifacts / "pipeline.png"), full_page=True)

        click(page, "reset")  # the run is rebuilt: new workers, the old ones stopped
        wait_for_app(page, timeout=300_000)
        assert wait_until(lambda: not alive(first)), "the replaced run's workers must stop"
        second = worker_pids(root)
        assert len(second) == 2 and not second & first
        assert page.get_by_test_id("stException").count() == 0
        page.context.close()  # the browser session ends: its workers stop after the grace period
        assert wait_until(lambda: not alive(second), timeout=GRACE_S + 30), "a closed session's workers must stop"
        assert server_pid(url) == root, "the server itself keeps running"

        page = chromium.new_context(viewport=VIEWPORT).new_page()  # one more session, left open
        load(page, f"{url}/pipeline?live_model=tiny-random&live_scenario=pipeline", timeout=300_000)
        wait_for_app(page, timeout=300_000)
        third = worker_pids(root)
        assert len(third) == 2 and not third & second
    assert wait_until(lambda: not alive(third)), "the workers must stop with the server"
