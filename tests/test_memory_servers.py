"""Issue #21 item 4: hardware presets carry their variants and servers are named as servers.

The Atlas 300V Pro is sold with 48 GB and (per one secondary table) 24 GB: both are answered,
and the other one is shown where its verdict differs. "Atlas 800I A2" is a server of 8 Ascend
910B, not one NPU; "DGX H100" is 8 H100 SXM. Torch-free, like the calculator.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.memory import Workload, estimate, get_hardware, hardware_from_dict, main
from engine.sizing import SizingError, hardware_info

ROOT = Path(__file__).resolve().parents[1]


def test_a_variant_whose_verdict_differs_is_answered_beside_the_preset() -> None:
    """InternVL2-8B at 16 sequences x 8k: fits the 48 GB card, not the 24 GB one."""
    est = estimate("internvl2-8b", "atlas-300v-pro", Workload(batch=2, context=16384))
    assert est.fits and est.device_memory_bytes == 48 << 30
    (variant,) = est.variants
    assert variant.hardware_name == "Atlas 300V Pro 24 GB" and variant.device_memory_bytes == 24 << 30
    assert not variant.fits and "does not fit" in variant.verdict
    alone = estimate("internvl2-8b", get_hardware("atlas-300v-pro").variants[0], Workload(batch=2, context=16384))
    assert (alone.fits, alone.devices_needed, alone.kv_room_tokens) == (variant.fits, variant.devices_needed,
                                                                       variant.kv_room_tokens)


def test_a_variant_with_the_same_verdict_is_a_note() -> None:
    est = estimate("llama-3-8b", "ascend-910b")
    assert est.fits and est.variants == []
    assert any("Ascend 910B4 (32 GB): the same verdict" in n for n in est.notes)


def test_atlas_800i_a2_is_a_server_of_eight_npus() -> None:
    """The alias used to mean one 910B silently; now it is the server, sized on its 8 NPUs."""
    hw = get_hardware("Atlas 800I A2")
    assert hw.key == "atlas-800i-a2" and hw.devices_per_node == 8 and hw.server.startswith("Atlas 800I A2 (8 x ")
    assert get_hardware("910b").server == ""  # the single NPU is still there, named as one
    est = estimate("qwen2.5-72b", hw)
    assert est.tp == 8 and est.fits
    assert f"{est.devices_needed} of its 8 devices hold this workload" in est.server


def test_a_server_preset_takes_its_device_figures_from_the_device_preset() -> None:
    dgx, h100 = get_hardware("dgx-h100"), get_hardware("h100-sxm")
    assert (dgx.memory_bytes, dgx.bandwidth, dgx.fp8_flops, dgx.name) == (h100.memory_bytes, h100.bandwidth,
                                                                          h100.fp8_flops, h100.name)
    assert "bandwidth_gb_s" not in json.loads((ROOT / "presets" / "hardware" / "dgx-h100.json").read_text())
    assert hardware_info("dgx-h100")["bandwidth_gb_s"] == hardware_info("h100-sxm")["bandwidth_gb_s"]
    est = estimate("llama-3.1-405b", dgx)
    assert not est.fits and est.devices_needed == 16 and "it needs 2 servers (16 devices)" in est.server


def test_cli_prints_the_server_and_the_differing_variant(capsys) -> None:
    assert main(["--model", "internvl2-8b", "--hardware", "atlas-300v-pro", "--batch", "2", "--context", "16384"]) == 0
    out = capsys.readouterr().out
    assert "  variant  Atlas 300V Pro 24 GB (24.00 GiB): DOES NOT FIT" in out
    assert main(["--model", "llama-3-70b", "--hardware", "dgx-h100", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["server"].startswith("DGX H100 (8 x H100 SXM 80GB): ") and answer["tp"] == 8


@pytest.mark.parametrize(("change", "fragment"), [
    ({"variants": {"name": "x"}}, "'variants' must be a list"),
    ({"variants": [{"memory_gib": 24}]}, "'variants[0]' must be an object with a \"name\""),
    ({"variants": [{"name": "x", "device_class": "apple"}]}, "may only change"),
    ({"variants": [{"name": "x", "memory_gib": -1}]}, "'memory_gib' must be a positive number"),
    ({"server": {"name": "S", "devices": 1}}, "'server.devices' must be a whole number between 2 and 64"),
    ({"server": {"devices": 8}}, "'server.name' must be a non-empty string"),
    ({"server": 8}, "'server' must be an object"),
])
def test_bad_variants_and_servers_are_refused_naming_the_field(change: dict, fragment: str) -> None:
    base = {"name": "Card", "memory_gib": 48, "bandwidth_gb_s": 200, "fp16_tflops": 70}
    with pytest.raises(SizingError, match=fragment.replace("(", r"\(").replace("[", r"\[")):
        hardware_from_dict({**base, **change})
