"""The Pipeline page's study: the bubble measured over the number of micro-batches, one fresh
engine per m (kept in the session per model, p and t)."""
from __future__ import annotations

from typing import Callable

from app import session
from app.models import shared_model
from app.scenarios import choose_scenario
from engine.replay.run import SweepPoint

PIPELINE_SCENARIO = "pipeline"


def switch_to_pipeline() -> None:
    """Widget callback: the pipeline scenario (p = 2, GPipe, m = 4) with its knobs; the model stays.

    The button sits in the views fragment, whose own rerun would neither rebuild the run nor
    redraw the sidebar: ``choose_scenario`` asks for a full rerun."""
    choose_scenario(PIPELINE_SCENARIO)


def sweep_points(model: str, p: int, t: int) -> list[SweepPoint] | None:
    """The bubble sweep measured in this session for (model, p, t), if any."""
    return session.sweeps.get().get((model, p, t))


def measure_sweep(model: str, p: int, t: int, progress: Callable[[str, float], None]) -> None:
    """Measure the bubble over m (engine.run.measure_bubble_sweep) and keep it in the session;
    a failure is a message."""
    from engine.replay.run import measure_bubble_sweep

    try:
        points = measure_bubble_sweep(shared_model(model), p, t, progress=progress)
    except (ValueError, RuntimeError, OSError) as e:
        session.error.set(f"bubble sweep failed: {e}")
        return
    session.sweeps.set({**session.sweeps.get(), (model, p, t): points})
