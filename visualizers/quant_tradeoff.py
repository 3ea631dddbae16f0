"""The quantization trade-off views: engine.quant_tradeoff records -> pandas frames / plotly figures.

* ``tradeoff_frame`` / ``tradeoff_figure``: one row / one bar group per weight scheme (fp32, bf16,
  int8, int4, fp8, w8a8): bytes read per decode step, measured batch-1 decode against its
  bandwidth bound and the calculator's prediction, perplexity vs fp32, greedy agreement;
* ``kv_frame`` / ``kv_figure``: one row / bar per KV-cache dtype: bytes per token, tokens the same
  pool bytes hold, and the error the dtype adds (K/V round trip, logits, greedy agreement).

Pure functions of TradeoffResult / KVTradeoffRow records (no streamlit, no engine mutation).
"""
from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.studies.quant_tradeoff import KVTradeoffRow, TradeoffResult
from visualizers.figures import legend_below
from visualizers.text import escape_plotly
from visualizers.theme import QUANT_COLORS

TRADEOFF_COLUMNS = ["scheme", "weight MB", "KV B/token", "batch-1 tok/s", "bound tok/s", "share of bound",
                    "calculator tok/s", "ppl", "ppl vs fp32", "greedy agreement", "load s"]
KV_COLUMNS = ["KV dtype", "KV B/token", "tokens in pool", "capacity vs fp32", "K error %", "V error %",
              "K max abs error", "V max abs error", "max logit diff", "greedy agreement"]


def tradeoff_frame(result: TradeoffResult) -> pd.DataFrame:
    """One row per scheme; "calculator tok/s" is missing (None) where the calculator has no format;
    "greedy agreement" reads "a of n" (mean tokens equal to fp32's until the first divergence)."""
    rows = [{
        "scheme": r.label,
        "weight MB": r.weight_bytes / 1e6,
        "KV B/token": r.kv_bytes_per_token,
        "batch-1 tok/s": r.batch1_tok_s,
        "bound tok/s": r.bound_tok_s,
        "share of bound": r.share_of_bound,
        "calculator tok/s": r.calculator_expected_tok_s,
        "ppl": r.ppl,
        "ppl vs fp32": r.ppl_ratio,
        "greedy agreement": f"{r.agreement:.1f} of {r.agreement_of}",
        "load s": r.load_s,
    } for r in result.rows]
    return pd.DataFrame(rows, columns=TRADEOFF_COLUMNS)


def _ratio_text(x: float) -> str:
    return f"{x:.3f}x"


def tradeoff_figure(result: TradeoffResult, font_size: int = 12) -> go.Figure:
    """Top: measured batch-1 decode tok/s per scheme (bars, log axis), the calculator's expected
    tok/s and the bandwidth bound as markers on the same bars. Bottom: perplexity / fp32's
    perplexity per scheme (bars, a line at 1), the greedy agreement in the hover."""
    labels = [escape_plotly(r.label) for r in result.rows]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08, row_heights=[0.62, 0.38])
    fig.add_trace(go.Bar(
        x=labels, y=[r.batch1_tok_s for r in result.rows], name="measured batch-1 decode",
        marker_color=QUANT_COLORS["measured"], text=[f"{r.batch1_tok_s:.1f}" for r in result.rows],
        textposition="outside",
        customdata=[[r.weight_bytes / 1e6, r.share_of_bound, r.decode_steps] for r in result.rows],
        hovertemplate="%{x}: %{y:.1f} tok/s (median of %{customdata[2]} steps)<br>"
                      "%{customdata[0]:.1f} MB read per step, %{customdata[1]:.0%} of its bound<extra></extra>",
    ), row=1, col=1)
    calc = [(escape_plotly(r.label), r.calculator_expected_tok_s) for r in result.rows
            if r.calculator_expected_tok_s is not None]
    if calc:
        fig.add_trace(go.Scatter(
            x=[c[0] for c in calc], y=[c[1] for c in calc], mode="markers", name="calculator (expected)",
            marker=dict(symbol="diamond", size=11, color=QUANT_COLORS["calculator"], line=dict(width=1, color="white")),
            hovertemplate="%{x}: the calculator expects %{y:.1f} tok/s<extra></extra>",
        ), row=1, col=1)
    fig.add_trace(go.Scatter(
        x=labels, y=[r.bound_tok_s for r in result.rows], mode="markers", name="bandwidth bound",
        marker=dict(symbol="line-ew", size=26, color=QUANT_COLORS["bound"], line=dict(width=3,
                                                                                       color=QUANT_COLORS["bound"])),
        hovertemplate=f"%{{x}}: bound %{{y:.1f}} tok/s ({result.read_bandwidth_gbs:.1f} GB/s read bandwidth / "
                      "weight bytes)<extra></extra>",
    ), row=1, col=1)
    fig.add_trace(go.Bar(
        x=labels, y=[r.ppl_ratio for r in result.rows], name="perplexity vs fp32", marker_color=QUANT_COLORS["ppl"],
        text=[_ratio_text(r.ppl_ratio) for r in result.rows], textposition="outside",
        customdata=[[r.ppl, r.agreement, r.agreement_of] for r in result.rows],
        hovertemplate="%{x}: perplexity %{customdata[0]:.3f} = %{y:.4f}x fp32's<br>greedy: %{customdata[1]:.1f} of "
                      "%{customdata[2]} tokens equal to fp32's before the first divergence<extra></extra>",
    ), row=2, col=1)
    fig.add_hline(y=1.0, line=dict(color="#888888", dash="dot", width=1), row=2, col=1)
    top = max(r.ppl_ratio for r in result.rows)
    low = min(r.ppl_ratio for r in result.rows)
    fig.update_yaxes(type="log", title_text="decode tok/s (batch 1)", fixedrange=True, row=1, col=1)
    fig.update_yaxes(title_text="ppl / fp32 ppl", fixedrange=True, row=2, col=1,
                     range=[min(0.98, low - 0.01), max(1.02, top + (top - 1) * 0.25 + 0.01)])
    fig.update_xaxes(fixedrange=True)
    fig.update_layout(
        height=520, barmode="overlay", margin=dict(l=80, r=10, t=70, b=40), font=dict(size=font_size),
        plot_bgcolor="white", dragmode=False, legend=dict(orientation="h", y=1.02, x=0, yanchor="bottom"),
        title=dict(text=f"{escape_plotly(result.model)}: speed and quality per weight scheme (this machine)",
                   font=dict(size=font_size + 3)),
    )
    return fig


def kv_frame(rows: Sequence[KVTradeoffRow]) -> pd.DataFrame:
    """One row per KV dtype; errors are against the float32 cache on the same prompt."""
    out = [{
        "KV dtype": r.kv_cache_dtype,
        "KV B/token": r.bytes_per_token,
        "tokens in pool": r.tokens,
        "capacity vs fp32": r.capacity_ratio,
        "K error %": 100 * r.k_rel_error,
        "V error %": 100 * r.v_rel_error,
        "K max abs error": r.k_max_abs_error,
        "V max abs error": r.v_max_abs_error,
        "max logit diff": r.max_logit_diff,
        "greedy agreement": f"{r.agreement} of {r.agreement_of}",
    } for r in rows]
    return pd.DataFrame(out, columns=KV_COLUMNS)


def kv_figure(rows: Sequence[KVTradeoffRow], font_size: int = 12) -> go.Figure:
    """Left: tokens the same pool bytes hold per KV dtype (bars, the ratio to float32 as text).
    Right: the relative error of K and V round-tripped through the dtype (grouped bars), with the
    max logit difference and greedy agreement in the hover."""
    labels = [escape_plotly(r.kv_cache_dtype) for r in rows]
    pool_mb = rows[0].pool_bytes / 1e6 if rows else 0.0
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=(f"tokens a {pool_mb:.1f} MB pool holds", "error it adds (vs float32 cache)"))
    fig.add_trace(go.Bar(
        x=labels, y=[r.tokens for r in rows], name="tokens in pool", marker_color=QUANT_COLORS["capacity"],
        text=[f"{r.capacity_ratio:.2f}x" for r in rows], textposition="outside",
        customdata=[[r.bytes_per_token] for r in rows],
        hovertemplate="%{x}: %{y:,} tokens at %{customdata[0]} B/token<extra></extra>",
    ), row=1, col=1)
    for side, key in (("K", "k error"), ("V", "v error")):
        fig.add_trace(go.Bar(
            x=labels, y=[100 * (r.k_rel_error if side == "K" else r.v_rel_error) for r in rows],
            name=f"{side} relative error", marker_color=QUANT_COLORS[key],
            customdata=[[r.max_logit_diff, r.agreement, r.agreement_of,
                         r.k_max_abs_error if side == "K" else r.v_max_abs_error] for r in rows],
            hovertemplate=f"%{{x}}: {side} off by %{{y:.3f}}% (Frobenius), at most %{{customdata[3]:.4f}}<br>"
                          "logits at most %{customdata[0]:.4f} off; greedy %{customdata[1]} of %{customdata[2]} "
                          "tokens equal<extra></extra>",
        ), row=1, col=2)
    fig.update_yaxes(title_text="tokens", fixedrange=True, row=1, col=1)
    fig.update_yaxes(title_text="relative error (%)", fixedrange=True, rangemode="tozero", row=1, col=2)
    fig.update_xaxes(fixedrange=True)
    fig.update_layout(
        height=360, barmode="group", margin=dict(l=70, r=10, t=80, b=40), font=dict(size=font_size),
        plot_bgcolor="white", dragmode=False, legend=legend_below(),
        title=dict(text="KV-cache dtype: capacity against error", font=dict(size=font_size + 3)),
    )
    return fig
