"""The "Will it fit?" page through Streamlit's AppTest.

Must show #4: any input on the page, however wrong, gives a message, never a traceback.
Also: verdict first in words and colour, the stacked memory bar, the every-device table, the
roofline, the formula expander, and settings taken from the URL (a sizing answer is a link).
"""
import json
import re
from pathlib import Path

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from engine.memory import hardware_presets

ROOT = Path(__file__).resolve().parents[1]
MAIN = ROOT / "app" / "main.py"
PAGE = ROOT / "app" / "app_pages" / "fit.py"
TIMEOUT = 60


pytestmark = pytest.mark.usefixtures("streamlit_clean")


def _all_pages_exist() -> bool:
    pages = re.findall(r'st\.Page\(\s*"([^"]+)"', MAIN.read_text())
    return all((MAIN.parent / p).exists() for p in pages)


def open_page(**query) -> AppTest:
    """The fit page, reached through the app's navigation (as users do), with URL parameters.

    While another page registered in app/main.py does not exist yet, the page script is run on its
    own instead (it does not depend on the entry point)."""
    if _all_pages_exist():
        at = AppTest.from_file(str(MAIN), default_timeout=TIMEOUT)
        for key, value in query.items():
            at.query_params[key] = value
        at.run()
        at.switch_page("app_pages/fit.py")
    else:
        at = AppTest.from_file(str(PAGE), default_timeout=TIMEOUT)
        for key, value in query.items():
            at.query_params[key] = value
    at.run()
    return at


def charts(at: AppTest) -> dict:
    out = {}
    for el in at.get("plotly_chart"):
        spec = json.loads(el.proto.spec)
        title = (spec.get("layout", {}).get("title") or {}).get("text", "")
        out[title] = spec
    return out


def no_traceback(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def test_default_answers_the_motivating_question():
    at = open_page()
    no_traceback(at)
    # verdict first, in words and colour
    assert at.markdown[0].value.startswith("## :green[Fits] — InternVL2-8B on 1 × Atlas 300V Pro")
    assert at.success and "Fits on 1 device" in at.success[0].value
    warnings = " ".join(w.value for w in at.warning)
    assert "FP16-only" in warnings and "--max-model-len" in warnings
    assert any("13.51 GiB ≈ 110,592 tokens" in m.value for m in at.markdown)  # KV room
    assert any(c.value.startswith("PYTORCH_NPU_ALLOC_CONF") for c in at.code)  # serve command
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Weights"] == "15.04 GiB"
    assert metrics["KV per token"] == "128.0 KiB"


def test_memory_bar_stacks_components_against_usable_memory():
    at = open_page()
    bar = next(spec for title, spec in charts(at).items() if "needed of" in title)
    assert all(t["type"] == "bar" and t["orientation"] == "h" for t in bar["data"])
    names = [t["name"] for t in bar["data"]]
    assert names[:3] == ["weights", "vision tower", "KV cache"] and "activations" in names and "overhead" in names
    assert bar["layout"]["barmode"] == "stack"
    total = sum(t["x"][0] if isinstance(t["x"], list) else 0 for t in bar["data"])
    assert total == pytest.approx(17.18, abs=0.01)
    assert "of 43.20 GiB usable" in bar["layout"]["title"]["text"]


def test_every_device_table_and_roofline_and_formulas():
    at = open_page()
    table = next(df.value for df in at.dataframe if "devices needed" in df.value.columns)
    assert len(table) == len(hardware_presets())
    assert {"fits?", "devices needed", "decode tok/s (expected)"} <= set(table.columns)
    t4 = table[table["hardware"] == "T4 16GB"].iloc[0]
    assert t4["fits?"] == "no — needs 2" and t4["devices needed"] == 2
    roof = next(spec for title, spec in charts(at).items() if title.startswith("Roofline"))
    assert roof["layout"]["xaxis"]["type"] == "log"
    ridge = next(t for t in roof["data"] if t["name"] == "ridge point")
    assert ridge["x"][0] == pytest.approx(70e12 / 204.8e9)
    assert {"decode (memory-bound)", "prefill (compute-bound)"} <= {t["name"] for t in roof["data"]}
    sources = next(df.value for df in at.dataframe if "confidence" in df.value.columns)
    memory = sources[sources["figure"] == "memory (GiB)"].iloc[0]
    assert memory["value"] == "48" and "pid-253542321" in memory["source"] and memory["confidence"].startswith("medium")
    bf16 = sources[sources["figure"] == "BF16 TFLOPS (dense)"].iloc[0]
    assert bf16["value"] == "not supported"
    formulas = " ".join(c.value for c in at.code)
    assert "KV elements/token = L x 2 x nkv x d = 32 x 2 x 8 x 128 = 65,536" in formulas
    assert "usable = gpu_memory_utilization x total = 0.90 x 48.00 GiB = 43.20 GiB" in formulas


def test_settings_come_from_the_url():
    at = open_page(model="llama-3-70b", hw="rtx-4090", batch="4", ctx="8192", w="fp8", fw="vllm")
    no_traceback(at)
    assert at.markdown[0].value.startswith("## :orange[Does not fit on 1 × GeForce RTX 4090 — needs ")
    assert at.selectbox(key="model").value == "llama-3-70b"
    assert at.number_input(key="batch").value == 4
    assert at.number_input(key="ctx").value == 8192
    assert any(m.value.startswith("- use ") for m in at.markdown)  # what would make it fit
    serve = next(c.value for c in at.code if c.value.startswith("vllm serve"))
    assert "--quantization fp8" in serve and "--max-model-len 8192" in serve and "--max-num-seqs 4" in serve


def test_window_on_every_layer_shows_token_slots_not_the_search_cap():
    at = open_page(model="mistral-7b", hw="rtx-4090")
    no_traceback(at)
    room = next(m.value for m in at.markdown if m.value.startswith("KV room:"))
    assert "token slots**" in room and "at most its last 4,096 tokens" in room and "16,777,216" not in room


def test_changing_a_control_changes_the_answer():
    at = open_page()
    at.selectbox(key="hw").set_value("t4").run()
    no_traceback(at)
    assert "T4 16GB" in at.markdown[0].value and ":orange[" in at.markdown[0].value
    at.selectbox(key="w").set_value("int4").run()
    assert at.markdown[0].value.startswith("## :green[Fits]")


def test_bad_link_values_are_reported_not_crashed():
    at = open_page(model="no-such-model", hw="t4", batch="-5", ctx="lots", tp="0", w="int3")
    no_traceback(at)
    warning = next(w.value for w in at.warning if "Ignored link settings" in w.value)
    for fragment in ("model=no-such-model", "batch=-5", "ctx=lots", "tp=0", "w=int3"):
        assert fragment in warning


def test_link_values_equal_to_the_defaults_are_not_reported_as_ignored():
    """Streamlit drops a bound value equal to the widget's default from the URL; it was taken."""
    at = open_page(model="internvl2-8b", hw="atlas-300v-pro", batch="1", ctx="4096")
    no_traceback(at)
    assert not [w.value for w in at.warning if "Ignored link settings" in w.value]
    at = open_page(model="internvl2-8b", hw="no-such-device", batch="1.0")
    warning = next(w.value for w in at.warning if "Ignored link settings" in w.value)
    assert "hw=no-such-device" in warning and "model=" not in warning and "batch=" not in warning


@pytest.mark.parametrize("query, fragment", [
    ({"model": "llama-2-7b", "hw": "t4", "tp": "3"}, "does not divide"),
    ({"model": "llama-2-7b", "hw": "t4", "ctx": "100", "out": "200"}, "fewer than the context"),
    ({"model": "llama-2-7b", "hw": "t4", "img": "1"}, "no vision tower"),
    ({"model": "internvl2-8b", "hw": "t4", "ctx": "1000", "img": "2"}, "do not fit"),
    ({"model": "smollm2-135m", "hw": "t4", "pp": "40"}, "layers"),
    ({"model": "llama-2-7b", "hw": "h100-sxm", "fw": "vllm-ascend"}, "Ascend"),
])
def test_impossible_combinations_give_a_message(query, fragment):
    at = open_page(**query)
    no_traceback(at)
    assert at.error and fragment in at.error[0].value


def test_custom_config_text():
    at = open_page(model="custom")
    no_traceback(at)
    assert at.info and "config.json" in at.info[0].value
    at.text_area(key="cfg_text").input('{"hidden_size": 4096,').run()
    no_traceback(at)
    assert at.error and "malformed config JSON" in at.error[0].value
    at.text_area(key="cfg_text").input('{"model_type": "llama", "hidden_size": 4096}').run()
    assert at.error and "num_hidden_layers" in at.error[0].value
    cfg = json.loads((ROOT / "presets" / "models" / "mistral-7b.json").read_text())
    at.text_area(key="cfg_text").input(json.dumps(cfg)).run()
    no_traceback(at)
    assert not at.error
    assert "Mistral-7B" in at.markdown[0].value


def test_custom_hardware_from_the_url():
    at = open_page(model="internvl2-8b", hw="custom", c_mem="16", c_bw="500", c_tf="50", c_bf16="false")
    no_traceback(at)
    assert "Custom" in at.markdown[0].value
    assert ":orange[" in at.markdown[0].value  # 15 GiB of weights do not fit 16 GiB at util 0.9
    assert any("--dtype float16" in c.value for c in at.code)


@pytest.mark.parametrize("query", [
    {"model": "llama-3.1-405b", "hw": "jetson-agx-orin", "batch": "1000000", "ctx": "100000000"},
    {"model": "mamba-1.4b", "hw": "apple-m3-max", "util": "0.05", "eta_m": "0.05", "eta_c": "0.05", "block": "1"},
    {"model": "deepseek-v3", "hw": "atlas-300i-duo", "kv": "q4_0", "vis": "w8a8", "fw": "sglang", "pp": "61"},
    {"model": "internvl2-8b", "hw": "this-machine", "img": "64", "tiles": "40", "ctx": "200000"},
])
def test_extreme_inputs_never_raise(query):
    at = open_page(**query)
    no_traceback(at)
    assert at.error or at.markdown[0].value.startswith("## :")


# --- the verdict says what it means (issue #19, item 8) ----------------------------------------------------------

def _metrics(at: AppTest) -> dict:
    return {m.label: m.value for m in at.metric}


def test_over_by_a_little_reads_does_not_fit_with_speed_only_where_it_fits():
    """The speaker's case: Llama-3-70B on 2 x H100 at 32,768 tokens, over by ~1.4 GiB per device (vLLM V0's
    rule, picked by the page's framework version box through the link)."""
    at = open_page(model="llama-3-70b", hw="h100-sxm", tp="2", ctx="32768", fwv="0.7")
    no_traceback(at)
    assert at.markdown[0].value == ("## :orange[Does not fit on 2 × H100 SXM 80GB — needs 4] — Llama-3-70B,"
                                    " over by 1.38 GiB per device")
    assert not at.success
    box = at.warning[0].value
    assert box.startswith("**Does not fit on 2 devices — needs 4**") and "over by 1.38 GiB" in box
    metrics = _metrics(at)
    assert metrics["Needed per device"] == "72.68 GiB"
    assert metrics["Decode on 2 (asked)"] == metrics["Time to first token on 2 (asked)"] == "does not fit"
    assert metrics["Decode on 4, fewest that fit"].endswith(" tok/s")
    assert metrics["Time to first token on 4, fewest that fit"].endswith(" s")
    assert not any(v.endswith("tok/s") for k, v in metrics.items() if "fewest" not in k)
    serve = next(c.value for c in at.code if c.value.startswith("vllm serve"))
    assert "--max-model-len 8192 " in serve and "32768" not in serve and "--tensor-parallel-size 4" in serve
    assert any("not 32,768" in c.value and "the model has 8,192 positions" in c.value for c in at.caption)


def test_an_exact_fit_and_one_token_over():
    from engine.memory import Settings, Workload, estimate
    n = estimate("llama-3.1-70b", "h100-sxm", Workload(context=4096), Settings(tp=2), detail=False).max_context
    at = open_page(model="llama-3.1-70b", hw="h100-sxm", tp="2", ctx=str(n), out="512")
    no_traceback(at)
    assert at.markdown[0].value == "## :green[Fits] — Llama-3.1-70B on 2 × H100 SXM 80GB"
    assert at.success and re.search(r"\([\d.]+ (MiB|KiB|B) to spare\)", at.success[0].value)
    assert _metrics(at)["Decode on 2"].endswith(" tok/s")
    at = open_page(model="llama-3.1-70b", hw="h100-sxm", tp="2", ctx=str(n + 1), out="512")
    no_traceback(at)
    assert re.fullmatch(r"## :orange\[Does not fit on 2 × H100 SXM 80GB — needs 4\] — Llama-3\.1-70B,"
                        r" over by [\d.]+ (MiB|KiB|B) per device", at.markdown[0].value)
    assert not at.success and _metrics(at)["Decode on 2 (asked)"] == "does not fit"


def test_fits_with_room():
    at = open_page(model="llama-3-70b", hw="h100-sxm", tp="2", fwv="0.7")  # V0's rule: 2.99 GiB to spare
    no_traceback(at)
    assert at.markdown[0].value == "## :green[Fits] — Llama-3-70B on 2 × H100 SXM 80GB"
    assert "(2.99 GiB to spare)" in at.success[0].value
    metrics = _metrics(at)
    assert metrics["Decode on 2"].endswith(" tok/s") and not any("fewest" in k or "asked" in k for k in metrics)


@pytest.mark.parametrize("model, shown", [
    ("jamba-v0.1", "Jamba-v0.1"), ("command-r-v01", "Command-R v01"), ("llama-4-scout-17b-16e", "Llama-4-Scout"),
    ("gemma-3-4b-it", "Gemma-3-4B-it"), ("mamba-codestral-7b", "Mamba-Codestral-7B"), ("bloom-560m", "BLOOM-560M"),
    ("opt-350m", "OPT-350M"), ("gpt-j-6b", "GPT-J-6B")])
def test_the_issue_21_families_are_listed_and_answered(model, shown):
    """The page lists every preset in presets/models; the new families answer without a traceback."""
    at = open_page(model=model, hw="h100-80gb")
    no_traceback(at)
    assert shown in at.markdown[0].value


def test_a_differing_variant_and_a_server_are_shown():
    """Issue #21 item 4: the 24 GB Atlas 300V Pro's verdict beside the 48 GB one; a server preset
    says how many of its devices the workload needs."""
    at = open_page(model="internvl2-8b", hw="atlas-300v-pro", batch="2", ctx="16384")
    no_traceback(at)
    assert any("Atlas 300V Pro 24 GB" in w.value and "does not fit" in w.value for w in at.warning)
    at = open_page(model="llama-3-70b", hw="dgx-h100")
    no_traceback(at)
    assert any("DGX H100" in i.value and "of its 8 devices hold this workload" in i.value for i in at.info)


# --- framework version: the page and the CLI apply the same budget rule ------------------------------------------

@pytest.mark.parametrize("fw, fwv, rule", [("vllm", "0.7", "v0"), ("vllm", "0.10.1", "v1"), ("vllm", "", "v1-graphs"),
                                           ("sglang", "0.4.3.post4", "0.4"), ("sglang", "0.5", "0.5")])
def test_framework_version_page_and_cli_agree(capsys, fw, fwv, rule):
    from engine.memory import main
    args = ["--model", "qwen2.5-7b", "--hardware", "a100-80gb", "--framework", fw, "--json"]
    assert main(args + (["--framework-version", fwv] if fwv else [])) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["budget_rule"] == rule and d["framework_version"] == fwv
    at = open_page(model="qwen2.5-7b", hw="a100-80gb", fw=fw, **({"fwv": fwv} if fwv else {}))
    no_traceback(at)
    room = next(m.value for m in at.markdown if m.value.startswith("KV room:"))
    assert f"≈ {d['kv_room_tokens']:,} " in room


def test_a_bad_framework_version_names_the_field():
    at = open_page(model="qwen2.5-7b", hw="a100-80gb", fw="vllm", fwv="seven")
    assert not at.exception
    assert at.error and "framework_version 'seven' is not a version number" in at.error[0].value


# --- MindIE on Ascend: the page and the CLI agree; refused off Ascend ----------------------------------------------

def test_mindie_page_and_cli_agree(capsys):
    from engine.memory import main
    assert main(["--model", "qwen3-8b", "--hardware", "ascend-910b", "--framework", "mindie", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    at = open_page(model="qwen3-8b", hw="ascend-910b", fw="mindie")
    no_traceback(at)
    room = next(m.value for m in at.markdown if m.value.startswith("KV room:"))
    assert f"≈ {d['kv_room_tokens']:,} " in room
    assert any("mindieservice_daemon" in c.value for c in at.code)


def test_mindie_off_ascend_is_refused_on_the_page():
    at = open_page(model="qwen3-8b", hw="h100-sxm", fw="mindie")
    assert not at.exception
    assert at.error and "framework 'mindie'" in at.error[0].value


def test_framework_inferscope_page_and_cli_agree(capsys):
    """The engine's own fp8 KV (per-token-head scales) on the page as in the CLI: 12,240 B/token."""
    from engine.memory import main

    at = open_page(model="smollm2-135m", hw="h100-sxm", fw="inferscope", kv="fp8")
    no_traceback(at)
    assert any(c.value.startswith("python -c \"from engine import LLM; llm = LLM('smollm2-135m'") for c in at.code)
    assert main(["--model", "smollm2-135m", "--hardware", "h100-sxm", "--framework", "inferscope", "--kv-dtype", "fp8",
                 "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["kv_bytes_per_token"] == 12240 and answer["framework"] == "inferscope"
    shown = next(m for m in at.metric if m.label == "KV per token")
    assert shown.value == f"{12240 / 1024:,.1f} KiB"
