"""A run's clocks: seconds since the run began, and how to wait for the next arrival.

    VirtualClock  a simulated run: moves only when a step advances it or an idle gap is skipped
    WallClock     a real run: perf_counter seconds since it was made; waiting is sleeping
"""
from __future__ import annotations

import math
import time
from typing import Protocol


class RunClock(Protocol):
    def __call__(self) -> float:
        """Seconds since the run began."""
        ...

    def wait_until(self, t: float) -> None:
        """Let time pass until ``t`` (nothing to do meanwhile)."""
        ...


class VirtualClock:
    """A monotonic clock that moves only when told (``advance``, ``wait_until``)."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if not (seconds >= 0 and math.isfinite(seconds)):
            raise ValueError(f"a step's duration must be finite and >= 0, got {seconds!r}")
        self.now += seconds

    def wait_until(self, t: float) -> None:
        """Skip an idle gap (never backwards)."""
        self.now = max(self.now, float(t))


class WallClock:
    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    def __call__(self) -> float:
        return time.perf_counter() - self.t0

    def wait_until(self, t: float) -> None:
        delay = t - self()
        if delay > 0:
            time.sleep(delay)
