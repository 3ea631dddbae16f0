"""Talk mode, the parts AppTest can see: the history cursor (Step back, the Step slider, Step /
Run N / Play / Reset with the cursor behind), each page's own scenario, deep links (``?step=``,
``?recording=``), and the bundled recordings (every one loads, replays to the end and draws its
page's views). The browser side (real clicks, links typed in the address bar, the switch button)
is tests/browser/test_talk_browser.py.
"""
from __future__ import annotations

from typing import Callable

import pytest
from streamlit.testing.v1 import AppTest

from app.scenarios import PAGE_SCENARIOS
from app.session import K
from engine.replay.bundled import BUNDLES, RECORDING_DIR, MAX_FILE_BYTES, bundled_names, bundled_path, load_bundled
from engine.parallel.stats import merge_timelines, pipeline_stats
from engine.replay.run import ReplayRun, RunView
from tests.test_live_app import (KV_CACHE, MAIN, MODEL, TIMEOUT, badges, chart_step, click, errors, metric, ok,
                                 open_app, run_n, steps_done)
from visualizers import batching as vb
from visualizers import kv_blocks as kv
from visualizers import pipeline as pv
from visualizers import prefix_stats as ps
from visualizers import prefix_tree as pt
from visualizers import speculative as sv

pytestmark = pytest.mark.usefixtures("streamlit_clean")  # tests/conftest.py

SPEC = "app_pages/speculative.py"
PREFIX = "app_pages/prefix_cache.py"
BATCHING = "app_pages/batching.py"
PIPELINE = "app_pages/pipeline.py"


def engine_steps(at: AppTest) -> int:
    return len(at.session_state[K.run].traces)


def slide(at: AppTest, value: int) -> AppTest:
    at.slider(key=K.step_slider).set_value(value)
    return ok(at.run())


# -- the history cursor ------------------------------------------------------------------------

def test_step_back_redraws_earlier_steps_and_step_walks_forward_before_the_engine() -> None:
    at = open_app(KV_CACHE)
    run_n(at, 4)
    assert metric(at, "Steps done") == "4" and chart_step(at, "chart_kv_cache") == 4
    free_at = {4: metric(at, "Free blocks")}

    click(at, "step_back")
    assert metric(at, "Steps done") == "3 of 4" and chart_step(at, "chart_kv_cache") == 3
    assert chart_step(at, "chart_kv_waste") == 3 and at.slider(key=K.step_slider).value == 3
    click(at, "step_back")
    assert metric(at, "Steps done") == "2 of 4" and chart_step(at, "chart_kv_cache") == 2
    assert engine_steps(at) == 4, "stepping back changes no engine state"

    click(at, "step")  # forward through the history: no engine work
    assert metric(at, "Steps done") == "3 of 4" and engine_steps(at) == 4
    click(at, "step")
    assert metric(at, "Steps done") == "4" and engine_steps(at) == 4 and metric(at, "Free blocks") == free_at[4]
    click(at, "step")  # at the end: the engine steps
    assert steps_done(at) == 5 and engine_steps(at) == 5 and chart_step(at, "chart_kv_cache") == 5


def test_step_back_stops_at_step_zero() -> None:
    at = open_app(KV_CACHE)
    click(at, "step")
    click(at, "step_back")
    assert metric(at, "Steps done") == "0 of 1" and chart_step(at, "chart_kv_cache") == 0
    assert metric(at, "Free blocks") == "160 / 160"
    click(at, "step_back")
    assert metric(at, "Steps done") == "0 of 1"


def test_slider_run_n_play_and_reset_follow_the_cursor() -> None:
    at = open_app(KV_CACHE)
    run_n(at, 4)
    slide(at, 1)
    assert metric(at, "Steps done") == "1 of 4" and chart_step(at, "chart_kv_cache") == 1
    run_n(at, 2)  # two steps of history
    assert metric(at, "Steps done") == "3 of 4" and engine_steps(at) == 4
    run_n(at, 3)  # one of history, then two engine steps
    assert steps_done(at) == 6 and engine_steps(at) == 6 and chart_step(at, "chart_kv_cache") == 6

    slide(at, 4)
    click(at, "play")  # Play walks the history too
    assert metric(at, "Steps done") == "5 of 6" and engine_steps(at) == 6
    click(at, "play")  # pause
    slide(at, 2)
    click(at, "reset")
    assert steps_done(at) == 0 and chart_step(at, "chart_kv_cache") == 0
    assert K.step_slider not in [s.key for s in at.slider], "no history to slide over at step 0"


def test_step_back_in_a_replay() -> None:
    """The same cursor over a bundled recording: no model, the replay's own steps."""
    at = open_app(KV_CACHE)
    click(at, "replay_bundled")
    assert "REPLAY" in badges(at)[0] and isinstance(at.session_state[K.run], ReplayRun)
    run_n(at, 3)
    click(at, "step_back")
    assert metric(at, "Steps done") == "2 of 3" and chart_step(at, "chart_kv_cache") == 2
    click(at, "step")
    click(at, "step")
    assert steps_done(at) == 4 and at.session_state[K.run].num_steps == 4


# -- each page's own scenario ------------------------------------------------------------------

@pytest.mark.parametrize("page, path", [(SPEC, "speculative"), (PREFIX, "prefix-cache"), (BATCHING, "batching"),
                                        (KV_CACHE, "kv-cache")])
def test_each_page_opens_on_its_own_scenario(page: str, path: str) -> None:
    at = open_app(page, scenario=None)
    assert at.session_state[K.scenario] == PAGE_SCENARIOS[path] and not errors(at)
    assert at.session_state[K.run].meta.scenario == PAGE_SCENARIOS[path]
    if page == SPEC:
        assert at.session_state[K.run].engine.config.speculative_config is not None
        assert not any("Speculation is off" in i.value for i in at.info)
    run_n(at, 3)
    assert steps_done(at) == 3


def test_pipeline_page_opens_on_two_workers() -> None:
    at = open_app(PIPELINE, scenario=None)
    try:
        config = at.session_state[K.run].engine.config
        assert config.parallel_config.pipeline_parallel_size == 2 and not any("single process" in i.value for i in at.info)
        run_n(at, 2)
        assert chart_step(at, "chart_pipeline_gantt") == 2
    finally:
        at.session_state[K.run].close()


def test_a_chosen_scenario_stays_across_pages() -> None:
    """Once the user picks a scenario, pages no longer replace it with their own."""
    at = open_app(KV_CACHE, scenario=None)
    assert at.session_state[K.scenario] == PAGE_SCENARIOS["kv-cache"]
    at.selectbox(key=K.scenario).set_value("chat-burst")
    ok(at.run())
    click(at, "step")
    ok(at.switch_page(SPEC).run())
    assert at.session_state[K.scenario] == "chat-burst" and steps_done(at) == 1
    assert any("Speculation is off" in i.value for i in at.info)


# -- deep links --------------------------------------------------------------------------------

def open_link(page: str, **query: str) -> AppTest:
    """A fresh session opened from a link to ``page`` with ``query`` (tiny-random)."""
    at = AppTest.from_file(str(MAIN), default_timeout=TIMEOUT)
    at.query_params.update({K.model: MODEL, **query})
    ok(at.run())
    return ok(at.switch_page(page).run())


def test_a_step_link_opens_at_that_step() -> None:
    at = open_link(KV_CACHE, live_scenario="chat-burst", step="5")
    assert steps_done(at) == 5 and chart_step(at, "chart_kv_cache") == 5
    assert at.session_state[K.scenario] == "chat-burst"
    ok(at.run())
    assert steps_done(at) == 5, "a link's steps run once, not on every rerun"


def test_a_copied_address_bar_link_opens_its_scenario() -> None:
    """The bound Scenario dropdown writes its title into the URL; a copied URL must open that
    scenario, not the default with the dropdown showing another."""
    at = open_link(KV_CACHE, live_scenario="Shared system prompt (few-shot)", step="2")
    assert at.session_state[K.run].meta.scenario == "shared-prefix" and steps_done(at) == 2


def test_a_link_to_a_step_of_a_bundled_recording() -> None:
    at = open_link(SPEC, recording="spec-copy", step="6")
    assert "REPLAY" in badges(at)[0] and not errors(at)
    assert steps_done(at) == 6 and at.session_state[K.run].meta.model == "smollm2-135m"


@pytest.mark.parametrize("query, words", [({"step": "many"}, "step"), ({"step": "-3"}, "step"),
                                          ({"recording": "../secrets"}, "no bundled recording")])
def test_a_bad_link_gives_a_message(query: dict[str, str], words: str) -> None:
    at = open_link(KV_CACHE, **query)
    assert any(words in e for e in errors(at)), errors(at)
    assert steps_done(at) == 0 and not at.exception


# -- bundled recordings ------------------------------------------------------------------------

Draw = Callable[[RunView], object]


def draw_kv(v: RunView) -> None:
    snap = v.snapshot
    kv.kv_figure(snap, v.last_trace, None, 12)
    frame = kv.waste_frame(snap, v.meta.max_model_len)
    kv.waste_figure(frame, snap.num_blocks * snap.block_size, snap.step, 12)
    kv.step_events_markdown(kv.step_events_frame(v.last_trace))
    kv.block_table_frame(snap)


def draw_batching(v: RunView) -> None:
    vb.timeline_figure(v.traces, v.snapshot, 12)
    vb.latency_figure(v.snapshot, 12)
    vb.latency_frame(v.snapshot)


def draw_prefix(v: RunView) -> None:
    pt.tree_figure(v.snapshot, v.last_trace, v.traces, 12)
    ps.cache_figure(v.traces, v.snapshot, 12)
    ps.cache_stats_frame(v.traces)
    pt.events_markdown(v.last_trace, v.snapshot.block_size)


def draw_spec(v: RunView) -> None:
    sv.drafts_figure(v.last_trace, 12, v.step)
    sv.tokens_per_step_figure(v.traces, 12, v.step)
    sv.spec_requests_frame(v.traces)


def draw_pipeline(v: RunView) -> None:
    timed = pv.timed_steps(v.traces)
    if timed and v.snapshot.parallel is not None:
        timeline = merge_timelines([timed[-1][1]])
        pipeline_stats(timeline)
        pv.gantt_figure(timeline, v.snapshot.parallel, 12, v.step)
    pv.stats_frame(v.traces)


# the pages each bundled recording is for (scenarios.PAGE_SCENARIOS), and what those pages draw
DRAWS: dict[str, tuple[Draw, ...]] = {"kv-cache": (draw_kv,), "batching": (draw_batching, draw_kv),
                                      "prefix-cache": (draw_prefix,), "speculative": (draw_spec,),
                                      "pipeline": (draw_pipeline,)}


def test_every_page_scenario_has_a_bundled_recording() -> None:
    assert set(PAGE_SCENARIOS.values()) <= set(bundled_names()) == {b.scenario for b in BUNDLES}


@pytest.mark.parametrize("name", sorted({b.scenario for b in BUNDLES}))
def test_a_bundled_recording_loads_and_replays_to_the_end_drawing_its_pages(name: str) -> None:
    path = bundled_path(name)
    assert path.parent == RECORDING_DIR and path.stat().st_size < MAX_FILE_BYTES
    recording = load_bundled(name)  # validated like an upload
    assert recording.meta.model == "smollm2-135m" and recording.meta.scenario == name
    replay = ReplayRun(recording)
    pages = [p for p, s in PAGE_SCENARIOS.items() if s == name]
    while not replay.done:
        replay.step()
        view = replay.view()
        for page in pages:
            for draw in DRAWS[page]:
                draw(view)
    final = replay.view()
    assert final.done and all(r.status.value == "finished" for r in final.snapshot.requests)
    for at in (0, final.step // 2):  # and back through the history
        for page in pages:
            for draw in DRAWS[page]:
                draw(replay.view(at))


# What each bundled recording must show for its page to make its point on stage.
SHOWS = {
    "memory-pressure": ("a preemption", lambda t: bool(t.preempted)),
    "shared-prefix": ("a prefix-cache hit", lambda t: t.prefix.num_cached_tokens > 0),
    "spec-copy": ("an accepted draft", lambda t: any(v.num_accepted > 0 for v in t.spec)),
    "pipeline": ("work on pipeline workers", lambda t: t.pipeline is not None),
    "mixed-lengths": ("a step mixing prefill and decode", lambda t: t.num_prefill_tokens > 0 < t.num_decode_tokens),
}


@pytest.mark.parametrize("name", sorted(SHOWS))
def test_a_bundled_recording_shows_its_pages_idea(name: str) -> None:
    """The trimmed run still does what its page explains (the first trim of memory-pressure,
    5 requests x 36 tokens, fitted the 40-block pool and never preempted)."""
    what, seen = SHOWS[name]
    assert any(seen(t) for t in load_bundled(name).traces), f"the {name} recording shows no {what}"


def test_a_bundled_name_cannot_leave_the_folder() -> None:
    for bad in ("../scenarios/chat-burst", "/etc/passwd", "", "spec-copy.json"):
        with pytest.raises(ValueError, match="recording"):
            bundled_path(bad)
