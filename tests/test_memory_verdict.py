"""The calculator's verdict says what it means (issue #19, item 8).

A configuration that does not fit is never worded as a fit ("Does not fit on 2 x H100 SXM 80GB —
needs 4", over by how much); speed is quoted for the devices asked for only when it fits there,
with the smallest count that fits beside it, labelled; the serve command never asks for more
positions than the model has; the Llama-3.1 presets load and size.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from engine.memory import Settings, SizingError, Workload, estimate, get_model, parse_config_text

ROOT = Path(__file__).resolve().parents[1]
TWO_H100 = ("--hardware", "h100-sxm", "--tp", "2")

PUBLISHED_PARAMS = {"llama-3.1-8b": 8.03e9, "llama-3.1-70b": 70.6e9, "llama-3.1-405b": 405.9e9}


@pytest.mark.parametrize("key, published", PUBLISHED_PARAMS.items())
def test_llama31_presets_load_and_size(key, published):
    spec = get_model(key)
    assert spec.params_total == pytest.approx(published, rel=0.002)
    assert spec.max_position == 131072 and spec.num_kv_heads == 8 and spec.vocab == 128256
    assert spec.source["hf_id"] == f"meta-llama/Llama-3.1-{key.split('-')[-1].upper()}"


# --- the CLI's verdict: a real subprocess, as users run it -------------------------------------------------------

def cli(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "engine.memory", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def boundary(model: str) -> int:
    """The longest context that fits on 2 x H100 (tp 2): it fits there by less than one KV block."""
    return estimate(model, "h100-sxm", Workload(context=4096), Settings(tp=2), detail=False).max_context


def test_cli_over_by_a_little_says_does_not_fit_and_quotes_speed_only_where_it_fits():
    """The speaker's case: Llama-3-70B on 2 x H100 at 32,768 tokens is over by ~1.4 GiB (vLLM V0's rule)."""
    out = cli("--model", "llama-3-70b", *TWO_H100, "--context", "32768", "--framework-version", "0.7")
    first = out.splitlines()[0]
    assert first.endswith("with vLLM 0.7: DOES NOT FIT ON 2 DEVICES — NEEDS 4 (over by 1.38 GiB per device)")
    assert "FITS WITH" not in out and "(over by 1.38 GiB;" in out
    assert "  speed    not quoted for 2 devices: it does not fit there" in out
    assert not re.search(r"^  (decode|prefill) ", out, re.M)  # no speed as if it ran on 2
    fewest = next(line for line in out.splitlines() if line.startswith("  fewest "))
    assert fewest.startswith("  fewest   4 devices fit (tp 4, pp 1); there: decode <=") and "tok/s" in fewest


def test_cli_exact_fit_and_one_token_over():
    n = boundary("llama-3.1-70b")
    fits = cli("--model", "llama-3.1-70b", *TWO_H100, "--context", str(n))
    assert fits.splitlines()[0].endswith(": FITS ON 2 DEVICES")
    assert re.search(r"usable \([\d.]+ (MiB|KiB|B) to spare\)", fits)  # a hair's breadth, never "0.00 GiB"
    assert re.search(r"^  decode   <= [\d.]+ tok/s roofline", fits, re.M)
    over = cli("--model", "llama-3.1-70b", *TWO_H100, "--context", str(n + 1))
    assert re.search(r": DOES NOT FIT ON 2 DEVICES — NEEDS 4 \(over by [\d.]+ (MiB|KiB|B) per device\)$",
                     over.splitlines()[0])


def test_cli_fits_with_room():
    out = cli("--model", "llama-3-70b", *TWO_H100, "--framework-version", "0.7")  # V0's rule: 2.99 GiB spare
    assert out.splitlines()[0].endswith(": FITS ON 2 DEVICES")
    assert "(2.99 GiB to spare)" in out and "not quoted" not in out and "fewest   " not in out


# --- the serve command never asks for more positions than the model has ------------------------------------------

def test_serve_command_is_capped_at_the_models_positions():
    out = cli("--model", "llama-3-70b", *TWO_H100, "--context", "32768")
    serve = next(line.strip() for line in out.splitlines() if line.strip().startswith("vllm serve"))
    assert "--max-model-len 8192 " in serve and "32768" not in serve
    assert "(the command asks for 8,192 tokens per sequence, not 32,768: the model has 8,192 positions" in out


@pytest.mark.parametrize("hardware, framework, fragment", [
    ("h100-sxm", "vllm", "--max-model-len 8192 "),
    ("h100-sxm", "sglang", "--context-length 8192 "),
    ("apple-m3-max", "none", "-c 16384 "),  # llama.cpp: -c is every sequence's tokens (2 x 8,192)
])
def test_every_tool_is_capped(hardware, framework, fragment):
    e = estimate("llama-3-8b", hardware, Workload(batch=2, context=32768), Settings(framework=framework))
    assert fragment in e.serve_command + " " and "32768" not in e.serve_command and "65536" not in e.serve_command
    assert e.serve_note and any("capped at 8,192" in w for w in e.warnings)


def test_within_the_limit_the_command_asks_for_the_context():
    e = estimate("llama-3.1-8b", "h100-sxm", Workload(context=32768))
    assert "--max-model-len 32768 " in e.serve_command and not e.serve_note


LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
         "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
         "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}


@pytest.mark.parametrize("rope_scaling, limit", [
    (None, 8192),
    ({"rope_type": "linear", "factor": 4.0}, 32768),  # max_position_embeddings x factor
    ({"type": "dynamic", "factor": 2.0}, 16384),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}, 16384),  # from the original
    ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 1024}, 8192),  # already counted
    ({"rope_type": "longrope", "factor": 32.0}, 8192),
    ({"type": "mrope", "mrope_section": [16, 24, 24]}, 8192),  # no factor: not extended
])
def test_the_limit_is_vllms_rope_scaled_length(rope_scaling, limit):
    spec = parse_config_text(json.dumps({**LLAMA, "rope_scaling": rope_scaling}))
    assert spec.max_model_len == limit and spec.max_position == 8192
    e = estimate(spec, "h100-sxm", Workload(context=65536))
    assert f"--max-model-len {limit} " in e.serve_command
    assert get_model("internvl2-8b").max_model_len == 65536  # 32,768 x dynamic factor 2, as vLLM derives it


@pytest.mark.parametrize("rope_scaling, field", [
    ({"rope_type": "linear", "factor": "four"}, "rope_scaling.factor"),
    ({"rope_type": "linear", "factor": -2}, "rope_scaling.factor"),
    ({"rope_type": "yarn", "factor": 4.0}, "original_max_position_embeddings"),
])
def test_a_malformed_rope_scaling_is_refused_naming_the_field(rope_scaling, field):
    with pytest.raises(SizingError, match=re.escape(field)):
        parse_config_text(json.dumps({**LLAMA, "rope_scaling": rope_scaling}))
