"""Live-view visualizers (kv_blocks, batching, comparison, steps) checked on their figures' DATA.

Inputs come from the real engine on ``tiny-random`` (instant): "chat-burst" (16 requests, more
than max_num_seqs, arrivals mid-run) and "memory-pressure" (a 40-block pool: preemption and
recompute), stepped one step at a time with ``check_integrity()`` after each. Every expected
value is computed here from the engine's records (StepTrace, Snapshot), not from the
visualizer under test, and every figure passes full Plotly validation and JSON serialisation.
"""
from __future__ import annotations

import dataclasses
import io
import json
import math
from collections import Counter
from typing import TYPE_CHECKING, Any, Callable, Iterator

import pandas as pd
import plotly.graph_objects as go
import pytest

from engine.replay.run import LiveRun, PolicyRun, RunView, compare_policies
from engine.replay.scenario import load_scenario
from engine.core.trace import BlockState, RequestState, RequestStatus, Snapshot, StepTrace
from visualizers import batching as vb
from visualizers import comparison as vc
from visualizers import kv_blocks as vk
from visualizers import steps as vs
from visualizers.figures import validated
from visualizers.theme import (BLOCK_STATE_COLORS, CHUNK_KIND_COLORS, CHUNK_OPACITY, LANE_STATES, POLICY_COLORS,
                               QUEUE_COLORS, REQUEST_COLORS, request_color, request_label, request_sort_key)

if TYPE_CHECKING:
    from engine.model.shared import SharedModel

FADED = 0.12  # opacity of requests other than the focused one (kv_blocks)

# Where each recorded run is captured: number of steps taken -> a RunView. The "end" view is the
# finished run. Chosen so the views cover: a first big prefill (chat-burst@1), a step that frees
# finished requests' blocks (chat-burst@16), one that allocates for a newcomer (chat-burst@17), a
# preemption (memory-pressure@20), a recompute after it (memory-pressure@65) and finished runs.
STOPS: dict[str, tuple[int, ...]] = {"chat-burst": (1, 16, 17, 30), "memory-pressure": (20, 65)}
VIEW_KEYS: list[str] = [f"{name}@{n}" for name, stops in STOPS.items() for n in stops] + \
    [f"{name}@end" for name in STOPS]
END_KEYS: list[str] = [f"{name}@end" for name in STOPS]


# -- recording real runs ----------------------------------------------------------------------

def _record(model: "SharedModel", name: str, stops: tuple[int, ...]) -> dict[str, RunView]:
    """Step scenario ``name`` to the end, checking invariants after every step; views at ``stops``."""
    # Prefix caching off: these tests pin the pool drawn without sharing (the prefix-cache
    # states are covered by tests/test_prefix_visualizers.py).
    run = LiveRun.from_scenario(load_scenario(name), model, enable_prefix_caching=False)
    run.engine.check_integrity()
    out: dict[str, RunView] = {}
    while not run.done:
        assert run.step() != []
        run.engine.check_integrity()
        n = len(run.traces)
        if n in stops:
            out[f"{name}@{n}"] = run.view()
        assert n < 1000, f"{name} did not finish"
    out[f"{name}@end"] = run.view()
    assert out[f"{name}@end"].done
    return out


@pytest.fixture(scope="module")
def recorded(tiny: "SharedModel", torch_single_thread: None) -> dict[str, RunView]:
    """Every view of VIEW_KEYS, from one live run per scenario."""
    views: dict[str, RunView] = {}
    for name, stops in STOPS.items():
        views.update(_record(tiny, name, stops))
    assert sorted(views) == sorted(VIEW_KEYS)
    return views


@pytest.fixture(params=VIEW_KEYS)
def view(request: pytest.FixtureRequest, recorded: dict[str, RunView]) -> RunView:
    return recorded[request.param]


@pytest.fixture(params=END_KEYS)
def full(request: pytest.FixtureRequest, recorded: dict[str, RunView]) -> RunView:
    """A finished run: every StepTrace plus the final snapshot."""
    return recorded[request.param]


@pytest.fixture(scope="module")
def policy_runs(tiny: "SharedModel", torch_single_thread: None) -> dict[str, dict[str, PolicyRun]]:
    """compare_policies (static vs continuous) on both scenarios."""
    return {name: compare_policies(load_scenario(name), tiny) for name in STOPS}


# -- helpers ----------------------------------------------------------------------------------

def check(fig: go.Figure) -> go.Figure:
    """Full Plotly validation and a JSON round trip; returns the validated figure to inspect."""
    assert isinstance(fig, go.Figure)
    out = validated(fig)
    json.loads(fig.to_json())
    json.loads(out.to_json())
    return out


def on_axis(fig: go.Figure, axis: str) -> list[Any]:
    """The traces drawn on x axis ``axis`` ("x", "x2", ...)."""
    return [t for t in fig.data if (t.xaxis or "x") == axis]


def seq(value: Any) -> list[Any]:
    """A Plotly array property (tuple, list, numpy array, scalar) as a plain list."""
    if value is None:
        return []
    if isinstance(value, (str, int, float)):
        return [value]
    return [seq(v) if not isinstance(v, (str, int, float)) and v is not None and hasattr(v, "__len__") else v
            for v in value]


def tables(snapshot: Snapshot) -> list[RequestState]:
    """Requests holding blocks, in id order (computed here, not by the visualizer)."""
    return sorted((r for r in snapshot.requests if r.block_table), key=lambda r: request_sort_key(r.request_id))


def fill_opacity(block: BlockState, block_size: int) -> float:
    """The fill rule kv_blocks documents: fuller blocks are more opaque (0.35 .. 1.0)."""
    return 0.35 + 0.65 * block.num_tokens / block_size


def chunks(trace: StepTrace) -> dict[str, Any]:
    return {c.request_id: c for c in trace.scheduled}


def grid_markers(traces: list[Any]) -> Iterator[tuple[Any, int, int]]:
    """(trace, marker index, block id) for every marker of the block-grid traces."""
    for t in traces:
        for i, cd in enumerate(seq(t.customdata)):
            yield t, i, int(cd[0])


# -- the recorded runs really cover the cases the views draw ----------------------------------

def test_recorded_views_cover_allocation_free_preemption_and_recompute(recorded: dict[str, RunView]) -> None:
    """The chosen steps exercise every event the views mark, so the tests below are not vacuous."""
    for key, v in recorded.items():
        assert v.step == len(v.traces) == v.snapshot.step, key
        assert v.last_trace is v.traces[-1]
        assert v.meta.kv_bytes_per_token == v.snapshot.kv_bytes_per_token > 0
        assert v.last_trace.num_free_blocks == v.snapshot.num_free_blocks, key
    assert recorded["chat-burst@16"].last_trace.blocks_freed and recorded["chat-burst@16"].last_trace.finished
    assert recorded["chat-burst@17"].last_trace.blocks_allocated and recorded["chat-burst@17"].last_trace.arrived
    pre = recorded["memory-pressure@20"].last_trace
    assert pre.preempted and pre.blocks_freed and pre.blocks_allocated
    assert any(c.resumed and c.kind == "prefill" for c in recorded["memory-pressure@65"].last_trace.scheduled)
    end = recorded["memory-pressure@end"].snapshot
    assert sum(r.num_preemptions for r in end.requests) >= 2
    assert len(recorded["chat-burst@end"].snapshot.requests) <= len(REQUEST_COLORS)  # no colour repeats


# -- kv_blocks: the block pool grid ------------------------------------------------------------

def _grid(v: RunView) -> list[Any]:
    """Block-grid traces of the live kv_figure (its first panel)."""
    return on_axis(check(vk.kv_figure(v.snapshot, v.last_trace)), "x")


def test_grid_has_exactly_one_marker_per_block_at_its_cell(view: RunView) -> None:
    """Markers across the grid traces == num_blocks; each block id once, at (id % cols, id // cols);
    the panel title's used / free counts are the snapshot's."""
    snap = view.snapshot
    cols = vk.grid_columns(snap.num_blocks)
    free = snap.num_free_blocks
    fig = check(vk.kv_figure(snap, view.last_trace))
    assert fig.layout.meta == {"step": snap.step}
    title = f"<b>{vk.pool_title(snap)}"
    assert vk.pool_title(snap) == f"Block pool: {snap.num_blocks - free} used, {free} free / {snap.num_blocks}"
    assert any(a.text.startswith(title) for a in fig.layout.annotations)
    grid = _grid(view)
    ids = [bid for _, _, bid in grid_markers(grid)]
    assert sum(len(seq(t.x)) for t in grid) == snap.num_blocks
    assert sorted(ids) == list(range(snap.num_blocks))
    for t, i, bid in grid_markers(grid):
        assert (seq(t.x)[i], seq(t.y)[i]) == (bid % cols, bid // cols)
        assert t.type == "scatter" and t.marker.symbol == "square"


def test_grid_traces_are_free_then_one_per_request_in_its_own_colour(view: RunView) -> None:
    """"free" holds exactly the free blocks; one trace per owning request, in request_color, holding
    exactly that request's block table; no two requests share a colour."""
    snap = view.snapshot
    blocks = {b.block_id: b for b in snap.blocks}
    held = tables(snap)
    assert {r.request_id for r in held} == set(snap.running)
    assert all(b.ref_count <= 1 for b in snap.blocks)  # no prefix cache: nothing is shared
    grid = _grid(view)
    names = [t.name for t in grid]
    expected = (["free"] if snap.num_free_blocks else []) + [request_label(r.request_id) for r in held]
    assert names == expected
    by_name = {t.name: t for t in grid}
    if snap.num_free_blocks:
        free = by_name["free"]
        free_ids = {int(cd[0]) for cd in seq(free.customdata)}
        assert len(free_ids) == snap.num_free_blocks == sum(1 for b in snap.blocks if b.ref_count == 0)
        assert all(blocks[i].ref_count == 0 for i in free_ids)
        assert free.marker.color == BLOCK_STATE_COLORS["free"]
        assert seq(free.marker.opacity) == [1.0] * len(free_ids)
    for r in held:
        t = by_name[request_label(r.request_id)]
        ids = [int(cd[0]) for cd in seq(t.customdata)]
        assert sorted(ids) == sorted(r.block_table)
        assert t.marker.color == request_color(r.request_id)
        assert seq(t.marker.opacity) == pytest.approx([fill_opacity(blocks[i], snap.block_size) for i in ids])
        for cd in seq(t.customdata):
            b = blocks[int(cd[0])]
            assert cd[1] == request_label(r.request_id) and cd[2] == b.ref_count == 1
            assert cd[3] == b.num_tokens
    colours = [t.marker.color for t in grid if t.name != "free"]
    assert len(set(colours)) == len(colours)
    assert "shared (ref>1)" not in names


def test_grid_puts_blocks_with_ref_count_above_one_in_the_shared_trace(recorded: dict[str, RunView]) -> None:
    """A block held by two block tables (ref 2) leaves its owner's trace for "shared (ref>1)"."""
    snap = recorded["chat-burst@16"].snapshot
    a, b = tables(snap)[:2]
    shared_id = a.block_table[0]
    blocks = tuple(dataclasses.replace(x, ref_count=2, owners=(a.request_id, b.request_id))
                   if x.block_id == shared_id else x for x in snap.blocks)
    requests = tuple(dataclasses.replace(r, block_table=r.block_table + (shared_id,)) if r.request_id == b.request_id
                     else r for r in snap.requests)
    shared_snap = dataclasses.replace(snap, blocks=blocks, requests=requests)
    grid = on_axis(check(vk.kv_figure(shared_snap)), "x")
    assert [t.name for t in grid][-1] == "shared (ref>1)"
    shared = grid[-1]
    assert shared.marker.color == BLOCK_STATE_COLORS["shared"]
    assert seq(shared.customdata) == [[shared_id, f"{request_label(a.request_id)}, {request_label(b.request_id)}",
                                       2, blocks[shared_id].num_tokens, seq(shared.customdata)[0][4],
                                       vk.cache_note(blocks[shared_id])]]
    owner = next(t for t in grid if t.name == request_label(a.request_id))
    assert shared_id not in {int(cd[0]) for cd in seq(owner.customdata)}
    assert sum(len(seq(t.x)) for t in grid) == snap.num_blocks
    frame = vk.block_table_frame(shared_snap)
    assert list(frame.loc[frame["physical"] == shared_id, "ref count"]) == [2, 2]


def test_grid_outlines_blocks_allocated_and_freed_in_the_last_step(view: RunView) -> None:
    """Allocated in the last trace: dark outline; freed (and not re-allocated): red outline; width 3;
    every other block: no outline. Without a trace nothing is outlined."""
    trace = view.last_trace
    assert trace is not None
    allocated, freed = set(trace.blocks_allocated), set(trace.blocks_freed)
    grid = _grid(view)
    seen_alloc, seen_freed = set(), set()
    for t, i, bid in grid_markers(grid):
        colour, width = seq(t.marker.line.color)[i], seq(t.marker.line.width)[i]
        if bid in allocated:
            assert (colour, width) == (vk.ALLOCATED_OUTLINE, 3)
            seen_alloc.add(bid)
        elif bid in freed:
            assert (colour, width) == (vk.FREED_OUTLINE, 3)
            seen_freed.add(bid)
        else:
            assert width == 0
    assert seen_alloc == allocated and seen_freed == freed - allocated
    if freed - allocated:  # a freed block that nobody took again is drawn free
        free = next(t for t in grid if t.name == "free")
        assert (freed - allocated) <= {int(cd[0]) for cd in seq(free.customdata)}
    plain = on_axis(check(vk.kv_figure(view.snapshot)), "x")
    assert all(w == 0 for t in plain for w in seq(t.marker.line.width))


def test_focus_fades_every_other_request_in_grid_and_tables(view: RunView) -> None:
    """With focus set, the focused request keeps its fill opacity, others drop to 0.12, free stays 1;
    the block-table rows fade the same way."""
    snap = view.snapshot
    held = tables(snap)
    blocks = {b.block_id: b for b in snap.blocks}
    focus = held[-1].request_id if held else "0"  # at the end nobody holds blocks: only "free" is drawn
    fig = check(vk.kv_figure(snap, view.last_trace, focus=focus))
    faded = focused = 0
    for axis, id_col in (("x", 0), ("x2", 1)):  # grid customdata[0] / table customdata[1] = block id
        for t in on_axis(fig, axis):
            if t.name == "no tables":  # the empty tables panel's invisible point (nothing to fade)
                continue
            opacity = seq(t.marker.opacity)
            if t.name == "free":
                assert opacity == [1.0] * len(opacity)
            elif t.name == request_label(focus):
                ids = [int(cd[id_col]) for cd in seq(t.customdata)]
                assert opacity == pytest.approx([fill_opacity(blocks[i], snap.block_size) for i in ids])
                assert FADED not in opacity
                focused += 1
            else:
                assert opacity == [FADED] * len(opacity), t.name
                faded += 1
    assert (focused, faded) == ((2, 2 * (len(held) - 1)) if held else (0, 0))


# -- kv_blocks: block tables, step events, waste ------------------------------------------------

def test_block_tables_panel_has_one_row_per_running_request(view: RunView) -> None:
    """One trace per running request (id order, its colour); markers == len(block_table); x = logical
    index; text = physical ids in table order (the second panel of kv_figure)."""
    snap = view.snapshot
    held = tables(snap)
    fig = check(vk.kv_figure(snap, view.last_trace))
    rows = on_axis(fig, "x2")
    if not held:  # one invisible point, so plotly draws the panel (and its note) where it belongs
        assert [(t.name, t.marker.opacity) for t in rows] == [("no tables", 0)]
        rows = []
    assert [t.name for t in rows] == [request_label(r.request_id) for r in held]
    for t, r in zip(rows, held):
        n = len(r.block_table)
        assert seq(t.x) == list(range(n))
        assert seq(t.y) == [request_label(r.request_id)] * n
        assert seq(t.text) == [str(p) for p in r.block_table]
        assert [int(cd[1]) for cd in seq(t.customdata)] == list(r.block_table)
        assert t.marker.color == request_color(r.request_id)
        assert t.showlegend is False
    if not held:
        assert any(a.text == "no request holds blocks" for a in fig.layout.annotations)


def test_block_table_frame_has_one_row_per_logical_block(view: RunView) -> None:
    """Rows == sum of table lengths; (request, logical, physical) follow the tables; tokens per block."""
    snap = view.snapshot
    blocks = {b.block_id: b for b in snap.blocks}
    frame = vk.block_table_frame(snap)
    held = tables(snap)
    assert len(frame) == sum(len(r.block_table) for r in held)
    expected = [(request_label(r.request_id), i, p) for r in held for i, p in enumerate(r.block_table)]
    assert list(zip(frame["request"], frame["logical"], frame["physical"])) == expected
    assert list(frame["tokens"]) == [blocks[p].num_tokens for _, _, p in expected]
    assert list(frame["fill"]) == pytest.approx([blocks[p].num_tokens / snap.block_size for _, _, p in expected])
    assert frame["physical"].is_unique


def test_step_events_frame_counts_match_the_step_trace(view: RunView) -> None:
    """Allocated / freed / preempted / arrived / finished counts and items are the trace's."""
    t = view.last_trace
    assert t is not None
    frame = vk.step_events_frame(t).set_index("event")
    for event, items in (("blocks allocated", t.blocks_allocated), ("blocks freed", t.blocks_freed),
                         ("requests preempted", t.preempted), ("requests arrived", t.arrived),
                         ("requests finished", t.finished)):
        assert frame.loc[event, "count"] == len(items), event
        if event.startswith("blocks"):
            expected = ", ".join(str(i) for i in items) or "—"
        else:
            expected = ", ".join(request_label(i) for i in items) or "—"
        assert frame.loc[event, "items"] == expected
    assert list(vk.step_events_frame(None).columns) == ["event", "count", "items"]
    assert vk.step_events_frame(None).empty


def test_waste_frame_paged_slack_vs_contiguous_reservation(view: RunView) -> None:
    """Paged waste == sum(len(table) * block_size - tokens with KV), only last-block slack; both
    contiguous schemes waste more; bytes == tokens * kv_bytes_per_token; shares are of the pool."""
    snap, meta = view.snapshot, view.meta
    bs = snap.block_size
    pool = snap.num_blocks * bs
    blocks = {b.block_id: b for b in snap.blocks}
    held = tables(snap)
    with_kv = {r.request_id: sum(blocks[p].num_tokens for p in r.block_table) for r in held}
    slack = {r.request_id: len(r.block_table) * bs - with_kv[r.request_id] for r in held}
    assert all(0 <= s < bs for s in slack.values())  # paged: only the last block has slack
    used = sum(with_kv.values())
    reserved = {vk.WASTE_SCHEMES[0]: sum(len(r.block_table) * bs for r in held),
                vk.WASTE_SCHEMES[1]: sum(min(r.num_prompt_tokens + r.max_tokens, meta.max_model_len) for r in held),
                vk.WASTE_SCHEMES[2]: meta.max_model_len * len(held)}
    frame = vk.waste_frame(snap, meta.max_model_len).set_index("scheme")
    assert list(frame.index) == list(vk.WASTE_SCHEMES)
    for scheme, res in reserved.items():
        row = frame.loc[scheme]
        wasted = max(res - used, 0)
        assert (row["requests"], row["used tokens"], row["reserved tokens"], row["wasted tokens"]) == \
            (len(held), used, res, wasted), scheme
        assert row["wasted bytes"] == wasted * meta.kv_bytes_per_token
        assert row["wasted share of pool"] == pytest.approx(wasted / pool)
        assert row["reserved share of pool"] == pytest.approx(res / pool)
        assert bool(row["fits in pool"]) == (res <= pool)
    if held:  # a model limit below a request's worst case caps its contiguous reservation
        cap = min(r.num_prompt_tokens + r.max_tokens for r in held)
        capped = vk.waste_frame(snap, cap).set_index("scheme")["reserved tokens"]
        assert capped[vk.WASTE_SCHEMES[1]] == sum(min(r.num_prompt_tokens + r.max_tokens, cap) for r in held)
        assert capped[vk.WASTE_SCHEMES[2]] == cap * len(held)
    paged = frame.loc[vk.WASTE_SCHEMES[0], "wasted tokens"]
    assert paged == sum(slack.values())
    if held:
        assert frame.loc[vk.WASTE_SCHEMES[1], "wasted tokens"] > paged
        assert frame.loc[vk.WASTE_SCHEMES[2], "wasted tokens"] > frame.loc[vk.WASTE_SCHEMES[1], "wasted tokens"]
    else:
        assert (frame["wasted tokens"] == 0).all()
    fig = check(vk.waste_figure(frame.reset_index(), pool, view.step))
    used_bar, waste_bar = fig.data
    assert seq(used_bar.customdata) == seq(waste_bar.customdata) == list(vk.WASTE_SCHEMES)
    assert seq(used_bar.y) == seq(waste_bar.y)  # the rows name the scheme and its waste
    for row, (scheme, wasted) in zip(used_bar.y, frame["wasted bytes"].items()):
        assert row.startswith(f"<b>{scheme}</b><br>{vk.format_bytes(wasted)} wasted"), row
    assert seq(used_bar.x) == [used] * 3
    assert seq(waste_bar.x) == [max(res - used, 0) for res in reserved.values()]
    assert fig.layout.barmode == "stack"
    assert any(s.type == "line" and s.x0 == pool for s in fig.layout.shapes)


# -- batching: token budget and counts ---------------------------------------------------------

def _budget_and_counts(traces: tuple[StepTrace, ...], snapshot: Snapshot) -> tuple[list[Any], list[Any]]:
    """(budget bars, count bars): the first two panels of the live timeline_figure."""
    timeline = check(vb.timeline_figure(traces, snapshot))
    return on_axis(timeline, "x"), on_axis(timeline, "x2")


def test_budget_bars_stack_to_the_batched_tokens_of_each_step(view: RunView) -> None:
    """Per step, the request bars sum to num_batched_tokens (<= token_budget); one bar per chunk,
    its height the chunk's tokens, its colour the request's, its trace (and opacity) the chunk
    kind; the hover names the request and the kind."""
    traces = view.traces
    bars, _ = _budget_and_counts(traces, view.snapshot)
    per_step: Counter[int] = Counter()
    seen: set[tuple[str, int]] = set()
    by_step = {t.step + 1: t for t in traces}  # steps are labelled from 1 (visualizers.steps.step_number)
    label_to_id = {request_label(c.request_id): c.request_id for t in traces for c in t.scheduled}
    for bar in bars:
        assert bar.type == "bar"
        for x, y, (label, kind), colour in zip(seq(bar.x), seq(bar.y), seq(bar.customdata),
                                               seq(bar.marker.color), strict=True):
            rid = label_to_id[label]
            chunk = chunks(by_step[x])[rid]
            assert (y, kind, colour) == (chunk.num_tokens, chunk.kind, request_color(rid))
            assert bar.marker.opacity == CHUNK_OPACITY[kind]
            assert y <= by_step[x].token_budget
            assert (rid, x) not in seen
            per_step[x] += y
            seen.add((rid, x))
    assert seen == {(c.request_id, t.step + 1) for t in traces for c in t.scheduled}
    for t in traces:
        assert per_step[t.step + 1] == t.num_batched_tokens <= t.token_budget
        assert t.num_batched_tokens == t.num_prefill_tokens + t.num_decode_tokens


def test_budget_panel_one_trace_per_chunk_kind_and_the_budget_line(full: RunView) -> None:
    """Two bar traces (prefill chunks, decodes) whatever the number of requests; every request's
    bars in request_color (a colour per id: no two requests of a scenario share one)."""
    traces = full.traces
    fig = check(vb.timeline_figure(traces, full.snapshot))
    bars = on_axis(fig, "x")
    ids = sorted({c.request_id for t in traces for c in t.scheduled}, key=request_sort_key)
    assert [b.name for b in bars] == ["prefill chunk", "decode"]
    colours = {label: colour for b in bars for (label, _), colour in zip(seq(b.customdata), seq(b.marker.color))}
    assert colours == {request_label(r): request_color(r) for r in ids}
    assert len(set(colours.values())) == len(ids)
    assert all(b.marker.pattern.shape is None for b in bars)  # no per-bar <pattern> to redraw
    assert fig.layout.barmode == "stack"
    budget = traces[-1].token_budget
    assert any(s.type == "line" and s.y0 == s.y1 == budget for s in fig.layout.shapes)


def test_counts_panel_counts_decodes_and_prefill_chunks_per_step(view: RunView) -> None:
    """The second panel's "decodes" / "prefill chunks" bars equal the chunk kinds in each trace."""
    traces = view.traces
    _, counts = _budget_and_counts(traces, view.snapshot)
    by_name = {t.name: t for t in counts}
    assert list(by_name) == ["decodes", "prefill chunks"]
    for name, kind in (("decodes", "decode"), ("prefill chunks", "prefill")):
        assert seq(by_name[name].x) == [t.step + 1 for t in traces]
        assert seq(by_name[name].y) == [sum(1 for c in t.scheduled if c.kind == kind) for t in traces]
        assert by_name[name].marker.color == CHUNK_KIND_COLORS[kind]


# -- batching: swim lane, queues, latency -------------------------------------------------------

def test_lanes_states_follow_the_traces(full: RunView) -> None:
    """Per request per step: "not arrived" before its arrival, the chunk kind when scheduled,
    "preempted" in the step that preempted it, "waiting" otherwise, "finished" after it finished."""
    traces, snap = full.traces, full.snapshot
    lane = vb.lanes(traces, [r.request_id for r in snap.requests])
    ids = sorted((r.request_id for r in snap.requests), key=request_sort_key)
    assert lane.request_ids == tuple(ids)
    assert lane.steps == tuple(t.step + 1 for t in traces)
    arrival = {rid: next(t.step for t in traces if rid in t.arrived) for rid in ids}
    finish = {rid: next(t.step for t in traces if rid in t.finished) for rid in ids}
    for i, rid in enumerate(ids):
        for j, t in enumerate(traces):
            chunk = chunks(t).get(rid)
            state = lane.states[i][j]
            if t.step < arrival[rid]:
                assert state == "not arrived"
            elif t.step > finish[rid]:
                assert state == "finished"
            elif rid in t.preempted:
                assert state == "preempted" and chunk is None
            elif chunk is not None:
                assert state == chunk.kind
            else:
                assert state == "waiting"
            assert lane.tokens[i][j] == (chunk.num_tokens if chunk else 0)
        last = lane.states[i][-1]
        assert last == ("decode" if finish[rid] == traces[-1].step else "finished")
    preemptions = {r.request_id: r.num_preemptions for r in snap.requests}
    for i, rid in enumerate(ids):
        assert lane.states[i].count("preempted") == preemptions[rid]
    assert lane.count("preempted") == [len(t.preempted) for t in traces]
    assert [lane.count(k) for k in ("prefill", "decode")] == \
        [[sum(1 for c in t.scheduled if c.kind == k) for t in traces] for k in ("prefill", "decode")]


def test_memory_pressure_lane_shows_the_preemption_then_the_recompute(recorded: dict[str, RunView]) -> None:
    """The request preempted at step 19 is "preempted" there, "waiting" next, and recomputes as "prefill"."""
    v = recorded["memory-pressure@end"]
    pre = recorded["memory-pressure@20"].last_trace
    (victim,) = pre.preempted
    lane = vb.lanes(v.traces)
    row = lane.states[lane.request_ids.index(victim)]
    j = lane.steps.index(pre.step + 1)
    assert row[j - 1] == "decode" and row[j] == "preempted" and row[j + 1] == "waiting"
    resumed = next(t for t in v.traces if any(c.request_id == victim and c.resumed for c in t.scheduled))
    assert row[lane.steps.index(resumed.step + 1)] == "prefill"
    assert set(row[j + 1: lane.steps.index(resumed.step + 1)]) == {"waiting"}


def test_swimlane_panel_encodes_the_lanes_with_one_colour_per_request(view: RunView) -> None:
    """Heatmap z == LANE_STATES codes of lanes(); rows = request labels; chips in request_color;
    a legend entry per state; the timeline's third panel is the same heatmap."""
    traces, snap = view.traces, view.snapshot
    lane = vb.lanes(traces, [r.request_id for r in snap.requests])
    codes = [[LANE_STATES.index(s) for s in row] for row in lane.states]
    labels = [request_label(r) for r in lane.request_ids]
    panel = on_axis(check(vb.timeline_figure(traces, snap)), "x3")
    (heat,) = [t for t in panel if t.type == "heatmap"]
    assert seq(heat.z) == codes
    assert seq(heat.x) == [t.step + 1 for t in traces] and seq(heat.y) == labels
    assert (heat.zmin, heat.zmax) == (-0.5, len(LANE_STATES) - 0.5)
    (chip,) = [t for t in panel if t.name == "request colour"]
    assert seq(chip.y) == labels
    assert seq(chip.marker.color) == [request_color(r) for r in lane.request_ids]
    legend = [t.name for t in panel if t.legendgroup == "states"]
    assert legend == list(LANE_STATES[1:])
    # numbers: the tokens of every prefill cell (a decode cell is one token), as one text trace
    prefill = {(step, request_label(rid)): str(n) for rid, srow, nrow in zip(lane.request_ids, lane.states, lane.tokens)
               for step, s, n in zip(lane.steps, srow, nrow) if s == "prefill"}
    assert all(n == "1" for rid, srow, nrow in zip(lane.request_ids, lane.states, lane.tokens)
               for s, n in zip(srow, map(str, nrow)) if s == "decode")
    if len(lane.steps) > vb.MAX_TEXT_STEPS:  # cells too narrow to read: no numbers
        assert not [t for t in panel if t.name == "prefill tokens"]
        return
    (numbers,) = [t for t in panel if t.name == "prefill tokens"]
    assert dict(zip(zip(seq(numbers.x), seq(numbers.y)), seq(numbers.text))) == prefill
    assert len(seq(numbers.text)) == len(prefill) and heat.text is None


def test_queue_frame_matches_the_traces_queue_lengths(full: RunView) -> None:
    """running == num_running; preempted == len(preempted); waiting == the trace's waiting queue
    minus requests whose arrival step has not come (the trace counts those, the lane does not)."""
    traces, snap = full.traces, full.snapshot
    arrival = {m.request_id: m.arrival_step for m in snap.metrics}
    frame = vb.queue_frame(traces, snap)
    assert len(frame) == len(traces)
    assert list(frame["step"]) == [t.step + 1 for t in traces]
    assert list(frame["running"]) == [t.num_running for t in traces]
    assert list(frame["preempted"]) == [len(t.preempted) for t in traces]
    not_arrived = [sum(1 for a in arrival.values() if a > t.step) for t in traces]
    assert list(frame["waiting"]) == [t.num_waiting - n for t, n in zip(traces, not_arrived)]
    by_name = {t.name: t for t in on_axis(check(vb.timeline_figure(traces, snap)), "x4")}
    assert seq(by_name["waiting"].y) == list(frame["waiting"])
    assert seq(by_name["running"].y) == list(frame["running"])
    assert seq(by_name["preempted"].x) == [t.step + 1 for t in traces if t.preempted]
    for name in ("waiting", "running", "preempted"):
        colour = by_name[name].line.color if name != "preempted" else by_name[name].marker.color
        assert colour == QUEUE_COLORS[name]
    in_timeline = {t.name: t for t in on_axis(check(vb.timeline_figure(traces, snap)), "x4")}
    assert seq(in_timeline["waiting"].y) == list(frame["waiting"])
    assert seq(in_timeline["running"].y) == list(frame["running"])


def test_latency_frame_one_row_per_request_consistent_with_metrics(view: RunView) -> None:
    """One row per request in the snapshot's metrics (id order); TTFT/TPOT/E2E are the metrics';
    finished rows: latency == finished - arrival + 1 >= TTFT steps, and E2E == TTFT + TPOT*(n-1)."""
    snap = view.snapshot
    states = {r.request_id: r for r in snap.requests}
    metrics = sorted(snap.metrics, key=lambda m: request_sort_key(m.request_id))
    frame = vb.latency_frame(snap)
    assert list(frame["request"]) == [request_label(m.request_id) for m in metrics]
    for (_, row), m in zip(frame.iterrows(), metrics):
        r = states[m.request_id]
        assert row["status"] == r.status.value
        assert row["output tokens"] == m.num_output_tokens == r.num_output_tokens
        assert row["preemptions"] == m.num_preemptions == r.num_preemptions
        assert row["arrival step"] == m.arrival_step + 1  # labelled from 1, as every step
        if r.status is RequestStatus.FINISHED:
            latency = m.finished_step - m.arrival_step + 1
            assert row["latency (steps)"] == latency >= row["TTFT (steps)"] == m.ttft_steps >= 1
            assert row["TTFT (ms)"] == pytest.approx(m.ttft_ms)
            if m.num_output_tokens > 1:
                assert row["TPOT (ms)"] == pytest.approx(m.tpot_ms)
                assert row["E2E (ms)"] == pytest.approx(m.ttft_ms + m.tpot_ms * (m.num_output_tokens - 1))
        else:
            assert pd.isna(row["latency (steps)"]) and pd.isna(row["E2E (ms)"])
    if view.done:
        assert set(frame["status"]) == {RequestStatus.FINISHED.value} and len(frame) == len(snap.requests)
    fig = check(vb.latency_figure(snap))
    ttft, tpot = fig.data
    with_ttft = [m for m in metrics if m.ttft_ms is not None]
    assert seq(ttft.x) == [request_label(m.request_id) for m in with_ttft]
    assert seq(ttft.y) == pytest.approx([m.ttft_ms for m in with_ttft])
    assert seq(ttft.marker.color) == [request_color(m.request_id) for m in with_ttft]
    assert seq(tpot.x) == [request_label(m.request_id) for m in metrics if m.tpot_ms is not None]


# -- comparison: static vs continuous ----------------------------------------------------------

def _idle_slots_by_hand(run: PolicyRun, max_num_seqs: int) -> tuple[int, int]:
    """Idle slot-steps, and those while a request had arrived, was unfinished and not scheduled."""
    metrics = {m.request_id: m for m in run.final.metrics}
    idle = idle_waiting = 0
    for t in run.traces:
        scheduled = {c.request_id for c in t.scheduled}
        waiting = sum(1 for rid, m in metrics.items()
                      if m.arrival_step <= t.step <= m.finished_step and rid not in scheduled)
        free = max(max_num_seqs - len(t.scheduled), 0)
        idle += free
        idle_waiting += min(free, waiting)
    return idle, idle_waiting


@pytest.mark.parametrize("scenario", list(STOPS))
def test_policy_summary_rows_steps_and_idle_slots(policy_runs: dict[str, dict[str, PolicyRun]],
                                                  scenario: str) -> None:
    """Rows "static" and "continuous"; steps == len(traces); output tokens == the metrics' sum;
    idle slots agree with a count made here; static never takes fewer steps than continuous."""
    runs = policy_runs[scenario]
    max_num_seqs = int(load_scenario(scenario).knobs["max_num_seqs"])
    frame = vc.policy_summary(runs, max_num_seqs).set_index("policy")
    assert list(frame.index) == ["static", "continuous"]
    for policy, run in runs.items():
        assert run.policy == policy
        row = frame.loc[policy]
        assert row["steps"] == len(run.traces)
        out = sum(m.num_output_tokens for m in run.final.metrics)
        assert row["output tokens"] == out == sum(len(t.sampled) for t in run.traces)
        assert row["tokens / step"] == pytest.approx(out / len(run.traces))
        assert (row["idle slots"], row["idle slots while requests waited"]) == \
            vc.idle_slots(run, max_num_seqs) == _idle_slots_by_hand(run, max_num_seqs)
        assert all(r.status is RequestStatus.FINISHED for r in run.final.requests)
        latencies = [m.finished_step - m.arrival_step + 1 for m in run.final.metrics]
        assert row["max latency (steps)"] == max(latencies)
        assert row["mean latency (steps)"] == pytest.approx(sum(latencies) / len(latencies))
    assert frame.loc["continuous", "steps"] <= frame.loc["static", "steps"]
    if scenario == "chat-burst":
        assert frame.loc["continuous", "steps"] < frame.loc["static", "steps"]
        assert frame.loc["static", "idle slots while requests waited"] > \
            frame.loc["continuous", "idle slots while requests waited"]


@pytest.mark.parametrize("scenario", list(STOPS))
def test_side_by_side_lanes_and_latency_comparison(policy_runs: dict[str, dict[str, PolicyRun]],
                                                   scenario: str) -> None:
    """One heatmap per policy (its lanes() codes, on its own axes, titled with its step count);
    latency bars per policy == finished - arrival + 1, in the policy's colour."""
    runs = policy_runs[scenario]
    fig = check(vc.lanes_side_by_side(runs))
    heats = [t for t in fig.data if t.type == "heatmap"]
    assert len(heats) == len(runs)
    for i, (policy, run) in enumerate(runs.items()):
        axis = "x" if i == 0 else f"x{i + 1}"
        lane = vb.lanes(run.traces, [r.request_id for r in run.final.requests])
        (heat,) = [t for t in heats if (t.xaxis or "x") == axis]
        assert seq(heat.z) == [[LANE_STATES.index(s) for s in row] for row in lane.states]
        assert seq(heat.x) == [t.step + 1 for t in run.traces]
        (chip,) = [t for t in on_axis(fig, axis) if t.name == "request colour"]
        assert seq(chip.marker.color) == [request_color(r) for r in lane.request_ids]
        assert any(a.text == f"<b>{policy}</b>: {len(run.traces)} steps" for a in fig.layout.annotations)
    bars = check(vc.latency_comparison_figure(runs)).data
    assert [b.name for b in bars] == list(runs)
    for b, (policy, run) in zip(bars, runs.items()):
        ms = sorted(run.final.metrics, key=lambda m: request_sort_key(m.request_id))
        assert seq(b.x) == [request_label(m.request_id) for m in ms]
        assert seq(b.y) == [m.finished_step - m.arrival_step + 1 for m in ms]
        assert b.marker.color == POLICY_COLORS[policy]


# -- steps: the step table ---------------------------------------------------------------------

def test_step_table_one_row_per_trace_and_csv_round_trip(view: RunView) -> None:
    """Rows == traces, columns == STEP_COLUMNS, prefill + decode == batched tokens; the CSV parses
    back with pandas to the same rows."""
    traces = view.traces
    table = vs.step_table(traces)
    assert list(table.columns) == vs.STEP_COLUMNS
    assert len(table) == len(traces)
    assert list(table["step"]) == [t.step + 1 for t in traces]
    assert list(table["prefill tokens"] + table["decode tokens"]) == list(table["batched tokens"]) == \
        [t.num_batched_tokens for t in traces]
    assert list(table["requests"]) == [", ".join(request_label(c.request_id) for c in t.scheduled) for t in traces]
    assert list(table["blocks in use"] + table["free blocks"]) == [view.snapshot.num_blocks] * len(traces)
    assert list(table["preempted"]) == [", ".join(request_label(r) for r in t.preempted) for t in traces]
    back = pd.read_csv(io.StringIO(vs.step_table_csv(traces)))
    assert list(back.columns) == vs.STEP_COLUMNS and len(back) == len(traces)
    assert list(back["step"]) == list(table["step"])
    assert list(back["batched tokens"]) == list(table["batched tokens"])


# -- every figure validates and serialises -----------------------------------------------------

FIGURES: dict[str, Callable[[RunView, dict[str, PolicyRun]], go.Figure]] = {
    "kv_figure": lambda v, _: vk.kv_figure(v.snapshot, v.last_trace),
    "kv_figure_focus": lambda v, _: vk.kv_figure(v.snapshot, v.last_trace, focus=(v.snapshot.running or ("0",))[0]),
    "waste_figure": lambda v, _: vk.waste_figure(vk.waste_frame(v.snapshot, v.meta.max_model_len),
                                                 v.snapshot.num_blocks * v.snapshot.block_size, v.step),
    "timeline_figure": lambda v, _: vb.timeline_figure(v.traces, v.snapshot),
    "latency_figure": lambda v, _: vb.latency_figure(v.snapshot),
    "lanes_side_by_side": lambda _, runs: vc.lanes_side_by_side(runs),
    "latency_comparison_figure": lambda _, runs: vc.latency_comparison_figure(runs),
}


@pytest.mark.parametrize("name", list(FIGURES))
def test_every_live_figure_validates_and_serialises(name: str, recorded: dict[str, RunView],
                                                    policy_runs: dict[str, dict[str, PolicyRun]]) -> None:
    """Full Plotly validation and fig.to_json() for every live figure, at every recorded view."""
    for key, v in recorded.items():
        fig = check(FIGURES[name](v, policy_runs[v.meta.scenario]))
        assert fig.data, key


def test_figures_of_an_empty_run_validate(tiny: "SharedModel", torch_single_thread: None) -> None:
    """Before the first step (no traces, empty pool) every live figure still validates."""
    run = LiveRun.from_scenario(load_scenario("chat-burst"), tiny)
    v = run.view()
    assert v.traces == () and v.last_trace is None
    snap = v.snapshot
    grid = on_axis(check(vk.kv_figure(snap, None)), "x")
    assert [t.name for t in grid] == ["free"] and len(seq(grid[0].x)) == snap.num_blocks
    for fig in (vb.timeline_figure((), snap), vb.latency_figure(snap)):
        check(fig)
    assert vs.step_table(()).empty and list(vs.step_table(()).columns) == vs.STEP_COLUMNS
    assert math.isclose(vk.waste_frame(snap, v.meta.max_model_len)["wasted tokens"].sum(), 0)


def test_every_scenario_gets_one_colour_per_request() -> None:
    """The palette has no repeats, no block-state colour, and covers every preset scenario."""
    from engine.replay.scenario import list_scenarios, load_scenario
    from visualizers.theme import BLOCK_STATE_COLORS

    assert len(set(REQUEST_COLORS)) == len(REQUEST_COLORS)
    assert not set(REQUEST_COLORS) & {BLOCK_STATE_COLORS["free"], BLOCK_STATE_COLORS["shared"],
                                      BLOCK_STATE_COLORS["cached"]}
    for name in list_scenarios():
        assert len(load_scenario(name).requests) <= len(REQUEST_COLORS), name
