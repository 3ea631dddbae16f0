"""Batch composition views: what each engine step computed, per request.

* token-budget bars: per step, the tokens each request contributed (prefill chunks solid,
  decodes faded) against ``max_num_batched_tokens``, with a second panel counting decodes
  and prefill chunks so single-token decodes stay visible next to 256-token chunks;
* swim lane: request x step, state in {not arrived, waiting, prefill, decode, preempted, finished};
* queue lengths over time; TTFT and time per output token per request.

Pure functions of StepTraces and Snapshots.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import pandas as pd
import plotly.graph_objects as go

from engine.core.trace import Snapshot, StepTrace
from visualizers.events import EventKind, notes, step_events
from visualizers.figures import Panel, figure, hline, live_layout, stack
from visualizers.steps import step_number
from visualizers.theme import (CHUNK_KIND_COLORS, CHUNK_OPACITY, LANE_STATE_COLORS, LANE_STATES, QUEUE_COLORS,
                               discrete_colorscale, plot_label, request_color, request_label,
                               request_sort_key, text_color_on)

LANE_EVENTS: tuple[EventKind, ...] = ("preemption", "split", "prefix hit")  # captioned on the swim lane
MAX_TEXT_STEPS = 80  # print prefill token counts in swim-lane cells only up to this many steps


@dataclass(frozen=True)
class Lanes:
    """The swim lane as data: ``states[i][j]`` is request ``request_ids[i]`` at ``steps[j]``."""

    request_ids: tuple[str, ...]
    steps: tuple[int, ...]
    states: tuple[tuple[str, ...], ...]
    tokens: tuple[tuple[int, ...], ...]  # tokens computed for that request in that step

    def count(self, state: str) -> list[int]:
        """How many requests were in ``state`` at each step."""
        return [sum(1 for row in self.states if row[j] == state) for j in range(len(self.steps))]


def lanes(traces: Sequence[StepTrace], request_ids: Sequence[str] = ()) -> Lanes:
    """Reconstruct every request's state at every step from the traces alone.

    A request is "not arrived" until the step whose trace lists it in ``arrived``; in a step
    it is "preempted" if the scheduler evicted it, else the kind of chunk it got ("prefill" /
    "decode"), else "waiting" (queued, or running without budget this step); after the step
    that lists it in ``finished`` it is "finished".
    """
    seen = set(request_ids)
    for t in traces:
        seen.update(t.arrived)
        seen.update(c.request_id for c in t.scheduled)
    ids = tuple(sorted(seen, key=request_sort_key))
    arrived = {rid: False for rid in ids}
    finished = {rid: False for rid in ids}
    states: dict[str, list[str]] = {rid: [] for rid in ids}
    tokens: dict[str, list[int]] = {rid: [] for rid in ids}
    for t in traces:
        chunks = {c.request_id: c for c in t.scheduled}
        preempted = set(t.preempted)
        for rid in ids:
            arrived[rid] = arrived[rid] or rid in t.arrived
            chunk = chunks.get(rid)
            if finished[rid]:
                state = "finished"
            elif rid in preempted:
                state = "preempted"
            elif chunk is not None:
                state = chunk.kind
            elif arrived[rid]:
                state = "waiting"
            else:
                state = "not arrived"
            states[rid].append(state)
            tokens[rid].append(chunk.num_tokens if chunk is not None else 0)
        for rid in t.finished:
            if rid in finished:
                finished[rid] = True
    return Lanes(ids, tuple(step_number(t) for t in traces), tuple(tuple(states[r]) for r in ids),
                 tuple(tuple(tokens[r]) for r in ids))


def _request_ids(snapshot: Snapshot | None) -> tuple[str, ...]:
    return tuple(r.request_id for r in snapshot.requests) if snapshot is not None else ()


CHUNK_KINDS: tuple[tuple[str, str], ...] = (("prefill", "prefill chunk"), ("decode", "decode"))


def budget_panel(traces: Sequence[StepTrace]) -> Panel:
    """Tokens per step, stacked by request, vs the budget.

    One bar per (request, step) chunk, coloured by its request; the bars sit in one trace per
    chunk kind (solid = prefill chunk, faded = decode: CHUNK_OPACITY) rather than one per request,
    and without fill patterns, so a step's redraw in the browser is two bar traces, not a
    patterned trace per request. Request and kind are in each bar's hover (``customdata``:
    escaped request label, kind); the swim lane's chips tie colours to requests, so the bars
    take no legend entries (a kind's entry could only show one request's colour).
    """
    per_kind: dict[str, list[tuple[str, int, int]]] = {kind: [] for kind, _ in CHUNK_KINDS}
    for t in traces:
        for c in sorted(t.scheduled, key=lambda c: request_sort_key(c.request_id)):
            per_kind.setdefault(c.kind, []).append((c.request_id, step_number(t), c.num_tokens))
    data = []
    for kind, name in CHUNK_KINDS:
        pts = per_kind[kind]
        data.append(dict(
            type="bar", x=[p[1] for p in pts], y=[p[2] for p in pts], name=name, showlegend=False,
            marker=dict(color=[request_color(p[0]) for p in pts], opacity=CHUNK_OPACITY[kind]), customdata=[[plot_label(p[0]), kind] for p in pts],
            hovertemplate="%{customdata[0]} step %{x}: %{y} tokens (%{customdata[1]})<extra></extra>",
        ))
    shapes, notes = [], []
    if traces:
        budget = traces[-1].token_budget
        shape, note = hline(budget, f"token budget {budget}")
        shapes, notes = [shape], [note]
    return Panel(data, height=210, shapes=shapes, annotations=notes,
                 xaxis=dict(title=dict(text="engine step"), fixedrange=True),
                 yaxis=dict(title=dict(text="tokens"), fixedrange=True, rangemode="tozero"),
                 title="Tokens per step (colour = request; solid = prefill, faded = decode)")


def counts_panel(traces: Sequence[StepTrace]) -> Panel:
    """How many decodes and prefill chunks each step held: a 1-token decode is invisible beside a
    256-token chunk on the token scale; here it counts as one."""
    steps = [step_number(t) for t in traces]
    data = [dict(type="bar", x=steps, y=[sum(1 for c in t.scheduled if c.kind == kind) for t in traces],
                 name=name, marker=dict(color=CHUNK_KIND_COLORS[kind]), legendgroup="counts",
                 hovertemplate=f"step %{{x}}: %{{y}} {name}<extra></extra>")
            for kind, name in (("decode", "decodes"), ("prefill", "prefill chunks"))]
    return Panel(data, height=80, xaxis=dict(title=dict(text="engine step"), fixedrange=True),
                 yaxis=dict(title=dict(text="requests"), fixedrange=True, rangemode="tozero"),
                 title="Requests per step: decodes and prefill chunks")


def lane_heatmap(lane: Lanes, xaxis: str = "x", yaxis: str = "y") -> dict[str, Any]:
    """The swim lane as one Heatmap trace (discrete colours: LANE_STATES order).

    No cell text: Plotly lays out each heatmap cell's text on every redraw (~15 ms per 300 cells
    in Chromium), so the lane numbers only the prefill cells, with ``lane_numbers``.
    """
    codes = [[LANE_STATES.index(s) for s in row] for row in lane.states]
    hover = [[f"{s}" + (f", {n} tokens" if n else "") for s, n in zip(srow, nrow)]
             for srow, nrow in zip(lane.states, lane.tokens)]
    return dict(
        type="heatmap", z=codes, x=list(lane.steps), y=[plot_label(r) for r in lane.request_ids],
        colorscale=discrete_colorscale([LANE_STATE_COLORS[s] for s in LANE_STATES]),
        zmin=-0.5, zmax=len(LANE_STATES) - 0.5, showscale=False, xgap=1, ygap=1,
        customdata=hover, hovertemplate="%{y}, step %{x}: %{customdata}<extra></extra>", name="swim lane",
        xaxis=xaxis, yaxis=yaxis,
    )


def lane_numbers(lane: Lanes, xaxis: str = "x", yaxis: str = "y", font_size: int = 12) -> list[dict[str, Any]]:
    """Token counts of the prefill cells as one text-only Scatter trace over the heatmap.

    A decode always computes one token (its colour says so), so only prefill cells carry a
    number; none once the lane is wider than MAX_TEXT_STEPS steps (cells too narrow to read).
    """
    if not lane.steps or len(lane.steps) > MAX_TEXT_STEPS:
        return []
    cells = [(step, plot_label(rid), n) for rid, srow, nrow in zip(lane.request_ids, lane.states, lane.tokens)
             for step, s, n in zip(lane.steps, srow, nrow) if s == "prefill"]
    return [dict(type="scatter", mode="text", x=[c[0] for c in cells], y=[c[1] for c in cells],
                 text=[str(c[2]) for c in cells], name="prefill tokens",
                 textfont=dict(size=font_size - 2, color=text_color_on(LANE_STATE_COLORS["prefill"])),
                 showlegend=False, hoverinfo="skip", xaxis=xaxis, yaxis=yaxis)]


def state_legend(xaxis: str = "x", yaxis: str = "y") -> list[dict[str, Any]]:
    """Legend-only entries for the lane states (a heatmap has no legend of its own)."""
    return [dict(type="scatter", x=[None], y=[None], mode="markers", name=s, legendgroup="states",
                 marker=dict(symbol="square", size=12, color=LANE_STATE_COLORS[s], line=dict(color="#999999", width=1)),
                 hoverinfo="skip", xaxis=xaxis, yaxis=yaxis) for s in LANE_STATES[1:]]


def request_chips(lane: Lanes, xaxis: str = "x", yaxis: str = "y") -> list[dict[str, Any]]:
    """A square in each request's colour left of its lane, tying the lane to the other views."""
    if not lane.request_ids:
        return []
    x0 = (lane.steps[0] if lane.steps else 0) - 1.2
    return [dict(type="scatter", x=[x0] * len(lane.request_ids), y=[plot_label(r) for r in lane.request_ids],
                 mode="markers", marker=dict(symbol="square", size=12, color=[request_color(r) for r in lane.request_ids]),
                 name="request colour", showlegend=False, hovertemplate="%{y}<extra></extra>",
                 xaxis=xaxis, yaxis=yaxis)]


def lane_panel(traces: Sequence[StepTrace], snapshot: Snapshot | None = None, font_size: int = 12) -> Panel:
    """Requests (rows, arrival order) x engine steps (columns), coloured by what each did."""
    lane = lanes(traces, _request_ids(snapshot))
    data = ([lane_heatmap(lane)] if lane.steps else []) + lane_numbers(lane, font_size=font_size) + \
        request_chips(lane) + state_legend()
    captions = notes(step_events(traces), font_size, LANE_EVENTS, y=lambda g: plot_label(g[0].request_id or ""),
                     yref="y")
    return Panel(data, height=max(90, 22 * len(lane.request_ids)), annotations=captions,
                 xaxis=dict(title=dict(text="engine step"), fixedrange=True),
                 yaxis=dict(autorange="reversed", fixedrange=True, type="category"),
                 title="Swim lane: each request's state per step (number = prefill tokens)")


def queue_frame(traces: Sequence[StepTrace], snapshot: Snapshot | None = None) -> pd.DataFrame:
    """Per step: requests waiting (arrived, not computed this step), running, preempted."""
    lane = lanes(traces, _request_ids(snapshot))
    waiting = lane.count("waiting")
    preempted = lane.count("preempted")
    return pd.DataFrame({
        "step": [step_number(t) for t in traces],
        "waiting": [w + p for w, p in zip(waiting, preempted)],
        "running": [t.num_running for t in traces],
        "preempted": preempted,
    })


def queue_panel(traces: Sequence[StepTrace], snapshot: Snapshot | None = None) -> Panel:
    """Waiting and running requests per step; a cross where a step preempted requests."""
    frame = queue_frame(traces, snapshot)
    data = [dict(type="scatter", x=list(frame["step"]), y=list(frame[col]), name=col, mode="lines",
                 legendgroup="queues", line=dict(color=QUEUE_COLORS[col], width=3, shape="hv"))
            for col in ("waiting", "running")]
    pre = frame[frame["preempted"] > 0]
    data.append(dict(type="scatter", x=list(pre["step"]), y=list(pre["preempted"]), name="preempted", mode="markers",
                     legendgroup="queues", marker=dict(color=QUEUE_COLORS["preempted"], size=11, symbol="x")))
    return Panel(data, height=110, xaxis=dict(title=dict(text="engine step"), fixedrange=True),
                 yaxis=dict(title=dict(text="requests"), fixedrange=True, rangemode="tozero"),
                 title="Queue lengths")


def timeline_figure(traces: Sequence[StepTrace], snapshot: Snapshot | None = None, font_size: int = 12) -> go.Figure:
    """The live view: token budget, batch counts, swim lane and queues on one shared step axis."""
    return stack([budget_panel(traces), counts_panel(traces), lane_panel(traces, snapshot, font_size),
                  queue_panel(traces, snapshot)],
                 live_layout(f"Batch composition after {len(traces)} steps", len(traces), font_size,
                             barmode="stack", legend=dict(tracegroupgap=18)),
                 shared_x=True, gap_px=48, margin_px=(70, 50))


def latency_frame(snapshot: Snapshot) -> pd.DataFrame:
    """Per request: arrival, TTFT (steps and ms), time per output token, end-to-end, preemptions."""
    status = {r.request_id: r.status.value for r in snapshot.requests}  # the label shown
    rows = []
    for m in sorted(snapshot.metrics, key=lambda m: request_sort_key(m.request_id)):
        latency_steps = None if m.finished_step is None else m.finished_step - m.arrival_step + 1
        rows.append({"request": request_label(m.request_id), "status": status.get(m.request_id, ""),
                     "arrival step": m.arrival_step + 1, "TTFT (steps)": m.ttft_steps, "TTFT (ms)": m.ttft_ms,
                     "TPOT (ms)": m.tpot_ms, "latency (steps)": latency_steps, "E2E (ms)": m.e2e_ms,
                     "output tokens": m.num_output_tokens, "preemptions": m.num_preemptions})
    return pd.DataFrame(rows, columns=["request", "status", "arrival step", "TTFT (steps)", "TTFT (ms)", "TPOT (ms)",
                                       "latency (steps)", "E2E (ms)", "output tokens", "preemptions"])


def latency_figure(snapshot: Snapshot, font_size: int = 12) -> go.Figure:
    """TTFT and time per output token per request, each bar in the request's colour."""
    metrics = sorted(snapshot.metrics, key=lambda m: request_sort_key(m.request_id))
    data = []
    for axis, attr in (("", "ttft_ms"), ("2", "tpot_ms")):
        pts = [m for m in metrics if getattr(m, attr) is not None]
        data.append(dict(type="bar", x=[plot_label(m.request_id) for m in pts], y=[getattr(m, attr) for m in pts],
                         marker=dict(color=[request_color(m.request_id) for m in pts]), name=attr, showlegend=False,
                         xaxis="x" + axis, yaxis="y" + axis, hovertemplate="%{x}: %{y:.1f} ms<extra></extra>"))
    category = dict(type="category", fixedrange=True)
    return figure(data, dict(
        height=300, margin=dict(l=10, r=10, t=60, b=40), font=dict(size=font_size),
        title=dict(text="Latency per request", font=dict(size=font_size + 3)), meta={"step": snapshot.step},
        dragmode=False,
        xaxis=dict(domain=[0.0, 0.47], **category), xaxis2=dict(domain=[0.53, 1.0], anchor="y2", **category),
        yaxis=dict(title=dict(text="time to first token (ms)"), fixedrange=True, rangemode="tozero"),
        yaxis2=dict(title=dict(text="time per output token (ms)"), anchor="x2", fixedrange=True, rangemode="tozero"),
    ))
