"""The "Quantization" page through Streamlit's AppTest, on the real engine with `tiny-random`.

Every tab renders live (and in replay, where the activations say they need the live engine);
the weight views follow the scheme, layer and matrix chosen; the activation views come from the
run's own ActivationRecorder and grow with its steps; the trade-off measurement runs for real
from the button; the KV tab measures the KV dtypes; a quantized run is named in the badge.
"""
from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from app.session import K
from engine.replay.recording import record, to_json
from tests.test_live_app import badges, chart, charts, click, errors, ok, open_app, run_n

QUANT = "app_pages/quantization.py"
TAB_KEY = "quant_tab"

pytestmark = pytest.mark.usefixtures("streamlit_clean")  # tests/conftest.py


def open_tab(at: AppTest, label: str) -> AppTest:
    at.session_state[TAB_KEY] = label
    return ok(at.run())


def test_weights_tab_follows_scheme_layer_and_matrix() -> None:
    at = open_app(QUANT)
    assert "Quantization" in [h.value for h in at.header] and not errors(at)
    assert {"chart_quant_histogram", "chart_quant_scales", "chart_quant_errors"} <= set(charts(at))
    hist = chart(at, "chart_quant_histogram")
    assert "int4" in hist["layout"]["title"]["text"] and "layer 0" in hist["layout"]["title"]["text"]
    at.session_state["quant_scheme"] = "fp8"
    at.session_state["quant_layer"] = 1
    at.session_state["quant_matrix"] = "down_proj"
    ok(at.run())
    title = chart(at, "chart_quant_histogram")["layout"]["title"]["text"]
    assert "fp8" in title and "layer 1" in title and "down_proj" in title
    heat = chart(at, "chart_quant_errors")
    assert len(heat["data"][0]["z"]) == at.session_state[K.run].engine.runner.model.config.num_hidden_layers
    assert "bfloat16" in " ".join(c.value for c in at.caption)


def test_activations_come_from_the_live_run_and_grow_with_it() -> None:
    at = open_tab(open_app(QUANT), "Activations")
    assert "chart_activation_absmax" not in charts(at)  # step 0: nothing computed yet
    assert any("Step the run" in i.value for i in at.info)
    run_n(at, 3)
    heat = chart(at, "chart_activation_absmax")
    assert heat["layout"]["meta"]["step"] == 3
    recorder = at.session_state[K.run].activation_recorder()
    recorder.check_integrity()
    tokens_3 = recorder.num_tokens
    assert tokens_3 == sum(r.num_computed_tokens for r in at.session_state[K.run].engine.requests.values())
    hist = chart(at, "chart_activation_histogram")
    assert sum(hist["data"][0]["y"]) == recorder.stats().histogram.num_values
    assert "chart_activation_float_columns" in charts(at)
    run_n(at, 2)
    assert chart(at, "chart_activation_absmax")["layout"]["meta"]["step"] == 5
    assert recorder.num_tokens > tokens_3
    at.session_state["quant_linear"] = "down"
    ok(at.run())
    assert "down" in chart(at, "chart_activation_absmax")["layout"]["title"]["text"]


def test_smoothquant_tab_shows_the_range_moved() -> None:
    at = open_tab(open_app(QUANT), "SmoothQuant")
    fig = chart(at, "chart_smoothing")
    assert "α = 0.5" in fig["layout"]["title"]["text"] and len(fig["data"]) == 4
    at.session_state["quant_alpha"] = 0.8
    at.session_state["quant_smooth_linear"] = "down"
    ok(at.run())
    assert "α = 0.8" in chart(at, "chart_smoothing")["layout"]["title"]["text"]
    assert "down" in chart(at, "chart_smoothing")["layout"]["title"]["text"]


def test_tradeoffs_are_measured_from_the_button() -> None:
    at = open_tab(open_app(QUANT), "Trade-offs")
    assert "chart_tradeoffs" not in charts(at)
    click(at, "measure_tradeoffs")
    assert not errors(at) and "chart_tradeoffs" in charts(at)
    frame = next(d.value for d in at.dataframe if "batch-1 tok/s" in d.value.columns)
    assert list(frame["scheme"])[:2] == ["fp32", "bf16"] and (frame["batch-1 tok/s"] > 0).all()


def test_kv_tab_measures_the_kv_dtypes() -> None:
    at = open_tab(open_app(QUANT), "KV cache")
    assert "chart_kv_tradeoff" in charts(at) and not errors(at)
    frame = next(d.value for d in at.dataframe if "KV dtype" in d.value.columns)
    assert list(frame["KV dtype"]) == ["float32", "bfloat16", "int8", "fp8"]


def test_a_quantized_run_replays_with_its_badge_and_weights() -> None:
    """A recording of an int8 run replays: the badge names int8, the weight views draw (the
    bundled model's weights need no engine), the activations say they need the live engine."""
    live = open_app(QUANT)
    live.session_state[K.knob + "quantization"] = "int8"
    ok(live.run())
    assert "int8" in badges(live)[1]
    run_n(live, 2)
    text = to_json(record(live.session_state[K.run]))

    at = open_app(QUANT)
    at.file_uploader(key=K.upload).set_value(("run.json", text.encode(), "application/json"))
    ok(at.run())
    assert "REPLAY" in badges(at)[0] and "int8" in badges(at)[1] and not errors(at)
    assert "chart_quant_histogram" in charts(at)
    open_tab(at, "Activations")
    assert any("need the live engine" in i.value for i in at.info)


def test_presentation_mode_on_the_quantization_page() -> None:
    at = open_app(QUANT)
    at.toggle(key=K.present).set_value(True)
    ok(at.run())
    assert chart(at, "chart_quant_histogram")["layout"]["font"]["size"] > 12
    assert not [c for c in at.main.caption if "bfloat16" in c.value]  # the sidebar keeps its own note
