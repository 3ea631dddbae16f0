"""What happened at which step, in a few words: the events a chart captions where they happen.

``step_events(traces)`` derives them from the StepTrace records alone, in one place, so every
view captions the same event the same way (and a replay captions it exactly like the live run):

* "preemption": the scheduler preempted a request (its KV freed, to be recomputed);
* "prefix hit": an admission found prompt tokens in the prefix cache;
* "split": a prefill chunk stopped short of the request's prompt (chunked prefill: the rest
  comes in later steps; the step sampled no token for it);
* "eviction": the prefix cache evicted nodes (LRU) to make room;
* "rejected draft": speculative verification rejected a draft (the rest of the drafts discarded);
* "bubble": a pipeline step in which the workers spent part of the window idle or waiting.

``notes(events, ...)`` turns the latest of them into Plotly annotations (one per step and
kind, at most ``MAX_NOTES``), so a chart stays legible however long the run.

Steps are numbered as every view numbers them (``visualizers.steps.step_number``: from 1).
Pure functions of records; no engine state.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, Sequence

from engine.parallel.stats import pipeline_stats
from engine.core.trace import StepTrace
from visualizers.steps import step_number
from visualizers.text import escape_plotly
from visualizers.theme import request_label

EventKind = Literal["preemption", "prefix hit", "split", "eviction", "rejected draft", "bubble"]
EVENT_KINDS: tuple[EventKind, ...] = ("preemption", "prefix hit", "split", "eviction", "rejected draft", "bubble")
MAX_NOTES = 5  # annotations drawn per chart, the latest first
MAX_NAMED = 2  # requests named in one caption ("r3, r4 +2 preempted")
NOTE_PREFIX = "event: "  # an event annotation's ``name``: "event: preemption" (tests find them by it)
EVENT_COLOR = "#333333"


@dataclass(frozen=True)
class Event:
    """One thing a step did that a chart should caption at that step."""

    step: int  # the step's label (from 1), as on every step axis
    kind: EventKind
    request_id: str | None  # the request it happened to (None: the cache's or the pipeline's event)
    caption: str  # a few words, plain text (escaped when drawn)
    amount: float = 0.0  # tokens from the cache, nodes evicted, the bubble's share, the draft's position


def _trace_events(t: StepTrace) -> list[Event]:
    """The events of one step, in EVENT_KINDS order."""
    n = step_number(t)
    sampled = {s.request_id for s in t.sampled}
    out = [Event(n, "preemption", rid, f"{request_label(rid)} preempted") for rid in t.preempted]
    out += [Event(n, "prefix hit", h.request_id, f"{request_label(h.request_id)}: {h.num_cached_tokens} tokens cached",
                  h.num_cached_tokens)
            for h in t.prefix.lookups if h.num_cached_tokens > 0]
    out += [Event(n, "split", c.request_id, f"{request_label(c.request_id)} prefill split after {c.num_tokens}",
                  c.num_tokens)
            for c in t.scheduled if c.kind == "prefill" and c.request_id not in sampled
            and c.request_id not in t.preempted]
    if t.prefix.evicted:
        blocks = sum(len(e.block_ids) for e in t.prefix.evicted)
        out.append(Event(n, "eviction", None, f"{len(t.prefix.evicted)} nodes evicted ({blocks} blocks)",
                         len(t.prefix.evicted)))
    for v in t.spec:
        rejected = next((i for i, d in enumerate(v.drafts) if d.outcome == "rejected"), None)
        if rejected is not None:
            out.append(Event(n, "rejected draft", v.request_id,
                             f"{request_label(v.request_id)}: draft {rejected + 1} rejected", rejected + 1))
    if t.pipeline is not None:
        bubble = pipeline_stats(t.pipeline).bubble_fraction
        if bubble > 0:
            out.append(Event(n, "bubble", None, f"bubble {bubble:.0%}", bubble))
    return out


def step_events(traces: Sequence[StepTrace]) -> list[Event]:
    """Every event of ``traces``, step by step (see the module doc for what each kind means)."""
    return [e for t in traces for e in _trace_events(t)]


def caption(group: Sequence[Event]) -> str:
    """One caption for the events of one kind in one step: "r3 preempted", "r3, r4 preempted",
    "r3, r4 +2 preempted"; events without a request (eviction, bubble) keep their own caption."""
    first = group[0]
    if len(group) == 1 or first.request_id is None:
        return first.caption
    names = ", ".join(request_label(e.request_id or "") for e in group[:MAX_NAMED])
    more = f" +{len(group) - MAX_NAMED}" if len(group) > MAX_NAMED else ""
    verbs = {"preemption": "preempted", "prefix hit": "hit the cache", "split": "prefill split",
             "rejected draft": "drafts rejected"}
    return f"{names}{more} {verbs.get(first.kind, first.kind)}"


def grouped(events: Sequence[Event], kinds: Sequence[EventKind] = EVENT_KINDS,
            limit: int = MAX_NOTES) -> list[list[Event]]:
    """Events of ``kinds`` grouped by (step, kind), the latest ``limit`` groups, in step order."""
    groups: dict[tuple[int, str], list[Event]] = {}
    for e in events:
        if e.kind in kinds:
            groups.setdefault((e.step, e.kind), []).append(e)
    latest = sorted(groups.items(), key=lambda kv: (kv[0][0], EVENT_KINDS.index(kv[1][0].kind)))[-limit:]
    return [g for _, g in latest]


def note(kind: EventKind, text: str, x: Any, y: Any, font_size: int, xref: str = "x", yref: str = "y",
         raised: int = 0) -> dict[str, Any]:
    """One caption: an arrow pointing at (x, y) with ``text`` (plain; escaped here) above it,
    ``raised`` rows higher (neighbouring captions alternate so they do not overlap)."""
    return dict(x=x, xref=xref, y=y, yref=yref, text=escape_plotly(text), name=NOTE_PREFIX + kind,
                showarrow=True, arrowhead=2, arrowsize=1, arrowwidth=1.5, arrowcolor=EVENT_COLOR,
                ax=0, ay=-(18 + 16 * raised) * max(font_size, 12) / 12, xanchor="center", yanchor="bottom",
                font=dict(size=font_size - 1, color=EVENT_COLOR), bgcolor="rgba(255,255,255,0.85)",
                bordercolor=EVENT_COLOR, borderwidth=1, borderpad=2)


def notes(events: Sequence[Event], font_size: int, kinds: Sequence[EventKind] = EVENT_KINDS,
          y: Callable[[list[Event]], Any] | None = None, yref: str = "y domain",
          limit: int = MAX_NOTES) -> list[dict[str, Any]]:
    """Annotations (``note``) for the latest ``limit`` (step, kind) groups on a step axis: at
    x = the step, pointing at ``y(group)`` (default: the top of the panel, ``yref`` "y domain")."""
    return [note(group[0].kind, caption(group), group[0].step, 1.0 if y is None else y(group), font_size,
                 yref=yref, raised=i % 2)
            for i, group in enumerate(grouped(events, kinds, limit))]
