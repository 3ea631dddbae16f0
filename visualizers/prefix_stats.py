"""Prefix cache over time, and caching on against caching off.

* ``cache_stats_frame``: per step, the prompt tokens looked up at admission, how many came from
  the cache (hit rate, step and cumulative), prefill tokens computed, cached / evictable
  blocks, blocks evicted, copy-on-write copies;
* ``cache_figure``: the block pool (cached blocks drawn as such) above the hit rate, prefill
  tokens computed vs served from the cache, and cached blocks with evictions, on one step axis;
* ``caching_summary`` / ``caching_requests_frame`` / ``caching_comparison_figure``: the same
  scenario run to the end twice (``engine.run.compare_prefix_caching``): prefill tokens
  computed and time to first token, in steps and in ms, per run and per request.

Pure functions of StepTraces, Snapshots and PolicyRuns.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import pandas as pd
import plotly.graph_objects as go

from engine.run import PolicyRun
from engine.trace import Snapshot, StepTrace
from visualizers.figures import Panel, live_layout, stack
from visualizers.kv_blocks import CACHED_IN_USE, CELL_PX, STATE_TRACES, grid_columns, grid_panel
from visualizers.text import escape_plotly
from visualizers.theme import BLOCK_STATE_COLORS, CACHING_COLORS, CHUNK_KIND_COLORS, request_label, request_sort_key

STATS_COLUMNS = ["step", "lookup tokens", "cached tokens", "hit rate", "cumulative hit rate", "prefill tokens",
                 "cached blocks", "evictable blocks", "evicted blocks", "evicted nodes", "copies"]
HIT_COLOR = "#225588"


def cache_stats_frame(traces: Sequence[StepTrace]) -> pd.DataFrame:
    """One row per step; a hit rate is missing (NaN) while nothing was looked up."""
    rows = []
    looked = cached = 0
    for t in traces:
        ev = t.prefix
        looked += ev.num_lookup_tokens
        cached += ev.num_cached_tokens
        rows.append({
            "step": t.step, "lookup tokens": ev.num_lookup_tokens, "cached tokens": ev.num_cached_tokens,
            "hit rate": ev.num_cached_tokens / ev.num_lookup_tokens if ev.num_lookup_tokens else None,
            "cumulative hit rate": cached / looked if looked else None,
            "prefill tokens": t.num_prefill_tokens, "cached blocks": t.num_cached_blocks,
            "evictable blocks": t.num_evictable_blocks,
            "evicted blocks": sum(len(n.block_ids) for n in ev.evicted), "evicted nodes": len(ev.evicted),
            "copies": len(ev.copies),
        })
    return pd.DataFrame(rows, columns=STATS_COLUMNS)


def values(column: pd.Series) -> list[Any]:
    """A frame column as plain Python values, None for a missing one (JSON-ready without Plotly's
    slow per-value cleaning of numpy scalars and NaN)."""
    return [None if v != v else v for v in column.tolist()]


def hit_rate(traces: Sequence[StepTrace]) -> float | None:
    """Tokens served from the cache / prompt tokens looked up, over all steps so far."""
    looked = sum(t.prefix.num_lookup_tokens for t in traces)
    return sum(t.prefix.num_cached_tokens for t in traces) / looked if looked else None


def _xaxis(title: bool) -> dict[str, Any]:
    return dict(title=dict(text="engine step") if title else None, fixedrange=True, matches="x2",
                rangemode="tozero")


def hit_panel(frame: pd.DataFrame) -> Panel:
    steps = values(frame["step"])
    data: list[dict[str, Any]] = [
        dict(type="scatter", mode="lines+markers", x=steps, y=values(frame["cumulative hit rate"]),
             name="hit rate, so far", line=dict(color=HIT_COLOR, width=2.5), marker=dict(size=4),
             connectgaps=False, hovertemplate="step %{x}: %{y:.0%} of looked-up tokens so far<extra></extra>"),
        dict(type="scatter", mode="markers", x=steps, y=values(frame["hit rate"]), name="hit rate, this step",
             marker=dict(color=HIT_COLOR, symbol="circle-open", size=7),
             hovertemplate="step %{x}: %{y:.0%} of this step's lookups<extra></extra>")]
    return Panel(data, height=120, xaxis=dict(fixedrange=True, rangemode="tozero"),
                 yaxis=dict(title=dict(text="hit rate"), range=[0, 1.05], tickformat=".0%", fixedrange=True),
                 title="Hit rate: prompt tokens served from the cache / looked up")


def tokens_panel(frame: pd.DataFrame) -> Panel:
    """Prefill tokens computed in each step, with the prompt tokens admissions found cached stacked on top."""
    steps = values(frame["step"])
    data: list[dict[str, Any]] = [
        dict(type="bar", x=steps, y=values(frame["prefill tokens"]), name="prefill tokens computed",
             marker=dict(color=CHUNK_KIND_COLORS["prefill"]),
             hovertemplate="step %{x}: %{y} prefill tokens computed<extra></extra>"),
        dict(type="bar", x=steps, y=values(frame["cached tokens"]), name="prefill tokens saved (from cache)",
             marker=dict(color=CACHING_COLORS["caching on"]),
             hovertemplate="step %{x}: %{y} prompt tokens served from the cache<extra></extra>")]
    return Panel(data, height=110, xaxis=_xaxis(False), yaxis=dict(title=dict(text="tokens"), fixedrange=True),
                 title="Prefill tokens per step: computed, and saved by the cache")


def blocks_panel(frame: pd.DataFrame) -> Panel:
    steps = values(frame["step"])
    data: list[dict[str, Any]] = [
        dict(type="scatter", mode="lines", x=steps, y=values(frame["cached blocks"]), name="blocks in the tree",
             line=dict(color=BLOCK_STATE_COLORS["cached outline"], width=2),
             hovertemplate="step %{x}: %{y} blocks held by the tree<extra></extra>"),
        dict(type="scatter", mode="lines", x=steps, y=values(frame["evictable blocks"]),
             name="of those, evictable", line=dict(color=BLOCK_STATE_COLORS["cached outline"], dash="dot"),
             hovertemplate="step %{x}: %{y} evictable blocks<extra></extra>"),
        dict(type="bar", x=steps, y=values(frame["evicted blocks"]), name="blocks evicted (LRU)",
             marker=dict(color="#EE6677"), hovertemplate="step %{x}: %{y} blocks evicted<extra></extra>")]
    return Panel(data, height=110, xaxis=_xaxis(True), yaxis=dict(title=dict(text="blocks"), fixedrange=True),
                 title="Cached blocks, and evictions")


def cache_figure(traces: Sequence[StepTrace], snapshot: Snapshot, font_size: int = 12) -> go.Figure:
    """The block pool after the last step (cached blocks drawn as such) above three step-axis panels."""
    frame = cache_stats_frame(traces)
    pool = grid_panel(snapshot, traces[-1] if traces else None)
    for t in pool.data:  # request colours are keyed by the tree's owner squares; the legend keeps the states
        if t["name"] not in (*STATE_TRACES.values(), CACHED_IN_USE):
            t["showlegend"] = False
    panels = [pool, hit_panel(frame), tokens_panel(frame), blocks_panel(frame)]
    rate = hit_rate(traces)
    title = f"Prefix cache after {snapshot.step} steps: hit rate " + (f"{rate:.0%}" if rate is not None else "—")
    width = grid_columns(snapshot.num_blocks) * CELL_PX + 40
    layout = live_layout(title, snapshot.step, font_size, width=width, barmode="stack",
                         legend=dict(orientation="h", y=-0.07, yanchor="top", x=0),
                         margin=dict(l=50, r=10, t=70, b=170))
    return stack(panels, layout, gap_px=48, margin_px=(70, 170))


# -- caching on vs off ------------------------------------------------------------------------

def prefill_tokens_by_request(run: PolicyRun) -> dict[str, int]:
    """Prefill (and recompute) tokens each request had computed over the run."""
    out: dict[str, int] = {r.request_id: 0 for r in run.final.requests}
    for t in run.traces:
        for c in t.scheduled:
            if c.kind == "prefill":
                out[c.request_id] = out.get(c.request_id, 0) + c.num_tokens
    return out


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def caching_summary(runs: Mapping[str, PolicyRun]) -> pd.DataFrame:
    """One row per run: steps, prompt tokens, prefill computed, tokens from cache, hit rate, TTFT, time."""
    rows = []
    for name, run in runs.items():
        ms = run.final.metrics
        rows.append({
            "run": name, "steps": len(run.traces),
            "prompt tokens": sum(r.num_prompt_tokens for r in run.final.requests if r.parent_id is None),
            "prefill tokens computed": sum(t.num_prefill_tokens for t in run.traces),
            "tokens from cache": sum(t.prefix.num_cached_tokens for t in run.traces),
            "hit rate": hit_rate(run.traces) or 0.0,  # caching off: nothing looked up, nothing served
            "mean TTFT (steps)": _mean([m.ttft_steps for m in ms if m.ttft_steps is not None]),
            "mean TTFT (ms)": _mean([m.ttft_ms for m in ms if m.ttft_ms is not None]),
            "engine time (ms)": sum(t.total_ms for t in run.traces),
        })
    return pd.DataFrame(rows)


REQUEST_COLUMNS = ["request", "prompt tokens", "from cache", "prefill computed (on)", "prefill computed (off)",
                   "TTFT steps (on)", "TTFT steps (off)", "TTFT ms (on)", "TTFT ms (off)"]


def caching_requests_frame(runs: Mapping[str, PolicyRun]) -> pd.DataFrame:
    """One row per request of the "caching on" run, with the same request's figures with caching off."""
    on, off = runs.get("caching on"), runs.get("caching off")
    if on is None or off is None:
        return pd.DataFrame([], columns=REQUEST_COLUMNS)
    prefill = {name: prefill_tokens_by_request(run) for name, run in runs.items()}
    metrics = {name: {m.request_id: m for m in run.final.metrics} for name, run in runs.items()}
    rows = []
    for r in sorted(on.final.requests, key=lambda r: request_sort_key(r.request_id)):
        m_on, m_off = metrics["caching on"].get(r.request_id), metrics["caching off"].get(r.request_id)
        rows.append({
            "request": request_label(r.request_id), "prompt tokens": r.num_prompt_tokens,
            "from cache": m_on.num_cached_tokens if m_on else r.num_cached_tokens,
            "prefill computed (on)": prefill["caching on"].get(r.request_id, 0),
            "prefill computed (off)": prefill["caching off"].get(r.request_id, 0),
            "TTFT steps (on)": m_on.ttft_steps if m_on else None,
            "TTFT steps (off)": m_off.ttft_steps if m_off else None,
            "TTFT ms (on)": m_on.ttft_ms if m_on else None, "TTFT ms (off)": m_off.ttft_ms if m_off else None,
        })
    return pd.DataFrame(rows, columns=REQUEST_COLUMNS)


def caching_comparison_figure(runs: Mapping[str, PolicyRun], font_size: int = 12) -> go.Figure:
    """Per request, caching on beside caching off: prefill tokens computed, TTFT in steps, TTFT in ms."""
    frame = caching_requests_frame(runs)
    labels = [escape_plotly(r) for r in frame["request"]]
    panels = []
    for column, title, unit in (("prefill computed", "Prefill tokens computed per request", "tokens"),
                                ("TTFT steps", "Time to first token (engine steps from arrival)", "steps"),
                                ("TTFT ms", "Time to first token (ms, measured)", "ms")):
        data: list[dict[str, Any]] = [
            dict(type="bar", x=labels, y=values(frame[f"{column} ({side})"]), name=f"caching {side}",
                 marker=dict(color=CACHING_COLORS[f"caching {side}"]), legendgroup=side,
                 showlegend=column == "prefill computed", offsetgroup=side,
                 hovertemplate=f"%{{x}}, caching {side}: %{{y:.4~g}} {unit}<extra></extra>")
            for side in ("on", "off")]
        panels.append(Panel(data, height=150, xaxis=dict(type="category", fixedrange=True),
                            yaxis=dict(title=dict(text=unit), fixedrange=True, rangemode="tozero"), title=title))
    layout = live_layout("Prefix caching on vs off: the same scenario run twice", None, font_size,
                         barmode="group", legend=dict(orientation="h", y=1.0, yanchor="bottom", x=1, xanchor="right"))
    return stack(panels, layout, gap_px=60, margin_px=(80, 40))
