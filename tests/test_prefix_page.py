"""The "Prefix cache" page through Streamlit's AppTest, on the real engine with `tiny-random`.

The page renders live and in replay without an exception; stepping the multi-turn scenario
fills the tree and the hit rate; the prefix-caching knob (shared by every live page) rebuilds
the run with caching off; the caching on/off comparison runs both for real; a recording replays
the same charts as the live run.
"""
from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from app.session import K
from engine.replay.recording import record, to_json
from tests.test_live_app import KV_CACHE, TIMEOUT, badges, chart, charts, click, errors, metric, ok, open_app, run_n, \
    steps_done

PREFIX = "app_pages/prefix_cache.py"
SCENARIO = "multi-turn"
TURN_2 = 13  # steps after which the travel chat's second turn (arrival step 12) has been admitted
LABEL_HIT = "hit this step"

pytestmark = pytest.mark.usefixtures("streamlit_clean")  # tests/conftest.py


def tree_boxes(spec: dict, label: str) -> int:
    """Boxes in a node-state trace of the tree chart (5 corners + None per box)."""
    trace = next(t for t in spec["data"] if t.get("name") == label)
    return 0 if trace["x"] == [None] else len(trace["x"]) // 6


def node_ids(spec: dict) -> list[int]:
    return [cd[0] for cd in next(t for t in spec["data"] if t.get("name") == "nodes")["customdata"]]


def open_tab(at: AppTest, label: str) -> AppTest:
    at.session_state["prefix_tab"] = label
    return ok(at.run())


def test_prefix_page_renders_and_steps_multi_turn() -> None:
    """Step 0: an empty tree, no hit rate. After the second turn's admission: more nodes, a matched
    path drawn as "hit", a hit rate above 0, and the step's lookup listed with its cached tokens."""
    at = open_app(PREFIX, scenario=SCENARIO)
    assert "Prefix cache" in [h.value for h in at.header]
    assert "LIVE engine" in badges(at)[0] and steps_done(at) == 0 and not errors(at)
    assert {"chart_prefix_tree", "chart_prefix_stats"} <= set(charts(at))
    tree0 = chart(at, "chart_prefix_tree")
    assert tree0["layout"]["meta"]["step"] == 0 and node_ids(tree0) == [0]
    assert metric(at, "Hit rate") == "—"
    assert at.session_state[K.run].engine.config.cache_config.enable_prefix_caching

    run_n(at, 2)
    first = node_ids(chart(at, "chart_prefix_tree"))
    assert len(first) > 1, "the first turn's full blocks are in the tree"
    run_n(at, TURN_2 - 2)
    tree = chart(at, "chart_prefix_tree")
    assert tree["layout"]["meta"]["step"] == TURN_2
    assert tree_boxes(tree, LABEL_HIT) >= 1
    assert set(first) <= set(node_ids(tree)), "nothing was evicted: the first turn's nodes are all still there"
    assert metric(at, "Hit rate") not in ("—", "0%")
    assert int(metric(at, "Prefill tokens saved")) > 0
    assert any("r2 admitted: **" in m.value and "from the cache" in m.value for m in at.markdown)
    assert chart(at, "chart_prefix_stats")["layout"]["meta"]["step"] == TURN_2


def test_prefix_caching_knob_rebuilds_the_run_with_caching_off() -> None:
    """The toggle in the shared knobs: off -> a fresh run at step 0, an engine without a tree, the
    page says so; the KV page of the same session shows the same run."""
    at = open_app(PREFIX, scenario=SCENARIO)
    run_n(at, 3)
    at.toggle(key=K.knob + "enable_prefix_caching").set_value(False)
    ok(at.run())
    assert steps_done(at) == 0 and not at.session_state[K.run].engine.config.cache_config.enable_prefix_caching
    run_n(at, 3)
    assert "prefix caching is off" in chart(at, "chart_prefix_tree")["layout"]["title"]["text"]
    assert any("Prefix caching is off" in i.value for i in at.info)
    assert metric(at, "Hit rate") == "—"
    ok(at.switch_page(KV_CACHE).run())
    assert steps_done(at) == 3 and not at.toggle(key=K.knob + "enable_prefix_caching").value


def test_caching_on_vs_off_runs_both_for_real() -> None:
    at = open_app(PREFIX, scenario="shared-prefix")
    open_tab(at, "Caching on vs off")
    click(at, "run_caching_comparison")
    assert not errors(at)
    summary = next(df.value for df in at.dataframe if "run" in df.value.columns).set_index("run")
    assert list(summary.index) == ["caching on", "caching off"]
    assert summary.loc["caching on", "prefill tokens computed"] < summary.loc["caching off", "prefill tokens computed"]
    assert summary.loc["caching on", "from cache"] > 0 == summary.loc["caching off", "from cache"]
    assert "chart_caching_comparison" in charts(at)
    ok(at.run())  # kept for the same set-up
    assert not [b for b in at.button if b.key == "run_caching_comparison"]


def test_a_recorded_caching_run_replays_the_same_charts() -> None:
    """Upload the live run's recording into a fresh session: REPLAY badge, and after the same steps
    the tree, the cache panels and the metrics are the live ones exactly."""
    live = open_app(PREFIX, scenario=SCENARIO)
    run_n(live, TURN_2)
    live_charts = charts(live)
    live_metrics = {m.label: m.value for m in live.metric if m.label != "Last step (engine)"}
    text = to_json(record(live.session_state[K.run]))

    at = open_app(PREFIX, scenario=SCENARIO)
    at.file_uploader(key=K.upload).set_value(("run.json", text.encode(), "application/json"))
    ok(at.run())
    assert "REPLAY" in badges(at)[0] and not errors(at)
    run_n(at, TURN_2)
    assert charts(at) == live_charts
    assert {m.label: m.value for m in at.metric if m.label != "Last step (engine)"} == live_metrics
    open_tab(at, "Caching on vs off")
    assert any("Recordings do not hold" in i.value for i in at.info)


def test_presentation_mode_on_the_prefix_page() -> None:
    at = open_app(PREFIX, scenario=SCENARIO)
    at.toggle(key=K.present).set_value(True)
    ok(at.run())
    assert chart(at, "chart_prefix_tree")["layout"]["font"]["size"] > 12
    assert not [e for e in at.expander if e.label == "Every cached node"]
    assert not [c for c in at.caption if c.value.startswith("The radix tree")]
    click(at, "step")
    assert steps_done(at) == 1 and chart(at, "chart_prefix_tree")["layout"]["meta"]["step"] == 1
