"""Talk-ready views (issue #19, defects 7 and 9, the radix tree's text, on-chart events), on real
runs of the engine (tiny-random; SmolLM2 once, for the caching table on its real tokenizer):

* the prefix caching on/off table adds up, row by row (prompt = computed + from cache; prefill
  computed = computed + recomputed after preemption), on a run that preempts with caching on;
* every step label agrees with "Steps done" (steps count from 1 on every page);
* no "None" in an α column;
* state colours are never request colours; text on a coloured cell has WCAG contrast >= 4.5;
* every text in a live figure scales with the Style's font size;
* radix-tree box text fits its box at the font size in use;
* events are captioned on the chart at the step they happen (preemption, prefix hit, split,
  eviction, rejected draft, pipeline bubble), and only there.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Iterator

import plotly.graph_objects as go
import pytest

from engine.replay.run import LiveRun, PolicyRun, RunView, compare_prefix_caching, compare_speculation
from engine.replay.scenario import load_scenario
from engine.core.trace import StepTrace
from visualizers import batching as vb
from visualizers import events as ve
from visualizers import kv_blocks as vk
from visualizers import pipeline as pv
from visualizers import prefix_stats as ps
from visualizers import prefix_tree as pt
from visualizers import speculative as sv
from visualizers import steps as vs
from visualizers import theme
from visualizers.figures import validated

if TYPE_CHECKING:
    from engine.model.shared import SharedModel

EARLY_EXIT = {"method": "early_exit", "num_layers": 1, "num_speculative_tokens": 4}
PRESENT, NORMAL = 19, 12  # app/live.py Style: presentation mode and the default


def stepped(model: "SharedModel", name: str, steps: int | None = None, **knobs: Any) -> RunView:
    """Scenario ``name`` on ``model`` stepped one step at a time (to the end, or ``steps``),
    every manager's invariants checked after each step."""
    run = LiveRun.from_scenario(load_scenario(name), model, **knobs)
    try:
        while not run.done and (steps is None or len(run.traces) < steps):
            run.step(1)
            run.engine.check_integrity()
        return run.view()
    finally:
        run.close()


@pytest.fixture(scope="module")
def caching_runs(tiny: "SharedModel", torch_single_thread: None) -> dict[str, PolicyRun]:
    """cache-pressure with caching on and off: both preempt, and the "on" run re-admits
    preempted requests whose blocks the cache still holds (the 2,246 + 400 > 2,380 of #19)."""
    return compare_prefix_caching(load_scenario("cache-pressure"), tiny)


@pytest.fixture(scope="module")
def spec_view(tiny: "SharedModel", torch_single_thread: None) -> RunView:
    """spec-sampled (temperature 0.8) with early-exit drafts (tiny-random's n-gram finds no
    match) to step 12: drafts accepted, and rejected at step 6."""
    return stepped(tiny, "spec-sampled", 12, speculative_config=EARLY_EXIT)


@pytest.fixture(scope="module")
def pressure_view(tiny: "SharedModel", torch_single_thread: None) -> RunView:
    """memory-pressure to step 30: a preemption at step 20 (the engine's index 19)."""
    return stepped(tiny, "memory-pressure", 30, enable_prefix_caching=False)


@pytest.fixture(scope="module")
def prefix_view(tiny: "SharedModel", torch_single_thread: None) -> RunView:
    """cache-pressure to the end: prefix hits, chunked prefills, LRU evictions."""
    return stepped(tiny, "cache-pressure")


# -- defect 7: numbers that add up and agree -----------------------------------------------------

def assert_rows_add_up(runs: dict[str, PolicyRun]) -> None:
    summary = ps.caching_summary(runs).set_index("run")
    for name, run in runs.items():
        row = summary.loc[name]
        prompt = sum(r.num_prompt_tokens for r in run.final.requests if r.parent_id is None)
        assert row["prompt tokens"] == prompt == row["computed"] + row["from cache"], name
        prefill = sum(t.num_prefill_tokens for t in run.traces)
        assert row["prefill tokens computed"] == prefill == row["computed"] + row["recomputed after preemption"], name
        cached = sum(t.prefix.num_cached_tokens for t in run.traces)
        assert row["from cache"] + row["from cache after preemption"] == cached, name
        preempted = any(t.preempted for t in run.traces)
        assert (row["recomputed after preemption"] > 0) == preempted, name
        if name == "caching off":  # every prompt token computed once, the rest is recompute
            assert row["from cache"] == row["from cache after preemption"] == 0
            assert row["recomputed after preemption"] == prefill - prompt
    frame = ps.caching_requests_frame(runs)
    for side in ("on", "off"):
        run = runs[f"caching {side}"]
        assert frame[f"prefill computed ({side})"].sum() == sum(t.num_prefill_tokens for t in run.traces)
    on = frame["prefill computed (on)"] - frame["recomputed (on)"] + frame["from cache"]
    assert list(on) == list(frame["prompt tokens"]) or not (frame["prompt tokens"] > 0).all()


def test_caching_table_rows_add_up_on_a_preempting_run(caching_runs: dict[str, PolicyRun]) -> None:
    """#19: "2,246 computed + 400 from cache > 2,380 prompt tokens". The 400 held tokens served
    again to preempted requests on their re-admission, and the 2,246 their recompute: the table
    names both, and each row's columns add up exactly."""
    on = caching_runs["caching on"]
    assert any(t.preempted for t in on.traces), "the scenario must preempt with caching on"
    assert any(h.num_cached_tokens for t in on.traces for h in t.prefix.lookups
               if any(c.request_id == h.request_id and c.resumed for c in t.scheduled)), \
        "a preempted request must be re-admitted with a cache hit"
    assert_rows_add_up(caching_runs)
    assert list(ps.caching_summary(caching_runs).columns[2:8]) == list(ps.SUMMARY_TOKEN_COLUMNS)


def test_caching_table_adds_up_with_parallel_sampling(tiny: "SharedModel", torch_single_thread: None) -> None:
    """Forked sequences share their parent's prompt (counted once)."""
    assert_rows_add_up(compare_prefix_caching(load_scenario("parallel-sampling"), tiny))


def test_prefill_accounts_on_smollm2_mid_run(torch_single_thread: None) -> None:
    """SmolLM2 (its real tokenizer, whole-block hits on a shared few-shot prefix), 8 steps in:
    the per-request accounts add up to the step records, and every request that has its first
    token had its whole prompt either computed or served from the cache."""
    from engine.model.shared import get_shared_model

    view = stepped(get_shared_model("smollm2-135m"), "shared-prefix", 8)
    run = PolicyRun("continuous", view.traces, view.snapshot)
    accounts = ps.prefill_accounts(run)
    assert sum(a.prefill_computed for a in accounts.values()) == sum(t.num_prefill_tokens for t in run.traces)
    assert sum(a.prompt_from_cache + a.recompute_from_cache for a in accounts.values()) == \
        sum(t.prefix.num_cached_tokens for t in run.traces) > 0
    started = [r for r in view.snapshot.requests if r.num_output_tokens > 0]
    assert len(started) >= 2
    for r in started:
        a = accounts[r.request_id]
        assert a.prompt_tokens == r.num_prompt_tokens == a.prompt_computed + a.prompt_from_cache
        assert a.prompt_from_cache == r.num_cached_tokens


def _x_steps(fig: go.Figure) -> list[int]:
    """Every step value on a figure's step axes (traces whose hover names the step)."""
    xs: list[int] = []
    for t in fig.data:
        if t.x is not None and "step" in (t.hovertemplate or "") + (t.name or ""):
            xs += [int(x) for x in t.x if isinstance(x, (int, float))]
    return xs


def test_every_step_label_agrees_with_steps_done(spec_view: RunView, prefix_view: RunView) -> None:
    """#19: the speculative chart said "Step 9" while "Steps done" said 10. The latest step is
    labelled with the number of steps done everywhere: chart titles, step axes, tables."""
    for view in (spec_view, prefix_view):
        done = view.step
        assert done == view.snapshot.step == len(view.traces) > 0
        assert vs.step_table(view.traces)["step"].iloc[-1] == done
        timeline = vb.timeline_figure(view.traces, view.snapshot)
        heat = next(t for t in timeline.data if t.type == "heatmap")
        assert max(heat.x) == done and min(heat.x) == 1
        assert ps.cache_stats_frame(view.traces)["step"].iloc[-1] == done
        assert max(vb.queue_frame(view.traces)["step"]) == done
    last = spec_view.last_trace
    assert last is not None and last.spec
    title = sv.drafts_figure(last, 12, spec_view.step).layout.title.text
    assert title.startswith(f"Step {spec_view.step}:"), title
    tokens = sv.tokens_per_step_figure(spec_view.traces, 12, spec_view.step)
    assert max(tokens.data[0].x) == spec_view.step


def test_pipeline_steps_and_latency_arrivals_are_labelled_from_one(tiny: "SharedModel",
                                                                    torch_single_thread: None) -> None:
    view = stepped(tiny, "pipeline", 3)
    assert list(pv.stats_frame(view.traces)["step"]) == [1, 2, 3] == [vs.step_number(t) for t in view.traces]
    first = min(m.arrival_step for m in view.snapshot.metrics)
    assert vb.latency_frame(view.snapshot)["arrival step"].min() == first + 1


def test_alpha_column_never_shows_none(tiny: "SharedModel", torch_single_thread: None) -> None:
    """#19: "None" in the α column. The run without speculation has no α: "—"; the run with it a
    percentage; per request likewise."""
    runs = compare_speculation(load_scenario("spec-sampled"), tiny, {"speculative_config": EARLY_EXIT})
    frame = sv.comparison_frame(runs).set_index("run")
    assert frame.loc[sv.PLAIN_RUN, "alpha"] == "—"
    spec = runs[sv.SPEC_RUN]
    assert frame.loc[sv.SPEC_RUN, "alpha"] == f"{spec.num_accepted_tokens / spec.num_draft_tokens:.0%}"
    per = sv.spec_requests_frame(spec.traces)
    for column in (frame["alpha"], per["alpha"]):
        assert column.notna().all() and not column.astype(str).str.contains("None|nan").any()


# -- defect 9: colours, contrast, fonts ------------------------------------------------------------

def _rgb(c: str) -> tuple[int, ...]:
    return tuple(int(c.lstrip("#")[i:i + 2], 16) for i in (0, 2, 4))


STATE_PALETTES = {"lane": theme.LANE_STATE_COLORS, "chunk": theme.CHUNK_KIND_COLORS, "queue": theme.QUEUE_COLORS,
                  "block": theme.BLOCK_STATE_COLORS, "prefix node": theme.PREFIX_NODE_COLORS,
                  "draft": sv.SPEC_COLORS}


def test_state_colours_are_never_request_colours() -> None:
    """#19: prefill/decode/preempted were r0/r6/r1's colours. No state colour equals a request
    colour or comes within STATE_COLOR_MIN_DISTANCE (RGB) of one."""
    requests = [_rgb(c) for c in theme.REQUEST_COLORS]
    for palette, colours in STATE_PALETTES.items():
        for state, colour in colours.items():
            assert colour.upper() not in {c.upper() for c in theme.REQUEST_COLORS}, (palette, state)
            nearest = min(sum((a - b) ** 2 for a, b in zip(_rgb(colour), r)) ** 0.5 for r in requests)
            assert nearest >= theme.STATE_COLOR_MIN_DISTANCE, (palette, state, colour, nearest)


def test_contrast_function_matches_wcag() -> None:
    assert theme.contrast_ratio("#FFFFFF", "#000000") == pytest.approx(21.0)
    assert theme.contrast_ratio("#777777", "#FFFFFF") == pytest.approx(4.48, abs=0.01)
    assert theme.blend("#000000", 0.5) in ("#7F7F7F", "#808080")
    # the old draft cells: the template's text colour on the accepted green / bonus blue
    assert theme.contrast_ratio("#2A3F5F", "#228833") < 2.5


TEXT_CELLS = {**{f"draft {k}": c for k, c in sv.SPEC_COLORS.items()},
              **{f"lane {k}": c for k, c in theme.LANE_STATE_COLORS.items()},
              **{f"unit {i}": c for i, c in enumerate(theme.PIPELINE_UNIT_COLORS)},
              **{f"node {k}": c for k, c in theme.PREFIX_NODE_COLORS.items()},
              **{f"request {c} at {o}": theme.blend(c, o) for c in theme.REQUEST_COLORS
                 for o in (0.12, 0.35, 0.7, 1.0)}}


@pytest.mark.parametrize("cell", list(TEXT_CELLS))
def test_text_on_every_cell_colour_reaches_wcag_aa(cell: str) -> None:
    background = TEXT_CELLS[cell]
    assert theme.contrast_ratio(theme.text_color_on(background), background) >= theme.MIN_TEXT_CONTRAST


def test_draft_lane_and_block_text_on_real_figures_reaches_wcag_aa(spec_view: RunView, pressure_view: RunView) -> None:
    """The colours the figures really draw: draft-token cells, swim-lane numbers, block ids."""
    drafts = validated(sv.drafts_figure(spec_view.last_trace, PRESENT, spec_view.step))
    drawn = [t for t in drafts.data if t.x]
    assert drawn
    for t in drawn:
        assert t.textfont.color and theme.contrast_ratio(t.textfont.color, t.marker.color) >= 4.5, t.name
    timeline = vb.timeline_figure(pressure_view.traces, pressure_view.snapshot, PRESENT)
    (numbers,) = [t for t in timeline.data if t.name == "prefill tokens"]
    assert theme.contrast_ratio(numbers.textfont.color, theme.LANE_STATE_COLORS["prefill"]) >= 4.5
    kv = vk.kv_figure(pressure_view.snapshot, pressure_view.last_trace, font_size=PRESENT)
    tables = [t for t in kv.data if t.type == "scatter" and t.mode == "markers+text"]
    assert tables
    for t in tables:
        for colour, opacity in zip(t.textfont.color, t.marker.opacity):
            assert theme.contrast_ratio(colour, theme.blend(t.marker.color, opacity)) >= 4.5


SIZE_IN_TEXT = re.compile(r"font-size:\s*(\d+(?:\.\d+)?)px")


def font_sizes(node: Any, key: str = "") -> Iterator[float]:
    """Every explicit text size in a figure's JSON: font dicts' "size", and "font-size:Npx" in text."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "size" and key.endswith("font") and isinstance(v, (int, float)):
                yield float(v)
            elif k == "size" and key.endswith("font") and isinstance(v, list):
                yield from (float(x) for x in v)
            else:
                yield from font_sizes(v, k)
    elif isinstance(node, list):
        for v in node:
            yield from font_sizes(v, key)
    elif isinstance(node, str):
        yield from (float(m) for m in SIZE_IN_TEXT.findall(node))


def live_figures(font_size: int, spec: RunView, pressure: RunView, prefix: RunView) -> dict[str, go.Figure]:
    return {
        "batch timeline": vb.timeline_figure(pressure.traces, pressure.snapshot, font_size),
        "kv cache": vk.kv_figure(pressure.snapshot, pressure.last_trace, font_size=font_size),
        "prefix tree": pt.tree_figure(prefix.snapshot, prefix.last_trace, prefix.traces, font_size),
        "prefix stats": ps.cache_figure(prefix.traces, prefix.snapshot, font_size),
        "drafts": sv.drafts_figure(spec.last_trace, font_size, spec.step),
        "spec tokens": sv.tokens_per_step_figure(spec.traces, font_size, spec.step),
    }


def test_every_text_scales_with_the_style_font(spec_view: RunView, pressure_view: RunView,
                                               prefix_view: RunView) -> None:
    """#19: subplot titles stayed 13 px and lane numbers 10 px in presentation mode. At the
    presentation font (19) no text in a live figure is smaller than 19 - 3 px."""
    views = (spec_view, pressure_view, prefix_view)
    present, normal = live_figures(PRESENT, *views), live_figures(NORMAL, *views)
    for name, fig in present.items():
        big = list(font_sizes(fig.to_plotly_json()))
        small = list(font_sizes(normal[name].to_plotly_json()))
        assert big and min(big) >= PRESENT - 3, (name, sorted(set(big)))
        assert max(big) > max(small), name


# -- defect 5: radix-tree text inside its boxes --------------------------------------------------

def _plain(line: str) -> str:
    return re.sub(r"<[^>]+>", "", line).replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


TREE_PLOT_PX = 1000  # the narrowest plot width (1440-px screen, sidebar open), margins included
CHAR_EM, LINE_EM = 0.62, 1.3  # a bold character's width and a line's height, in ems (generous)
SPAN_SIZE = re.compile(r'<span style="font-size:(\d+)px">')


@pytest.mark.parametrize("font_size", [NORMAL, PRESENT])
def test_radix_tree_text_fits_its_boxes(prefix_view: RunView, tiny: "SharedModel", torch_single_thread: None,
                                        font_size: int) -> None:
    """#19 (5): node text overflowed its boxes in presentation mode. Measured on the figure
    alone: every line of every box, at the size it is drawn in, is no wider than the box on the
    narrowest plot, the lines together no taller than the box; long texts end with an ellipsis."""
    shared = stepped(tiny, "shared-prefix", 10)
    for view in (prefix_view, shared):
        fig = pt.tree_figure(view.snapshot, view.last_trace, view.traces, font_size)
        (labels,) = [t for t in fig.data if t.name == "labels"]
        x0, x1 = fig.layout.xaxis.range
        y0, y1 = fig.layout.yaxis.range  # levels, reversed: depth + 0.55 .. -0.55
        plot_h = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
        box_w = pt.BOX_W * (TREE_PLOT_PX - fig.layout.margin.l - fig.layout.margin.r) / (x1 - x0)
        box_h = pt.BOX_H * plot_h / abs(y0 - y1)
        cut = 0
        for text in labels.text:
            lines = text.split("<br>")
            span = SPAN_SIZE.search(text)
            sizes = [labels.textfont.size] + [int(span.group(1)) if span else labels.textfont.size] * (len(lines) - 1)
            for line, size in zip(lines, sizes):
                shown = _plain(line)
                assert len(shown) * size * CHAR_EM <= box_w, (font_size, shown, box_w)
                cut += shown.endswith("…")
            assert sum(sizes) * LINE_EM <= box_h, (font_size, lines, box_h)
        assert cut, "long node texts are cut with an ellipsis"


# -- events at the step they happen ----------------------------------------------------------------

def event_notes(fig: go.Figure, kind: str) -> list[Any]:
    return [a for a in fig.layout.annotations if (a.name or "") == ve.NOTE_PREFIX + kind]


def test_step_events_follow_the_traces(pressure_view: RunView, prefix_view: RunView, spec_view: RunView) -> None:
    """Each kind happens exactly where the records say, and nowhere else."""
    for view in (pressure_view, prefix_view, spec_view):
        events = ve.step_events(view.traces)
        by = lambda kind: {(e.step, e.request_id) for e in events if e.kind == kind}  # noqa: E731
        traces: tuple[StepTrace, ...] = view.traces
        assert by("preemption") == {(t.step + 1, r) for t in traces for r in t.preempted}
        assert by("prefix hit") == {(t.step + 1, h.request_id) for t in traces for h in t.prefix.lookups
                                    if h.num_cached_tokens}
        assert {e.step for e in events if e.kind == "eviction"} == {t.step + 1 for t in traces if t.prefix.evicted}
        assert by("rejected draft") == {(t.step + 1, v.request_id) for t in traces for v in t.spec
                                        if any(d.outcome == "rejected" for d in v.drafts)}
        for e in events:
            if e.kind == "split":  # a prefill chunk that sampled nothing: the prompt goes on next step
                t = traces[e.step - 1]
                assert any(c.request_id == e.request_id and c.kind == "prefill" for c in t.scheduled)
                assert e.request_id not in {s.request_id for s in t.sampled}
                later = [c for u in traces[e.step:] for c in u.scheduled if c.request_id == e.request_id]
                assert not later or later[0].kind == "prefill"
    kinds = {e.kind for v in (pressure_view, prefix_view, spec_view) for e in ve.step_events(v.traces)}
    assert {"preemption", "prefix hit", "split", "eviction", "rejected draft"} <= kinds


def test_a_preemption_is_captioned_on_the_swim_lane_at_its_step(tiny: "SharedModel", pressure_view: RunView,
                                                                torch_single_thread: None) -> None:
    pre = next(t for t in pressure_view.traces if t.preempted)
    at = stepped(tiny, "memory-pressure", pre.step + 1, enable_prefix_caching=False)
    fig = validated(vb.timeline_figure(at.traces, at.snapshot, PRESENT))
    notes = event_notes(fig, "preemption")
    assert notes and notes[-1].x == pre.step + 1 == at.step
    assert notes[-1].y == theme.plot_label(pre.preempted[0]) and "preempted" in notes[-1].text
    kv = validated(vk.kv_figure(at.snapshot, at.last_trace, font_size=PRESENT))
    (pool_note,) = event_notes(kv, "preemption")  # on the pool, at the first block the preemption freed
    cols = vk.grid_columns(at.snapshot.num_blocks)
    first = min(pre.blocks_freed)
    assert (pool_note.x, pool_note.y) == (first % cols, first // cols) and "blocks freed" in pool_note.text
    before = stepped(tiny, "memory-pressure", pre.step, enable_prefix_caching=False)
    assert not event_notes(vb.timeline_figure(before.traces, before.snapshot), "preemption")
    assert not event_notes(vk.kv_figure(before.snapshot, before.last_trace), "preemption")


def test_hits_evictions_and_rejections_are_captioned_where_they_happen(prefix_view: RunView,
                                                                       spec_view: RunView) -> None:
    fig = validated(ps.cache_figure(prefix_view.traces, prefix_view.snapshot, PRESENT))
    hits = {t.step + 1 for t in prefix_view.traces if t.prefix.num_cached_tokens}
    evictions = {t.step + 1 for t in prefix_view.traces if t.prefix.evicted}
    assert evictions and hits
    drawn_hits = event_notes(fig, "prefix hit")
    drawn_evictions = event_notes(fig, "eviction")
    assert drawn_hits and {a.x for a in drawn_hits} <= hits and max(a.x for a in drawn_hits) == max(hits)
    assert drawn_evictions and {a.x for a in drawn_evictions} <= evictions
    assert max(a.x for a in drawn_evictions) == max(evictions)
    assert len(fig.layout.annotations) <= 4 + 4 + 2 * ve.MAX_NOTES  # panel titles, budget lines, capped notes
    spec = validated(sv.tokens_per_step_figure(spec_view.traces, PRESENT, spec_view.step))
    rejected = {t.step + 1 for t in spec_view.traces if any(d.outcome == "rejected" for v in t.spec
                                                           for d in v.drafts)}
    drawn = event_notes(spec, "rejected draft")
    assert rejected and drawn and {a.x for a in drawn} <= rejected and max(a.x for a in drawn) == max(rejected)
    assert len(drawn) <= ve.MAX_NOTES and "rejected" in drawn[-1].text


def test_a_pipeline_bubble_is_captioned_on_the_gantt(tiny: "SharedModel", torch_single_thread: None) -> None:
    view = stepped(tiny, "pipeline", 2)
    trace = view.traces[-1]
    assert trace.pipeline is not None
    events = ve.step_events([trace])
    (bubble,) = [e for e in events if e.kind == "bubble"]
    assert bubble.step == view.step and 0 < bubble.amount < 1
    fig = validated(pv.gantt_figure(trace.pipeline, view.snapshot.parallel, PRESENT, view.step, events))
    (note,) = event_notes(fig, "bubble")
    assert f"step {view.step}" in note.text and note.y in fig.layout.meta["lanes"]
    assert not event_notes(pv.gantt_figure(trace.pipeline, view.snapshot.parallel, PRESENT, view.step), "bubble")


# -- defect 9: axes titled, titles within the chart at 1440 px -----------------------------------

def _axes(fig: go.Figure) -> dict[str, Any]:
    layout = fig.to_plotly_json()["layout"]
    return {k: v for k, v in layout.items() if k.startswith(("xaxis", "yaxis"))}


def test_pipeline_and_sweep_axes_have_titles(tiny: "SharedModel", torch_single_thread: None) -> None:
    """#19: the Gantt chart and the sweep had no axis titles (given as strings, which plotly.js
    3+ ignores in an unvalidated figure). Every axis carries {"text": ...} and automargin."""
    from engine.replay.run import SweepPoint

    view = stepped(tiny, "pipeline", 1)
    trace = view.traces[-1]
    assert trace.pipeline is not None
    gantt = pv.gantt_figure(trace.pipeline, view.snapshot.parallel, PRESENT, view.step)
    sweep = pv.sweep_figure([SweepPoint(1, 0.5, 0.5, 10.0), SweepPoint(2, 0.35, 1 / 3, 9.0)], 2, PRESENT)
    for name, fig in (("gantt", gantt), ("sweep", sweep)):
        axes = _axes(fig)
        assert {"xaxis", "yaxis"} <= set(axes), name
        for key, axis in axes.items():
            assert isinstance(axis.get("title"), dict) and axis["title"]["text"], (name, key)
            assert axis["automargin"] is True, (name, key)


ASSUMED_WIDTH_PX = 1000  # a stretched chart's plot width on a 1440-px screen with the sidebar open
CHAR_W = 0.5  # average character width of Source Sans, in ems


def test_titles_fit_the_chart_width_in_presentation_mode(spec_view: RunView, pressure_view: RunView,
                                                         prefix_view: RunView) -> None:
    """Chart and panel titles at the presentation font fit within the chart's width (its own
    ``width`` when it sets one, else a stretched chart at 1440 px)."""
    for name, fig in live_figures(PRESENT, spec_view, pressure_view, prefix_view).items():
        layout = fig.to_plotly_json()["layout"]
        width = layout.get("width") or ASSUMED_WIDTH_PX
        titles = [(layout["title"]["text"], layout["title"]["font"]["size"])]
        titles += [(a["text"], a["font"]["size"]) for a in layout.get("annotations", ())
                   if a.get("text", "").startswith("<b>")]  # panel titles (figures.stack)
        for text, size in titles:
            plain = _plain(text)
            assert len(plain) * CHAR_W * size <= width, (name, plain)
