"""The simulated run's clock: seconds that advance by each step's predicted duration."""
from __future__ import annotations

import math


class VirtualClock:
    """A monotonic clock that moves only when told (``advance``, ``jump_to``); call it for the time."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if not (seconds >= 0 and math.isfinite(seconds)):
            raise ValueError(f"a step's duration must be finite and >= 0, got {seconds!r}")
        self.now += seconds

    def jump_to(self, t: float) -> None:
        """Skip an idle gap (never backwards)."""
        self.now = max(self.now, float(t))
