"""app/session_reaper.py: the workers of a browser session that has gone away are stopped after
the grace period, never before, and never those of a session that is still (or again)
connected. Real engines: tiny-random on two worker processes, one per session."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from app import session_reaper
from engine.parallel.executor import WorkerError
from engine.replay.run import LiveRun
from engine.replay.scenario import load_scenario, with_knobs


@pytest.fixture()
def runs() -> Iterator[dict[str, LiveRun]]:
    sc = with_knobs(load_scenario("pipeline"), max_num_batched_tokens=64)
    out = {sid: LiveRun.from_scenario(sc, "tiny-random") for sid in ("a", "b")}
    for sid, run in out.items():
        session_reaper.adopt(sid, run)
    try:
        yield out
    finally:
        for sid, run in out.items():
            session_reaper.release(sid)
            run.close()


def test_a_disconnected_session_loses_its_workers_after_the_grace_period_only(runs: dict[str, LiveRun]) -> None:
    connected = {"a": True, "b": False}
    assert session_reaper.reap(connected.__getitem__, now=100.0, grace_s=30) == []  # b's clock starts
    assert session_reaper.reap(connected.__getitem__, now=129.0, grace_s=30) == []
    assert runs["b"].engine.runner.executor.alive
    assert session_reaper.reap(connected.__getitem__, now=130.0, grace_s=30) == ["b"]
    assert not runs["b"].engine.runner.executor.alive and runs["a"].engine.runner.executor.alive
    with pytest.raises(WorkerError, match="restart"):
        runs["b"].step()  # the session, should it come back, gets a message and a Restart button
    runs["a"].step()  # the connected one runs on
    assert session_reaper.reap(connected.__getitem__, now=1000.0, grace_s=30) == []


def test_a_session_that_reconnects_in_time_keeps_its_workers(runs: dict[str, LiveRun]) -> None:
    state = {"a": True, "b": False}
    session_reaper.reap(state.__getitem__, now=0.0, grace_s=30)
    state["b"] = True  # a reload reconnects
    session_reaper.reap(state.__getitem__, now=20.0, grace_s=30)
    state["b"] = False  # away again: the clock starts over
    assert session_reaper.reap(state.__getitem__, now=40.0, grace_s=30) == []
    assert session_reaper.reap(state.__getitem__, now=69.0, grace_s=30) == []
    assert runs["b"].engine.runner.executor.alive
    assert session_reaper.reap(state.__getitem__, now=70.0, grace_s=30) == ["b"]
