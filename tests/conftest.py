"""Shared fixtures: the tiny random model (loaded once per session) and an engine driver.

Torch and the engine are imported lazily, so torch-free tests (the calculator) stay light.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import os

import pytest

if TYPE_CHECKING:
    from engine.serving.engine import LLMEngine
    from engine.model.shared import SharedModel


@pytest.fixture(scope="session")
def tiny() -> "SharedModel":
    """2 layers, hidden 64, byte tokenizer, seeded random weights: instant on CPU."""
    from engine.model.shared import get_shared_model

    return get_shared_model("tiny-random")


def run_to_completion(engine: "LLMEngine", check: bool = True, max_steps: int = 100_000) -> list:
    """Step until nothing is left, checking every manager's invariants after each step."""
    traces = []
    if check:
        engine.check_integrity()
    while engine.has_unfinished_requests():
        traces.append(engine.step())
        if check:
            engine.check_integrity()
        assert len(traces) <= max_steps, f"engine did not finish within {max_steps} steps"
    return traces


@pytest.fixture
def streamlit_clean():
    """Streamlit's caches outlive an AppTest (ui.md 4.2): clear them around a page test, and put
    back torch's thread count, which an app run may change. Tiny-random reloads in milliseconds.
    The worker reaper's registry outlives it too: the AppTest session is gone afterwards (its
    test stops its run's workers), so the reaper stops watching it."""
    import streamlit as st
    import torch

    from app import session_reaper

    threads = torch.get_num_threads()
    st.cache_data.clear()
    st.cache_resource.clear()
    yield
    st.cache_data.clear()
    st.cache_resource.clear()
    torch.set_num_threads(threads)
    for sid in session_reaper.sessions():
        session_reaper.release(sid)


@pytest.fixture(scope="module")
def torch_single_thread():
    """One intra-op thread for the tiny model: its ops are too small to gain from more, and on a
    shared 2-core machine a second thread contending with another process stalls each step
    (measured: ~2 ms/step alone vs ~200 ms/step with 2 threads beside a busy process)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def recording_text() -> str:
    """A real short tiny-random run as recording JSON (tests/fuzz/recordings.py), to break."""
    from tests.fuzz.recordings import record_json

    return record_json()


@pytest.fixture(scope="module")
def recording_data(recording_text: str) -> dict:
    """``recording_text`` parsed: mutate it with ``tests.fuzz.recordings.set_path`` (which copies)."""
    import json

    return json.loads(recording_text)


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`make test` runs two processes on the two cores) each process gets one
    torch thread, so the two never contend for a core (``torch_single_thread`` says what that
    costs). Set before torch is imported: the engine's worker processes inherit it too."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``make test`` runs ``-n 2 --dist loadfile``: each test file is one unit of work, except that
    every browser test (tests/browser/) is in one unit, so they share one Streamlit server and one
    Chromium in one xdist process (tests/browser/conftest.py) while the other process runs the
    rest. (xdist's own ``--dist loadgroup`` cannot do it under pytest 9.2: it renames
    ``item._nodeid``, which pytest no longer reads.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class BrowserTestsTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "tests/browser/" if nodeid.startswith("tests/browser/") else super()._split_scope(nodeid)

    return BrowserTestsTogether(config, log)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """An xdist process hands its fuzz tallies to the controlling process (``workeroutput``)."""
    from dataclasses import asdict

    from tests.fuzz.harness import TALLY

    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["fuzz_tally"] = asdict(TALLY)


def pytest_testnodedown(node: object, error: object) -> None:
    """The controlling process adds up each xdist process's fuzz tallies."""
    from tests.fuzz.harness import TALLY

    for name, count in getattr(node, "workeroutput", {}).get("fuzz_tally", {}).items():
        setattr(TALLY, name, getattr(TALLY, name) + count)


def pytest_terminal_summary(terminalreporter) -> None:
    """The fuzz suite's tallies (tests/fuzz/harness.py), when any fuzz case ran."""
    from tests.fuzz.harness import TALLY

    if TALLY.cases:
        terminalreporter.write_line(TALLY.line())
