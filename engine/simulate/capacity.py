"""Capacity: the highest request rate whose p90 TTFT and p90 TPOT meet the SLOs.

A rate sweep by doubling (or halving) from 1 req/s until the SLO verdict flips, then bisection
between the last rate that met the SLOs and the first that did not, until they are within
``tolerance`` of each other. Every rate serves the same requests: one seed, so the arrival
times scale with 1 / rate and the lengths stay the same (common random numbers keep the verdict
monotone in practice). A run cut short by its time limit counts as missing the SLOs.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine.simulate.metrics import SLO, Summary, summarize
from engine.simulate.result import RunResult
from engine.simulate.workload import Workload

START_RATE = 1.0
MIN_RATE, MAX_RATE = 1e-3, 1e4


@dataclass(frozen=True)
class RatePoint:
    rate: float
    summary: Summary
    meets: bool


@dataclass(frozen=True)
class Capacity:
    max_rate: float  # 0.0: not even MIN_RATE meets the SLOs
    slo: SLO
    points: tuple[RatePoint, ...]  # every rate tried, sorted by rate

    @property
    def knee(self) -> RatePoint | None:
        """The highest rate tried that met the SLOs."""
        ok = [p for p in self.points if p.meets]
        return ok[-1] if ok else None


def meets(summary: Summary, slo: SLO) -> bool:
    if summary.partial or summary.finished < summary.num_requests:
        return False
    ttft, tpot = summary.ttft_p90_s, summary.tpot_p90_s
    return (slo.ttft_s is None or (ttft is not None and ttft <= slo.ttft_s)) and \
        (slo.tpot_s is None or tpot is None or tpot <= slo.tpot_s)


def find_capacity(run: Callable[[Workload], RunResult], workload_at: Callable[[float], Workload], slo: SLO, *,
                  tolerance: float = 0.05, progress: Callable[[str], None] | None = None) -> Capacity:
    """``run`` serves a workload; ``workload_at(rate)`` makes the workload at a rate (module doc)."""
    if slo.ttft_s is None and slo.tpot_s is None:
        raise ValueError("slo_ttft, slo_tpot: capacity needs at least one SLO")
    if not 0 < tolerance < 1:
        raise ValueError(f"tolerance: must be in (0, 1), got {tolerance!r}")
    points: dict[float, RatePoint] = {}

    def probe(rate: float) -> bool:
        summary = summarize(run(workload_at(rate)), slo)
        point = RatePoint(rate, summary, meets(summary, slo))
        points[rate] = point
        if progress is not None:
            progress(f"rate {rate:.3g} req/s: p90 TTFT {_ms(summary.ttft_p90_s)}, p90 TPOT {_ms(summary.tpot_p90_s)}"
                     f" -> {'meets' if point.meets else 'misses'} the SLOs")
        return point.meets

    rate = START_RATE
    if probe(rate):
        lo, hi = rate, None
        while hi is None and lo < MAX_RATE:
            nxt = min(lo * 2, MAX_RATE)
            if probe(nxt):
                lo = nxt
            else:
                hi = nxt
        if hi is None:
            return Capacity(lo, slo, tuple(points[r] for r in sorted(points)))
    else:
        lo_opt, hi = None, rate
        while lo_opt is None and hi > MIN_RATE:
            nxt = max(hi / 2, MIN_RATE)
            if probe(nxt):
                lo_opt = nxt
            else:
                hi = nxt
        if lo_opt is None:
            return Capacity(0.0, slo, tuple(points[r] for r in sorted(points)))
        lo = lo_opt
    while (hi - lo) / hi > tolerance:
        mid = (lo + hi) / 2
        if probe(mid):
            lo = mid
        else:
            hi = mid
    return Capacity(lo, slo, tuple(points[r] for r in sorted(points)))


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:,.0f} ms"
