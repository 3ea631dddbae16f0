"""Units, exact arithmetic and the few number formats every part of the calculator prints.

One byte unit for the whole calculator: ``GiB`` / ``MiB`` (binary, 2**30 / 2**20 bytes), defined
once in ``hardware`` and re-exported here. Byte counts are kept as exact ``Fraction``s until the
end and rounded up once (``ceil_exact``).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

from .hardware import GiB, MiB

__all__ = ["GiB", "MiB", "ceil_exact", "round_up", "search_max", "gib", "fmt_bytes", "margin", "rate", "tokens"]


def ceil_exact(x: Fraction | int | float) -> int:
    """Smallest integer >= x, exact for Fractions (no float rounding on byte counts)."""
    if isinstance(x, Fraction):
        return -((-x.numerator) // x.denominator)
    return int(math.ceil(x))


def round_up(n: int, block: int) -> int:
    """n rounded up to a whole number of blocks: ceil(n / block) x block."""
    return -(-n // block) * block


def search_max(pred: Callable[[int], bool], lo_ok: int, hi: int) -> int:
    """Largest n in [lo_ok, hi] with pred(n), given pred(lo_ok) is True and pred is monotone
    (true up to some n, false after it): bisection, O(log(hi - lo_ok)) calls."""
    if pred(hi):
        return hi
    lo, hi_bad = lo_ok, hi
    while hi_bad - lo > 1:
        mid = (lo + hi_bad) // 2
        if pred(mid):
            lo = mid
        else:
            hi_bad = mid
    return lo


def gib(n: float | int | Fraction) -> str:
    """Bytes as GiB with two decimals: "15.04 GiB"."""
    return f"{float(n) / GiB:,.2f} GiB"


def fmt_bytes(n: float | int | Fraction) -> str:
    """Bytes in the largest binary unit that keeps the number >= 1 (GiB, MiB, KiB, B)."""
    v = float(n)
    if abs(v) >= GiB:
        return f"{v / GiB:,.2f} GiB"
    if abs(v) >= MiB:
        return f"{v / MiB:,.1f} MiB"
    if abs(v) >= 1024:
        return f"{v / 1024:,.1f} KiB"
    return f"{v:,.0f} B"


def margin(over: int) -> str:
    """Bytes over the usable memory (``over`` > 0) or to spare, in words: "over by 1.38 GiB",
    "2.99 GiB to spare"; under 0.01 GiB in MiB / KiB / B, so a hair's breadth never reads as 0.00 GiB."""
    size = gib(abs(over)) if abs(over) >= GiB / 100 else fmt_bytes(abs(over))
    return f"over by {size}" if over > 0 else f"{size} to spare"


def rate(flops: float) -> str:
    """FLOP/s for people: TFLOP/s above 1e12, else GFLOP/s."""
    return f"{flops / 1e12:,.1f} TFLOP/s" if flops >= 1e12 else f"{flops / 1e9:,.1f} GFLOP/s"


def tokens(n: int) -> str:
    """A token count with thousands separators: "4,096"."""
    return f"{n:,}"
