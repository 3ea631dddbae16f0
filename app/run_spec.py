"""The record a session's run is built from: what the controls ask for (``RunSpec``). Its own
module so that the session (which stores it) and the knobs (which fill it) do not import each other."""
from __future__ import annotations

from dataclasses import dataclass

from engine.core.config import EngineConfig


@dataclass(frozen=True)
class RunSpec:
    """What the controls ask for: the model, the scenario and the engine config of its knobs with
    the controls' on top (``app.scenarios.requested_spec``); a run is rebuilt whenever this changes.
    ``config`` is None when the engine refuses the knobs, and ``problem`` is its message."""

    model: str
    scenario: str
    config: EngineConfig | None
    problem: str = ""

    @property
    def parallel(self) -> bool:
        """The config runs worker processes (p or t above 1)."""
        return self.config is not None and self.config.parallel_config.world_size > 1
