"""Bubble fraction and communication share measured from a step's PipelineTimeline (torch-free).

    lane = one worker (stage x tp rank); window = first forward start .. last forward end

    stage 0  [F0][F1][F2][F3]............        compute  = forward time minus the all-reduces in it
    stage 1  ....[F0][F1][F2][F3]........        comm     = all-reduce + send time
    stage 2  ........[F0][F1][F2][F3]....        bubble   = the rest of lanes x window: idle,
    stage 3  ............[F0][F1][F2][F3]                   including waits for activations

    compute + comm + bubble = 1 (of lanes x window). GPipe's closed form for p stages and m
    equal units with no communication: bubble = (p - 1) / (m + p - 1) (theory_bubble).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import NamedTuple

from engine.parallel.layout import theory_bubble
from engine.core.trace import PipelineTimeline, PipelineUnit, WorkEvent


class PipelineStats(NamedTuple):
    window_ms: float
    num_lanes: int
    compute_fraction: float
    comm_fraction: float
    bubble_fraction: float
    theory_bubble: float  # (p - 1) / (units + p - 1) for this step's p and unit count
    num_units: int


def _union_ms(intervals: Iterable[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def pipeline_stats(timeline: PipelineTimeline, since_ms: float | None = None) -> PipelineStats:
    """The shares of one step (see the module docstring); ``since_ms`` starts the window later
    (a steady-state stretch of a merged timeline, with the work still in flight from before
    it counted)."""
    forwards = [e for e in timeline.events if e.kind == "forward"]
    lanes = timeline.pipeline_parallel_size * timeline.tensor_parallel_size
    units = len(timeline.units)
    theory = theory_bubble(timeline.pipeline_parallel_size, max(units, 1))
    if not forwards:
        return PipelineStats(0.0, lanes, 0.0, 0.0, 0.0, theory, units)
    start = min(e.start_ms for e in forwards) if since_ms is None else since_ms
    window = max(e.end_ms for e in forwards) - start
    if window <= 0:
        return PipelineStats(0.0, lanes, 0.0, 0.0, 0.0, theory, units)
    total = lanes * window
    by_lane: dict[int, list[WorkEvent]] = {}
    for e in timeline.events:
        by_lane.setdefault(e.rank, []).append(e)
    busy = compute = comm = 0.0
    for events in by_lane.values():
        clipped = [(max(e.start_ms, start), min(e.end_ms, start + window), e.kind) for e in events]
        clipped = [(a, b, k) for a, b, k in clipped if b > a]
        busy += _union_ms((a, b) for a, b, k in clipped if k in ("forward", "send"))
        reduce = _union_ms((a, b) for a, b, k in clipped if k == "all_reduce")
        comm += reduce + _union_ms((a, b) for a, b, k in clipped if k == "send")
        compute += _union_ms((a, b) for a, b, k in clipped if k == "forward") - reduce
    return PipelineStats(window, lanes, compute / total, comm / total, max(0.0, 1 - busy / total), theory, units)


def merge_timelines(timelines: Sequence[PipelineTimeline]) -> PipelineTimeline:
    """Several steps' timelines on one axis (ms from the first one's send, using each one's
    ``offset_ms``), units renumbered in order: the batch queue's overlap between consecutive
    batches shows, and ``pipeline_stats`` of the result is the bubble over the whole stretch,
    gaps between steps (the driver sampling and scheduling) included."""
    if not timelines:
        raise ValueError("timelines: need at least one")
    base = min(t.offset_ms for t in timelines)
    units: list[PipelineUnit] = []
    events: list[WorkEvent] = []
    for t in timelines:
        shift = t.offset_ms - base
        number = {u.unit: len(units) + i for i, u in enumerate(t.units)}
        units.extend(replace(u, unit=number[u.unit]) for u in t.units)
        events.extend(replace(e, unit=number.get(e.unit, e.unit), start_ms=e.start_ms + shift,
                              end_ms=e.end_ms + shift) for e in t.events)
    first = timelines[0]
    span = max(t.offset_ms - base + t.span_ms for t in timelines)
    return replace(first, units=tuple(units), events=tuple(events), span_ms=span, offset_ms=base)
