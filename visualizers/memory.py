"""Hardware-fit calculator views: estimate records -> plotly Figures / pandas DataFrames.

Pure functions (no streamlit, no engine mutation). Inputs are ``engine.memory.Estimate``
objects (or the ``HardwareRow`` / ``CurvePoint`` records ``compare_hardware`` /
``concurrency_curve`` return).
"""
from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go

from engine.sizing.estimate import CurvePoint, Estimate, HardwareRow
from engine.sizing.hardware import Hardware
from engine.sizing.units import GiB
from visualizers.figures import legend_below
from visualizers.text import escape_plotly
from visualizers.theme import MEMORY_COLORS, VERDICT_COLORS

#: (field on the estimate, label, colour key) in stacking order
COMPONENTS = (
    ("llm_weights", "weights", "weights"),
    ("vision_weight_bytes_per_device", "vision tower", "vision"),
    ("kv_bytes_per_device", "KV cache", "kv_cache"),
    ("activation_bytes", "activations", "activations"),
    ("mask_bytes", "310P attention mask", "mask"),
    ("overhead_bytes", "overhead", "overhead"),
    ("reserve_bytes", "framework reserve", "free"),
)


def _components(est: Estimate) -> list[tuple[str, int, str]]:
    values = {
        "llm_weights": est.weight_bytes_per_device - est.vision_weight_bytes_per_device,
        "vision_weight_bytes_per_device": est.vision_weight_bytes_per_device,
        "kv_bytes_per_device": est.kv_bytes_per_device,
        "activation_bytes": est.activation_bytes,
        "mask_bytes": est.mask_bytes,
        "overhead_bytes": est.overhead_bytes,
        "reserve_bytes": est.reserve_bytes,
    }
    return [(label, int(values[name]), color) for name, label, color in COMPONENTS if values[name] > 0]


def verdict_color(est: Estimate) -> str:
    return VERDICT_COLORS[est.verdict_key]


def memory_bar(est: Estimate) -> go.Figure:
    """Stacked horizontal bar: what one device holds, against its usable and total memory."""
    fig = go.Figure()
    unit = est.device_unit
    for label, value, color in _components(est):
        fig.add_trace(go.Bar(
            name=label, y=[f"per {unit}"], x=[value / GiB], orientation="h",
            marker_color=MEMORY_COLORS[color] if color != "free" else "#BBBBBB",
            marker_pattern_shape="/" if color == "free" else "",
            hovertemplate=f"{label}: %{{x:.2f}} GiB<extra></extra>", text=[f"{value / GiB:.2f}"],
            textposition="inside", insidetextanchor="middle",
        ))
    usable = est.usable_bytes_per_device / GiB
    total = est.device_memory_bytes / GiB
    needed = est.total_bytes_per_device / GiB
    top = max(total, needed) * 1.05
    fig.add_vline(x=usable, line_dash="dash", line_color="#333333", line_width=2,
                  annotation_text=f"usable {usable:.1f} GiB", annotation_position="top")
    if abs(total - usable) > 0.01:
        fig.add_vline(x=total, line_color="#999999", line_width=1,
                      annotation_text=f"total {total:.1f} GiB", annotation_position="bottom")
    if needed > usable:
        fig.add_vrect(x0=usable, x1=needed, fillcolor=MEMORY_COLORS["over"], opacity=0.15, line_width=0)
    fig.update_layout(
        barmode="stack", height=270, margin=dict(l=10, r=10, t=40, b=90),
        xaxis=dict(title="GiB", range=[0, top], fixedrange=True), yaxis=dict(fixedrange=True),
        legend=legend_below(), dragmode=False,
        title=dict(text=f"{needed:.2f} GiB needed of {usable:.2f} GiB usable per {unit}", font=dict(size=14)),
    )
    return fig


def memory_table(est: Estimate) -> pd.DataFrame:
    """Per-device breakdown. Bytes as text: exact, and safe beyond int64 (absurd workloads)."""
    rows = [(label, value) for label, value, _ in _components(est)]
    rows += [("total needed", est.total_bytes_per_device), ("usable", est.usable_bytes_per_device)]
    return pd.DataFrame([{"component": label, "bytes": f"{value:,}", "GiB": round(value / GiB, 3)}
                         for label, value in rows])


def compare_table(rows: list[HardwareRow]) -> pd.DataFrame:
    """One row per hardware preset (from engine.memory.compare_hardware)."""
    out = []
    for r in rows:
        out.append({
            "hardware": r.name,
            "fits?": ("yes" if r.fits else (f"no — needs {r.devices_needed}" if r.devices_needed else "no"))
            if not r.error else "n/a",
            "devices needed": r.devices_needed,
            "tp x pp": "" if r.tp is None else f"{r.tp} x {r.pp}",
            "memory GiB": None if r.memory_gib is None else round(r.memory_gib, 1),
            "needed GiB/device": None if r.total_gib is None else round(r.total_gib, 2),
            "usable GiB": None if r.usable_gib is None else round(r.usable_gib, 2),
            "decode tok/s (expected)": None if r.decode_tokens_per_s is None else round(r.decode_tokens_per_s, 2),
            "decode tok/s (roofline)": None if r.decode_tokens_per_s_roofline is None
            else round(r.decode_tokens_per_s_roofline, 2),
            "TTFT s": None if r.prefill_seconds is None else round(r.prefill_seconds, 2),
            "framework": r.framework,
            "note": r.error,
        })
    return pd.DataFrame(out)


def alternatives_table(est: Estimate) -> pd.DataFrame:
    rows = []
    for a in est.alternatives:
        rows.append({
            "format": a.label + (" (current)" if a.current else ""),
            "weights GiB": round(a.weight_bytes / GiB, 2),
            "needed GiB/device": round(a.total_bytes_per_device / GiB, 2),
            "fits?": "yes" if a.fits else "no",
            "decode tok/s (roofline)": round(a.decode_tokens_per_s_roofline, 1),
            "decode tok/s (expected)": round(a.decode_tokens_per_s, 1),
            "KV room tokens": a.kv_room_tokens,
            "support": a.support,
        })
    return pd.DataFrame(rows)


def roofline_figure(est: Estimate) -> go.Figure:
    """Log-log roofline: attainable FLOP/s vs arithmetic intensity, with prefill and decode placed."""
    peak = est.peak_flops
    bw = est.bandwidth_bytes_per_s
    ridge = peak / bw
    decode_ai = est.decode_flops_per_step / max(est.decode_bytes_per_step, 1.0)
    prefill_ai = est.prefill_flops / max(est.prefill_bytes, 1.0)
    lo = 10 ** math.floor(math.log10(max(min(decode_ai, ridge, prefill_ai) / 3, 1e-2)))
    hi = 10 ** math.ceil(math.log10(max(decode_ai, ridge, prefill_ai) * 3))
    xs = [lo * (hi / lo) ** (i / 60) for i in range(61)]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=xs, y=[min(peak, x * bw) / 1e12 for x in xs], mode="lines", name="roof (peak, BW)",
                             line=dict(color="#333333", width=2), hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=[ridge], y=[peak / 1e12], mode="markers+text", name="ridge point",
                             marker=dict(symbol="diamond", size=11, color="#888888"),
                             text=[f"ridge {ridge:,.0f} FLOP/B"], textposition="top left",
                             hovertemplate="ridge %{x:,.0f} FLOP/byte<extra></extra>"))
    e = est.efficiency_compute
    points = (
        # decode_tokens_per_s is steps per second (one token per sequence per step)
        ("decode", decode_ai, est.decode_flops_per_step * est.decode_tokens_per_s_roofline,
         est.decode_flops_per_step * est.decode_tokens_per_s, MEMORY_COLORS["kv_cache"], est.bound),
        ("prefill", prefill_ai, est.prefill_flops / max(est.prefill_seconds_roofline, 1e-12),
         est.prefill_flops / max(est.prefill_seconds, 1e-12), MEMORY_COLORS["weights"], est.prefill_bound),
    )
    for name, ai, roof_rate, real_rate, color, bound in points:
        fig.add_trace(go.Scatter(
            x=[ai], y=[roof_rate / 1e12], mode="markers+text", name=f"{name} ({bound}-bound)",
            marker=dict(size=14, color=color), text=[name], textposition="bottom right",
            hovertemplate=f"{name}: %{{x:,.1f}} FLOP/byte, %{{y:,.2f}} TFLOP/s at the roof<extra></extra>"))
        fig.add_trace(go.Scatter(
            x=[ai], y=[real_rate / 1e12], mode="markers", name=f"{name} expected",
            marker=dict(size=10, color=color, symbol="circle-open", line=dict(width=2)),
            hovertemplate=f"{name} expected: %{{y:,.2f}} TFLOP/s<extra></extra>", showlegend=False))
    fig.update_layout(
        height=380, margin=dict(l=10, r=10, t=40, b=40), dragmode=False,
        xaxis=dict(type="log", title="arithmetic intensity (FLOP / byte moved)", fixedrange=True),
        yaxis=dict(type="log", title=f"attainable TFLOP/s ({est.peak_label})", fixedrange=True),
        title=dict(text=f"Roofline: {escape_plotly(est.hardware_name)} — filled at the roof, open with efficiency"
                        f" {est.efficiency_memory:.2f}/{e:.2f}", font=dict(size=14)),
        legend=legend_below(),
    )
    return fig


def concurrency_figure(points: list[CurvePoint], context: int | None = None, batch: int | None = None) -> go.Figure:
    """Most concurrent sequences that fit vs context length."""
    fig = go.Figure(go.Scatter(
        x=[p.context for p in points], y=[p.max_batch for p in points], mode="lines+markers",
        line=dict(color=MEMORY_COLORS["kv_cache"]), name="max sequences",
        hovertemplate="%{x:,} tokens: %{y:,} sequences<extra></extra>"))
    if context and batch:
        fig.add_trace(go.Scatter(x=[context], y=[batch], mode="markers", name="this workload",
                                 marker=dict(size=12, symbol="x", color="#EE6677")))
    fig.update_layout(height=300, margin=dict(l=10, r=10, t=30, b=40), dragmode=False,
                      xaxis=dict(type="log", title="context (tokens per sequence)", fixedrange=True),
                      yaxis=dict(type="log", title="concurrent sequences that fit", fixedrange=True),
                      title=dict(text="How many sequences fit at each context length", font=dict(size=14)))
    return fig


def formula_text(est: Estimate) -> str:
    """All formulas with numbers, as one monospace block."""
    lines = []
    for name, text in est.formulas.items():
        for i, line in enumerate(text.splitlines()):
            lines.append(f"{(name + ':') if i == 0 else '':14} {line}")
    return "\n".join(lines)


def hardware_sources_table(hw: Hardware) -> pd.DataFrame:
    """Each preset figure with its value, source and confidence (empty for typed-in hardware)."""
    labels = {"memory_gib": "memory (GiB)", "memory_visible_mib": "memory visible to the runtime (MiB)",
              "usable_fraction": "usable share (unified memory)", "bandwidth_gb_s": "bandwidth (GB/s)",
              "fp16_tflops": "FP16 TFLOPS (dense)", "bf16_tflops": "BF16 TFLOPS (dense)",
              "fp8_tflops": "FP8 TFLOPS (dense)", "int8_tops": "INT8 TOPS (dense)", "fp32_tflops": "FP32 TFLOPS",
              "interconnect_gb_s": "interconnect (GB/s per direction)", "runtime_overhead_mb": "runtime overhead (MB)"}
    measured = {"memory_gib": hw.memory_bytes / GiB, "bandwidth_gb_s": hw.bandwidth / 1e9,
                "fp16_tflops": hw.fp16_flops / 1e12} if hw.measured else {}
    rows = []
    for key, label in labels.items():
        fig = hw.sources.get(key)
        if not fig:
            continue
        value = measured.get(key, fig.value)
        rows.append({"figure": label, "value": "not supported" if value is None else f"{value:,.4g}",
                     "source": fig.source, "confidence": fig.confidence})
    return pd.DataFrame(rows)
