"""The live pages' Precision controls (app/controls.py ``_precision``): weight quantization, the
int4 group size and the KV cache's dtype, through AppTest on the real engine (`tiny-random`).

Must show: choosing a scheme rebuilds the run on quantized weights (the engine's config, the
shared model and the status badge agree) and stepping works; a quantized KV cache changes the
bytes per token the KV page shows; "none" restores fp32; a group size the model cannot take is
a message naming the knob, never a traceback; a quantized run's recording keeps its knobs and
its replay shows them; scenario files and recordings carry the knobs (validated on load).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app.knobs import NONE_WORDS, engine_value, scenario_knobs, widget_value
from app.session import K
from engine.core.config import EngineConfig
from engine.replay.recording import from_json, record, to_json
from engine.replay.run import LiveRun, precision_label
from engine.replay.scenario import load_scenario, parse_scenario
from tests.fuzz.recordings import dumps, set_path
from visualizers.kv_blocks import pool_summary

ROOT = Path(__file__).resolve().parents[1]
MAIN = ROOT / "app" / "main.py"
KV_CACHE = "app_pages/kv_cache.py"
QUANT, GROUP, KV = (K.knob + k for k in ("quantization", "quantization_group_size", "kv_cache_dtype"))
TINY_KV_FP32 = 2 * 2 * 2 * 16 * 4  # layers x (K, V) x KV heads x head_dim x 4 bytes = 512
TINY_KV_INT8 = 2 * 2 * 2 * (16 + 4)  # int8 values + one fp32 scale per token and KV head = 160
TINY_KV_BF16 = TINY_KV_FP32 // 2


# -- helpers ----------------------------------------------------------------------------------

def ok(at: AppTest) -> AppTest:
    assert not at.exception, [e.value for e in at.exception]
    return at


def open_app(model: str = "tiny-random", **widgets: object) -> AppTest:
    """A fresh session on the KV page, ``widgets`` (key -> value) set before the first run."""
    at = AppTest.from_file(str(MAIN), default_timeout=300)
    at.session_state[K.model] = model
    at.session_state[K.scenario_chosen] = True  # the default scenario, not the KV page's own
    for key, value in widgets.items():
        at.session_state[key] = value
    ok(at.run())
    return ok(at.switch_page(KV_CACHE).run())


def choose(at: AppTest, key: str, value: object) -> AppTest:
    widget = at.segmented_control(key=key) if key == GROUP else at.selectbox(key=key)
    widget.set_value(value)
    return ok(at.run())


def precision_badge(at: AppTest) -> str:
    """The grey badge (scenario · model · policy · precision)."""
    found = [m.value for m in at.markdown if m.value.startswith(":gray-badge[")]
    assert len(found) == 1, found
    return found[0]


def pool_line(at: AppTest) -> str:
    found = [m.value for m in at.markdown if m.value.startswith("KV cache in ")]
    assert len(found) == 1, [m.value for m in at.markdown]
    return found[0]


def bytes_per_token(at: AppTest) -> int:
    match = re.search(r"\*\*([\d,]+) B per token\*\*", pool_line(at))
    assert match, pool_line(at)
    return int(match.group(1).replace(",", ""))


def errors(at: AppTest) -> list[str]:
    return [e.value for e in at.error]


def steps_done(at: AppTest) -> int:
    return int(next(m.value for m in at.metric if m.label == "Steps done"))


# -- the page ---------------------------------------------------------------------------------

@pytest.mark.usefixtures("streamlit_clean")
def test_int8_and_kv_int8_rebuild_the_run_and_none_restores_fp32() -> None:
    """int8: a rebuilt run on int8 weights (bf16 compute), named in the badge, that steps; KV int8
    shrinks the bytes per token the KV page shows; "none" / "auto" give back the fp32 run."""
    at = open_app()
    assert at.selectbox(key=QUANT).value == "none" and at.selectbox(key=KV).value == "auto"
    assert at.segmented_control(key=GROUP).disabled  # int4 only
    fp32 = at.session_state[K.run]
    assert fp32.engine.config.quantization is None and fp32.engine.shared.model.quantization is None
    assert precision_badge(at) == ":gray-badge[Chat burst · tiny-random · continuous]"
    assert bytes_per_token(at) == TINY_KV_FP32 and "**float32**" in pool_line(at)

    choose(at, QUANT, "int8")
    run = at.session_state[K.run]
    assert run is not fp32 and steps_done(at) == 0 and not errors(at)
    config = run.engine.config
    assert (config.quantization, config.dtype) == ("int8", "bfloat16")
    assert run.engine.shared.model.quantization.scheme == "int8"
    assert run.meta.config.quantization == "int8"
    assert precision_badge(at).endswith("· continuous · int8]")
    assert bytes_per_token(at) == TINY_KV_BF16  # the KV cache follows the compute dtype
    for _ in range(2):
        ok(at.button(key="step").click().run())
    assert steps_done(at) == 2 and len(run.traces) == 2 and not errors(at)

    choose(at, KV, "int8")
    assert at.session_state[K.run].engine.config.kv_cache_dtype == "int8" and steps_done(at) == 0
    assert bytes_per_token(at) == TINY_KV_INT8 and at.session_state[K.run].engine.kv_cache_bytes_per_token == 160
    assert "with the scales" in pool_line(at) and precision_badge(at).endswith("· int8 · KV int8]")
    ok(at.button(key="step").click().run())
    assert steps_done(at) == 1

    choose(at, QUANT, "none")
    choose(at, KV, "auto")
    config = at.session_state[K.run].engine.config
    assert (config.quantization, config.dtype, config.cache_config.cache_dtype) == (None, "float32", "auto")
    assert at.session_state[K.run].engine.shared is fp32.engine.shared  # the cached fp32 copy again
    assert precision_badge(at) == ":gray-badge[Chat burst · tiny-random · continuous]"
    assert bytes_per_token(at) == TINY_KV_FP32


@pytest.mark.usefixtures("streamlit_clean")
def test_int4_group_size_and_a_bad_one_gives_a_message() -> None:
    """int4 enables the group size; 64 is used and shown; 128 does not divide tiny-random's
    hidden size (64): a message naming the knob and the sizes that fit, no run, no traceback;
    a good size recovers."""
    at = open_app()
    choose(at, QUANT, "int4")
    assert not at.segmented_control(key=GROUP).disabled
    assert precision_badge(at).endswith("· int4 g32]")
    choose(at, GROUP, 64)
    run = at.session_state[K.run]
    assert (run.engine.config.quant_config.group_size, run.engine.shared.model.quantization.group_size) == (64, 64)
    assert precision_badge(at).endswith("· int4 g64]")
    ok(at.button(key="step").click().run())
    assert steps_done(at) == 1

    choose(at, GROUP, 128)
    assert len(errors(at)) == 1, errors(at)
    message = errors(at)[0]
    assert message.startswith("quantization_group_size") and "128 does not divide" in message and "32, 64" in message
    assert at.session_state[K.run] is None and not at.metric
    ok(at.run())  # the same bad request again: still only the message
    assert len(errors(at)) == 1

    choose(at, GROUP, 32)
    assert not errors(at) and steps_done(at) == 0 and precision_badge(at).endswith("· int4 g32]")


@pytest.mark.usefixtures("streamlit_clean")
def test_a_quantized_recording_replays_with_its_knobs() -> None:
    """A run recorded with int4 g64 weights and an int8 KV cache replays (no model) with the
    same badge, the same bytes per token and the same steps."""
    live = open_app()
    choose(live, QUANT, "int4")
    choose(live, GROUP, 64)
    choose(live, KV, "int8")
    for _ in range(3):
        ok(live.button(key="step").click().run())
    badge, line = precision_badge(live), pool_line(live)
    text = to_json(record(live.session_state[K.run]))
    config = json.loads(text)["meta"]["config"]
    assert (config["quantization"], config["quantization_group_size"], config["kv_cache_dtype"],
            config["dtype"]) == ("int4", 64, "int8", "bfloat16")

    at = open_app()
    at.file_uploader(key=K.upload).set_value(("run.json", text.encode(), "application/json"))
    ok(at.run())
    assert not errors(at) and any("REPLAY" in m.value for m in at.markdown)
    assert at.selectbox(key=QUANT).disabled and at.selectbox(key=KV).disabled
    for _ in range(3):
        ok(at.button(key="step").click().run())
    assert steps_done(at) == 3
    assert precision_badge(at) == badge and badge.endswith("· int4 g64 · KV int8]")
    assert pool_line(at) == line and bytes_per_token(at) == TINY_KV_INT8


# -- the knobs outside the page ---------------------------------------------------------------

def test_widget_words_for_none() -> None:
    """A select widget's None means "nothing chosen", so the engine's None is a word there."""
    for knob, word in NONE_WORDS.items():
        assert widget_value(knob, None) == word and engine_value(knob, word) is None
        assert engine_value(knob, "int8") == "int8" == widget_value(knob, "int8")
    assert widget_value("max_model_len", None) is None


def test_a_scenario_file_sets_the_precision_knobs() -> None:
    """Scenario knobs may set the three; the sidebar takes them, and a bad one names the knob."""
    data = json.loads((ROOT / "presets" / "scenarios" / "chat-burst.json").read_text())
    data["knobs"] = {**data["knobs"], "quantization": "int4", "quantization_group_size": 64, "kv_cache_dtype": "fp8"}
    sc = parse_scenario(data)
    config = sc.engine_config()
    assert (config.quantization, config.quant_config.group_size, config.kv_cache_dtype, config.dtype) == \
        ("int4", 64, "fp8", "bfloat16")
    knobs = scenario_knobs(sc)
    assert (knobs["quantization"], knobs["quantization_group_size"], knobs["kv_cache_dtype"]) == ("int4", 64, "fp8")
    assert scenario_knobs(load_scenario("chat-burst"))["quantization"] is None
    for knob, bad in [("quantization", "int3"), ("kv_cache_dtype", "int4"), ("quantization_group_size", 48)]:
        with pytest.raises(ValueError, match=f"^{knob}: "):
            parse_scenario({**data, "knobs": {**data["knobs"], knob: bad}})
    with pytest.raises(ValueError, match="^dtype: "):  # quantized weights compute in bf16
        parse_scenario({**data, "knobs": {**data["knobs"], "dtype": "float32"}})


def test_precision_label() -> None:
    """Only what differs from fp32 weights and a KV cache in the weights' dtype is named."""
    def label(**knobs: object) -> str:
        return precision_label(EngineConfig.from_knobs(**knobs))
    assert label(quantization=None, dtype="float32", kv_cache_dtype=None) == ""
    assert label(dtype="float32", kv_cache_dtype="float32") == ""
    assert label(quantization="int4", quantization_group_size=32, dtype="bfloat16", kv_cache_dtype="int8") == \
        "int4 g32 · KV int8"
    assert label(quantization="int8", quantization_group_size=32, dtype="bfloat16", kv_cache_dtype="bfloat16") == "int8"
    assert label(quantization="w8a8", quantization_smoothing_strength=0.5, dtype="bfloat16", sparsity="2:4") == \
        "w8a8 SmoothQuant 0.5 · 2:4 sparse"
    assert label(dtype="bfloat16", kv_cache_dtype="fp8") == "bfloat16 · KV fp8"
    assert label() == ""  # a recording from before the knobs existed (every knob at its default)


@pytest.fixture(scope="module")
def quantized_recording() -> str:
    """Three steps of chat-burst on tiny-random with int8 weights and an fp8 KV cache."""
    from engine.model.shared import get_shared_model

    model = get_shared_model("tiny-random", quantization="int8")
    run = LiveRun.from_scenario(load_scenario("chat-burst"), model, quantization="int8", kv_cache_dtype="fp8")
    run.step(3)
    return to_json(record(run))


def test_a_quantized_recording_loads_back_and_bad_knobs_name_their_path(quantized_recording: str) -> None:
    """from_json keeps the precision knobs (and the views' bytes per token), and refuses a
    scheme, KV dtype or group size the engine would refuse, naming the field."""
    loaded = from_json(quantized_recording)
    assert to_json(loaded) == quantized_recording
    assert loaded.meta.precision == "int8 · KV fp8" and loaded.meta.kv_cache_dtype == "fp8"
    assert loaded.meta.kv_bytes_per_token == loaded.snapshots[0].kv_bytes_per_token == TINY_KV_INT8
    assert pool_summary(loaded.snapshots[0], loaded.meta.kv_cache_dtype).startswith(
        f"KV cache in **fp8**: **{TINY_KV_INT8} B per token**")
    data = json.loads(quantized_recording)
    for path, value, words in [
        ("meta.config.quantization", "int3", "meta.config.quantization: must be one of"),
        ("meta.config.kv_cache_dtype", "int4", "meta.config.kv_cache_dtype: must be one of"),
        ("meta.config.quantization_group_size", 48, "meta.config.quantization_group_size: must be one of"),
        ("meta.config.dtype", "float32", "meta.config.dtype: quantization='int8' computes in 'bfloat16'"),
    ]:
        with pytest.raises(ValueError) as info:
            from_json(dumps(set_path(data, path, value)))
        assert str(info.value).startswith(f"recording: {words}"), str(info.value)


@pytest.mark.usefixtures("streamlit_clean")
def test_smollm2_int8_steps() -> None:
    """The real model through the page, int8 from the first run (the weights come from the disk
    cache after the first time: ~5 s here then, ~15 s cold)."""
    at = open_app("smollm2-135m", **{QUANT: "int8"})
    run = at.session_state[K.run]
    assert run.engine.config.quantization == "int8" and run.engine.shared.model.quantization.scheme == "int8"
    assert not errors(at) and precision_badge(at).endswith("· smollm2-135m · continuous · int8]")
    assert bytes_per_token(at) == 30 * 2 * 3 * 64 * 2  # layers x (K, V) x KV heads x head_dim x 2 bytes (bf16)
    ok(at.button(key="step").click().run())
    assert steps_done(at) == 1 and len(run.traces) == 1
