"""Fuzz: every hardware preset with one field mutated (wrong type, negative, zero, NaN, inf, huge,
missing), names users type (aliases that must resolve, garbage that must be refused with a
suggestion), and hardware files through the real CLI. Each case is classified by tests/fuzz/harness.py
(documented outcome / traceback / hang / silent acceptance) under its time limit."""
from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest

from engine.memory import MiB, get_hardware, hardware_from_dict, hardware_info, hardware_presets
from tests.fuzz.harness import expect_accepted, expect_cli_error, expect_rejected, run_cli

SECONDS = 5.0
PRESETS = [k for k in hardware_presets() if not hardware_info(k).get("measure")]
MISSING = object()
MUTATIONS: dict[str, Any] = {
    "string": "12", "bool": True, "nan": float("nan"), "inf": float("inf"), "negative": -1, "zero": 0,
    "huge": 1e300, "missing": MISSING,
}
# field -> mutations that are valid (documented acceptances); every other mutation must be refused
FIELDS: dict[str, frozenset[str]] = {
    "memory_gib": frozenset(),
    "bandwidth_gb_s": frozenset(),
    "fp16_tflops": frozenset(),
    "runtime_overhead_mb": frozenset({"zero", "missing"}),  # 0 MB is allowed; missing -> 650 MB
    "usable_fraction": frozenset({"missing"}),  # missing -> 1.0
    "devices_per_card": frozenset({"missing"}),  # missing -> 1
    "memory_visible_mib": frozenset({"missing"}),  # missing -> memory_gib
    "int8_tops": frozenset({"missing"}),  # missing -> no INT8 unit
    "efficiency.memory": frozenset({"missing"}),  # missing -> 0.7
}


def mutate(d: dict[str, Any], name: str, value: Any) -> dict[str, Any]:
    """The preset with one field replaced (inside its {"value"} wrapper when it has one) or removed."""
    out = copy.deepcopy(d)
    if name.startswith("efficiency."):
        eff = out.setdefault("efficiency", {})
        if value is MISSING:
            eff.pop(name.split(".", 1)[1], None)
        else:
            eff[name.split(".", 1)[1]] = value
        return out
    if value is MISSING:
        out.pop(name, None)
    elif isinstance(out.get(name), dict):
        out[name]["value"] = value
    else:
        out[name] = value
    return out


CASES = [(key, f, m) for key in PRESETS for f in FIELDS for m in MUTATIONS]


@pytest.mark.parametrize("key, field_name, mutation", CASES)
def test_preset_with_one_field_mutated(key: str, field_name: str, mutation: str) -> None:
    d = mutate(hardware_info(key), field_name, MUTATIONS[mutation])
    if mutation in FIELDS[field_name]:
        hw = expect_accepted(lambda: hardware_from_dict(d, key), seconds=SECONDS)
        assert hw.memory_bytes > 0 and math.isfinite(hw.bandwidth) and hw.runtime_overhead_bytes >= 0
        return
    expect_rejected(lambda: hardware_from_dict(d, key), match=field_name.replace(".", r"\."), seconds=SECONDS)


@pytest.mark.parametrize("typed, key", [
    ("a100", "a100-80gb"), ("A100", "a100-80gb"), ("h100", "h100-sxm"), ("H100", "h100-sxm"), ("4090", "rtx-4090"),
    ("rtx4090", "rtx-4090"), ("RTX-4090", "rtx-4090"), ("GeForce RTX 3090", "rtx-3090"), ("3090", "rtx-3090"),
    ("tesla t4", "t4"), ("NVIDIA L4", "l4"), ("l40s", "l40s"), ("H200", "h200"), ("A10", "a10"),
    ("NVIDIA A100-SXM4-80GB", "a100-80gb"), ("a100 40gb", "a100-40gb"), ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("h100 pcie", "h100-pcie"), ("Atlas 300I Duo", "atlas-300i-duo"), ("910b", "ascend-910b"),
    ("M3 Max", "apple-m3-max"), ("jetson orin", "jetson-agx-orin"),
])
def test_alias_resolves(typed: str, key: str) -> None:
    hw = expect_accepted(lambda: get_hardware(typed), seconds=SECONDS)
    assert hw.key == key


@pytest.mark.parametrize("typed", [
    "rtx-4080", "rtx5090", "a1000", "h1OO", "b200", "mi300x", "v100", "tpu-v5e", "gaudi2", "xx", "!!!!", "4O9O",
    "nvidia", "a100-120gb", "l40x", "a" * 5000, "rtx 4090 ti super", "h20", "😀", "..\\..\\gpu",
])
def test_garbage_name_refused_with_a_suggestion(typed: str) -> None:
    expect_rejected(lambda: get_hardware(typed), match=r"did you mean \S|presets: a10", seconds=SECONDS)


@pytest.mark.parametrize("content, match", [
    ({"name": "x", "memory_gib": 24, "bandwidth_gb_s": 900, "fp16_tflops": 70, "runtime_overhead_mb": -1e12},
     "runtime_overhead_mb"),
    ({"name": "x", "memory_gib": 24, "bandwidth_gb_s": 900, "fp16_tflops": 70, "usable_fraction": 5}, "usable_fraction"),
    ({"name": "x", "memory_gib": 24, "bandwidth_gb_s": 900, "fp16_tflops": 70, "devices_per_card": 0},
     "devices_per_card"),
    ({"name": "x", "memory_gib": "24", "bandwidth_gb_s": 900, "fp16_tflops": 70}, "memory_gib"),
    ({"name": "x", "memory_gib": 24, "bandwidth_gb_s": 900}, "fp16_tflops"),
    ([1, 2, 3], "JSON object"),
])
def test_cli_hardware_file(tmp_path: Path, content: Any, match: str) -> None:
    path = tmp_path / "hw.json"
    path.write_text(json.dumps(content))
    expect_cli_error(run_cli("engine.memory", ["--model", "llama-2-7b", "--hardware", str(path)]), match=match)


def test_cli_unknown_name_suggests() -> None:
    expect_cli_error(run_cli("engine.memory", ["--model", "llama-2-7b", "--hardware", "rtx-4080"]),
                     match="did you mean rtx-4090")


def test_visible_memory_field_round_trips() -> None:
    d = mutate(hardware_info("rtx-3090"), "memory_visible_mib", 20000)
    hw = expect_accepted(lambda: hardware_from_dict(d, "rtx-3090"), seconds=SECONDS)
    assert hw.memory_bytes == 20000 * MiB
