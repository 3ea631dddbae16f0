"""Issue #21 item 1: a quantized checkpoint is sized at the bytes it stores, served with the
kernel that runs its format, and refused where none does.

Real sizes: tests/data/quantized_checkpoints.json (21 public checkpoints: AWQ, GPTQ 3/4/8-bit with
and without act-order, bitsandbytes NF4 and INT8, FP8, MXFP4, compressed-tensors W8A8 and W4A16;
exact bytes or the Hub's listed GB, each with its source). Torch-free, like the calculator.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engine.memory import Settings, Workload, compare_hardware, estimate
from engine.sizing import SizingError, model_from_config

ROOT = Path(__file__).resolve().parents[1]
DATA = json.loads((ROOT / "tests" / "data" / "quantized_checkpoints.json").read_text())
CASES: list[dict[str, Any]] = DATA["cases"]
TOLERANCE = 0.02


def _id(case: dict[str, Any]) -> str:
    return case["repo"].split("/")[-1] + ("" if case["revision"] == "main" else "@" + case["revision"])


def _real_bytes(case: dict[str, Any]) -> float:
    return float(case["bytes"]) if "bytes" in case else case["gb"] * 1e9


def _case(repo: str, revision: str = "main") -> dict[str, Any]:
    return next(c for c in CASES if c["repo"] == repo and c["revision"] == revision)


def test_every_format_has_real_checkpoints() -> None:
    formats = {c["format"] for c in CASES}
    assert formats == {"awq", "gptq", "bitsandbytes", "fp8", "mxfp4", "compressed-tensors"}
    assert all(c.get("source") for c in CASES)
    assert sum(1 for c in CASES if "bytes" in c) >= 9  # exact byte counts, not only rounded GB


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_weight_bytes_match_the_real_checkpoint(case: dict[str, Any]) -> None:
    """Within 2% of the stored size (16-bit sizing was 2-4x off for every 4-bit case here)."""
    spec = model_from_config(case["config"])
    assert spec.quantization is not None
    weights = estimate(spec, "h100-sxm", detail=False).weight_bytes
    real = _real_bytes(case)
    assert weights == pytest.approx(real, rel=TOLERANCE), f"{_id(case)}: {weights:,} B vs real {real:,.0f} B"


def test_the_format_follows_the_checkpoint_not_a_generic_4bit() -> None:
    """GPTQ is served as GPTQ (it was ``--quantization awq``), with Marlin where the GPU has it."""
    gptq = model_from_config(_case("Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4")["config"])
    on_h100 = estimate(gptq, "h100-sxm")
    assert on_h100.weights_format == "gptq-w4-g128"
    assert "--quantization gptq_marlin" in on_h100.serve_command and "awq" not in on_h100.serve_command
    assert "--quantization gptq " in estimate(gptq, "t4").serve_command + " "  # no Marlin below sm80
    awq = model_from_config(_case("TheBloke/Mistral-7B-v0.1-AWQ")["config"])
    assert "--quantization awq_marlin" in estimate(awq, "a100-80gb").serve_command
    assert "--quantization awq " in estimate(awq, "t4").serve_command + " "
    sglang = estimate(gptq, "h100-sxm", settings=Settings(framework="sglang")).serve_command
    assert "--quantization gptq_marlin" in sglang


def test_a_4bit_awq_7b_fits_one_t4() -> None:
    """The issue's example: a 4.2 GB AWQ Mistral-7B-class checkpoint was sized at 13.5 GiB and
    "needs 2 devices" on a 16 GB T4."""
    awq = model_from_config(_case("TheBloke/Mistral-7B-v0.1-AWQ")["config"])
    est = estimate(awq, "t4", Workload(batch=1, context=4096))
    assert est.weight_bytes < 4.3e9 and est.fits and est.devices_needed == 1


def test_mxfp4_keeps_everything_but_the_experts_in_16_bit() -> None:
    oss = model_from_config(_case("openai/gpt-oss-20b")["config"])
    est = estimate(oss, "h100-sxm", detail=False)
    assert est.weight_bytes == pytest.approx(13_761_264_768, rel=0.001)
    sixteen = estimate(oss, "h100-sxm", settings=Settings(weights="bf16"), detail=False).weight_bytes
    assert sixteen > 2.5 * est.weight_bytes  # the 38.9 GiB answer the issue quotes


@pytest.mark.parametrize(("repo", "hardware", "words"), [
    ("openai/gpt-oss-20b", "t4", ["MXFP4", "T4", "sm80"]),
    ("Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4", "ascend-910b", ["GPTQ", "msmodelslim"]),
    ("TheBloke/Mistral-7B-v0.1-AWQ", "apple-m3-max", ["AWQ", "GGUF"]),
    ("xiaoxixiaoxi/Qwen2.5-32B-Instruct-quantized_w4a16_wy", "t4", ["compressed-tensors", "Marlin"]),
])
def test_a_format_no_kernel_runs_is_refused_with_the_reason(repo: str, hardware: str, words: list[str]) -> None:
    spec = model_from_config(_case(repo)["config"])
    with pytest.raises(SizingError) as err:
        estimate(spec, hardware)
    for word in words:
        assert word in str(err.value)
    row = next(r for r in compare_hardware(spec, [hardware, "h100-sxm"]) if r.hardware == hardware)
    assert row.error and words[0] in row.error  # the every-device table says why, the others still answer


@pytest.mark.parametrize(("quant", "fragment"), [
    ({"quant_method": "hqq", "nbits": 4}, "'hqq' is not a format the calculator sizes"),
    ({"bits": 4}, "quant_method' is missing"),
    ({"quant_method": "gptq", "bits": 5, "group_size": 128}, "quantization_config.bits"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 0}, "quantization_config.group_size"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True, "load_in_8bit": True}, "load_in_4bit"),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"targets": ["Embedding"], "weights": {}}}},
     "no group targets 'Linear'"),
])
def test_a_quantization_config_it_cannot_size_is_refused_by_name(quant: dict[str, Any], fragment: str) -> None:
    cfg = {**_case("TheBloke/Mistral-7B-v0.1-AWQ")["config"], "quantization_config": quant}
    with pytest.raises(SizingError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        model_from_config(cfg)


def test_cli_answers_a_quantized_config_with_the_same_bytes(tmp_path: Path) -> None:
    case = _case("TheBloke/Wizard-Vicuna-30B-Uncensored-GPTQ", "gptq-4bit-128g-actorder_True")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(case["config"]))
    proc = subprocess.run([sys.executable, "-m", "engine.memory", "--model", str(path), "--hardware", "a100-80gb",
                           "--json"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    expected = estimate(model_from_config(case["config"]), "a100-80gb")
    assert answer["weight_bytes"] == expected.weight_bytes
    assert "gptq_marlin" in answer["serve_command"]


def test_the_page_sizes_a_pasted_quantized_config_as_the_cli_does() -> None:
    """A pasted GPTQ config.json: the Fit page's weights and serve line equal the CLI's answer."""
    from streamlit.testing.v1 import AppTest

    case = _case("Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4")
    at = AppTest.from_file(str(ROOT / "app" / "app_pages" / "fit.py"), default_timeout=60)
    at.query_params["model"] = "custom"
    at.query_params["hw"] = "a100-80gb"
    at.run()
    at.text_area(key="cfg_text").input(json.dumps(case["config"])).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    expected = estimate(model_from_config(case["config"]), "a100-80gb")
    weights = next(m for m in at.metric if m.label == "Weights")
    assert weights.value == f"{expected.weight_bytes / 2**30:.2f} GiB" and "GPTQ-W4-G128" in str(weights.proto.delta)
    assert any("--quantization gptq_marlin" in c.value for c in at.code)
