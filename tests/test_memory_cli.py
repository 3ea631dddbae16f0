"""The CLI contract, exercised as a real subprocess: ``python -m engine.memory ...``.

Must show #3: ``--model internvl2-8b --hardware atlas-300v-pro`` answers that it fits in FP16,
with its decode bound (~12.7 tok/s at 204.8 GB/s), what W8A8 / W4A16 would give, the 310P
FP16-only and max-model-len warnings, and the KV room left for context.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
JSON_KEYS = ("params_total", "params_active", "weight_bytes", "kv_bytes_per_token", "kv_bytes", "activation_bytes",
             "overhead_bytes", "total_bytes_per_device", "device_memory_bytes", "fits", "devices_needed",
             "max_context", "max_batch", "prefill_seconds", "decode_tokens_per_s", "bound")
SIZE_KEYS = ("params_total", "params_active", "weight_bytes", "kv_bytes_per_token", "kv_bytes", "activation_bytes",
             "overhead_bytes", "total_bytes_per_device", "device_memory_bytes")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine.memory", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONWARNINGS": "ignore"})


def run_json(*args: str) -> dict:
    proc = run(*args, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_internvl2_on_atlas_300v_pro_text_answer():
    proc = run("--model", "internvl2-8b", "--hardware", "atlas-300v-pro")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    first = out.splitlines()[0]
    assert "InternVL2-8B" in first and "Atlas 300V Pro" in first and "FITS ON 1 DEVICE" in first
    assert "weights  FP16: 15.04 GiB" in out  # BF16 checkpoint -> FP16 on 310P
    assert "decode   <= 12.8 tok/s roofline (memory-bound" in out and "204.8 GB/s" in out
    assert "INT8 W8A8:" in out and "INT4 W4A16" in out  # what the smaller formats would give
    assert "310P is FP16-only" in out
    # the default max_model_len's mask: 32,768 positions x rope_scaling dynamic factor 2 = 65,536 (vLLM's rule)
    assert "always set --max-model-len on 310P" in out and "default 65,536 would take 8.00 GiB" in out
    assert "KV room  13.51 GiB for the KV pool = 110,592 tokens" in out
    assert "vllm serve OpenGVLab/InternVL2-8B" in out and "--max-model-len 4096" in out
    assert "--dtype float16" in out and "--enforce-eager" not in out  # latest 310P image: decode graph mode


def test_internvl2_on_atlas_300v_pro_json():
    d = run_json("--model", "internvl2-8b", "--hardware", "atlas-300v-pro")
    assert d["fits"] is True and d["weights_format"] == "fp16" and d["framework"] == "vllm-ascend"
    assert d["weight_bytes"] == 16_150_730_752
    assert d["kv_bytes_per_token"] == 131_072
    assert d["decode_tokens_per_s_roofline"] == pytest.approx(12.7, rel=0.02)
    assert d["bound"] == "memory"
    assert d["max_context"] == 65_536  # the model's limit (32,768 x dynamic rope factor 2); KV room ~111k tokens
    assert d["kv_room_tokens"] == pytest.approx(111_000, rel=0.03)
    w8a8 = next(a for a in d["alternatives"] if a["format"] == "w8a8")
    w4a16 = next(a for a in d["alternatives"] if a["format"] == "int4")
    assert w8a8["fits"] and w4a16["fits"]
    assert w8a8["decode_tokens_per_s_roofline"] > 1.7 * d["decode_tokens_per_s_roofline"]
    assert w4a16["decode_tokens_per_s_roofline"] > w8a8["decode_tokens_per_s_roofline"]
    assert any("FP16-only" in w for w in d["warnings"])
    assert any("--max-model-len" in w for w in d["warnings"])


def test_json_has_every_contract_key_with_integer_sizes():
    d = run_json("--model", "llama-3-8b", "--hardware", "h100-sxm", "--batch", "4", "--context", "8192")
    for key in JSON_KEYS:
        assert key in d, key
    for key in SIZE_KEYS:
        assert isinstance(d[key], int) and not isinstance(d[key], bool), key
    assert isinstance(d["fits"], bool)
    assert isinstance(d["devices_needed"], int)
    assert isinstance(d["max_context"], int) and isinstance(d["max_batch"], int)
    assert isinstance(d["prefill_seconds"], float) and isinstance(d["decode_tokens_per_s"], float)
    assert d["bound"] in ("memory", "compute")
    assert d["batch"] == 4 and d["context"] == 8192
    assert d["kv_bytes"] == 4 * 8192 * 131_072


@pytest.mark.parametrize("args, key, value", [
    (("--weights", "int4"), "weights_format", "int4"),
    (("--kv-dtype", "fp8"), "kv_dtype", "fp8"),
    (("--tp", "2"), "tp", 2),
    (("--pp", "2"), "pp", 2),
    (("--framework", "sglang"), "framework", "sglang"),
    (("--framework", "none"), "framework", "none"),
])
def test_every_contract_option_is_honoured(args, key, value):
    d = run_json("--model", "llama-3-8b", "--hardware", "a100-80gb", *args)
    assert d[key] == value


def test_tp_halves_weights_per_device():
    v0 = ("--framework-version", "0.7")  # under V0's rule 70B needs 2 H100s (V1 >= 0.21 with its graph estimate: 4)
    one = run_json("--model", "llama-3-70b", "--hardware", "h100-sxm", *v0)
    four = run_json("--model", "llama-3-70b", "--hardware", "h100-sxm", "--tp", "4", *v0)
    assert not one["fits"] and one["devices_needed"] == 2
    assert four["fits"]
    assert four["weight_bytes_per_device"] == pytest.approx(one["weight_bytes"] / 4, rel=1e-6)


def test_list_models_and_hardware():
    models = run("--list-models")
    assert models.returncode == 0
    for name in ("internvl2-8b", "smollm2-135m", "llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b",
                 "llama-3-70b", "llama-3.1-405b", "qwen2.5-7b", "qwen2.5-72b", "qwen3-8b", "mistral-7b",
                 "mixtral-8x7b", "deepseek-v2-lite", "deepseek-v3", "gemma-2-9b", "phi-3-mini", "falcon-7b",
                 "mamba-1.4b"):
        assert name in models.stdout
    hardware = run("--list-hardware", "--json")
    assert hardware.returncode == 0
    names = {row["name"] for row in json.loads(hardware.stdout)}
    assert {"atlas-300v-pro", "atlas-300i-pro", "atlas-300i-duo", "ascend-910b", "a100-40gb", "a100-80gb",
            "h100-sxm", "h100-pcie", "h200", "l40s", "l4", "t4", "a10", "rtx-4090", "rtx-3090", "jetson-agx-orin",
            "apple-m2-ultra", "apple-m3-max", "this-machine"} <= names


@pytest.mark.parametrize("args, fragment", [
    (("--model", "no-such-model", "--hardware", "t4"), "unknown model"),
    (("--model", "llama-2-7b", "--hardware", "no-such-gpu"), "unknown hardware"),
    (("--model", "llama-2-7b", "--hardware", "t4", "--batch", "0"), "batch"),
    (("--model", "llama-2-7b", "--hardware", "t4", "--batch", "-3"), "batch"),
    (("--model", "llama-2-7b", "--hardware", "t4", "--context", "0"), "context"),
    (("--model", "llama-2-7b", "--hardware", "t4", "--tp", "0"), "tp"),
    (("--model", "llama-2-7b", "--hardware", "t4", "--tp", "3"), "does not divide"),
    (("--model", "llama-2-7b", "--hardware", "t4", "--weights", "int3"), "unknown weight format"),
    (("--model", "llama-2-7b", "--hardware", "t4", "--kv-dtype", "fp5"), "unknown KV-cache dtype"),
    (("--model", "llama-2-7b", "--hardware", "t4", "--framework", "tgi"), "unknown framework"),
    (("--model", "llama-2-7b", "--hardware", "t4", "--framework", "vllm-ascend"), "Ascend"),
    (("--model", "llama-2-7b", "--hardware", "t4", "--batch", "many"), "invalid int"),
    (("--model", "llama-2-7b"), "--hardware is required"),
    (("--hardware", "t4"), "--model is required"),
    (("--model", "/nonexistent/config.json", "--hardware", "t4"), "not found"),
    (("--model", "llama-2-7b", "--hardware", "t4", "--context", "100", "--output", "200"), "fewer than the context"),
    (("--model", "internvl2-8b", "--hardware", "t4", "--context", "1000", "--images", "1"), "do not fit"),
])
def test_bad_values_exit_nonzero_with_one_line(args, fragment):
    proc = run(*args)
    assert proc.returncode != 0
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and fragment in lines[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("text, fragment", [
    ('{"hidden_size": 4096', "malformed config JSON"),
    ('[1, 2]', "JSON object"),
    ('{"model_type": "llama", "hidden_size": 4096}', "missing 'num_hidden_layers'"),
    ('{"model_type": "llama", "hidden_size": -1, "num_hidden_layers": 2, "num_attention_heads": 2,'
     ' "vocab_size": 10, "intermediate_size": 8}', "must be >= 1"),
    ('{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,'
     ' "num_key_value_heads": 3, "vocab_size": 10, "intermediate_size": 8}', "not a multiple"),
    ('', "empty"),
])
def test_bad_config_files(tmp_path, text, fragment):
    path = tmp_path / "config.json"
    path.write_text(text)
    proc = run("--model", str(path), "--hardware", "t4")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and fragment in proc.stderr


def test_config_path_and_model_folder(tmp_path):
    cfg = json.loads((ROOT / "presets" / "models" / "llama-3-8b.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if not k.startswith("_")}))
    by_path = run_json("--model", str(tmp_path / "config.json"), "--hardware", "l4")
    by_folder = run_json("--model", str(tmp_path), "--hardware", "l4")
    assert by_path["params_total"] == by_folder["params_total"] == 8_030_261_248


def test_calculator_import_does_not_import_torch():
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "engine.memory", "--list-models"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0
    imported = [line for line in proc.stderr.splitlines() if line.startswith("import time:")]
    assert imported, "no import trace"
    assert not [line for line in imported if "torch" in line or "transformers" in line]
    check = subprocess.run([sys.executable, "-c", "import engine.memory, sys; "
                            "print(sorted(m for m in ('torch', 'transformers', 'streamlit') if m in sys.modules))"],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert check.stdout.strip() == "[]"


def test_formula_flag_prints_formulas_with_numbers():
    proc = run("--model", "llama-2-7b", "--hardware", "rtx-4090", "--formula")
    assert proc.returncode == 0
    assert "KV elements/token = L x 2 x nkv x d = 32 x 2 x 32 x 128 = 262,144" in proc.stdout
    assert "= 524,288 B/token" in proc.stdout
    assert "usable = gpu_memory_utilization x total = 0.90 x" in proc.stdout


# --- the JSON contract's key set, pinned (the typed refactor must not change it) -----------------------------
CONTRACT_TOP_KEYS = frozenset({
    "activation_bytes", "alternatives", "at_devices_needed", "bandwidth_bytes_per_s", "batch", "bound", "context",
    "decode_bytes_per_step", "decode_flops_per_step", "decode_tokens_per_s", "decode_tokens_per_s_roofline",
    "decode_tokens_per_s_total", "device_memory_bytes", "device_unit", "devices", "devices_needed",
    "devices_needed_pp", "devices_needed_tp", "efficiency_compute", "efficiency_memory", "fits", "framework",
    "framework_version", "budget_rule", "hardware", "hardware_name", "image_tokens", "images", "kv_bytes", "kv_bytes_per_device", "kv_bytes_per_token",
    "kv_bytes_per_token_per_device", "kv_dtype", "kv_pool_bytes", "kv_room_tokens", "mask_bytes", "max_batch",
    "max_context", "model", "model_name", "notes", "output_tokens", "over_bytes_per_device", "overhead_bytes",
    "params_active", "params_total", "params_vision", "peak_flops", "peak_label", "pp", "prefill_bound",
    "prefill_bytes", "prefill_flops", "prefill_seconds", "prefill_seconds_roofline", "prompt_tokens", "reason", "reserve_bytes",
    "ridge_flops_per_byte", "serve_command", "suggestions", "tiles", "total_bytes_per_device", "tp",
    "usable_bytes_per_device", "verdict", "verdict_key", "vision_dtype", "vision_weight_bytes_per_device", "warnings",
    "weight_bytes", "weight_bytes_per_device", "weights_format", "variants", "server",
    "decode_backend", "decode_overhead_s"})
CONTRACT_ALTERNATIVE_KEYS = frozenset({
    "current", "decode_tokens_per_s", "decode_tokens_per_s_roofline", "fits", "format", "kv_room_tokens", "label",
    "prefill_seconds", "support", "total_bytes_per_device", "weight_bytes"})
CONTRACT_AT_DEVICES_KEYS = frozenset({
    "decode_tokens_per_s", "decode_tokens_per_s_roofline", "devices", "pp", "prefill_seconds",
    "prefill_seconds_roofline", "serve_command", "tp"})
CONTRACT_FORMULA_KEYS = frozenset({
    "activations", "budget", "decode", "fits", "kv_per_token", "kv_room", "kv_total", "overhead", "parameters",
    "prefill", "ridge", "weights"})


def _main_json(capsys, *args: str) -> dict:
    from engine.memory import main

    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_contract_key_set_is_pinned(capsys):
    """Exactly these keys (no more, no fewer) at the top level and in the nested records."""
    d = _main_json(capsys, "--model", "llama-3-70b", "--hardware", "rtx-4090", "--batch", "4", "--context", "8192",
                   "--formula")
    assert set(d) == CONTRACT_TOP_KEYS | {"formulas"}
    assert set(d["formulas"]) == CONTRACT_FORMULA_KEYS
    assert all(set(a) == CONTRACT_ALTERNATIVE_KEYS for a in d["alternatives"]) and d["alternatives"]
    assert set(d["at_devices_needed"]) == CONTRACT_AT_DEVICES_KEYS
    vlm = _main_json(capsys, "--model", "internvl2-8b", "--hardware", "atlas-300v-pro")
    assert set(vlm) == CONTRACT_TOP_KEYS and vlm["at_devices_needed"] is None
    assert set(JSON_KEYS) <= CONTRACT_TOP_KEYS


# --- issue 7: bad inputs that used to be answered (each failed before its fix) ----------------------------------
def _main_error(capsys, *args: str) -> str:
    """In-process ``main(argv)``: exit status 2, nothing on stdout, exactly one line on stderr."""
    from engine.memory import main

    assert main(list(args)) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    return lines[0]


BASE = ("--model", "llama-2-7b", "--hardware", "t4")


def test_prompt_longer_than_context_is_refused(capsys):
    """Was: "-4,904 output" and FITS."""
    line = _main_error(capsys, *BASE, "--prompt", "9000", "--context", "4096")
    assert "prompt" in line and "9,000" in line and "4,096" in line
    line = _main_error(capsys, *BASE, "--prompt", "4096", "--context", "4096")
    assert "prompt" in line


@pytest.mark.parametrize("flag, value, fragment", [
    ("--context", str(10**21), "context"),
    ("--context", str(2**24 + 1), "16,777,216"),
    ("--prompt", str(10**12), "prompt"),
    ("--batch", str(10**12), "batch"),
    ("--max-num-batched-tokens", str(10**14), "max_num_batched_tokens"),
])
def test_huge_workloads_are_refused_with_the_documented_maximum(capsys, flag, value, fragment):
    """Was: "122,070,312,500,000,016 GiB needed" and similar astronomical answers."""
    line = _main_error(capsys, *BASE, flag, value)
    assert fragment in line and "<=" in line


def test_context_beyond_the_model_limit_is_noted_not_refused(capsys):
    d = _main_json(capsys, *BASE, "--context", "8192")
    assert any("max_position_embeddings" in w and "4,096" in w for w in d["warnings"])


@pytest.mark.parametrize("framework, block, accepted", [
    ("vllm", "7", False), ("vllm", "256", False), ("vllm", "0", False), ("vllm", "8", True),
    ("vllm", "128", True), ("none", "7", False), ("sglang", "7", True), ("sglang", "100000", False),
])
def test_block_size_must_be_one_the_framework_accepts(capsys, framework, block, accepted):
    """Was: ``--block-size 7`` copied into the vLLM command."""
    args = (*BASE, "--framework", framework, "--block-size", block)
    if accepted:
        d = _main_json(capsys, *args)
        flag = "--page-size" if framework == "sglang" else "--block-size"
        assert f"{flag} {block}" in (d["at_devices_needed"] or d)["serve_command"]
    else:
        line = _main_error(capsys, *args)
        assert "block" in line
        if framework != "sglang" and block != "0":
            assert "1, 8, 16, 32, 64, 128" in line


def test_block_size_on_ascend_names_the_accepted_sizes(capsys):
    line = _main_error(capsys, "--model", "qwen2.5-7b", "--hardware", "atlas-300i-duo", "--block-size", "8")
    assert "vllm-ascend" in line and "128" in line


def test_serve_heading_names_the_framework_the_command_is_for(capsys):
    """Was: a ``llama-server`` line printed under "with vLLM" with no word on why."""
    from engine.memory import main

    assert main(["--model", "mixtral-8x7b", "--hardware", "a100-80gb", "--weights", "q2_k", "--framework", "vllm"]) == 0
    lines = capsys.readouterr().out.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("serve"))
    assert "llama.cpp" in lines[i] and "not vLLM" in lines[i] and "GGUF" in lines[i]
    assert lines[i + 1].strip().startswith("llama-server")
    # the same framework as asked: the heading just names it
    assert main(["--model", "llama-3-8b", "--hardware", "h100-sxm"]) == 0
    lines = capsys.readouterr().out.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("serve"))
    assert lines[i].split() == ["serve", "with", "vLLM:"] and lines[i + 1].strip().startswith("vllm serve")
