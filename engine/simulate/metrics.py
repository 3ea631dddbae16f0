"""Serving metrics of a run: latency percentiles, throughput, goodput under SLOs, KV use.

    TTFT   first token - arrival          TPOT  (finish - first token) / (output tokens - 1)
    E2E    finish - arrival               (vLLM's benchmark definitions)
    throughput   output tokens / makespan, finished requests / makespan
    goodput      requests per second that met both SLOs (DistServe's definition), and the share
                 of requests that met them (SLO attainment)
Percentiles interpolate linearly between order statistics (numpy's default). Only finished
requests count; a partial run says so.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from engine.simulate.result import RequestRecord, RunResult


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear between order statistics; None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class SLO:
    """Latency targets in seconds (None: no target on that metric)."""

    ttft_s: float | None = None
    tpot_s: float | None = None

    def __post_init__(self) -> None:
        for name, v in (("slo_ttft", self.ttft_s), ("slo_tpot", self.tpot_s)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                                  or v <= 0):
                raise ValueError(f"{name}: must be a number of seconds > 0, got {v!r}")

    def met(self, r: RequestRecord) -> bool:
        if not r.finished:
            return False
        ttft, tpot = r.ttft_s, r.tpot_s
        return (self.ttft_s is None or (ttft is not None and ttft <= self.ttft_s)) and \
            (self.tpot_s is None or tpot is None or tpot <= self.tpot_s)


@dataclass(frozen=True)
class Summary:
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p90_s: float | None
    tpot_p99_s: float | None
    e2e_p50_s: float | None
    e2e_p90_s: float | None
    ttft_mean_s: float | None
    tpot_mean_s: float | None
    output_tokens_per_s: float
    requests_per_s: float
    goodput: float  # requests/s that met the SLOs
    slo_attainment: float  # share of requests that met the SLOs
    finished: int
    num_requests: int
    makespan_s: float
    kv_pool_tokens: int
    max_kv_usage: float  # the most of the pool's blocks requests held at once (0..1)
    preemptions: int
    prefix_hit_rate: float  # prompt tokens served from the cache / prompt tokens looked up
    steps: int
    partial: bool

    def as_dict(self) -> dict[str, float | int | bool | None]:
        return dict(self.__dict__)


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def summarize(run: RunResult, slo: SLO = SLO()) -> Summary:
    done = [r for r in run.requests if r.finished]
    ttft = [t for r in done if (t := r.ttft_s) is not None]
    tpot = [t for r in done if (t := r.tpot_s) is not None]
    e2e = [t for r in done if (t := r.e2e_s) is not None]
    span = run.makespan_s
    good = sum(1 for r in run.requests if slo.met(r))
    looked = sum(s.prefix_lookup_tokens for s in run.steps)
    return Summary(
        ttft_p50_s=percentile(ttft, 50), ttft_p90_s=percentile(ttft, 90), ttft_p99_s=percentile(ttft, 99),
        tpot_p50_s=percentile(tpot, 50), tpot_p90_s=percentile(tpot, 90), tpot_p99_s=percentile(tpot, 99),
        e2e_p50_s=percentile(e2e, 50), e2e_p90_s=percentile(e2e, 90), ttft_mean_s=_mean(ttft), tpot_mean_s=_mean(tpot),
        output_tokens_per_s=sum(r.output_tokens for r in done) / span if span else 0.0,
        requests_per_s=len(done) / span if span else 0.0,
        goodput=good / span if span else 0.0, slo_attainment=good / len(run.requests) if run.requests else 0.0,
        finished=len(done), num_requests=len(run.requests), makespan_s=span, kv_pool_tokens=run.kv_pool_tokens,
        max_kv_usage=max((s.kv_blocks_used for s in run.steps), default=0) / run.kv_pool_blocks if run.kv_pool_blocks else 0.0,
        preemptions=sum(s.preempted for s in run.steps),
        prefix_hit_rate=sum(s.prefix_hit_tokens for s in run.steps) / looked if looked else 0.0,
        steps=len(run.steps), partial=run.partial)
