"""Paged KV cache views: the physical block pool, each request's block table, what a step did,
and the memory a paged cache saves against a contiguous reservation.

Pure functions of engine records (Snapshot, StepTrace) -> plotly Figure / pandas DataFrame
(and the Markdown summaries the page prints beside them).
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Any

import pandas as pd
import plotly.graph_objects as go


from engine.core.trace import BlockState, RequestState, Snapshot, StepTrace
from visualizers.events import caption, grouped, note, step_events
from visualizers.figures import Panel, legend_below, live_layout, stack, vline
from visualizers.text import escape_markdown
from visualizers.theme import (BLOCK_STATE_COLORS, blend, plot_label, request_color, request_label, request_sort_key,
                               text_color_on)

CELL_PX = 30  # pitch of one block in the pool grid
ALLOCATED_OUTLINE = BLOCK_STATE_COLORS["allocated outline"]
FREED_OUTLINE = BLOCK_STATE_COLORS["freed outline"]


def block_state(block: BlockState) -> str:
    """free (ref 0), cached (ref 0, held by a prefix-cache node: evictable), used (ref 1),
    shared (ref > 1)."""
    if block.ref_count == 0:
        return "cached" if block.cached else "free"
    return "shared" if block.ref_count > 1 else "used"


def cache_note(block: BlockState) -> str:
    """The block's prefix-cache state, for its hover."""
    if not block.cached:
        return "not in the prefix cache"
    if block.ref_count == 0:
        return "prefix cache: cached, evictable (no request uses it; LRU eviction may reuse it)"
    return "prefix cache: cached and in use (a tree node holds it too)"


def grid_columns(num_blocks: int) -> int:
    """Columns of the pool grid: 16 for demo pools, wider for big ones."""
    if num_blocks <= 256:
        return 16
    return 32 if num_blocks <= 1024 else 64


def _hover_text(text: str, limit: int = 60) -> str:
    """Token text made safe for a Plotly hover label (HTML-escaped, newlines visible)."""
    shown = text if len(text) <= limit else text[:limit] + "…"
    return html.escape(shown).replace("\n", "⏎")


def _fill_opacity(num_tokens: int, block_size: int) -> float:
    """Fuller blocks are more opaque, so a request's partly filled last block stands out."""
    return 0.35 + 0.65 * (num_tokens / block_size)


@dataclass(frozen=True)
class _Cell:
    block: BlockState
    x: int
    y: int


def _cells(snapshot: Snapshot) -> list[_Cell]:
    cols = grid_columns(snapshot.num_blocks)
    return [_Cell(b, b.block_id % cols, b.block_id // cols) for b in snapshot.blocks]


STATE_TRACES = {"free": "free", "cached": "cached, evictable", "shared": "shared (ref>1)"}
CACHED_IN_USE = "cached, in use (outline)"


def _outline(block: BlockState, allocated: set[int], freed: set[int]) -> tuple[str, float]:
    """(colour, width) of a block's outline: allocated in the last step (dark), freed in it (red),
    else held by the prefix cache (the cache's outline), else none."""
    if block.block_id in allocated:
        return ALLOCATED_OUTLINE, 3.0
    if block.block_id in freed:
        return FREED_OUTLINE, 3.0
    if block.cached:
        return BLOCK_STATE_COLORS["cached outline"], 2.0
    return "rgba(0,0,0,0)", 0.0


def _group_style(key: str, group: list[_Cell], block_size: int, focus: str | None) -> tuple[str, str, list[float]]:
    """(trace name, colour, opacity per block) of one grid trace."""
    if key in ("free", "cached"):
        return STATE_TRACES[key], BLOCK_STATE_COLORS[key], [1.0] * len(group)
    if key == "shared":
        return STATE_TRACES[key], BLOCK_STATE_COLORS[key], [_fill_opacity(c.block.num_tokens, block_size) for c in group]
    faded = focus is not None and key != focus
    return plot_label(key), request_color(key), [0.12 if faded else _fill_opacity(c.block.num_tokens, block_size)
                                                 for c in group]


def _cached_in_use_legend() -> dict[str, Any]:
    """Legend-only entry for the outline a block in use gets when a prefix-cache node holds it."""
    return dict(type="scatter", x=[None], y=[None], mode="markers", name=CACHED_IN_USE, hoverinfo="skip",
                marker=dict(symbol="square", size=CELL_PX - 8, color="#FFFFFF",
                            line=dict(color=BLOCK_STATE_COLORS["cached outline"], width=2)))


def grid_panel(snapshot: Snapshot, trace: StepTrace | None = None, focus: str | None = None) -> Panel:
    """The physical block pool: one square per block, row-major, block 0 top left.

    Traces: "free", "cached, evictable" (ref count 0, held by a prefix-cache node), one per owning
    request (ref count 1, in the request's colour) and "shared (ref>1)". Opacity = how full the
    block is. Blocks allocated in ``trace`` get a dark outline, blocks freed in it a red one,
    other blocks a prefix-cache node holds the cache's outline (plus a legend-only entry for it).
    With ``focus`` set, other requests fade. Block ids are in the hover (printing them in the
    squares is costly to redraw each step).
    """
    bs = snapshot.block_size
    allocated = set(trace.blocks_allocated) if trace else set()
    freed = set(trace.blocks_freed) if trace else set()
    groups: dict[str, list[_Cell]] = {}
    for c in _cells(snapshot):
        state = block_state(c.block)
        key = c.block.owners[0] if state == "used" else state
        groups.setdefault(key, []).append(c)
    fixed = ("free", "cached", "shared")
    order = ["free", "cached"] + sorted((k for k in groups if k not in fixed), key=request_sort_key) + ["shared"]
    data = []
    for key in order:
        group = groups.get(key)
        if not group:
            continue
        name, color, opacity = _group_style(key, group, bs, focus)
        outlines = [_outline(c.block, allocated, freed) for c in group]
        data.append(dict(
            type="scatter", x=[c.x for c in group], y=[c.y for c in group],
            mode="markers", name=name, legendgroup=name,
            marker=dict(symbol="square", size=CELL_PX - 4, color=color, opacity=opacity,
                        line=dict(color=[o[0] for o in outlines], width=[o[1] for o in outlines])),
            customdata=[[c.block.block_id, ", ".join(plot_label(o) for o in c.block.owners) or "—",
                         c.block.ref_count, c.block.num_tokens, _hover_text(c.block.text), cache_note(c.block)]
                        for c in group],
            hovertemplate=("block %{customdata[0]}<br>owner: %{customdata[1]}<br>ref count: %{customdata[2]}"
                           f"<br>tokens: %{{customdata[3]}}/{bs}<br>%{{customdata[4]}}<br>%{{customdata[5]}}"
                           "<extra></extra>"),
        ))
    if any(b.cached and b.ref_count > 0 for b in snapshot.blocks):
        data.append(_cached_in_use_legend())
    cols = grid_columns(snapshot.num_blocks)
    rows = math.ceil(snapshot.num_blocks / cols)
    return Panel(data, height=rows * CELL_PX,
                 xaxis=dict(visible=False, range=[-0.7, cols - 0.3], fixedrange=True),
                 yaxis=dict(visible=False, range=[rows - 0.3, -0.7], fixedrange=True),
                 title=pool_title(snapshot))


def pool_title(snapshot: Snapshot) -> str:
    """"Block pool: U used, F free / N", with the evictable cached blocks when any (short: it
    heads a chart as narrow as the pool grid). The block size is in the pool summary."""
    evictable = snapshot.num_evictable_blocks
    used = snapshot.num_blocks - snapshot.num_free_blocks - evictable
    cached = f", {evictable} evictable" if evictable else ""
    return f"Block pool: {used} used, {snapshot.num_free_blocks} free{cached} / {snapshot.num_blocks}"


def running_tables(snapshot: Snapshot) -> list[RequestState]:
    """Requests that hold blocks, in id order."""
    return sorted((r for r in snapshot.requests if r.block_table), key=lambda r: request_sort_key(r.request_id))


def block_table_frame(snapshot: Snapshot) -> pd.DataFrame:
    """One row per (request, logical block): the physical block and the tokens it holds."""
    blocks = {b.block_id: b for b in snapshot.blocks}
    rows = []
    for r in running_tables(snapshot):
        for logical, physical in enumerate(r.block_table):
            b = blocks[physical]
            rows.append({"request": request_label(r.request_id), "logical": logical, "physical": physical,
                         "tokens": b.num_tokens, "fill": b.num_tokens / snapshot.block_size,
                         "ref count": b.ref_count, "text": b.text})
    return pd.DataFrame(rows, columns=["request", "logical", "physical", "tokens", "fill", "ref count", "text"])


def table_panel(snapshot: Snapshot, focus: str | None = None, font_size: int = 12) -> Panel:
    """Each running request's block table as a row: logical block i (x) -> physical id (text).

    One trace per request, in the request's colour (the same colour as its blocks in the pool).
    """
    blocks = {b.block_id: b for b in snapshot.blocks}
    tables = running_tables(snapshot)
    data = []
    widest = max((len(r.block_table) for r in tables), default=1)
    size = max(6, min(CELL_PX - 4, int(700 / max(widest, 1)) - 2))
    for r in tables:
        bs = [blocks[p] for p in r.block_table]
        faded = focus is not None and r.request_id != focus
        label = plot_label(r.request_id)
        color = request_color(r.request_id)
        opacity = [0.12 if faded else _fill_opacity(b.num_tokens, snapshot.block_size) for b in bs]
        data.append(dict(
            type="scatter", x=list(range(len(bs))), y=[label] * len(bs),
            mode="markers+text" if size >= 18 else "markers", name=label, legendgroup=label, showlegend=False,
            marker=dict(symbol="square", size=size, color=color, opacity=opacity),
            text=[str(b.block_id) for b in bs],
            textfont=dict(size=max(8, font_size - 3), color=[text_color_on(blend(color, o)) for o in opacity]),
            customdata=[[i, b.block_id, b.num_tokens, _hover_text(b.text)] for i, b in enumerate(bs)],
            hovertemplate=(f"{label}: logical %{{customdata[0]}} → physical %{{customdata[1]}}"
                           f"<br>tokens: %{{customdata[2]}}/{snapshot.block_size}<br>%{{customdata[3]}}<extra></extra>"),
        ))
    notes = [] if tables else [dict(text="no request holds blocks", showarrow=False, x=0.5, y=0.5,
                                    xref="x domain", yref="y domain")]
    if not tables:  # plotly draws no subplot without a trace: its axes and the note would float over the pool
        data.append(dict(type="scatter", x=[0], y=[""], mode="markers", marker=dict(opacity=0),
                         hoverinfo="skip", showlegend=False, name="no tables"))
    return Panel(data, height=max(CELL_PX, CELL_PX * len(tables)), annotations=notes,
                 xaxis=dict(title=dict(text="logical block (number = physical block)"), range=[-0.7, max(widest, 8) - 0.3],
                            dtick=1 if widest <= 24 else None, fixedrange=True, zeroline=False, showgrid=False),
                 yaxis=dict(autorange="reversed", fixedrange=True, type="category", showgrid=False),
                 title="Block tables: logical → physical blocks")


def kv_figure(snapshot: Snapshot, trace: StepTrace | None = None, focus: str | None = None,
              font_size: int = 12) -> go.Figure:
    """The live view: block pool above, block tables below, one legend (click a request to hide it)."""
    cols = grid_columns(snapshot.num_blocks)
    pool = grid_panel(snapshot, trace, focus)
    pool.annotations += freed_notes(snapshot, trace, font_size)
    return stack([pool, table_panel(snapshot, focus, font_size)],
                 live_layout(f"Paged KV cache after {snapshot.step} steps", snapshot.step, font_size,
                             width=cols * CELL_PX + 200, legend=dict(title=dict(text="owner"), itemsizing="constant")),
                 gap_px=70, margin_px=(80, 50))


def freed_notes(snapshot: Snapshot, trace: StepTrace | None, font_size: int) -> list[dict[str, Any]]:
    """The last step's preemptions and evictions (visualizers.events) captioned on the pool,
    pointing at the first block the step freed."""
    if trace is None or not trace.blocks_freed:
        return []
    cols = grid_columns(snapshot.num_blocks)
    first = min(trace.blocks_freed)
    freed = f": {len(trace.blocks_freed)} blocks freed"
    return [note(group[0].kind, caption(group) + (freed if group[0].kind == "preemption" else ""), first % cols,
                 first // cols, font_size, raised=i)
            for i, group in enumerate(grouped(step_events([trace]), ("preemption", "eviction")))]


def step_events_frame(trace: StepTrace | None) -> pd.DataFrame:
    """What one step did to the pool and the queues, one row per kind of event."""
    columns = ["event", "count", "items"]
    if trace is None:
        return pd.DataFrame([], columns=columns)

    def ids(items: tuple[object, ...]) -> str:
        return ", ".join(str(i) for i in items) or "—"

    def reqs(items: tuple[str, ...]) -> str:
        return ", ".join(request_label(i) for i in items) or "—"

    rows = [
        ("blocks allocated", len(trace.blocks_allocated), ids(trace.blocks_allocated)),
        ("blocks freed", len(trace.blocks_freed), ids(trace.blocks_freed)),
        ("requests preempted", len(trace.preempted), reqs(trace.preempted)),
        ("requests arrived", len(trace.arrived), reqs(trace.arrived)),
        ("requests finished", len(trace.finished), reqs(trace.finished)),
    ]
    return pd.DataFrame(rows, columns=columns)


WASTE_SCHEMES = ("paged (this engine)", "contiguous: prompt + max_tokens", "contiguous: max_model_len")


def step_events_markdown(frame: pd.DataFrame) -> str:
    """``step_events_frame`` as a short Markdown list (cheaper to redraw every step than a table).

    The items (request ids from a recording) are escaped: they render as text, never as Markdown.
    """
    if frame.empty:
        return "No step yet: press **Step** (PageDown)."
    return "\n".join(f"- {row.event}: **{row.count}**" + (f" ({escape_markdown(row.items)})" if row.count else "")
                     for row in frame.itertuples())


def waste_frame(snapshot: Snapshot, max_model_len: int) -> pd.DataFrame:
    """KV memory reserved vs used by the requests that hold KV now, under three allocators.

    paged: each request holds ceil(tokens / block_size) blocks; waste = slack in its last block.
    contiguous (vLLM paper's baseline): each request reserves one slab up front, either its own
    worst case (prompt + max_tokens) or the model's max length. Shares are of the real pool
    (num_blocks * block_size tokens); above 100 % the contiguous reservation would not fit.
    """
    live = running_tables(snapshot)
    bs = snapshot.block_size
    pool = snapshot.num_blocks * bs
    used = sum(r.num_computed_tokens for r in live)
    reserved = {
        WASTE_SCHEMES[0]: sum(len(r.block_table) * bs for r in live),
        WASTE_SCHEMES[1]: sum(min(r.num_prompt_tokens + r.max_tokens, max_model_len) for r in live),
        WASTE_SCHEMES[2]: max_model_len * len(live),
    }
    rows = []
    for scheme, res in reserved.items():
        wasted = max(res - used, 0)
        rows.append({"scheme": scheme, "requests": len(live), "used tokens": used, "reserved tokens": res,
                     "wasted tokens": wasted, "wasted bytes": wasted * snapshot.kv_bytes_per_token,
                     "wasted share of pool": wasted / pool, "reserved share of pool": res / pool,
                     "fits in pool": res <= pool})
    return pd.DataFrame(rows)


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def waste_summary(frame: pd.DataFrame, max_model_len: int) -> str:
    """``waste_frame`` in one Markdown sentence: paged against reserving max_model_len per request."""
    paged, contiguous = frame.iloc[0], frame.iloc[2]
    return (f"Paged: **{format_bytes(paged['wasted bytes'])}** reserved but unused "
            f"(**{paged['wasted share of pool']:.1%}** of the pool), only the slack in each request's last "
            f"block. Reserving max_model_len = {max_model_len} tokens per request up front: "
            f"**{format_bytes(contiguous['wasted bytes'])}** unused "
            f"(**{contiguous['wasted share of pool']:.0%}** of the pool).")


def pool_summary(snapshot: Snapshot, kv_dtype: str) -> str:
    """The KV pool's size in one Markdown line: bytes per token (all layers, K and V, with the
    per-token scales of a quantized cache), tokens it holds, and its total in bytes.

    ``kv_dtype`` is the cache's element type as the run's config names it (``"float32"``,
    ``"int8"``, ...); the byte counts are the engine's own (``snapshot.kv_bytes_per_token``).
    """
    tokens = snapshot.num_blocks * snapshot.block_size
    per_token = snapshot.kv_bytes_per_token
    return (f"KV cache in **{escape_markdown(kv_dtype)}**: **{per_token:,} B per token** (all layers, K and V"
            f"{', with the scales' if kv_dtype in ('int8', 'fp8') else ''}) · pool {snapshot.num_blocks:,} blocks "
            f"× {snapshot.block_size} = {tokens:,} tokens = **{format_bytes(tokens * per_token)}**.")


def waste_figure(frame: pd.DataFrame, pool_tokens: int, step: int | None = None, font_size: int = 12) -> go.Figure:
    """Horizontal bars per allocator: tokens used (blue) + reserved but unused (red), vs the pool.

    Each bar's waste is written in its axis label, not beside the bar: a contiguous reservation can
    exceed the pool, and a label past the bar's end would run off the figure."""
    wasted = [f"{format_bytes(b)} wasted ({w:.0%} of pool)"
              for b, w in zip(frame["wasted bytes"], frame["wasted share of pool"])]
    rows = [f"<b>{scheme}</b><br>{w}" for scheme, w in zip(frame["scheme"], wasted)]
    data: list[dict[str, Any]] = [
        dict(type="bar", y=rows, x=list(frame["used tokens"]), name="used (tokens with KV)",
             orientation="h", marker=dict(color=BLOCK_STATE_COLORS["used"]), customdata=list(frame["scheme"]),
             hovertemplate="%{customdata}: %{x} tokens used<extra></extra>"),
        dict(type="bar", y=rows, x=list(frame["wasted tokens"]), name="reserved, unused",
             orientation="h", marker=dict(color="#EE6677"), customdata=list(frame["scheme"]),
             hovertemplate="%{customdata}: %{x} tokens reserved, unused<extra></extra>"),
    ]
    shape, note = vline(pool_tokens, f"pool: {pool_tokens} tokens")
    panel = Panel(data, height=150, shapes=[shape], annotations=[note],
                  xaxis=dict(title=dict(text="tokens of KV"), fixedrange=True),
                  yaxis=dict(autorange="reversed", fixedrange=True))
    layout = live_layout("KV memory: paged vs contiguous reservation", step, font_size, barmode="stack",
                         legend=legend_below())
    return stack([panel], layout, margin_px=(70, 70))
