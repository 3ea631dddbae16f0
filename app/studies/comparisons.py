"""The scenario run to the end twice on the real engine, side by side: static vs continuous
batching (kept on the run itself: a recording carries them), prefix caching on vs off and
speculation on vs off and one run per scheduling policy (kept in the session per set-up: a change
of model, scenario or knob drops them, and a replay has none, since engine/recording.py accepts
only the two batching policies as comparison runs).
"""
from __future__ import annotations

from typing import Callable

from app import session
from app.current_run import is_replay, live_run, run
from app.models import shared_model
from app.scenarios import spec_scenario
from engine.replay.run import (PolicyRun, compare_policies, compare_prefix_caching, compare_scheduling_policies,
                               compare_speculation)

Progress = Callable[[str, int], None]  # (run name, steps done)
Compare = Callable[..., dict[str, PolicyRun]]  # engine.run.compare_*(scenario, model, on_step=...)


def comparison() -> dict[str, PolicyRun]:
    """Static vs continuous batching of the session's run (live, or as recorded), if run."""
    current = run()
    return dict(current.comparison) if current is not None else {}


def run_comparison(progress: Progress | None = None) -> None:
    """Run the current scenario to the end under both policies (live runs only)."""
    current = live_run()
    if current is not None and (runs := _compare(compare_policies, progress)) is not None:
        with current.lock:
            current.comparison.update(runs)


def _compare(compare: Compare, progress: Progress | None) -> dict[str, PolicyRun] | None:
    """The session's live scenario run to the end both ways with ``compare``; None where there is
    no live run, or it failed (then the failure is the session's message)."""
    spec = session.run_spec.get()
    if live_run() is None or spec is None:
        return None
    try:
        sc = spec_scenario(spec)
        return compare(sc, shared_model(spec.model, sc.engine_config()), on_step=progress)
    except (ValueError, RuntimeError) as e:
        session.error.set(f"comparison failed: {e}")
        return None


def _stored(slot: session.Slot[session.Comparison | None]) -> dict[str, PolicyRun]:
    """The runs stored in ``slot`` for the current live set-up, if run."""
    stored = slot.get()
    if is_replay() or stored is None or stored[0] != session.run_spec.get():
        return {}
    return dict(stored[1])


def _run_stored(slot: session.Slot[session.Comparison | None], compare: Compare, progress: Progress | None) -> None:
    """Run the current scenario to the end both ways with ``compare`` and store the runs in
    ``slot`` for the set-up they ran (live runs only); a failure is a message."""
    spec = session.run_spec.get()
    if spec is not None and (runs := _compare(compare, progress)) is not None:
        slot.set((spec, runs))


def caching_comparison() -> dict[str, PolicyRun]:
    """The caching on/off runs of the current live set-up (same model, scenario and knobs), if run."""
    return _stored(session.caching_runs)


def run_caching_comparison(progress: Progress | None = None) -> None:
    """Run the current scenario to the end with prefix caching on and off (live runs only)."""
    _run_stored(session.caching_runs, compare_prefix_caching, progress)


def spec_comparison() -> dict[str, PolicyRun]:
    """The with/without-speculation runs of the current live set-up, if run."""
    return _stored(session.spec_runs)


def run_spec_comparison(progress: Progress | None = None) -> None:
    """Run the current scenario to the end with its speculative_config and without (live only)."""
    _run_stored(session.spec_runs, compare_speculation, progress)


def scheduling_comparison() -> dict[str, PolicyRun]:
    """One run per scheduling policy of the current live set-up, if run."""
    return _stored(session.scheduling_runs)


def run_scheduling_comparison(progress: Progress | None = None) -> None:
    """Run the current scenario to the end under every scheduling policy (live runs only)."""
    _run_stored(session.scheduling_runs, compare_scheduling_policies, progress)
