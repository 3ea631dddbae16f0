"""Pipeline and tensor parallelism: what every worker process did in a step (Gantt), the bubble
fraction measured against GPipe's (p - 1) / (m + p - 1), a sweep over m, and the calculator's
view of the same layout. Records in (PipelineTimeline, ParallelLayout, sizing Estimate), figures
and frames out; no streamlit.

    lane "stage 0 · tp 0"  [mb 0][mb 1][mb 2][mb 3]░░░░░░░░░░      one lane per worker, stage 0 on top
    lane "stage 1 · tp 0"  ░░░░░[mb 0][mb 1][mb 2][mb 3]           ░ idle / waiting = the bubble

Drawn with go.Bar(orientation="h", base=start, x=duration) in overlay mode: one trace per unit,
one each for sends, all-reduces, receive waits and idle gaps, so a step is a handful of traces
however many events it has (ui.md 5.3).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import pandas as pd
import plotly.graph_objects as go

from engine.core.config import EngineConfig
from engine.parallel.layout import (CommBytes, ModelDims, WorkerBytes, comm_bytes_per_token, theory_bubble,
                                    worker_bytes)
from engine.parallel.stats import PipelineStats, pipeline_stats
from engine.replay.run import SweepPoint
from engine.core.trace import ParallelLayout, PipelineTimeline, PipelineUnit, StepTrace, WorkEvent
from visualizers.events import Event, note
from visualizers.figures import figure, legend_below, live_layout
from visualizers.steps import step_number
from visualizers.theme import PIPELINE_COLORS, PIPELINE_UNIT_COLORS, text_color_on

GIB = 2**30
MIB = 2**20


def lane_label(stage: int, tp_rank: int) -> str:
    return f"stage {stage} · tp {tp_rank}"


def unit_label(unit: PipelineUnit, schedule: str, one_batch: bool = True) -> str:
    """"mb 2" for GPipe's micro-batch 2 ("5·mb 2" of batch 5 when several steps are drawn),
    "batch 7" for the batch queue's batch 7."""
    if schedule == "batch_queue":
        return f"batch {unit.batch}"
    return f"mb {unit.microbatch}" if one_batch else f"{unit.batch}·mb {unit.microbatch}"


def timed_steps(traces: Sequence[StepTrace]) -> list[tuple[StepTrace, PipelineTimeline]]:
    """The steps that ran on workers, each with its timeline."""
    return [(t, t.pipeline) for t in traces if t.pipeline is not None]


def bubble_title(timeline: PipelineTimeline, s: PipelineStats) -> str:
    p = timeline.pipeline_parallel_size
    return (f"Bubble measured {s.bubble_fraction:.0%} · GPipe (p−1)/(m+p−1) = {p - 1}/{s.num_units + p - 1} = "
            f"{s.theory_bubble:.0%} · comm {s.comm_fraction:.0%}")


def _idle_gaps(events: Sequence[WorkEvent], start: float, end: float) -> list[tuple[float, float]]:
    """The parts of [start, end) that none of ``events`` covers."""
    gaps, cursor = [], start
    for e in sorted(events, key=lambda e: e.start_ms):
        if e.start_ms > cursor:
            gaps.append((cursor, min(e.start_ms, end)))
        cursor = max(cursor, e.end_ms)
        if cursor >= end:
            break
    if cursor < end:
        gaps.append((cursor, end))
    return [(a, b) for a, b in gaps if b > a]


def _bar(name: str, y: list[str], starts: list[float], ends: list[float], color: str, *, width: float = 0.8,
         text: list[str] | None = None, pattern: str = "", legendrank: int = 1000,
         hover: str = "") -> dict[str, Any]:
    bar: dict[str, Any] = dict(type="bar", orientation="h", name=name, y=y, base=starts,
                               x=[b - a for a, b in zip(starts, ends)], width=width,
                               marker=dict(color=color, line=dict(width=0)), legendrank=legendrank,
                               customdata=[[a, b] for a, b in zip(starts, ends)],
                               hovertemplate=f"{name}{hover}<br>%{{y}}<br>%{{customdata[0]:.2f}} – "
                                             "%{customdata[1]:.2f} ms<extra></extra>")
    if pattern:
        bar["marker"]["pattern"] = dict(shape=pattern, fgcolor="#FFFFFF", solidity=0.4)
    if text is not None:
        bar.update(text=text, textposition="inside", insidetextanchor="middle", textangle=0,
                   textfont=dict(color=text_color_on(color)), cliponaxis=False)
    return bar


def gantt_figure(timeline: PipelineTimeline, layout: ParallelLayout | None, font_size: int = 12,
                 step: int | None = None, events: Sequence[Event] = ()) -> go.Figure:
    """One lane per worker (stage 0 on top), each forward a box coloured by its unit; sends and
    all-reduces as thin patterned bars over it, receive waits light, idle gaps grey. The window
    is the one the bubble is measured over (first forward start .. last forward end).
    ``events``: the drawn step's (visualizers.events); its "bubble" is captioned on the longest
    idle gap."""
    bubble = [e for e in events if e.kind == "bubble"]
    p, t = timeline.pipeline_parallel_size, timeline.tensor_parallel_size
    # each stage's layers when the layout is known: "stage 0 · tp 0 (L0–14)"
    spans = {} if layout is None else {s.stage: f" (L{s.start_layer}–{s.end_layer - 1})" for s in layout.stages}
    lanes = [f"{lane_label(s, r)}{spans.get(s, '')}" for s in range(p) for r in range(t)]
    units = {u.unit: u for u in timeline.units}
    one_batch = len({u.batch for u in timeline.units}) <= 1
    forwards = [e for e in timeline.events if e.kind == "forward"]
    data: list[dict[str, Any]] = []
    by_unit: dict[int, list[WorkEvent]] = {}
    for e in forwards:
        by_unit.setdefault(e.unit, []).append(e)
    for n, (u, work) in enumerate(sorted(by_unit.items())):
        label = unit_label(units[u], timeline.schedule, one_batch) if u in units else f"unit {u}"
        tokens = f" · {units[u].num_tokens} tokens" if u in units else ""
        data.append(_bar(label, [lanes[e.rank] for e in work], [e.start_ms for e in work],
                         [e.end_ms for e in work], PIPELINE_UNIT_COLORS[u % len(PIPELINE_UNIT_COLORS)],
                         text=[label] * len(work), legendrank=n, hover=tokens))
    for kind, name, pattern, width in (("recv", "waiting for activations", "", 0.8), ("send", "send", "/", 0.3),
                                       ("all_reduce", "all-reduce", "x", 0.3)):
        work = [e for e in timeline.events if e.kind == kind]
        if work:
            data.append(_bar(name, [lanes[e.rank] for e in work], [e.start_ms for e in work],
                             [e.end_ms for e in work], PIPELINE_COLORS[kind], width=width, pattern=pattern,
                             legendrank=500 if kind == "recv" else 600))
    captions: list[dict[str, Any]] = []
    if forwards:
        start, end = min(e.start_ms for e in forwards), max(e.end_ms for e in forwards)
        idle_y: list[str] = []
        idle_a: list[float] = []
        idle_b: list[float] = []
        for rank in range(p * t):
            for a, b in _idle_gaps([e for e in timeline.events if e.rank == rank], start, end):
                idle_y.append(lanes[rank])
                idle_a.append(a)
                idle_b.append(b)
        if idle_y:
            data.insert(0, _bar("idle", idle_y, idle_a, idle_b, PIPELINE_COLORS["idle"], pattern=".",
                                legendrank=700))
        # the bubble's biggest piece: the longest idle gap or wait for activations inside the window
        gaps = list(zip(idle_y, idle_a, idle_b)) + [
            (lanes[e.rank], max(e.start_ms, start), min(e.end_ms, end)) for e in timeline.events
            if e.kind == "recv" and min(e.end_ms, end) > max(e.start_ms, start)]
        if bubble and gaps:
            lane, a, b = max(gaps, key=lambda g: g[2] - g[1])
            captions.append(note("bubble", f"{bubble[-1].caption} (step {bubble[-1].step}): "
                                           f"{lane.split(' (')[0]} waits {b - a:.1f} ms", (a + b) / 2, lane, font_size))
    s = pipeline_stats(timeline)
    title = bubble_title(timeline, s) if forwards else "No pipeline work in this step"
    fig_layout = live_layout(title, step, font_size, barmode="overlay", height=max(260, 70 * p * t + 130),
                             xaxis=dict(title="ms since the driver sent the step" if one_batch else
                                        "ms since the driver sent the first step shown", zeroline=False),
                             yaxis=dict(categoryorder="array", categoryarray=lanes, autorange="reversed",
                                        type="category", title=dict(text="worker (stage · tp rank)")),
                             legend=legend_below(), margin=dict(l=10, r=10, t=60, b=10),
                             annotations=captions)
    fig_layout["meta"].update(bubble=s.bubble_fraction, theory=s.theory_bubble, lanes=lanes,
                              units=len(timeline.units), schedule=timeline.schedule)
    return figure(data, fig_layout)


def stats_frame(traces: Sequence[StepTrace]) -> pd.DataFrame:
    """One row per step that ran on workers: units, tokens, the driver's span, and the shares of
    lanes x window that were compute, communication and bubble (engine/parallel/stats.py)."""
    rows = []
    for t, line in timed_steps(traces):
        s = pipeline_stats(line)
        rows.append({"step": step_number(t), "schedule": line.schedule, "units": s.num_units,
                     "tokens": sum(u.num_tokens for u in line.units), "span ms": line.span_ms,
                     "window ms": s.window_ms, "compute": s.compute_fraction, "comm": s.comm_fraction,
                     "bubble": s.bubble_fraction, "theory bubble": s.theory_bubble})
    columns = ["step", "schedule", "units", "tokens", "span ms", "window ms", "compute", "comm", "bubble",
               "theory bubble"]
    return pd.DataFrame(rows, columns=columns)


def sweep_figure(points: Sequence[SweepPoint], p: int, font_size: int = 12) -> go.Figure:
    """Measured bubble fraction against GPipe's (p - 1) / (m + p - 1) over m, for one p."""
    ms = [pt.m for pt in points]
    data = [dict(type="scatter", mode="lines+markers", name="GPipe (p−1)/(m+p−1)", x=ms,
                 y=[pt.theory for pt in points], line=dict(color=PIPELINE_COLORS["theory"], dash="dash")),
            dict(type="scatter", mode="lines+markers", name="measured", x=ms, y=[pt.measured for pt in points],
                 line=dict(color=PIPELINE_COLORS["measured"]), marker=dict(size=10),
                 customdata=[pt.window_ms for pt in points],
                 hovertemplate="m=%{x}: %{y:.0%} of lanes × window (%{customdata:.1f} ms)<extra></extra>")]
    layout = live_layout(f"Bubble fraction over micro-batches, p = {p}", None, font_size,
                         xaxis=dict(title="micro-batches m", type="log", tickvals=ms, ticktext=[str(m) for m in ms]),
                         yaxis=dict(title="bubble (share of lanes × window)", tickformat=".0%", rangemode="tozero"),
                         height=340, legend=legend_below())
    layout["meta"].update(p=p, points=len(points))
    return figure(data, layout)


def sweep_frame(points: Sequence[SweepPoint]) -> pd.DataFrame:
    return pd.DataFrame([{"m": pt.m, "measured": pt.measured, "theory": pt.theory, "window ms": pt.window_ms}
                         for pt in points], columns=["m", "measured", "theory", "window ms"])


def worker_frame(workers: Sequence[WorkerBytes]) -> pd.DataFrame:
    return pd.DataFrame([{"worker": lane_label(w.stage, w.tp_rank), "layers": w.num_layers,
                          "weights MiB": w.weight_bytes / MIB, "KV pool MiB": w.kv_bytes / MIB,
                          "total MiB": w.total_bytes / MIB} for w in workers],
                        columns=["worker", "layers", "weights MiB", "KV pool MiB", "total MiB"])


class CalculatorView(NamedTuple):
    """The same p x t seen by the calculator: this engine's per-worker memory (from the layout),
    bytes on the wire per token, and (when the calculator takes the layout) its per-device
    figures on a hardware preset and the roofline decode rate with the schedule's bubble."""

    workers: pd.DataFrame
    figure: go.Figure
    comm: CommBytes
    calculator: pd.DataFrame  # empty when the calculator refuses the layout
    refusal: str  # why the calculator (and vLLM) refuse this t, "" if they do not
    throughput: pd.DataFrame


def calculator_view(layout: ParallelLayout, dims: ModelDims, config: EngineConfig,
                    estimate: Any = None, refusal: str = "", measured: Sequence[StepTrace] = (),
                    kv_bytes_per_token: float | None = None, font_size: int = 12) -> CalculatorView:
    """``config``: the run's EngineConfig (RunMeta.config): weights and activations take
    the bytes of its compute ``dtype`` (a quantized run computes in bfloat16: its weights are
    drawn at 2 B too), the KV pool num_blocks x block_size tokens. ``estimate``:
    engine.sizing.estimate(model, hardware, settings=Settings(tp=t, pp=p)) or None (``refusal``
    then says why); ``measured``: this run's steps, for the measured token rate."""
    from engine.sizing.formats import weight_format  # the calculator's bytes per element

    dtype_bytes = float(weight_format(config.dtype).bytes_per_param)
    pool_tokens = config.cache_config.pool_tokens
    workers = worker_bytes(layout, dims, dtype_bytes, pool_tokens, kv_bytes_per_token)
    frame = worker_frame(workers)
    names = list(frame["worker"])
    data = [dict(type="bar", name=label, x=names, y=list(frame[col]), marker=dict(color=PIPELINE_COLORS[key]))
            for label, col, key in (("weights", "weights MiB", "weights"), ("KV pool", "KV pool MiB", "kv_cache"))]
    fig = figure(data, live_layout("Memory per worker in this engine (from the layout)", None, font_size,
                                   barmode="stack", yaxis=dict(title="MiB"), height=320,
                                   legend=legend_below()))
    comm = comm_bytes_per_token(dims.hidden, dims.num_layers, layout.pipeline_parallel_size,
                                layout.tensor_parallel_size, dtype_bytes)
    calc_rows = []
    if estimate is not None:
        calc_rows = [{"figure": "weights per device (GiB)", "value": estimate.weight_bytes_per_device / GIB},
                     {"figure": "KV cache per device (GiB)", "value": estimate.kv_bytes_per_device / GIB},
                     {"figure": "total per device (GiB)", "value": estimate.total_bytes_per_device / GIB},
                     {"figure": "devices", "value": float(estimate.devices)},
                     {"figure": "roofline decode tokens/s", "value": estimate.decode_tokens_per_s_roofline}]
    calculator = pd.DataFrame(calc_rows, columns=["figure", "value"])
    return CalculatorView(frame, fig, comm, calculator, refusal,
                          throughput_frame(measured, estimate, layout))


def throughput_frame(traces: Sequence[StepTrace], estimate: Any, layout: ParallelLayout) -> pd.DataFrame:
    """The honest throughput note as rows: the tokens/s this run measured (its engine steps on
    this machine, all p x t processes together) and what a model of the same schedule gives on
    the calculator's hardware: roofline decode tokens/s x (1 - theory bubble)."""
    rows = []
    timed = timed_steps(traces)
    if timed:
        ms = sum(t.total_ms for t, _ in timed)
        tokens = sum(u.num_tokens for _, line in timed for u in line.units)
        rows.append({"what": f"measured here: {len(timed)} steps on {layout.num_workers} processes",
                     "ms per step": ms / len(timed), "tokens/s": tokens / (ms / 1000) if ms > 0 else None,
                     "kind": "measured"})
    if estimate is not None:
        m = layout.num_microbatches if layout.schedule == "gpipe" else layout.pipeline_parallel_size
        bubble = theory_bubble(layout.pipeline_parallel_size, m)
        roof = estimate.decode_tokens_per_s_roofline
        rows.append({"what": f"{estimate.hardware_name}: roofline decode, batch {estimate.batch}",
                     "ms per step": 1000 / roof if roof else None, "tokens/s": roof, "kind": "model"})
        rows.append({"what": f"{estimate.hardware_name}: roofline × (1 − bubble {bubble:.0%})",
                     "ms per step": 1000 / (roof * (1 - bubble)) if roof else None,
                     "tokens/s": roof * (1 - bubble), "kind": "model"})
    return pd.DataFrame(rows, columns=["what", "ms per step", "tokens/s", "kind"])
