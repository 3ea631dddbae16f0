"""Prefix cache over time, and caching on against caching off.

* ``cache_stats_frame``: per step, the prompt tokens looked up at admission, how many came from
  the cache (hit rate, step and cumulative), prefill tokens computed, cached / evictable
  blocks, blocks evicted, copy-on-write copies;
* ``cache_figure``: the block pool (cached blocks drawn as such) above the hit rate, prefill
  tokens computed vs served from the cache, and cached blocks with evictions, on one step axis;
* ``caching_summary`` / ``caching_requests_frame`` / ``caching_comparison_figure``: the same
  scenario run to the end twice (``engine.replay.run.compare_prefix_caching``): prefill tokens
  computed and time to first token, in steps and in ms, per run and per request.

Pure functions of StepTraces, Snapshots and PolicyRuns.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import pandas as pd
import plotly.graph_objects as go

from engine.replay.run import PolicyRun
from engine.core.trace import Snapshot, StepTrace
from visualizers.events import notes, step_events
from visualizers.figures import Panel, legend_below, live_layout, stack
from visualizers.kv_blocks import CACHED_IN_USE, STATE_TRACES, grid_panel
from visualizers.steps import step_number
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
            "step": step_number(t), "lookup tokens": ev.num_lookup_tokens, "cached tokens": ev.num_cached_tokens,
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
                 title="Hit rate (cached / looked-up prompt tokens)")


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
                 title="Prefill tokens: computed, and from the cache")


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
             marker=dict(color=BLOCK_STATE_COLORS["freed outline"]), hovertemplate="step %{x}: %{y} blocks evicted<extra></extra>")]
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
    events = step_events(traces)  # captions where they happen: hits on the tokens, evictions on the blocks
    panels[2].annotations += notes(events, font_size, ("prefix hit",), limit=3)
    panels[3].annotations += notes(events, font_size, ("eviction",), limit=3)
    rate = hit_rate(traces)
    title = f"Prefix cache after {snapshot.step} steps: hit rate " + (f"{rate:.0%}" if rate is not None else "—")
    layout = live_layout(title, snapshot.step, font_size, barmode="stack",
                         legend=legend_below(),
                         margin=dict(l=50, r=10))
    return stack(panels, layout, gap_px=48, margin_px=(70, 60))


# -- caching on vs off ------------------------------------------------------------------------

@dataclass(frozen=True)
class PrefillAccount:
    """Where one request's prefill work went, position by position.

    Rule: a prompt position is *covered* the first time it is either served from the prefix
    cache (an admission's lookup) or computed (a prefill chunk); every later prefill of a
    position, and every prefill of a generated token, is a recompute after a preemption (the
    preemption dropped its KV). Hence, exactly:
    ``prompt_tokens == prompt_computed + prompt_from_cache`` and
    ``prompt_computed + recomputed`` == the prefill tokens the request had computed,
    ``prompt_from_cache + recompute_from_cache`` == the tokens its lookups found cached.
    A parallel-sampling sequence ("3#1") shares its parent's prompt: its prompt is covered when it
    is created, and its ``prompt_tokens`` are 0 (the parent counts them once).
    """

    prompt_tokens: int
    prompt_computed: int  # prompt positions computed for the first time
    prompt_from_cache: int  # prompt positions first served from the cache
    recomputed: int  # prefill positions computed again after a preemption (prompt or generated tokens)
    recompute_from_cache: int  # positions served from the cache again after a preemption

    @property
    def prefill_computed(self) -> int:
        return self.prompt_computed + self.recomputed


def prefill_accounts(run: PolicyRun) -> dict[str, PrefillAccount]:
    """Request id -> its PrefillAccount over the run (see its rule); lookups of a step are taken
    before its chunks (an admission's hit comes before the chunk that computes past it)."""
    prompt = {r.request_id: r.num_prompt_tokens for r in run.final.requests}
    forks = {r.request_id for r in run.final.requests if r.parent_id is not None}
    covered = {rid: (n if rid in forks else 0) for rid, n in prompt.items()}
    tally = {rid: [0, 0, 0, 0] for rid in prompt}  # computed, from cache, recomputed, recompute from cache
    for t in run.traces:
        for h in t.prefix.lookups:
            p, done = prompt.get(h.request_id, 0), covered.get(h.request_id, 0)
            new = max(0, min(h.num_cached_tokens, p) - done)
            acc = tally.setdefault(h.request_id, [0, 0, 0, 0])
            acc[1] += new
            acc[3] += h.num_cached_tokens - new
            covered[h.request_id] = max(done, min(h.num_cached_tokens, p))
        for c in t.scheduled:
            if c.kind != "prefill":
                continue
            p, done = prompt.get(c.request_id, 0), covered.get(c.request_id, 0)
            end = min(c.start + c.num_tokens, p)
            new = max(0, end - max(c.start, done))
            acc = tally.setdefault(c.request_id, [0, 0, 0, 0])
            acc[0] += new
            acc[2] += c.num_tokens - new
            covered[c.request_id] = max(done, end)
    return {rid: PrefillAccount(0 if rid in forks else prompt.get(rid, 0), *acc) for rid, acc in tally.items()}


def prefill_tokens_by_request(run: PolicyRun) -> dict[str, int]:
    """Prefill (and recompute) tokens each request had computed over the run."""
    return {rid: a.prefill_computed for rid, a in prefill_accounts(run).items()}


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


# The summary's token columns add up, row by row: prompt tokens = computed + from cache;
# prefill tokens computed = computed + recomputed after preemption.
SUMMARY_TOKEN_COLUMNS = ("prompt tokens", "computed", "from cache", "recomputed after preemption",
                         "from cache after preemption", "prefill tokens computed")


def caching_summary(runs: Mapping[str, PolicyRun]) -> pd.DataFrame:
    """One row per run: steps, the prompt tokens split into computed and served from the cache,
    the prefill recomputed after preemptions (and the part of it the cache served), prefill
    tokens computed in all, hit rate, TTFT, time (PrefillAccount's rule: the columns add up)."""
    rows = []
    for name, run in runs.items():
        ms = run.final.metrics
        accounts = prefill_accounts(run).values()
        prompt, computed, cached, recomputed, recached = (sum(getattr(a, f) for a in accounts) for f in (
            "prompt_tokens", "prompt_computed", "prompt_from_cache", "recomputed", "recompute_from_cache"))
        rows.append({
            "run": name, "steps": len(run.traces), "prompt tokens": prompt, "computed": computed,
            "from cache": cached, "recomputed after preemption": recomputed,
            "from cache after preemption": recached, "prefill tokens computed": computed + recomputed,
            "hit rate": hit_rate(run.traces) or 0.0,  # caching off: nothing looked up, nothing served
            "mean TTFT (steps)": _mean([m.ttft_steps for m in ms if m.ttft_steps is not None]),
            "mean TTFT (ms)": _mean([m.ttft_ms for m in ms if m.ttft_ms is not None]),
            "engine time (ms)": sum(t.total_ms for t in run.traces),
        })
    return pd.DataFrame(rows)


REQUEST_COLUMNS = ["request", "prompt tokens", "from cache", "prefill computed (on)", "prefill computed (off)",
                   "recomputed (on)", "recomputed (off)", "TTFT steps (on)", "TTFT steps (off)", "TTFT ms (on)",
                   "TTFT ms (off)"]


def caching_requests_frame(runs: Mapping[str, PolicyRun]) -> pd.DataFrame:
    """One row per request of the "caching on" run, with the same request's figures with caching off.

    Per side: prompt tokens = prefill computed - recomputed (after preemption) + from cache (with
    caching off, from cache is 0)."""
    on, off = runs.get("caching on"), runs.get("caching off")
    if on is None or off is None:
        return pd.DataFrame([], columns=REQUEST_COLUMNS)
    accounts = {name: prefill_accounts(run) for name, run in runs.items()}
    metrics = {name: {m.request_id: m for m in run.final.metrics} for name, run in runs.items()}
    empty = PrefillAccount(0, 0, 0, 0, 0)
    rows = []
    for r in sorted(on.final.requests, key=lambda r: request_sort_key(r.request_id)):
        m_on, m_off = metrics["caching on"].get(r.request_id), metrics["caching off"].get(r.request_id)
        a_on = accounts["caching on"].get(r.request_id, empty)
        a_off = accounts["caching off"].get(r.request_id, empty)
        rows.append({
            "request": request_label(r.request_id), "prompt tokens": a_on.prompt_tokens,
            "from cache": a_on.prompt_from_cache,
            "prefill computed (on)": a_on.prefill_computed, "prefill computed (off)": a_off.prefill_computed,
            "recomputed (on)": a_on.recomputed, "recomputed (off)": a_off.recomputed,
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
