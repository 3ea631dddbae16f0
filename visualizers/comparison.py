"""Static against continuous batching on the same scenario, from two real runs.

Inputs are ``PolicyRun`` records (every StepTrace of a complete run plus its final Snapshot);
outputs are a summary table, side-by-side swim lanes and per-request latency bars.
"""
from __future__ import annotations

from typing import Mapping

import pandas as pd
import plotly.graph_objects as go

from engine.replay.run import PolicyRun
from visualizers.batching import lane_heatmap, lanes, request_chips, state_legend
from visualizers.figures import figure, legend_below
from visualizers.theme import POLICY_COLORS, plot_label, request_sort_key


def idle_slots(run: PolicyRun, max_num_seqs: int) -> tuple[int, int]:
    """(idle slot-steps, idle slot-steps while some request waited).

    A slot is one of ``max_num_seqs`` sequences a step could compute; it is idle when no
    request was scheduled in it. Idle while requests wait is the waste a policy causes:
    static batching keeps slots empty until its whole batch finishes.
    """
    lane = lanes(run.traces, [r.request_id for r in run.final.requests])
    waiting = [w + p for w, p in zip(lane.count("waiting"), lane.count("preempted"))]
    idle = idle_waiting = 0
    for t, w in zip(run.traces, waiting):
        free = max(max_num_seqs - len(t.scheduled), 0)
        idle += free
        idle_waiting += min(free, w)
    return idle, idle_waiting


def policy_summary(runs: Mapping[str, PolicyRun], max_num_seqs: int) -> pd.DataFrame:
    """One row per policy: steps, throughput, idle slots, latency."""
    rows = []
    for policy, run in runs.items():
        out_tokens = sum(m.num_output_tokens for m in run.final.metrics)
        ms = sum(t.total_ms for t in run.traces)
        latencies = [m.finished_step - m.arrival_step + 1 for m in run.final.metrics if m.finished_step is not None]
        ttfts = [m.ttft_steps for m in run.final.metrics if m.ttft_steps is not None]
        e2e = [m.e2e_ms for m in run.final.metrics if m.e2e_ms is not None]
        idle, idle_waiting = idle_slots(run, max_num_seqs)
        steps = len(run.traces)
        rows.append({
            "policy": policy, "steps": steps, "output tokens": out_tokens,
            "tokens / step": out_tokens / steps if steps else 0.0,
            "tokens / s (measured)": out_tokens / (ms / 1e3) if ms > 0 else None,
            "idle slots": idle, "idle slots while requests waited": idle_waiting,
            "mean TTFT (steps)": sum(ttfts) / len(ttfts) if ttfts else None,
            "mean latency (steps)": sum(latencies) / len(latencies) if latencies else None,
            "max latency (steps)": max(latencies) if latencies else None,
            "mean E2E (ms)": sum(e2e) / len(e2e) if e2e else None,
        })
    return pd.DataFrame(rows)


def lanes_side_by_side(runs: Mapping[str, PolicyRun], font_size: int = 12) -> go.Figure:
    """One swim lane per policy, same requests, same colours, side by side."""
    names = list(runs)
    n = max(len(names), 1)
    gap = 0.04
    width = (1.0 - gap * (n - 1)) / n
    data, layout_axes, titles = [], {}, []
    n_requests = 0
    for i, p in enumerate(names):
        suffix = "" if i == 0 else str(i + 1)
        lane = lanes(runs[p].traces, [r.request_id for r in runs[p].final.requests])
        n_requests = max(n_requests, len(lane.request_ids))
        x, y = "x" + suffix, "y" + suffix
        data.append(lane_heatmap(lane, xaxis=x, yaxis=y))
        data.extend(request_chips(lane, xaxis=x, yaxis=y))
        lo = i * (width + gap)
        layout_axes["xaxis" + suffix] = dict(domain=[lo, lo + width], anchor=y, title=dict(text="engine step"),
                                             fixedrange=True)
        layout_axes["yaxis" + suffix] = dict(anchor=x, autorange="reversed", type="category", fixedrange=True,
                                             showticklabels=i == 0, **({} if i == 0 else {"matches": "y"}))
        titles.append(dict(text=f"<b>{p}</b>: {len(runs[p].traces)} steps", x=lo + width / 2, y=1.0,
                           xref="paper", yref="paper", showarrow=False, xanchor="center", yanchor="bottom"))
    data.extend(state_legend())
    return figure(data, dict(
        height=max(260, 22 * n_requests + 150), margin=dict(l=10, r=10, t=80, b=40), font=dict(size=font_size),
        plot_bgcolor="white", legend=legend_below(), annotations=titles, dragmode=False,
        title=dict(text="Static vs continuous batching: swim lanes", font=dict(size=font_size + 3)),
        **layout_axes,
    ))


def latency_comparison_figure(runs: Mapping[str, PolicyRun], font_size: int = 12) -> go.Figure:
    """Latency in steps (arrival to last token) per request, one bar series per policy."""
    data = []
    for p, run in runs.items():
        # (request id, latency in steps) of the finished requests
        done = sorted(((m.request_id, m.finished_step - m.arrival_step + 1) for m in run.final.metrics
                       if m.finished_step is not None), key=lambda d: request_sort_key(d[0]))
        data.append(dict(type="bar", x=[plot_label(rid) for rid, _ in done],
                         y=[steps for _, steps in done], name=p,
                         marker=dict(color=POLICY_COLORS.get(p, "#888888")),
                         hovertemplate=f"{p} %{{x}}: %{{y}} steps<extra></extra>"))
    return figure(data, dict(
        barmode="group", height=300, margin=dict(l=10, r=10, t=50, b=40), font=dict(size=font_size),
        title=dict(text="Latency per request (steps from arrival to last token)", font=dict(size=font_size + 3)),
        xaxis=dict(type="category", fixedrange=True), yaxis=dict(title=dict(text="steps"), fixedrange=True),
        dragmode=False,
    ))
