"""Scheduling policies compared on the same scenario, from one real run per policy
(``engine.replay.run.compare_scheduling_policies``): a summary table and TTFT per policy.

Inputs are ``PolicyRun`` records (every StepTrace of a complete run plus its final Snapshot),
read only. TTFT is in engine steps (first_token_step - arrival_step), so the policies compare
by what the scheduler decided, not by this machine's timing.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import pandas as pd
import plotly.graph_objects as go

from engine.replay.run import PolicyRun
from visualizers.figures import figure, legend_below
from visualizers.theme import REQUEST_COLORS, request_label, request_sort_key


def percentile(values: Sequence[int], q: float) -> float | None:
    """The nearest-rank q-th percentile (q in (0, 100]); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return float(ordered[max(math.ceil(q / 100 * len(ordered)) - 1, 0)])


def ttfts(run: PolicyRun) -> list[int]:
    """TTFT in steps of each request that got a first token."""
    return [m.ttft_steps for m in run.final.metrics if m.ttft_steps is not None]


def finish_order(run: PolicyRun) -> list[str]:
    """Request labels in the order they finished (ties: engine id order)."""
    done = [m for m in run.final.metrics if m.finished_step is not None]
    done.sort(key=lambda m: (m.finished_step or 0, request_sort_key(m.request_id)))
    return [request_label(m.request_id) for m in done]


def prefix_hit_rate(run: PolicyRun) -> float:
    """Prompt tokens served from the prefix cache / prompt tokens (each request once: a
    parallel-sampling sequence shares its parent's prompt)."""
    own = [r for r in run.final.requests if r.parent_id is None]
    total = sum(r.num_prompt_tokens for r in own)
    return sum(r.num_cached_tokens for r in own) / total if total else 0.0


def scheduling_summary(runs: Mapping[str, PolicyRun]) -> pd.DataFrame:
    """One row per scheduling policy: TTFT (mean, p90, in steps), steps, preemptions, prefix
    hit rate, finish order."""
    rows = []
    for policy, run in runs.items():
        t = ttfts(run)
        rows.append({
            "scheduling policy": policy,
            "mean TTFT (steps)": sum(t) / len(t) if t else None,
            "p90 TTFT (steps)": percentile(t, 90),
            "steps": len(run.traces),
            "preemptions": sum(len(s.preempted) for s in run.traces),
            "prefix hit rate": prefix_hit_rate(run),
            "finish order": " ".join(finish_order(run)),
        })
    return pd.DataFrame(rows)


def ttft_figure(runs: Mapping[str, PolicyRun], font_size: int = 12) -> go.Figure:
    """Mean and p90 TTFT (steps) per scheduling policy, side by side."""
    names = list(runs)
    data = []
    for i, (label, q) in enumerate((("mean", None), ("p90", 90.0))):
        values = []
        for name in names:
            t = ttfts(runs[name])
            values.append((sum(t) / len(t) if t else None) if q is None else percentile(t, q))
        data.append(dict(type="bar", x=names, y=values, name=f"{label} TTFT",
                         marker=dict(color=REQUEST_COLORS[i]),
                         hovertemplate=f"%{{x}}: {label} TTFT %{{y:.1f}} steps<extra></extra>"))
    return figure(data, dict(
        barmode="group", height=300, margin=dict(l=10, r=10, t=50, b=40), font=dict(size=font_size),
        title=dict(text="Time to first token per scheduling policy (steps from arrival)",
                   font=dict(size=font_size + 3)),
        xaxis=dict(type="category", fixedrange=True), yaxis=dict(title=dict(text="steps"), fixedrange=True),
        legend=legend_below(), dragmode=False,
    ))
