"""Hardware presets and hardware files: names users type, fields that must be checked, and the memory
the driver really makes visible (issue 7, "Hardware names" and "hardware files" defects)."""
from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engine.memory import (GiB, MiB, SizingError, Workload, custom_hardware, estimate, get_hardware, hardware_from_dict,
                           hardware_info, hardware_presets)
from engine.sizing.hardware import norm_name, preset_aliases, resolve_hardware_name, suggest_hardware

ROOT = Path(__file__).resolve().parents[1]
NVIDIA = [k for k in hardware_presets() if hardware_info(k).get("vendor") == "NVIDIA"]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engine.memory", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONWARNINGS": "ignore"})


# --- names ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("typed, key", [
    ("a100", "a100-80gb"), ("A100", "a100-80gb"), ("h100", "h100-sxm"), ("H100", "h100-sxm"),
    ("4090", "rtx-4090"), ("rtx4090", "rtx-4090"), ("RTX 4090", "rtx-4090"), ("NVIDIA GeForce RTX 4090", "rtx-4090"),
    ("3090", "rtx-3090"), ("Tesla T4", "t4"), ("T4", "t4"), ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("NVIDIA A100-SXM4-40GB", "a100-40gb"), ("L40S", "l40s"), ("nvidia l4", "l4"), ("H200", "h200"),
    ("300V Pro", "atlas-300v-pro"), ("910B", "ascend-910b"), ("m2 ultra", "apple-m2-ultra"), ("a10", "a10"),
    ("H100 PCIe", "h100-pcie"), ("  rtx-4090  ", "rtx-4090"),
])
def test_aliases_case_and_punctuation_insensitive(typed: str, key: str) -> None:
    assert get_hardware(typed).key == key


@pytest.mark.parametrize("typed, chosen, sibling", [("a100", "a100-80gb", "a100-40gb"), ("H100", "h100-sxm", "h100-pcie")])
def test_ambiguous_family_name_takes_the_common_variant_and_says_so(typed: str, chosen: str, sibling: str) -> None:
    hw = get_hardware(typed)
    assert hw.key == chosen and sibling in hw.alias_note and "most common variant" in hw.alias_note
    e = estimate("llama-3-8b", typed, detail=False)
    assert any(sibling in n for n in e.notes)
    assert get_hardware(chosen).alias_note == ""  # the exact key needs no note


@pytest.mark.parametrize("typed, expected", [("rtx409", "rtx-4090"), ("rtx-4080", "rtx-4090"), ("h10", "h100-sxm"),
                                             ("a1OO", "a100-80gb"), ("l40", "l40s"), ("atlas300v", "atlas-300v-pro")])
def test_miss_suggests_the_closest_names(typed: str, expected: str) -> None:
    with pytest.raises(SizingError, match="did you mean") as err:
        get_hardware(typed)
    assert expected in str(err.value)
    assert expected in suggest_hardware(typed)


def test_garbage_name_lists_the_presets() -> None:
    with pytest.raises(SizingError, match="unknown hardware 'qqqqqq'; presets: a10, ") as err:
        get_hardware("qqqqqq")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("bad", ["", "   ", None, 5, 4090.0, ["a100"], True])
def test_empty_or_non_string_names(bad: Any) -> None:
    with pytest.raises(SizingError):
        get_hardware(bad)


def test_aliases_are_unique_and_never_shadow_another_preset() -> None:
    owner: dict[str, str] = {}
    for key in hardware_presets():
        for name in [key, hardware_info(key).get("name", key), *preset_aliases(key)]:
            n = norm_name(name)
            assert owner.setdefault(n, key) == key, f"{name!r} claimed by {owner[n]} and {key}"
    for key in hardware_presets():
        assert resolve_hardware_name(key) == (key, "")


def test_cli_accepts_aliases_and_refuses_a_miss_with_a_suggestion() -> None:
    ok = run_cli("--model", "llama-3-8b", "--hardware", "4090", "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["hardware"] == "rtx-4090"
    note = run_cli("--model", "llama-3-8b", "--hardware", "a100")
    assert note.returncode == 0 and "a100-40gb" in note.stdout and "most common variant" in note.stdout
    miss = run_cli("--model", "llama-3-8b", "--hardware", "rtx-4080")
    lines = [ln for ln in miss.stderr.splitlines() if ln.strip()]
    assert miss.returncode == 2 and len(lines) == 1 and "did you mean rtx-4090" in lines[0]


# --- visible memory -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("key", NVIDIA)
def test_every_nvidia_preset_has_visible_memory_with_a_source(key: str) -> None:
    info = hardware_info(key)
    visible = info.get("memory_visible_mib")
    assert isinstance(visible, dict) and visible["source"] and visible["confidence"] in ("high", "medium", "low")
    hw = get_hardware(key)
    assert hw.memory_bytes == int(visible["value"] * MiB)
    # CUDA's total sits 2-10 % under the nominal size (driver reserve, GB vs GiB marketing)
    assert 0.88 * hw.nominal_memory_bytes < hw.memory_bytes < hw.nominal_memory_bytes


@pytest.mark.parametrize("key, gib", [("rtx-3090", 23.58), ("h100-sxm", 79.22), ("a100-80gb", 79.15),
                                      ("rtx-4090", 23.64), ("t4", 14.57)])
def test_visible_memory_matches_the_logged_totals(key: str, gib: float) -> None:
    assert get_hardware(key).memory_bytes / GiB == pytest.approx(gib, abs=0.005)


def test_every_preset_passes_validation() -> None:
    for key in hardware_presets():
        assert get_hardware(key).key == key


# --- validation of hardware dicts and files --------------------------------------------------------------------
BASE: dict[str, Any] = {"name": "Test GPU", "device_class": "custom", "memory_gib": 24, "bandwidth_gb_s": 1000,
                        "fp16_tflops": 100, "efficiency": {"memory": 0.8, "compute": 0.6}}


def with_(**changes: Any) -> dict[str, Any]:
    d = copy.deepcopy(BASE)
    for k, v in changes.items():
        if k.startswith("eff_"):
            d["efficiency"][k[4:]] = v
        else:
            d[k] = v
    return d


def without(name: str) -> dict[str, Any]:
    d = copy.deepcopy(BASE)
    del d[name]
    return d


@pytest.mark.parametrize("d, field", [
    (with_(runtime_overhead_mb=-1e12), "runtime_overhead_mb"),
    (with_(runtime_overhead_mb=1e12), "runtime_overhead_mb"),
    (with_(runtime_overhead_mb=float("nan")), "runtime_overhead_mb"),
    (with_(usable_fraction=5), "usable_fraction"), (with_(usable_fraction=-1), "usable_fraction"),
    (with_(usable_fraction=0), "usable_fraction"), (with_(usable_fraction="0.5"), "usable_fraction"),
    (with_(devices_per_card=0), "devices_per_card"), (with_(devices_per_card=-2), "devices_per_card"),
    (with_(devices_per_card=1.5), "devices_per_card"), (with_(devices_per_card=True), "devices_per_card"),
    (with_(devices_per_card=10**9), "devices_per_card"),
    (with_(memory_gib=float("nan")), "memory_gib"), (with_(memory_gib=float("inf")), "memory_gib"),
    (with_(memory_gib="24"), "memory_gib"), (with_(memory_gib=True), "memory_gib"), (with_(memory_gib=0), "memory_gib"),
    (with_(memory_gib=1e300), "memory_gib"), (with_(memory_gib={"source": "x"}), "memory_gib"),
    (with_(bandwidth_gb_s=-1), "bandwidth_gb_s"), (with_(fp16_tflops=None), "fp16_tflops"),
    (with_(bf16_tflops="fast"), "bf16_tflops"), (with_(fp8_tflops=float("inf")), "fp8_tflops"),
    (with_(int8_tops=False), "int8_tops"), (with_(interconnect_gb_s=0), "interconnect_gb_s"),
    (with_(memory_visible_mib=30000), "memory_visible_mib"), (with_(memory_visible_mib=-5), "memory_visible_mib"),
    (with_(eff_memory=0), "efficiency.memory"), (with_(eff_memory=1.5), "efficiency.memory"),
    (with_(eff_compute=float("nan")), "efficiency.compute"), (with_(eff_compute="0.5"), "efficiency.compute"),
    (with_(efficiency=0.7), "efficiency"), (with_(device_class=5), "device_class"),
    (with_(device_class="tpu"), "device_class"), (with_(default_framework="tgi"), "default_framework"),
    (with_(name=42), "name"), (with_(notes="one note"), "notes"),
    (without("memory_gib"), "memory_gib"), (without("bandwidth_gb_s"), "bandwidth_gb_s"),
    (without("fp16_tflops"), "fp16_tflops"),
])
def test_bad_hardware_fields_are_named(d: dict[str, Any], field: str) -> None:
    with pytest.raises(SizingError, match=field.replace(".", r"\.")) as err:
        hardware_from_dict(d)
    assert "\n" not in str(err.value)


def test_good_hardware_dict_still_builds() -> None:
    hw = hardware_from_dict(with_(memory_visible_mib=24000, usable_fraction=0.9, devices_per_card=2,
                                  runtime_overhead_mb=0, bf16_tflops=None, interconnect_gb_s=None))
    assert hw.memory_bytes == 24000 * MiB and hw.usable_fraction == 0.9 and hw.devices_per_card == 2
    assert hw.bf16_flops is None and hw.runtime_overhead_bytes == 0 and math.isclose(hw.eta_memory, 0.8)


@pytest.mark.parametrize("content, field", [
    ({**BASE, "runtime_overhead_mb": -1e12}, "runtime_overhead_mb"),
    ({**BASE, "usable_fraction": 5}, "usable_fraction"),
    ({**BASE, "devices_per_card": 0}, "devices_per_card"),
    ({k: v for k, v in BASE.items() if k != "fp16_tflops"}, "fp16_tflops"),
])
def test_cli_hardware_file_errors_are_one_line(tmp_path: Path, content: dict[str, Any], field: str) -> None:
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(content))
    proc = run_cli("--model", "llama-2-7b", "--hardware", str(path))
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and field in lines[0] and "gpu.json" in lines[0]
    assert "Traceback" not in proc.stderr


def test_hardware_file_not_json_or_not_object(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(SizingError, match="not valid JSON"):
        get_hardware(str(bad))
    arr = tmp_path / "arr.json"
    arr.write_text("[1, 2]")
    with pytest.raises(SizingError, match="JSON object"):
        get_hardware(str(arr))
    with pytest.raises(SizingError, match="not found"):
        get_hardware(str(tmp_path / "missing.json"))


@pytest.mark.parametrize("kwargs, label", [
    (dict(memory_gib="16", bandwidth_gb_s=500, fp16_tflops=50), "memory"),
    (dict(memory_gib=16, bandwidth_gb_s=float("inf"), fp16_tflops=50), "bandwidth"),
    (dict(memory_gib=16, bandwidth_gb_s=500, fp16_tflops=50, eta_memory="0.5"), "efficiency \\(memory\\)"),
    (dict(memory_gib=16, bandwidth_gb_s=500, fp16_tflops=50, overhead_mb=-1), "overhead"),
    (dict(memory_gib=16, bandwidth_gb_s=500, fp16_tflops=50, devices_per_card=0), "devices per card"),
    (dict(memory_gib=16, bandwidth_gb_s=500, fp16_tflops=50, int8_tops=float("nan")), "INT8"),
])
def test_custom_hardware_errors_name_the_page_field(kwargs: dict[str, Any], label: str) -> None:
    with pytest.raises(SizingError, match=f"custom hardware: {label}"):
        custom_hardware(**kwargs)


def test_kv_pool_uses_visible_memory() -> None:
    # the old RTX 3090 preset used the nominal 24 GiB: 35,696 tokens at 20k where vLLM logged 31,232
    e = estimate("llama-3-8b", "rtx-3090", Workload(context=20000), detail=False)
    assert e.device_memory_bytes == 24146 * MiB
