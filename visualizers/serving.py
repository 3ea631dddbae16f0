"""Serving under load: pure views of simulated runs (engine.simulate records -> DataFrame / Figure).

Every number here is read from the records (``RunResult``, ``Summary``, ``Capacity``): the
tables, the CDFs and the curves of one page agree because they come from one run.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.simulate.capacity import Capacity
from engine.simulate.metrics import SLO, Summary
from engine.simulate.result import RunResult

MAX_POINTS = 2000  # a time series is thinned to at most this many points (a browser draws them all)
SLO_COLOR = "#C0392B"
MEETS_COLOR, MISSES_COLOR = "#1E8449", "#C0392B"
POLICY_COLORS = ("#1F77B4", "#FF7F0E", "#2CA02C", "#9467BD", "#8C564B", "#E377C2")


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def latency_frame(s: Summary) -> pd.DataFrame:
    """TTFT, TPOT and end-to-end latency percentiles of one run, in milliseconds (finished requests)."""
    rows = [("TTFT", s.ttft_p50_s, s.ttft_p90_s, s.ttft_p99_s, s.ttft_mean_s),
            ("TPOT", s.tpot_p50_s, s.tpot_p90_s, s.tpot_p99_s, s.tpot_mean_s),
            ("E2E", s.e2e_p50_s, s.e2e_p90_s, None, None)]
    return pd.DataFrame([(m, *(_ms(v) for v in vs)) for m, *vs in rows],
                        columns=["metric", "p50 (ms)", "p90 (ms)", "p99 (ms)", "mean (ms)"])


def policy_frame(summaries: Mapping[str, Summary]) -> pd.DataFrame:
    """One row per scheduling policy: the run's latencies, throughput, goodput and KV figures."""
    rows = []
    for policy, s in summaries.items():
        rows.append({"policy": policy, "finished": f"{s.finished} / {s.num_requests}" + (" (partial)" if s.partial else ""),
                     "p50 TTFT (ms)": _ms(s.ttft_p50_s), "p90 TTFT (ms)": _ms(s.ttft_p90_s),
                     "p50 TPOT (ms)": _ms(s.tpot_p50_s), "p90 TPOT (ms)": _ms(s.tpot_p90_s),
                     "output tok/s": s.output_tokens_per_s, "req/s": s.requests_per_s, "goodput req/s": s.goodput,
                     "SLO attained": s.slo_attainment, "max KV use": s.max_kv_usage, "preemptions": s.preemptions,
                     "prefix hit rate": s.prefix_hit_rate})
    return pd.DataFrame(rows)


def _cdf(values: Sequence[float]) -> tuple[list[float], list[float]]:
    xs = sorted(values)
    n = len(xs)
    return xs, [(i + 1) / n for i in range(n)]


def cdf_figure(runs: Mapping[str, RunResult], slo: SLO, font_size: int = 12) -> go.Figure:
    """Empirical CDFs of TTFT and TPOT (ms), one line per policy, the SLOs as red lines."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("TTFT", "TPOT"), horizontal_spacing=0.1)
    for i, (policy, run) in enumerate(runs.items()):
        color = POLICY_COLORS[i % len(POLICY_COLORS)]
        for col, values in ((1, [t for r in run.requests if (t := r.ttft_s) is not None and r.finished]),
                            (2, [t for r in run.requests if (t := r.tpot_s) is not None])):
            xs, ys = _cdf([v * 1e3 for v in values])
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(color=color, shape="hv"), name=policy,
                                     legendgroup=policy, showlegend=col == 1,
                                     hovertemplate="%{x:,.1f} ms: %{y:.0%} of requests<extra>" + policy + "</extra>"),
                          row=1, col=col)
    for col, target in ((1, slo.ttft_s), (2, slo.tpot_s)):
        if target is not None:
            fig.add_vline(x=target * 1e3, line=dict(color=SLO_COLOR, dash="dash"), row=1, col=col,
                          annotation_text="SLO", annotation_font_color=SLO_COLOR)
    fig.update_xaxes(title_text="milliseconds (predicted)")
    fig.update_yaxes(title_text="share of requests", tickformat=".0%", range=[0, 1.02], row=1, col=1)
    fig.update_yaxes(tickformat=".0%", range=[0, 1.02], row=1, col=2)
    fig.update_layout(title="Latency CDFs (finished requests)", height=360, font=dict(size=font_size),
                      margin=dict(t=70, b=50), template="plotly_white", meta={"figure": "serving_cdf"})
    return fig


def _thin(n: int) -> int:
    return max(1, -(-n // MAX_POINTS))


def timeline_figure(run: RunResult, font_size: int = 12) -> go.Figure:
    """KV use (share of the pool's blocks held by requests), running and waiting requests over the
    run's predicted time, preemptions marked on the queue panel."""
    stride = _thin(len(run.steps))
    steps = run.steps[::stride]
    t = [s.start_s + s.duration_s for s in steps]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("KV cache use", "Requests running and waiting"))
    pool = max(run.kv_pool_blocks, 1)
    fig.add_trace(go.Scatter(x=t, y=[s.kv_blocks_used / pool for s in steps], mode="lines", name="KV use",
                             line=dict(color="#1F77B4"), hovertemplate="%{x:,.2f} s: %{y:.1%}<extra>KV use</extra>"),
                  row=1, col=1)
    fig.add_trace(go.Scatter(x=t, y=[s.running for s in steps], mode="lines", name="running",
                             line=dict(color="#2CA02C", shape="hv")), row=2, col=1)
    fig.add_trace(go.Scatter(x=t, y=[s.waiting for s in steps], mode="lines", name="waiting",
                             line=dict(color="#FF7F0E", shape="hv")), row=2, col=1)
    pre = [s for s in run.steps if s.preempted]
    if pre:
        fig.add_trace(go.Scatter(x=[s.start_s + s.duration_s for s in pre], y=[s.running for s in pre], mode="markers",
                                 name="preemption", marker=dict(color="#C0392B", symbol="x", size=8),
                                 customdata=[s.preempted for s in pre],
                                 hovertemplate="%{x:,.2f} s: %{customdata} preempted<extra></extra>"), row=2, col=1)
    fig.update_yaxes(title_text="of the pool", tickformat=".1%", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="requests", rangemode="tozero", row=2, col=1)
    fig.update_xaxes(title_text="time since the first arrival, s (predicted)", row=2, col=1)
    fig.update_layout(title="KV use and queues over time", height=480, font=dict(size=font_size),
                      margin=dict(t=70, b=50), template="plotly_white", meta={"figure": "serving_timeline"})
    return fig


def capacity_figure(cap: Capacity, font_size: int = 12) -> go.Figure:
    """The rate sweep: p90 TTFT and p90 TPOT (ms) against the request rate, the SLOs as red lines,
    each rate green (met both) or red (missed), the knee (capacity) as a dashed vertical line."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("p90 TTFT", "p90 TPOT"), horizontal_spacing=0.1)
    rates = [p.rate for p in cap.points]
    colors = [MEETS_COLOR if p.meets else MISSES_COLOR for p in cap.points]
    words = ["meets the SLOs" if p.meets else "misses the SLOs" for p in cap.points]
    for col, values, target in ((1, [_ms(p.summary.ttft_p90_s) for p in cap.points], cap.slo.ttft_s),
                                (2, [_ms(p.summary.tpot_p90_s) for p in cap.points], cap.slo.tpot_s)):
        fig.add_trace(go.Scatter(x=rates, y=values, mode="lines+markers", showlegend=False,
                                 line=dict(color="#7F8C8D"), marker=dict(color=colors, size=9), customdata=words,
                                 hovertemplate="%{x:,.3g} req/s: %{y:,.1f} ms, %{customdata}<extra></extra>"),
                      row=1, col=col)
        if target is not None:
            fig.add_hline(y=target * 1e3, line=dict(color=SLO_COLOR, dash="dash"), row=1, col=col,
                          annotation_text="SLO", annotation_font_color=SLO_COLOR)
        if cap.max_rate > 0:
            fig.add_vline(x=cap.max_rate, line=dict(color=MEETS_COLOR, dash="dot"), row=1, col=col,
                          annotation_text=f"knee {cap.max_rate:,.3g} req/s", annotation_font_color=MEETS_COLOR)
    fig.update_xaxes(title_text="request rate, req/s", type="log")
    fig.update_yaxes(title_text="ms (predicted)", type="log", row=1, col=1)
    fig.update_yaxes(type="log", row=1, col=2)
    fig.update_layout(title="Capacity: latency against request rate", height=380, font=dict(size=font_size),
                      margin=dict(t=70, b=50), template="plotly_white", meta={"figure": "serving_capacity"})
    return fig


def capacity_frame(cap: Capacity) -> pd.DataFrame:
    """Every rate tried, in order of rate."""
    return pd.DataFrame([{"rate (req/s)": p.rate, "p90 TTFT (ms)": _ms(p.summary.ttft_p90_s),
                          "p90 TPOT (ms)": _ms(p.summary.tpot_p90_s), "finished": p.summary.finished,
                          "meets the SLOs": "yes" if p.meets else "no"} for p in cap.points])
