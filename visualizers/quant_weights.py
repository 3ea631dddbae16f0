"""Weight-quantization views (the "Quantization" page): engine.quant_inspect records -> plotly
figures / pandas frames.

* ``histogram_figure``: a matrix's weights before and after (same bins), above one row or
  group zoomed in: its original values, the grid of values the codes can stand for (every
  int8 level, int4's 16, fp8's non-uniform e4m3 levels), and where each value lands;
* ``scales_figure``: the distribution of per-channel (int8, fp8) or per-group (int4) scales;
* ``error_heatmap``: relative Frobenius error per layer and matrix;
* ``inspection_frame``: a one-row summary for an export table.

Pure functions of WeightInspection / ErrorGrid records (no streamlit, no torch).
"""
from __future__ import annotations

from collections import Counter
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from engine.studies.quant_inspect import ErrorGrid, Histogram, WeightInspection
from visualizers.figures import Panel, figure, legend_below, stack
from visualizers.theme import QUANT_COLORS

FRAME_COLUMNS = ["layer", "matrix", "scheme", "weight format", "group size", "shape", "bits", "relative error",
                 "max |err|", "max |err| / bound", "clipped", "scale min", "scale max"]
ERROR_COLORSCALE = "YlOrRd"


def mode_label(mode: str, scheme: str, group_size: int | None) -> str:
    """"int4 g32", "w8a8 (int8 weights)", "fp8"."""
    label = f"{scheme} g{group_size}" if group_size else scheme
    return label if mode == scheme else f"{mode} ({label} weights)"


def _centers(h: Histogram) -> tuple[list[float], list[float]]:
    e = h.edges
    return [(a + b) / 2 for a, b in zip(e, e[1:])], [b - a for a, b in zip(e, e[1:])]


def _bars(h: Histogram, name: str, color: str, what: str) -> dict[str, Any]:
    x, width = _centers(h)
    return dict(type="bar", x=x, y=list(h.counts), width=width, name=name, opacity=0.55,
                marker=dict(color=color, line=dict(width=0)), customdata=[[a, b] for a, b in zip(h.edges, h.edges[1:])],
                hovertemplate=f"{what} in [%{{customdata[0]:.4g}}, %{{customdata[1]:.4g}}]: %{{y:,}}<extra></extra>")


def _title(ins: WeightInspection) -> str:
    e = ins.error
    return (f"{mode_label(ins.mode, ins.scheme, ins.group_size)} · layer {ins.layer} · {ins.matrix} "
            f"[{ins.shape[0]} x {ins.shape[1]}]: relative error {e.relative_frobenius:.2%}, "
            f"max |err| {e.max_abs:.3g}")


def whole_panel(ins: WeightInspection, log_y: bool) -> Panel:
    """Original and dequantized weights of the whole matrix, overlaid on the same bins."""
    data = [_bars(ins.original, "original", QUANT_COLORS["original"], "original weights"),
            _bars(ins.dequantized, "dequantized", QUANT_COLORS["dequantized"], "dequantized weights")]
    return Panel(data, height=260, xaxis=dict(title=dict(text="weight value")),
                 yaxis=dict(title=dict(text="count"), type="log" if log_y else "linear"),
                 title=f"Whole matrix ({ins.shape[0] * ins.shape[1]:,} weights): original vs dequantized"
                       + (", log count" if log_y else ""))


def detail_panel(ins: WeightInspection) -> Panel:
    """The detail row / group: grid levels as thin vertical lines, the original values on top
    (y = 1), the dequantized ones on the levels they land on (y = 0, marker size ~ how many),
    and a thin line from each value to its level."""
    d = ins.detail
    grid_x: list[float | None] = []
    grid_y: list[float | None] = []
    for g in d.grid:
        grid_x += [g, g, None]
        grid_y += [-0.2, 1.2, None]
    move_x: list[float | None] = []
    move_y: list[float | None] = []
    for a, b in zip(d.original, d.dequantized):
        move_x += [a, b, None]
        move_y += [1, 0, None]
    landed = sorted(Counter(d.dequantized).items())
    biggest = max((c for _, c in landed), default=1)
    data: list[dict[str, Any]] = [
        dict(type="scatter", mode="lines", x=grid_x, y=grid_y, name=f"grid levels ({len(d.grid)})",
             line=dict(color=QUANT_COLORS["grid"], width=0.6), hoverinfo="skip"),
        dict(type="scatter", mode="lines", x=move_x, y=move_y, name="rounding", opacity=0.35,
             line=dict(color=QUANT_COLORS["rounding"], width=0.6), hoverinfo="skip", showlegend=False),
        dict(type="scatter", mode="markers", x=list(d.original), y=[1] * len(d.original), name="original values",
             marker=dict(color=QUANT_COLORS["original"], symbol="line-ns-open", size=14, line=dict(width=1.2)),
             hovertemplate="original %{x:.5g}<extra></extra>"),
        dict(type="scatter", mode="markers", x=[v for v, _ in landed], y=[0] * len(landed),
             name="dequantized values", customdata=[c for _, c in landed],
             marker=dict(color=QUANT_COLORS["dequantized"], size=[5 + 13 * (c / biggest) ** 0.5 for _, c in landed]),
             hovertemplate="level %{x:.5g}: %{customdata} values<extra></extra>"),
    ]
    if d.kind == "group":
        what = (f"Group {d.index} (row {d.row}, columns {d.columns[0]}..{d.columns[1] - 1}): scale {d.scale:.3g}, "
                f"zero {d.zero:.3g}")
    else:
        what = f"Row {d.row}: scale {d.scale:.3g}"
    title = (f"{what}; {len(d.grid)} levels, max |err| {d.max_abs_error:.3g}, clipped {d.num_clipped}")
    return Panel(data, height=230, xaxis=dict(title=dict(text="weight value")),
                 yaxis=dict(tickvals=[0, 1], ticktext=["dequantized", "original"], range=[-0.35, 1.35],
                            fixedrange=True), title=title)


def histogram_figure(ins: WeightInspection, font_size: int = 12, log_y: bool = True) -> go.Figure:
    """The whole matrix's histograms over the detail row / group with its grid."""
    layout = dict(title=dict(text=_title(ins), font=dict(size=font_size + 3)), font=dict(size=font_size),
                  plot_bgcolor="white", barmode="overlay", bargap=0, dragmode="zoom",
                  legend=legend_below())
    return stack([whole_panel(ins, log_y), detail_panel(ins)], layout, gap_px=90, margin_px=(80, 90))


def scales_figure(ins: WeightInspection, font_size: int = 12) -> go.Figure:
    """Histogram of the per-channel (int8, fp8) or per-group (int4) scales."""
    per = f"group of {ins.group_size}" if ins.group_size else "output channel"
    x, width = _centers(ins.scales)
    data = [dict(type="bar", x=x, y=list(ins.scales.counts), width=width, name="scales",
                 marker=dict(color=QUANT_COLORS["scales"], line=dict(width=0)),
                 hovertemplate="scale %{x:.4g}: %{y:,}<extra></extra>")]
    lo, hi = ins.scale_range
    title = (f"Scales per {per} ({ins.scales.total:,}): {lo:.3g} to {hi:.3g}<br>"  # two lines: fits half a 1080p screen
             f"{mode_label(ins.mode, ins.scheme, ins.group_size)} · layer {ins.layer} · {ins.matrix}")
    layout = dict(title=dict(text=title, font=dict(size=font_size + 3)), font=dict(size=font_size), height=300,
                  plot_bgcolor="white", bargap=0, margin=dict(l=10, r=10, t=80, b=50),
                  xaxis=dict(title=dict(text=f"scale (weight units per code step{'' if ins.scheme != 'fp8' else ' x e4m3 value'})")),
                  yaxis=dict(title=dict(text="count")))
    return figure(data, layout)


def error_heatmap(grid: ErrorGrid, font_size: int = 12) -> go.Figure:
    """Layers (y, layer 0 on top) x matrices (x); colour = relative Frobenius error, light to dark
    red over the grid's own range (within one scheme the matrices differ by fractions of a percent)."""
    hover = [[f"{v:.3%}" for v in row] for row in grid.relative]
    data = [dict(type="heatmap", z=[list(r) for r in grid.relative], x=list(grid.matrices), y=list(grid.layers),
                 customdata=[[[h, a] for h, a in zip(hr, ar)] for hr, ar in zip(hover, grid.max_abs)],
                 colorscale=ERROR_COLORSCALE, reversescale=True, name="relative error",  # plotly's YlOrRd starts dark
                 colorbar=dict(title=dict(text="relative error"), tickformat=".2%"),
                 hovertemplate="layer %{y} · %{x}<br>relative error %{customdata[0]}"
                               "<br>max |err| %{customdata[1]:.3g}<extra></extra>")]
    table = ""
    if grid.table_error is not None:
        table = f"<br>embedding table ({grid.table_scheme} per row): {grid.table_error:.2%}"  # 2nd line: fits 1440 px
    title = f"Relative error ||W - deq(W)|| / ||W||, {mode_label(grid.mode, grid.scheme, grid.group_size)}{table}"
    layout = dict(title=dict(text=title, font=dict(size=font_size + 3)), font=dict(size=font_size),
                  height=max(260, 16 * len(grid.layers) + 130), margin=dict(l=10, r=10, t=80 if table else 60, b=40),
                  xaxis=dict(title=dict(text="matrix"), side="bottom"),
                  yaxis=dict(title=dict(text="layer"), autorange="reversed", dtick=1 if len(grid.layers) <= 12 else 5))
    return figure(data, layout)


def inspection_frame(ins: WeightInspection) -> pd.DataFrame:
    """One row: what was inspected and how far it moved."""
    return pd.DataFrame([{
        "layer": ins.layer, "matrix": ins.matrix, "scheme": ins.mode, "weight format": ins.scheme,
        "group size": ins.group_size, "shape": f"{ins.shape[0]} x {ins.shape[1]}", "bits": ins.bits,
        "relative error": ins.error.relative_frobenius, "max |err|": ins.error.max_abs,
        "max |err| / bound": ins.error_bound_ratio, "clipped": ins.num_clipped,
        "scale min": ins.scale_range[0], "scale max": ins.scale_range[1],
    }], columns=FRAME_COLUMNS)
