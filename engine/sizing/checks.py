"""Input checks shared by every resolver (one-line ``SizingError``s), and the notes/warnings
collector that resolution fills in.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .formats import SizingError


@dataclass
class Remarks:
    """What resolution has to say besides numbers: ``warnings`` (the answer may be wrong for you)
    and ``notes`` (how it was computed). Order is kept; duplicates are dropped when read."""

    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def warn(self, text: str) -> None:
        self.warnings.append(text)

    def note(self, text: str) -> None:
        self.notes.append(text)


def whole_number(name: str, value: object, minimum: int = 1, maximum: int | None = None) -> int:
    """``value`` as an int in [minimum, maximum]; bools, NaN, inf and fractions are refused.
    The maximum is named in the message ("<= 16,777,216") so the limit is documented where it bites."""
    if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, float) and value.is_integer())):
        raise SizingError(f"{name} must be a whole number, got {value!r}")
    n = int(value)
    if n < minimum:
        raise SizingError(f"{name} must be >= {minimum:,}, got {n:,}")
    if maximum is not None and n > maximum:
        raise SizingError(f"{name} must be <= {maximum:,}, got {n:,}")
    return n


def fraction_in(name: str, value: object, low: float = 0.0, high: float = 1.0) -> float:
    """``value`` as a finite float in (low, high]."""
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or not low < value <= high):
        raise SizingError(f"{name} must be in ({low:g}, {high:g}], got {value!r}")
    return float(value)
