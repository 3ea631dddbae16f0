"""Attention architectures views: ArchitectureRow / LayoutStudy records -> plotly Figures / DataFrames.

Pure functions (no streamlit, no engine mutation). The calculator side: one table and one bar
chart (log scales: KV per sequence spans over two decades, from Mamba's state to Llama-2's MHA). The
live side: the three engines' block pools drawn as squares of the same area (the same bytes), so
a block of the MHA pool is four times the area of an MQA block and one request covers four
times the share of memory; and the sequences running per step.
"""
from __future__ import annotations

import math
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.studies.architectures import ArchitectureRow
from engine.studies.attention_layouts import LayoutRun, LayoutStudy
from engine.sizing.units import GiB
from visualizers.text import escape_plotly
from visualizers.theme import (BLOCK_STATE_COLORS, LAYOUT_COLORS, discrete_colorscale, request_color,
                               request_label, text_color_on)

MiB = 2**20


def row_label(row: ArchitectureRow) -> str:
    return f"{row.kind} · {row.model_name}"


def _bound(tokens_per_s: float, bound: str) -> str:
    return f"{tokens_per_s:,.0f} ({bound})" if bound else "—"


def architecture_table(rows: tuple[ArchitectureRow, ...]) -> pd.DataFrame:
    """One row per architecture: the calculator's numbers at the chosen device and context."""
    return pd.DataFrame([{
        "architecture": row.kind,
        "model": row.model_name,
        "KV/token KiB": round(row.kv_bytes_per_token / 1024, 2),
        "KV/sequence MiB": round(row.kv_bytes_per_sequence / MiB, 2),
        "weights GiB": round(row.weight_bytes / GiB, 2),
        "sequences": row.max_sequences,
        "decode tok/s, 1 seq": _bound(row.decode_tokens_per_s, row.decode_bound) if row.fits else "—",
        "decode tok/s, full": _bound(row.full_decode_tokens_per_s, row.full_decode_bound),
        "GB read per full step": round(row.full_decode_bytes_per_step / 1e9, 2) if row.max_sequences else None,
    } for row in rows])


def architecture_figure(rows: tuple[ArchitectureRow, ...], font_size: int = 14) -> go.Figure:
    """Two horizontal bar panels on log axes: KV (or state) bytes per sequence at the context, and
    the sequences the device holds beside the weights. A model whose weights leave no room says so."""
    labels = [escape_plotly(row_label(r)) for r in rows]
    context = rows[0].context if rows else 0
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.04, subplot_titles=(
        f"KV (or state) per sequence at {context:,} tokens, MiB (log)", "sequences the device holds (log)"))
    colors = [LAYOUT_COLORS.get(r.kind, LAYOUT_COLORS["other"]) for r in rows]
    kv = [r.kv_bytes_per_sequence / MiB for r in rows]
    fig.add_trace(go.Bar(y=labels, x=kv, orientation="h", marker_color=colors, showlegend=False,
                         text=[f"{v:,.1f}" for v in kv], textposition="outside", cliponaxis=False,
                         hovertemplate="%{y}: %{x:,.2f} MiB per sequence<extra></extra>"), row=1, col=1)
    seqs = [r.max_sequences if r.max_sequences else None for r in rows]
    fig.add_trace(go.Bar(y=labels, x=seqs, orientation="h", marker_color=colors, showlegend=False,
                         text=[f"{r.max_sequences:,}" if r.max_sequences else "" for r in rows],
                         textposition="outside", cliponaxis=False,
                         hovertemplate="%{y}: %{x:,} sequences<extra></extra>"), row=1, col=2)
    for label, row in zip(labels, rows):
        if not row.max_sequences:  # a log axis has no zero: say it in words where the bar would be
            fig.add_annotation(x=0, xref="x2 domain", y=label, yref="y2", xanchor="left", showarrow=False,
                               text="does not fit: weights leave no room", font=dict(color="#B2182B"))
    positive = [v for v in kv if v > 0] + [v for v in seqs if v]
    top = math.log10(max(positive)) + 0.6 if positive else 1
    fig.update_xaxes(type="log", row=1, col=1, range=[math.log10(min(v for v in kv if v > 0)) - 0.3, top]
                     if any(v > 0 for v in kv) else None)
    fig.update_xaxes(type="log", row=1, col=2)
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(height=80 + 46 * len(rows), margin=dict(l=10, r=40, t=40, b=10), font=dict(size=font_size),
                      plot_bgcolor="white", dragmode=False, bargap=0.3)
    fig.update_annotations(font_size=font_size)
    return fig


# -- the live part ---------------------------------------------------------------------------------


def grid_shape(n: int) -> tuple[int, int]:
    """(rows, cols) for ``n`` blocks: the most square exact split (16 -> 4 x 4, 32 -> 4 x 8), else
    the square that holds them (a prime count would make one long row)."""
    rows = int(math.isqrt(n))
    while rows > 1 and n % rows:
        rows -= 1
    if rows == 1 and n > 3:
        cols = math.ceil(math.sqrt(n))
        return math.ceil(n / cols), cols
    return rows, n // rows


def _pool_traces(run: LayoutRun, steps_done: int, owners_order: list[str]) -> list[dict[str, Any]]:
    """One pool over the unit square: a heatmap cell per physical block in its owner's colour,
    and the owners' labels as a text layer (black or white, whichever reads on that colour)."""
    state = run.at(steps_done)
    rows, cols = grid_shape(run.num_blocks)
    codes: list[list[float | None]] = [[None] * cols for _ in range(rows)]
    hover: list[list[str]] = [[""] * cols for _ in range(rows)]
    palette = [BLOCK_STATE_COLORS["free"], *(request_color(o) for o in owners_order)]
    block_kib = run.block_size * run.kv_bytes_per_token / 1024
    tx: list[float] = []
    ty: list[float] = []
    labels: list[str] = []
    label_colors: list[str] = []
    for b, (owner, tokens) in enumerate(zip(state.block_owners, state.block_tokens)):
        r, c = divmod(b, cols)
        code = 0 if owner is None else 1 + owners_order.index(owner)
        codes[r][c] = code
        hover[r][c] = (f"block {b} ({block_kib:g} KiB): "
                       + ("free" if owner is None else f"{request_label(owner)}, {tokens}/{run.block_size} tokens"))
        if owner is not None:
            tx.append((c + 0.5) / cols)
            ty.append((r + 0.5) / rows)
            labels.append(request_label(owner))
            label_colors.append(text_color_on(palette[code]))
    heat = dict(type="heatmap", z=codes, x=[(c + 0.5) / cols for c in range(cols)],
                y=[(r + 0.5) / rows for r in range(rows)], zmin=0, zmax=len(palette) - 1,
                colorscale=discrete_colorscale(palette), showscale=False, xgap=2, ygap=2, customdata=hover,
                hovertemplate="%{customdata}<extra>" + run.layout + "</extra>")
    text = dict(type="scatter", x=tx, y=ty, mode="text", text=labels, textfont=dict(color=label_colors),
                hoverinfo="skip", showlegend=False)
    return [heat, text]


def pools_figure(study: LayoutStudy, steps_done: int, font_size: int = 14) -> go.Figure:
    """The three block pools after ``steps_done`` steps, each drawn as the same square: the same
    KV-cache bytes, cut into fewer, larger blocks where a token's KV is larger."""
    owners_order = [str(i) for i in range(study.workload.num_requests)]  # the engine's ids, arrival order
    titles = []
    for run in study.runs:
        s = run.at(steps_done)
        titles.append(f"<b>{run.layout}</b>: {run.num_kv_heads} KV head{'s' if run.num_kv_heads > 1 else ''}, "
                      f"{run.num_blocks} blocks of {run.block_size * run.kv_bytes_per_token / 1024:g} KiB"
                      f"<br>{s.blocks_used}/{s.num_blocks} used · {s.running} running · {s.waiting} waiting")
    fig = make_subplots(rows=1, cols=len(study.runs), subplot_titles=titles, horizontal_spacing=0.05)
    for i, run in enumerate(study.runs, start=1):
        heat, text = _pool_traces(run, steps_done, owners_order)
        fig.add_trace(go.Heatmap(**{k: v for k, v in heat.items() if k != "type"}), row=1, col=i)
        fig.add_trace(go.Scatter(**{k: v for k, v in text.items() if k != "type"}), row=1, col=i)
        fig.update_xaxes(range=[0, 1], visible=False, fixedrange=True, row=1, col=i)
        fig.update_yaxes(range=[1, 0], visible=False, fixedrange=True, row=1, col=i,
                         scaleanchor="x" if i == 1 else f"x{i}", scaleratio=1)
    fig.update_layout(height=420, margin=dict(l=10, r=10, t=80, b=10), font=dict(size=font_size),
                      plot_bgcolor="white", dragmode=False, meta={"step": steps_done})
    fig.update_annotations(font_size=font_size)
    return fig


def running_figure(study: LayoutStudy, steps_done: int, font_size: int = 14) -> go.Figure:
    """Sequences running (admitted, holding KV) after each step, one line per layout, with a rule
    at the step the pools show."""
    fig = go.Figure()
    for run in study.runs:
        fig.add_trace(go.Scatter(x=[s.steps_done for s in run.steps], y=[s.running for s in run.steps],
                                 mode="lines", line=dict(shape="hv", width=3, color=LAYOUT_COLORS[run.layout]),
                                 name=f"{run.layout} ({run.num_blocks} blocks)",
                                 hovertemplate=f"{run.layout}: %{{y}} running after step %{{x}}<extra></extra>"))
    fig.add_vline(x=steps_done, line=dict(color="#333333", dash="dash", width=2))
    fig.update_layout(height=300, margin=dict(l=10, r=10, t=40, b=10), font=dict(size=font_size),
                      plot_bgcolor="white", dragmode=False, meta={"step": steps_done},
                      title=dict(text="Sequences running after each step", font=dict(size=font_size + 2)),
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, x=1, xanchor="right"),
                      xaxis=dict(title=dict(text="steps done"), range=[0, max(study.num_steps, 1)], gridcolor="#EEE"),
                      yaxis=dict(title=dict(text="running"), rangemode="tozero", dtick=1, gridcolor="#EEE"))
    return fig


def step_frame(study: LayoutStudy, steps_done: int) -> pd.DataFrame:
    """Per layout after ``steps_done`` steps: the pool, the queues, the preemptions."""
    out = []
    for run in study.runs:
        s = run.at(steps_done)
        out.append({
            "layout": run.layout,
            "KV heads": run.num_kv_heads,
            "KV B/token": run.kv_bytes_per_token,
            "blocks used": f"{s.blocks_used}/{s.num_blocks}",
            "running": s.running,
            "waiting": s.waiting,
            "finished": s.finished,
            "preempted this step": ", ".join(request_label(r) for r in s.preempted_now) or "—",
            "preemptions so far": s.preemptions,
            "done at step": run.num_steps,
        })
    return pd.DataFrame(out)
