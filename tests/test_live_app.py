"""The whole app through Streamlit's AppTest, on the real engine with the `tiny-random` model.

Must show (issue item 2): every page renders without an exception; Step / Run N / Reset / Play
change the engine and the views; switching scenario applies its knobs and restarts at step 0;
a bad knob gives a message (never a traceback) and the next good value recovers; a recorded
run replays (REPLAY badge) exactly like the live run; presentation mode; the Batch composition
tabs and the static-vs-continuous comparison; the Generate page answers.

Live charts are a custom component (``bidi_component``, figure JSON under ``data["spec"]``)
when ``server.enableStaticServing`` is on (.streamlit/config.toml, read from the working
directory) and ``st.plotly_chart`` otherwise; ``charts`` reads both.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from app.scenarios import DEFAULT_SCENARIO
from app.session import K
from engine.core.config import SCHEDULING_POLICIES
from engine.replay.recording import record, to_json
from engine.replay.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
MAIN = ROOT / "app" / "main.py"
TIMEOUT = 120
MODEL = "tiny-random"
GENERATE = "app_pages/generate.py"
KV_CACHE = "app_pages/kv_cache.py"
BATCHING = "app_pages/batching.py"
FIT = "app_pages/fit.py"
TAB_KEY = "batching_tab"  # st.tabs key in app/app_pages/batching.py
KNOB_WIDGETS = ("block_size", "num_blocks", "max_num_batched_tokens", "max_num_seqs")


pytestmark = pytest.mark.usefixtures("streamlit_clean")  # tests/conftest.py


# -- helpers ----------------------------------------------------------------------------------

def ok(at: AppTest) -> AppTest:
    """Assert the last run raised nothing."""
    assert not at.exception, [e.value for e in at.exception]
    return at


def open_app(page: str | None = KV_CACHE, scenario: str | None = DEFAULT_SCENARIO) -> AppTest:
    """A fresh session on tiny-random (seeded before the first run), switched to ``page``.

    ``scenario`` is seeded as the user's own choice, so the page's scenario (scenarios.PAGE_SCENARIOS)
    does not replace it; None leaves the choice to the page."""
    at = AppTest.from_file(str(MAIN), default_timeout=TIMEOUT)
    at.session_state[K.model] = MODEL
    if scenario is not None:
        at.session_state[K.scenario] = scenario
        at.session_state[K.scenario_chosen] = True
    ok(at.run())
    if page is not None and page != GENERATE:
        ok(at.switch_page(page).run())
    return at


def click(at: AppTest, key: str) -> AppTest:
    return ok(at.button(key=key).click().run())


def charts(at: AppTest) -> dict[str, dict[str, Any]]:
    """Every chart's Plotly spec by widget key, from the live component or st.plotly_chart."""
    out: dict[str, dict[str, Any]] = {}
    for el in at.get("bidi_component"):
        if el.proto.component_name == "inferscope_step_queue":  # the Step-press counter, no chart
            continue
        assert el.proto.component_name == "inferscope_live_plot"
        payload = json.loads(el.proto.json)
        assert {"spec", "config", "src"} <= set(payload)
        out[el.proto.id.split("-", 2)[-1]] = json.loads(payload["spec"])
    for el in at.get("plotly_chart"):
        out[el.proto.id.split("-", 2)[-1]] = json.loads(el.proto.spec)
    return out


def chart(at: AppTest, key: str) -> dict[str, Any]:
    found = charts(at)
    assert key in found, f"no chart {key!r}; charts: {sorted(found)}"
    return found[key]


def chart_step(at: AppTest, key: str) -> int:
    return chart(at, key)["layout"]["meta"]["step"]


def free_cells(kv_spec: dict[str, Any]) -> int:
    """Free blocks drawn in the block-pool grid of the KV chart."""
    return sum(len(t["x"]) for t in kv_spec["data"] if t.get("name") == "free")


def metric(at: AppTest, label: str) -> str:
    values = [m.value for m in at.metric if m.label == label]
    assert values, f"no metric {label!r}; metrics: {[m.label for m in at.metric]}"
    return values[0]


def steps_done(at: AppTest) -> int:
    return int(metric(at, "Steps done"))


def badges(at: AppTest) -> list[str]:
    return [m.value for m in at.markdown if "-badge[" in m.value]


def errors(at: AppTest) -> list[str]:
    return [e.value for e in at.error]


def run_n(at: AppTest, n: int) -> AppTest:
    at.number_input(key=K.run_n).set_value(n)
    return click(at, "run_n_button")


def open_tab(at: AppTest, label: str) -> AppTest:
    """Select a Batch composition tab the way its key allows (AppTest has no tab setter)."""
    at.session_state[TAB_KEY] = label
    return ok(at.run())


def summary_policies(at: AppTest) -> list[str]:
    tables = [df.value for df in at.dataframe if "policy" in df.value.columns]
    assert len(tables) == 1, [list(df.value.columns) for df in at.dataframe]
    return list(tables[0]["policy"])


# -- every page --------------------------------------------------------------------------------

@pytest.mark.parametrize("page, header", [
    (GENERATE, "Generate"),
    (KV_CACHE, "Paged KV cache"),
    (BATCHING, "Batch composition"),
    (FIT, "📐 Will it fit?"),
])
def test_every_page_renders(page: str, header: str) -> None:
    """Each page of the navigation runs to the end without an exception and draws its own content."""
    at = open_app(page)
    assert header in [h.value for h in at.header] + [t.value for t in at.title]
    if page in (KV_CACHE, BATCHING):
        assert badges(at)[0].startswith(":green-badge[") and "LIVE engine" in badges(at)[0]
        assert steps_done(at) == 0
        assert charts(at), "a live page without a chart"
        assert not errors(at)


# -- stepping ----------------------------------------------------------------------------------

def test_step_changes_engine_and_views() -> None:
    """Step runs one real engine step: the metric, the chart's meta.step and the block pool all change."""
    at = open_app(KV_CACHE)
    kv0 = chart(at, "chart_kv_cache")
    assert kv0["layout"]["meta"]["step"] == 0 and free_cells(kv0) == 160
    assert metric(at, "Free blocks") == "160 / 160"
    assert any("No step yet" in m.value for m in at.markdown)
    engine = at.session_state[K.run].engine

    click(at, "step")
    assert steps_done(at) == 1
    kv1 = chart(at, "chart_kv_cache")
    assert kv1["layout"]["meta"]["step"] == 1 and "after 1 steps" in kv1["layout"]["title"]["text"]
    assert free_cells(kv1) < 160
    assert metric(at, "Free blocks") == f"{free_cells(kv1)} / 160"  # the chart and the metric agree
    assert kv1["data"] != kv0["data"]
    assert any("blocks allocated" in m.value for m in at.markdown)
    assert at.session_state[K.run].engine is engine and len(at.session_state[K.run].traces) == 1

    click(at, "step")
    assert steps_done(at) == 2 and chart_step(at, "chart_kv_cache") == 2
    assert chart_step(at, "chart_kv_waste") == 2


def test_run_n_runs_n_steps_and_stops_at_the_end() -> None:
    """Run N advances exactly N steps each time, and never past the last request's end."""
    at = open_app(KV_CACHE)
    run_n(at, 5)
    assert steps_done(at) == 5 and chart_step(at, "chart_kv_cache") == 5
    run_n(at, 3)
    assert steps_done(at) == 8 and chart_step(at, "chart_kv_cache") == 8

    run_n(at, 1000)
    total = steps_done(at)
    assert 8 < total < 1000
    assert any("all requests finished" in b for b in badges(at))
    free = int(metric(at, "Free blocks").split(" / ")[0])
    assert metric(at, "Finished") == "16 / 16" and metric(at, "Free blocks").endswith(" / 160")
    assert free + int(metric(at, "Cached blocks")) == 160  # nothing in use; the rest is cached
    click(at, "step")
    assert steps_done(at) == total


def test_reset_goes_back_to_step_zero() -> None:
    """Reset rebuilds the run from the controls: step 0, an empty pool, a fresh engine."""
    at = open_app(KV_CACHE)
    run_n(at, 4)
    before = at.session_state[K.run]
    assert steps_done(at) == 4
    click(at, "reset")
    assert steps_done(at) == 0 and chart_step(at, "chart_kv_cache") == 0
    assert metric(at, "Free blocks") == "160 / 160" and free_cells(chart(at, "chart_kv_cache")) == 160
    assert at.session_state[K.run] is not before
    click(at, "step")
    assert steps_done(at) == 1


def test_play_steps_on_every_views_run_until_paused() -> None:
    """Play makes each views run take a step (the timer itself never fires in AppTest); Pause stops it."""
    at = open_app(KV_CACHE)
    click(at, "play")
    assert at.button(key="play").label == "Pause"
    assert steps_done(at) == 1
    ok(at.run())
    assert steps_done(at) == 2
    click(at, "play")
    assert at.button(key="play").label == "Play"
    stopped = steps_done(at)
    ok(at.run())
    assert steps_done(at) == stopped


def test_play_from_an_earlier_step_of_a_finished_run_stops_at_its_end() -> None:
    """Play walks the history forward; at the finished run's latest step it stops by itself (the
    button says Play again, and further views runs take no step)."""
    at = open_app(KV_CACHE)
    at.number_input(key=K.run_n).set_value(1000)
    click(at, "run_n_button")  # the whole run (Run N stops when it is done)
    done = steps_done(at)
    click(at, "step_back")
    click(at, "play")
    for _ in range(5):
        if at.button(key="play").label == "Play":
            break
        ok(at.run())
    assert at.button(key="play").label == "Play" and steps_done(at) == done
    ok(at.run())
    assert steps_done(at) == done


# -- scenario and knobs ------------------------------------------------------------------------

def test_switching_scenario_applies_its_knobs_and_restarts() -> None:
    """A new scenario brings its own knobs into the widgets and the engine, and starts again at step 0."""
    at = open_app(KV_CACHE)
    run_n(at, 3)
    at.selectbox(key=K.scenario).set_value("memory-pressure")
    ok(at.run())
    sc = load_scenario("memory-pressure")
    for knob in KNOB_WIDGETS:
        assert at.number_input(key=K.knob + knob).value == sc.knobs[knob], knob
    config = at.session_state[K.run].engine.config
    assert (config.cache_config.block_size, config.cache_config.num_blocks) == (sc.knobs["block_size"], sc.knobs["num_blocks"])
    assert steps_done(at) == 0 and chart_step(at, "chart_kv_cache") == 0
    assert metric(at, "Finished") == f"0 / {len(sc.requests)}"
    assert metric(at, "Free blocks") == "40 / 40" and free_cells(chart(at, "chart_kv_cache")) == 40
    assert any(sc.title in b and MODEL in b for b in badges(at))
    click(at, "step")
    assert steps_done(at) == 1


@pytest.mark.parametrize("knob, bad, words", [
    ("block_size", 0, ("block_size",)),
    ("max_num_batched_tokens", 0, ("max_num_batched_tokens",)),
    ("num_blocks", 2, ("num_blocks", "cannot hold")),
    ("max_num_seqs", 0, ("max_num_seqs",)),
])
def test_bad_knob_gives_a_message_and_a_good_value_recovers(knob: str, bad: int, words: tuple[str, ...]) -> None:
    """A knob the engine rejects shows an error naming it (no traceback, no stale view); a good value recovers."""
    at = open_app(KV_CACHE)
    click(at, "step")
    good = at.number_input(key=K.knob + knob).value
    at.number_input(key=K.knob + knob).set_value(bad)
    ok(at.run())
    assert len(errors(at)) == 1 and all(w in errors(at)[0] for w in words), errors(at)
    assert not at.metric and not charts(at)
    ok(at.run())  # the same bad request again: still the message, still no exception
    assert len(errors(at)) == 1
    click(at, "step")  # nothing to step
    assert len(errors(at)) == 1

    at.number_input(key=K.knob + knob).set_value(good)
    ok(at.run())
    assert not errors(at)
    assert steps_done(at) == 0 and chart_step(at, "chart_kv_cache") == 0
    click(at, "step")
    assert steps_done(at) == 1


def test_switching_scenario_recovers_from_a_bad_knob() -> None:
    """After a bad knob, picking a scenario restores that scenario's knobs and a working run."""
    at = open_app(KV_CACHE)
    at.number_input(key=K.knob + "block_size").set_value(0)
    ok(at.run())
    assert errors(at)
    at.selectbox(key=K.scenario).set_value("mixed-lengths")
    ok(at.run())
    assert not errors(at)
    assert at.number_input(key=K.knob + "block_size").value == load_scenario("mixed-lengths").knobs["block_size"]
    assert steps_done(at) == 0


# -- record and replay -------------------------------------------------------------------------

def test_a_recorded_run_replays_like_the_live_run() -> None:
    """An uploaded recording replays with the REPLAY badge, locked controls and the live run's exact charts."""
    live = open_app(KV_CACHE)
    run_n(live, 3)
    live_charts = charts(live)
    text = to_json(record(live.session_state[K.run]))

    at = open_app(KV_CACHE)
    at.file_uploader(key=K.upload).set_value(("run.json", text.encode(), "application/json"))
    ok(at.run())
    assert not errors(at)
    assert badges(at)[0].startswith(":orange-badge[") and "REPLAY" in badges(at)[0]
    assert any("Replaying a recording of" in c.value and "(3 steps)" in c.value for c in at.caption)
    assert at.selectbox(key=K.scenario).disabled and at.number_input(key=K.knob + "block_size").disabled
    assert steps_done(at) == 0

    for _ in range(3):
        click(at, "step")
    assert steps_done(at) == 3
    assert charts(at) == live_charts
    click(at, "step")  # past the end of the recording
    assert steps_done(at) == 3
    click(at, "reset")
    assert steps_done(at) == 0 and "REPLAY" in badges(at)[0]

    click(at, "leave_replay")
    assert "LIVE engine" in badges(at)[0] and steps_done(at) == 0
    ok(at.run())
    click(at, "step")
    assert steps_done(at) == 1 and "LIVE engine" in badges(at)[0]


def test_a_broken_recording_gives_a_message() -> None:
    """An upload that is not a recording is reported, and the live run stays."""
    at = open_app(KV_CACHE)
    at.file_uploader(key=K.upload).set_value(("bad.json", b"{not json", "application/json"))
    ok(at.run())
    assert errors(at) and "recording" in errors(at)[0]
    assert "LIVE engine" in badges(at)[0]


# -- presentation ------------------------------------------------------------------------------

def test_presentation_mode_hides_explanations() -> None:
    """Presentation mode renders without an exception: larger chart fonts, no intro or exports; off restores them."""
    at = open_app(KV_CACHE)
    explained_downloads = len(at.get("download_button"))
    assert not at.get("html")
    at.toggle(key=K.present).set_value(True)
    ok(at.run())
    assert any("font-size" in h.proto.body for h in at.get("html"))
    assert chart(at, "chart_kv_cache")["layout"]["font"]["size"] > 12
    assert not any(c.value.startswith("Top: every square") for c in at.caption)
    assert len(at.get("download_button")) < explained_downloads
    click(at, "step")
    assert steps_done(at) == 1

    at.toggle(key=K.present).set_value(False)
    ok(at.run())
    assert not at.get("html") and len(at.get("download_button")) == explained_downloads
    assert chart(at, "chart_kv_cache")["layout"]["font"]["size"] == 12


# -- batch composition ---------------------------------------------------------------------------

def test_batching_tabs_render() -> None:
    """Each Batch composition tab renders its own chart (and table) for the current step."""
    at = open_app(BATCHING)
    assert [t.label for t in at.tabs] == ["Live batches", "Latency per request", "Static vs continuous",
                                          "Scheduling policies"]
    assert set(charts(at)) == {"chart_batch_timeline"}
    run_n(at, 4)
    assert chart_step(at, "chart_batch_timeline") == 4

    open_tab(at, "Latency per request")
    assert set(charts(at)) == {"chart_batch_latency"} and chart_step(at, "chart_batch_latency") == 4
    assert any(len(df.value) == 16 for df in at.dataframe)  # one latency row per request

    open_tab(at, "Static vs continuous")
    assert at.button(key="run_comparison").label == "Run both policies"
    assert steps_done(at) == 4


def test_static_vs_continuous_comparison_runs_and_replays() -> None:
    """The comparison button runs both policies to the end: a summary table with both, kept on rerun and in a recording."""
    at = open_app(BATCHING)
    open_tab(at, "Static vs continuous")
    click(at, "run_comparison")
    assert not errors(at)
    assert sorted(summary_policies(at)) == ["continuous", "static"]
    table = next(df.value for df in at.dataframe if "policy" in df.value.columns).set_index("policy")
    assert table.loc["static", "steps"] > table.loc["continuous", "steps"]  # 16 requests, 8 slots
    assert {"chart_policy_lanes", "chart_policy_latency"} <= set(charts(at))
    ok(at.run())
    assert sorted(summary_policies(at)) == ["continuous", "static"]
    assert not [b for b in at.button if b.key == "run_comparison"]

    text = to_json(record(at.session_state[K.run]))
    at.file_uploader(key=K.upload).set_value(("run.json", text.encode(), "application/json"))
    ok(at.run())
    assert "REPLAY" in badges(at)[0]
    assert sorted(summary_policies(at)) == ["continuous", "static"]


def test_scheduling_policy_comparison_runs_every_policy() -> None:
    """The Scheduling policies tab runs the scenario to the end once per scheduling_policy on the
    real engine: one summary row each (TTFT in steps, preemptions, hit rate, finish order) and the
    TTFT chart, kept on rerun; the session's own run is not stepped."""
    at = open_app(BATCHING)
    open_tab(at, "Scheduling policies")
    click(at, "run_scheduling_comparison")
    assert not errors(at)
    tables = [df.value for df in at.dataframe if "scheduling policy" in df.value.columns]
    assert len(tables) == 1 and list(tables[0]["scheduling policy"]) == list(SCHEDULING_POLICIES)
    table = tables[0].set_index("scheduling policy")
    assert (table["mean TTFT (steps)"] > 0).all() and (table["p90 TTFT (steps)"] >= table["mean TTFT (steps)"]).all()
    assert all(len(order.split()) == 16 for order in table["finish order"])  # the scenario's 16 requests
    assert "chart_scheduling_ttft" in charts(at)
    assert steps_done(at) == 0
    ok(at.run())
    assert [df for df in at.dataframe if "scheduling policy" in df.value.columns]
    assert not [b for b in at.button if b.key == "run_scheduling_comparison"]


# -- generate ----------------------------------------------------------------------------------

def test_generate_answers_with_tiny_random() -> None:
    """The Generate page sends one request through the engine and shows its answer and step table."""
    at = open_app(GENERATE)
    at.selectbox(key="gen_model").set_value(MODEL)
    at.number_input(key="gen_max_tokens").set_value(8)
    click(at, "generate")
    assert not errors(at)
    assert len(at.chat_message) == 1
    assert metric(at, "Output tokens") == "8" and metric(at, "Engine steps") == "8"
    assert metric(at, "Finish reason") == "length" and int(metric(at, "Prompt tokens")) > 0
    assert len(at.dataframe[0].value) == 8
    ok(at.run())  # a rerun shows the stored answer without generating again
    assert len(at.chat_message) == 1 and metric(at, "Output tokens") == "8"


def test_play_pause_presses_are_a_counted_value_like_step_presses() -> None:
    """app/step_queue.py: the browser counts Play/Pause presses (its button or P) next to the Step
    presses, in one value per server session (a value survives the Play ticks' reruns, where a
    button trigger could be lost); the server reads each count only for its own epoch."""
    from app import step_queue

    value = {"presses": {"epoch": "e1", "count": 3, "plays": 5}}
    assert step_queue.presses(value, "e1") == 3 and step_queue.presses(value, "e1", "plays") == 5
    assert step_queue.presses(value, "e2", "plays") is None  # another session's presses
    assert step_queue.presses({"presses": {"epoch": "e1", "count": 2}}, "e1", "plays") == 0  # none yet
    for bad in (-1, True, "2", 1.5):
        assert step_queue.presses({"presses": {"epoch": "e1", "plays": bad}}, "e1", "plays") is None
    keys = step_queue.key_map()
    assert keys["p"] == {"play": True} and keys["PageDown"] == {"step": True}
    assert all("play" not in str(what.get("click", "")) for what in keys.values())  # never the trigger path
