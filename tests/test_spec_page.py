"""The "Speculative decoding" page through Streamlit's AppTest, on the real engine (tiny-random).

The sidebar's drafter controls rebuild the run with speculative_config (the badge names it);
stepping draws the drafts the engine verified; the theory tab shows α and the curves; with
speculation off the page says how to turn it on; a recording replays the same drafts.
"""
from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from app.session import K
from engine.replay.recording import record, to_json
from tests.test_live_app import badges, chart, charts, errors, ok, open_app, run_n

SPEC = "app_pages/speculative.py"

pytestmark = pytest.mark.usefixtures("streamlit_clean")  # tests/conftest.py


def open_tab(at: AppTest, label: str) -> AppTest:
    at.session_state["spec_tab"] = label
    return ok(at.run())


def speculating(method: str = "early_exit", k: int = 3) -> AppTest:
    at = open_app(SPEC)
    at.session_state[K.spec_method] = method
    at.session_state[K.spec_k] = k
    at.session_state[K.spec_layers] = 1
    return ok(at.run())


def test_off_by_default_says_how_to_turn_it_on() -> None:
    at = open_app(SPEC)
    assert "Speculative decoding" in [h.value for h in at.header] and not errors(at)
    assert any("Speculation is off" in i.value for i in at.info)
    assert at.session_state[K.run].engine.config.speculative_config is None


def test_drafter_controls_rebuild_the_run_and_the_drafts_are_drawn() -> None:
    at = speculating()
    config = at.session_state[K.run].engine.config.speculative_config
    assert config.method == "early_exit" and config.num_speculative_tokens == 3 and config.num_layers == 1
    assert "early exit 1 layers k=3" in badges(at)[1]
    run_n(at, 4)
    fig = chart(at, "chart_spec_drafts")
    assert fig["layout"]["meta"]["step"] == 4
    last = at.session_state[K.run].traces[-1]
    cells = sum(len(t["x"]) for t in fig["data"])
    assert cells == sum(len(v.drafts) + 1 for v in last.spec) > 0
    assert "chart_spec_pq" in charts(at)
    assert any(":green-background[" in m.value for m in at.markdown)


def test_theory_tab_shows_the_measured_alpha() -> None:
    at = open_tab(speculating(), "Acceptance & theory")
    assert any("No drafts verified yet" in i.value for i in at.info)
    run_n(at, 5)
    fig = chart(at, "chart_spec_theory")
    assert "α = " in fig["layout"]["title"]["text"]
    assert {"chart_spec_tokens"} <= set(charts(at))
    positions = next(d.value for d in at.dataframe if "position" in d.value.columns)
    assert positions.iloc[0]["position"] == 1 and positions["accepted"].sum() <= positions["verified"].sum()


def test_a_speculative_recording_replays_the_same_drafts() -> None:
    live = speculating("ngram", 4)
    run_n(live, 6)
    live_chart = chart(live, "chart_spec_drafts")
    text = to_json(record(live.session_state[K.run]))
    at = open_app(SPEC)
    at.file_uploader(key=K.upload).set_value(("run.json", text.encode(), "application/json"))
    ok(at.run())
    assert "REPLAY" in badges(at)[0] and "ngram k=4" in badges(at)[1] and not errors(at)
    run_n(at, 6)
    assert chart(at, "chart_spec_drafts") == live_chart
    open_tab(at, "With vs without")
    assert any("Recordings do not hold" in i.value for i in at.info)


def test_with_and_without_runs_both_for_real() -> None:
    at = open_tab(speculating("ngram", 4), "With vs without")
    at.button(key="run_spec_comparison").click()
    ok(at.run())
    assert not errors(at)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Same text with and without"] == "yes"  # greedy: token for token
    with_spec, without = (int(x) for x in metrics["Target steps"].split(" vs "))
    assert with_spec <= without
    assert "chart_spec_comparison" in charts(at)
    frame = next(d.value for d in at.dataframe if "target steps" in d.value.columns)
    assert list(frame["run"]) == ["with speculation", "without speculation"]
