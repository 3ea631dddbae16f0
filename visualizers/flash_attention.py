"""FlashAttention views: the score matrix cut into the kernel's tiles, the online softmax's running
max / sum / rescale after each tile, the split-KV segments and their merge, and the HBM traffic
of naive against tiled attention.

Pure functions of the records of engine/studies/flash_attention.py (FlashStudy, TileStep,
Traffic) -> plotly Figure / pandas DataFrame / Markdown.
"""
from __future__ import annotations

import math
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from engine.studies.flash_attention import FlashStudy, TileStep, Traffic
from visualizers.figures import figure, legend_below, live_layout
from visualizers.text import escape_markdown
from visualizers.theme import request_label

#: Tiles numbered on the score figure up to this many (past it the numbers would cover the cells),
#: and outlined up to MAX_OUTLINED (past it only the selected tile's query block: each outline is a
#: shape the browser redraws one by one).
MAX_NUMBERED_TILES = 160
MAX_OUTLINED = 400
SEGMENT_COLORS = ("#1f2937", "#d97706", "#2563eb", "#059669", "#db2777", "#7c3aed", "#0891b2", "#65a30d")
FOCUS_COLOR = "#dc2626"
SHOWN_DIMS = 4  # output dimensions the tables list (the heatmap shows all)


def _num(x: float) -> float | None:
    return None if math.isnan(x) else x


def _signed(x: float, digits: int) -> str:
    """A factor in a written-out product: negatives in parentheses ("·(-0.5)", not "·-0.5")."""
    return f"({x:.{digits}f})" if x < 0 else f"{x:.{digits}f}"


def fmt_bytes(n: float) -> str:
    """1,536 -> "1.5 KiB"; powers of 1024 up to TiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.1f} TiB"


def tile_label(tile: TileStep) -> str:
    """"#3 · query block 1, tile 0 (segment 2)" — the tile select's words."""
    seg = f" (segment {tile.segment})" if tile.segment else ""
    return (f"#{tile.order} · query block {tile.query_block}, tile {tile.index}{seg}: positions "
            f"{tile.positions[0]}–{tile.positions[1] - 1}")


def score_figure(study: FlashStudy, focus: int | None, font_size: int) -> go.Figure:
    """The chosen head's scores q·kᵀ·scale (rows: this step's new tokens at their positions;
    columns: context positions; blank: causally masked), with every tile the kernel visited
    outlined and numbered in visiting order; ``focus`` (a tile's order) drawn in red."""
    n, seq_len = study.num_tokens, study.seq_len
    z = [[_num(x) for x in row] for row in study.scores]
    ys = list(range(study.start, seq_len))
    data: list[dict[str, Any]] = [dict(
        type="heatmap", z=z, x=list(range(seq_len)), y=ys, colorscale="RdBu", zmid=0, name="scores",
        colorbar=dict(title=dict(text="score"), thickness=12),
        hovertemplate="query position %{y}<br>key position %{x}<br>score %{z:.4f}<extra></extra>")]
    shapes: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    numbered = len(study.tiles) <= MAX_NUMBERED_TILES
    block = next((t.query_block for t in study.tiles if t.order == focus), None)
    outlined = [t for t in study.tiles if len(study.tiles) <= MAX_OUTLINED or t.query_block == block]
    for t in outlined:
        focused = t.order == focus
        y0, y1 = study.start + t.rows[0] - 0.5, study.start + t.rows[-1] + 0.5
        shapes.append(dict(type="rect", x0=t.positions[0] - 0.5, x1=t.positions[1] - 0.5, y0=y0, y1=y1,
                           line=dict(color=FOCUS_COLOR if focused else SEGMENT_COLORS[t.segment % len(SEGMENT_COLORS)],
                                     width=3 if focused else 1.2), fillcolor="rgba(0,0,0,0)", layer="above"))
        if numbered or focused:
            annotations.append(dict(x=(t.positions[0] + t.positions[1] - 1) / 2, y=(y0 + y1) / 2, text=f"{t.order}",
                                    showarrow=False, font=dict(size=font_size + (2 if focused else 0),
                                                               color=FOCUS_COLOR if focused else "#111827"),
                                    bgcolor="rgba(255,255,255,0.7)"))
    title = (f"Scores Q·Kᵀ of {request_label(study.request_id)}, layer {study.layer}, head {study.query_head}: "
             f"{len(study.tiles)} tiles of Br {study.block_m} × Bc {study.block_n}"
             + ("" if numbered else " (too many to number: the selected one is)")
             + ("" if len(outlined) == len(study.tiles) else "; outlined: the selected tile's query block"))
    height = max(220, min(640, 60 + 18 * n))
    layout = live_layout(title, study.step, font_size, height=height, shapes=shapes, annotations=annotations,
                         xaxis=dict(title="key position (context)", range=[-0.5, seq_len - 0.5]),
                         yaxis=dict(title="query position", autorange="reversed",
                                    range=[seq_len - 0.5, study.start - 0.5]),
                         margin=dict(l=60, r=20, t=50, b=50))
    return figure(data, layout)


def tile_frame(study: FlashStudy, tile: TileStep) -> pd.DataFrame:
    """One row per query token of the tile's block: running max m, running sum l and the rescale
    exp(m_old − m_new) after this tile, and the partial output acc / l (first dimensions)."""
    rows = []
    for j, r in enumerate(tile.rows):
        out = tile.out[j]
        row: dict[str, Any] = {"query position": study.start + r, "m (running max)": tile.m[j],
                               "l (running sum)": tile.l[j], "rescale exp(m_old − m_new)": tile.alpha[j]}
        for i in range(min(SHOWN_DIMS, len(out))):
            row[f"o[{i}]"] = out[i]
        row["‖o‖"] = math.sqrt(sum(x * x for x in out))
        rows.append(row)
    return pd.DataFrame(rows)


def partial_output_figure(study: FlashStudy, tile: TileStep, font_size: int) -> go.Figure:
    """The partial output acc / l of every row of the tile's query block after this tile [rows × head_dim]."""
    ys = [study.start + r for r in tile.rows]
    data: list[dict[str, Any]] = [dict(
        type="heatmap", z=[list(o) for o in tile.out], x=list(range(study.head_dim)), y=ys, colorscale="PuOr",
        zmid=0, name="partial output", colorbar=dict(thickness=10),
        hovertemplate="query position %{y}<br>dim %{x}<br>%{z:.5f}<extra></extra>")]
    layout = live_layout(f"Partial output after tile #{tile.order}", study.step, font_size,
                         height=max(180, min(420, 80 + 22 * len(ys))),
                         xaxis=dict(title="head dimension"),
                         yaxis=dict(title="query position", autorange="reversed", dtick=1),
                         margin=dict(l=60, r=20, t=40, b=45))
    return figure(data, layout)


def running_figure(study: FlashStudy, row: int, font_size: int) -> go.Figure:
    """For one query row (new-token index ``row``): m and l after each tile its program visited,
    in visiting order (split-KV: one line per segment, each from scratch)."""
    data: list[dict[str, Any]] = []
    for seg in range(study.num_segments):
        tiles = [t for t in study.tiles if t.segment == seg and row in t.rows]
        xs = [t.order for t in tiles]
        at = [t.rows.index(row) for t in tiles]
        suffix = f" (segment {seg})" if study.num_segments > 1 else ""
        color = SEGMENT_COLORS[seg % len(SEGMENT_COLORS)]
        data.append(dict(type="scatter", mode="lines+markers", x=xs, y=[_num(t.m[i]) for t, i in zip(tiles, at)],
                         name=f"m, running max{suffix}", line=dict(color=color)))
        data.append(dict(type="scatter", mode="lines+markers", x=xs, y=[t.l[i] for t, i in zip(tiles, at)],
                         name=f"l, running sum{suffix}", yaxis="y2", line=dict(color=color, dash="dot")))
    layout = live_layout(f"Query position {study.start + row}: m and l after each tile", study.step, font_size,
                         height=320 + 24 * (study.num_segments - 1),
                         xaxis=dict(title="tile # (visiting order)", dtick=1),
                         yaxis=dict(title="m"), yaxis2=dict(title="l", overlaying="y", side="right"),
                         legend=legend_below(), margin=dict(l=60, r=60, t=40))
    return figure(data, layout)


def final_frame(study: FlashStudy) -> pd.DataFrame:
    """Per query token after its block's last tile: the kernel's m, l against the float64 ones
    (max, sum of exp(s − max) over the row's visible scores), and max |kernel − softmax(QKᵀ)V|."""
    last = study.final_tiles()
    rows = []
    for i in range(study.num_tokens):
        tile = next(t for t in last.values() if i in t.rows)
        j = tile.rows.index(i)
        diff = max(abs(a - b) for a, b in zip(study.out[i], study.reference[i]))
        rows.append({"query position": study.start + i, "kernel m": tile.m[j], "float64 m": study.ref_m[i],
                     "kernel l": tile.l[j], "float64 l": study.ref_l[i], "max |out − reference|": diff})
    return pd.DataFrame(rows)


def output_frame(study: FlashStudy) -> pd.DataFrame:
    """The kernel's output against softmax(QKᵀ)V in float64, dimension by dimension, for the last query token."""
    i = study.num_tokens - 1
    return pd.DataFrame({"dim": range(study.head_dim), "kernel (fp32)": study.out[i],
                         "softmax(QKᵀ)V (float64)": study.reference[i],
                         "difference": [a - b for a, b in zip(study.out[i], study.reference[i])]})


def segments_frame(study: FlashStudy) -> pd.DataFrame:
    """Each split-KV segment's (m, l, partial output) and its weight in the merge."""
    if not study.segments:
        return pd.DataFrame()
    big_m = max(s.m for s in study.segments)
    rows = []
    for s in study.segments:
        scale = math.exp(s.m - big_m) if s.l > 0 else 0.0
        row: dict[str, Any] = {"segment": s.segment,
                               "positions": f"{s.positions[0]}–{s.positions[1] - 1}" if s.l > 0 else "empty",
                               "m_s": s.m, "l_s": s.l, "lse_s = m_s + ln l_s": s.lse, "exp(m_s − M)": scale,
                               "w_s = l_s·exp(m_s − M)": s.l * scale}
        for i in range(min(SHOWN_DIMS, len(s.out))):
            row[f"o_s[{i}]"] = s.out[i]
        rows.append(row)
    return pd.DataFrame(rows)


def merge_markdown(study: FlashStudy) -> str:
    """The log-sum-exp merge written out with this decode's numbers (dimension 0)."""
    segs = [s for s in study.segments if s.l > 0]
    if not segs or study.unsplit is None or study.merged_vs_unsplit is None:
        return ""
    big_m = max(s.m for s in segs)
    w = [s.l * math.exp(s.m - big_m) for s in segs]
    num = " + ".join(f"{wi:.4f}·{_signed(s.out[0], 5)}" for wi, s in zip(w, segs))
    den = " + ".join(f"{wi:.4f}" for wi in w)
    merged0 = sum(wi * s.out[0] for wi, s in zip(w, segs)) / sum(w)
    return (f"**Merge** (one row, every dimension alike; dimension 0 written out): M = max m_s = {big_m:.6f}; "
            f"w_s = l_s·exp(m_s − M); out = Σ w_s·o_s / Σ w_s\n\n"
            f"out[0] = ({num}) / ({den}) = **{merged0:.6f}** — the kernel's merged output {study.out[0][0]:.6f}, "
            f"the unsplit kernel's {study.unsplit[0]:.6f}.\n\n"
            f"Max |merged − unsplit| over the {study.head_dim} dimensions: **{study.merged_vs_unsplit:.2e}**.")


def summary_markdown(study: FlashStudy) -> str:
    """What was traced, in one paragraph."""
    kind = "decode" if study.kind == "decode" else "prefill chunk"
    blocks = -(-study.seq_len // study.block_size)
    table = ", ".join(str(b) for b in study.block_table[:blocks])
    where = "Triton's interpreter on this CPU" if study.interpreted else "the GPU (compiled)"
    live = ("" if study.live_cache_difference is None else
            f" The recomputed K/V differ from the live cache by at most {study.live_cache_difference:.2e}.")
    return escape_markdown(
        f"{request_label(study.request_id)}, step {study.step}: {kind} of {study.num_tokens} token(s) at positions "
        f"{study.start}–{study.seq_len - 1}, context {study.seq_len}; layer {study.layer}, query head "
        f"{study.query_head} (KV head {study.kv_head}, whose GQA group of {study.group} query head(s) the kernel "
        f"packs into its rows). Its K/V sit in blocks [{table}] of {study.block_size} slots, the block table the "
        f"engine used. Kernel run by {where}.{live}")


def traffic_frame(items: list[Traffic]) -> pd.DataFrame:
    """The formula's inputs and terms (bytes of one layer, every head), one column per case
    (a row per quantity: narrow enough for the page's width with any number of cases)."""
    terms: list[tuple[str, Any]] = [
        ("H (query heads)", lambda t: f"{t.heads}"), ("KVH (KV heads)", lambda t: f"{t.kv_heads}"),
        ("d (head_dim)", lambda t: f"{t.head_dim}"), ("b (bytes per element)", lambda t: f"{t.dtype_bytes}"),
        ("N (context)", lambda t: f"{t.context:,}"), ("M (query tokens)", lambda t: f"{t.query_tokens:,}"),
        ("Br (query tokens per tile pass)", lambda t: f"{t.block_m}"),
        ("Q + O", lambda t: fmt_bytes(2 * t.q_bytes)), ("K + V", lambda t: fmt_bytes(t.kv_bytes)),
        ("S (one pass)", lambda t: fmt_bytes(t.s_bytes)), ("naive, one layer", lambda t: fmt_bytes(t.naive)),
        ("tiled, one layer", lambda t: fmt_bytes(t.tiled)), ("naive / tiled", lambda t: f"{t.ratio:.2f}"),
        ("naive, all layers", lambda t: fmt_bytes(t.naive * t.layers)),
        ("tiled, all layers", lambda t: fmt_bytes(t.tiled * t.layers))]
    frame: dict[str, list[str]] = {"quantity": [name for name, _ in terms]}
    for t in items:
        frame[t.label] = [f(t) for _, f in terms]
    return pd.DataFrame(frame)


def traffic_markdown(t: Traffic) -> str:
    """The formula with ``t``'s numbers."""
    return escape_markdown(
        f"{t.label}: Q + O = 2·b·M·H·d = 2·{t.dtype_bytes}·{t.query_tokens}·{t.heads}·{t.head_dim} = "
        f"{2 * t.q_bytes:,} B; K + V = 2·b·N·KVH·d = 2·{t.dtype_bytes}·{t.context}·{t.kv_heads}·{t.head_dim} = "
        f"{t.kv_bytes:,} B; S = b·H·M·N = {t.dtype_bytes}·{t.heads}·{t.query_tokens}·{t.context} = "
        f"{t.s_bytes:,} B. "
        f"Naive = Q + K + V + O + 4·S = {t.naive:,} B; tiled = Q + O + (K + V)·⌈M / Br⌉ = "
        f"{2 * t.q_bytes:,} + {t.kv_bytes:,}·{t.passes} = {t.tiled:,} B ({t.ratio:.2f}× less), per layer.",
    )
