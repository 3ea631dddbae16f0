"""Activation views of the Quantization page: why activations are harder to quantize than weights.

* ``absmax_heatmap``: per input channel absmax of one linear's input, every layer (layers on y,
  channels on x, log colour): the few outlier channels LLM.int8() is about stand out as lines.
* ``activation_histogram``: one layer's input values with the outlier threshold marked.
* ``float_columns_figure`` / ``float_columns_frame``: what LLM.int8() keeps in floating point:
  per layer and linear, the input channels above the threshold (the engine's w8a8 keeps
  exactly those columns in float for a batch holding these tokens).
* ``smoothing_figure`` / ``smoothing_frame``: SmoothQuant's move of range from activations into
  weights, per channel (before / after), and its spread (max / median) per layer.

Pure functions of engine.activations.ActivationStats and engine.smoothing.Smoothing records.
"""
from __future__ import annotations

import math
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import torch

from engine.model.activations import DEFAULT_THRESHOLD, LINEARS, ActivationHistogram, ActivationStats
from engine.model.smoothing import Smoothing
from visualizers.figures import Panel, figure, legend_below, live_layout, stack

LINEAR_LABELS = {"qkv": "qkv (input: RMSNorm(h))", "o": "o (input: attention output)",
                 "gate_up": "gate/up (input: RMSNorm(h))", "down": "down (input: silu(gate)·up)"}
THRESHOLD_COLOR = "#EE6677"
INLIER_COLOR = "#4477AA"
BEFORE_COLOR = "#BBBBBB"
AFTER_COLOR = "#228833"
WEIGHT_COLOR = "#EE7733"


def _sig(x: float) -> float:
    """Three significant digits: the figures' JSON stays small."""
    return float(f"{x:.3g}")


def _sig_rows(rows: tuple[tuple[float, ...], ...], log: bool = False) -> list[list[float]]:
    """``_sig`` of every value (of log10 of it, floored at 1e-6, with ``log``), vectorised: the
    heatmap has 30 x 1,536 cells for down."""
    t = torch.tensor(rows, dtype=torch.float64)  # [L, K]
    if log:
        t = t.clamp(min=1e-6).log10()
    scale = 10.0 ** (2 - t.abs().clamp(min=1e-12).log10().floor())  # [L, K]
    return (torch.round(t * scale) / scale).tolist()


def absmax_heatmap(stats: ActivationStats, linear: str, font_size: int = 12, step: int | None = None) -> go.Figure:
    """z[layer][channel] = log10 max_t |x[t, channel]| of ``linear``'s input; hover shows the value.
    The colour bar's tick at log10(threshold) marks where LLM.int8() starts keeping a column in float."""
    rows = stats.absmax_of(linear)  # [L][K]
    z = _sig_rows(rows, log=True)
    custom = _sig_rows(rows)
    top = max((max(r) for r in rows), default=1.0)
    ticks = [v for v in (0.01, 0.1, 1, 10, 100, 1000) if v <= max(top, stats.threshold) * 10]
    trace: dict[str, Any] = dict(
        type="heatmap", z=z, customdata=custom, colorscale="Viridis", zmin=math.log10(0.01),
        colorbar=dict(title=dict(text="absmax"), tickvals=[math.log10(v) for v in ticks] + [math.log10(stats.threshold)],
                      ticktext=[f"{v:g}" for v in ticks] + [f"threshold {stats.threshold:g}"]),
        hovertemplate="layer %{y}, channel %{x}<br>max |x| = %{customdata}<extra></extra>")
    n_out = sum(1 for o in stats.outliers if o.linear == linear)
    title = (f"Input absmax per channel, {LINEAR_LABELS.get(linear, linear)} — {n_out} (layer, channel) "
             f"pairs above {stats.threshold:g}")
    layout = live_layout(title, step, font_size, height=360 + 4 * len(rows), margin=dict(l=60, r=20, t=60, b=50),
                         xaxis=dict(title=dict(text="input channel")),
                         yaxis=dict(title=dict(text="layer"), autorange="reversed"))
    return figure([trace], layout)


def activation_histogram(hist: ActivationHistogram, threshold: float, font_size: int = 12,
                         step: int | None = None) -> go.Figure:
    """Counts of one layer's input values (log y), with ±threshold: LLM.int8() sends every column
    holding a value beyond the red lines to the floating-point GEMM."""
    centers = [(a + b) / 2 for a, b in zip(hist.edges[:-1], hist.edges[1:])]
    widths = [b - a for a, b in zip(hist.edges[:-1], hist.edges[1:])]
    colors = [THRESHOLD_COLOR if abs(c) > threshold else INLIER_COLOR for c in centers]
    beyond = sum(n for c, n in zip(centers, hist.counts) if abs(c) > threshold)
    bars = dict(type="bar", x=centers, y=hist.counts, width=widths, marker=dict(color=colors),
                customdata=[[a, b] for a, b in zip(hist.edges[:-1], hist.edges[1:])],
                hovertemplate="[%{customdata[0]:.3g}, %{customdata[1]:.3g}): %{y:,} values<extra></extra>",
                name="values")
    shapes = [dict(type="line", x0=s * threshold, x1=s * threshold, y0=0, y1=1, yref="paper",
                   line=dict(color=THRESHOLD_COLOR, dash="dash", width=2)) for s in (-1, 1)]
    title = f"Layer {hist.layer} {hist.linear} input: {beyond:,} of {hist.num_values:,} values in bins beyond ±{threshold:g}"
    layout = live_layout(title, step, font_size, height=340, shapes=shapes, bargap=0, showlegend=False,
                         margin=dict(l=60, r=20, t=60, b=50),
                         xaxis=dict(title=dict(text="activation value")),
                         yaxis=dict(title=dict(text="count"), type="log"))
    return figure([bars], layout)


def float_columns_frame(stats: ActivationStats) -> pd.DataFrame:
    """Per layer and linear: input channels, how many exceed the threshold (kept in float by
    LLM.int8() for a batch of these tokens), their share, and the largest absmax."""
    rows = []
    for entry in stats.absmax:
        for layer, row in enumerate(entry.absmax):
            n = sum(1 for v in row if v > stats.threshold)
            rows.append({"layer": layer, "linear": entry.linear, "channels": len(row), "kept in float": n,
                         "share in float": n / len(row) if row else 0.0, "max |x|": max(row, default=0.0)})
    return pd.DataFrame(rows, columns=["layer", "linear", "channels", "kept in float", "share in float", "max |x|"])


def float_columns_figure(stats: ActivationStats, font_size: int = 12, step: int | None = None) -> go.Figure:
    """Grouped bars: per layer, the input channels each linear keeps in floating point."""
    frame = float_columns_frame(stats)
    colors = {"qkv": "#4477AA", "o": "#CCBB44", "gate_up": "#228833", "down": "#EE7733"}
    data = []
    for linear in LINEARS:
        part = frame[frame["linear"] == linear]
        data.append(dict(type="bar", name=linear, x=part["layer"].tolist(), y=part["kept in float"].tolist(),
                         marker=dict(color=colors[linear]),
                         customdata=[[c, f"{s:.1%}"] for c, s in zip(part["channels"], part["share in float"])],
                         hovertemplate=(f"{linear}, layer %{{x}}: %{{y}} of %{{customdata[0]}} channels in float "
                                        "(%{customdata[1]})<extra></extra>")))
    total = int(frame["kept in float"].sum())
    channels = int(frame["channels"].sum())
    title = (f"What LLM.int8() keeps in float: {total:,} of {channels:,} input channels "
             f"({total / max(channels, 1):.2%}) have |x| > {stats.threshold:g}")
    layout = live_layout(title, step, font_size, height=340, barmode="group",
                         margin=dict(l=60, r=20, t=60, b=50), legend=legend_below(),
                         xaxis=dict(title=dict(text="layer")),
                         yaxis=dict(title=dict(text="channels kept in float")))
    return figure(data, layout)


def smoothing_frame(smoothing: Smoothing, threshold: float = DEFAULT_THRESHOLD) -> pd.DataFrame:
    """Per smoothed linear: max / median of the channel absmax of activations and of weights,
    before and after the fold (1.0 = every channel alike, which int8 likes best), and the
    activation channels above ``threshold`` (the columns w8a8 keeps in float) before and after."""
    rows = []
    for s in smoothing.linears:
        a0, a1 = s.act_spread()
        w0, w1 = s.weight_spread()
        rows.append({"layer": s.layer, "linear": s.linear, "folded into": s.folded_into,
                     "act max/median before": a0, "act max/median after": a1,
                     "weight max/median before": w0, "weight max/median after": w1,
                     "channels above threshold before": sum(1 for v in s.act_absmax_before if v > threshold),
                     "channels above threshold after": sum(1 for v in s.act_absmax_after if v > threshold)})
    return pd.DataFrame(rows)


def widest_layer(smoothing: Smoothing, linear: str) -> int:
    """The layer whose ``linear`` input channels had the largest max / median absmax before
    smoothing (where SmoothQuant has the most to move)."""
    entries = [e for e in smoothing.linears if e.linear == linear]
    return max(entries, key=lambda e: e.act_spread()[0]).layer if entries else 0


def smoothing_figure(smoothing: Smoothing, layer: int, linear: str, font_size: int = 12) -> go.Figure:
    """One smoothed linear, per input channel (log y), two panels on one channel axis: the
    activation absmax before (grey) and after (green) dividing by s, and the weight's column
    absmax before and after multiplying by s (orange). At α = 0.5 the two "after" curves are the
    same numbers: s = sqrt(max|X| / max|W|) gives max|X| / s = max|W| · s = sqrt(max|X| · max|W|)."""
    s = smoothing.of(layer, linear)
    k = list(range(len(s.scales)))
    a0, a1 = s.act_spread()
    w0, w1 = s.weight_spread()

    def line(name: str, y: tuple[float, ...], color: str) -> dict[str, Any]:
        return dict(type="scatter", mode="lines", name=name, x=k, y=[_sig(v) for v in y],
                    line=dict(color=color, width=1),
                    hovertemplate=f"{name}<br>channel %{{x}}: %{{y}}<extra></extra>")

    axis = dict(title=dict(text="absmax"), type="log")
    panels = [
        Panel([line("activation absmax, before", s.act_absmax_before, BEFORE_COLOR),
               line("activation absmax, after (÷ s)", s.act_absmax_after, AFTER_COLOR)], 200,
              xaxis=dict(), yaxis=axis, title=f"activations (input channels): max/median {a0:.1f}× → {a1:.1f}×"),
        Panel([line("weight column absmax, before", s.weight_absmax_before, BEFORE_COLOR),
               line("weight column absmax, after (× s)", s.weight_absmax_after, WEIGHT_COLOR)], 200,
              xaxis=dict(title=dict(text="input channel")), yaxis=axis,
              title=f"weights (columns): max/median {w0:.1f}× → {w1:.1f}×"),
    ]
    title = f"SmoothQuant α = {smoothing.strength:g}, layer {layer} {linear} (folded into {s.folded_into})"
    layout = live_layout(title, None, font_size, legend=legend_below(),
                         margin=dict(l=60, r=20, t=80, b=60))
    return stack(panels, layout, shared_x=True, margin_px=(80, 60))
