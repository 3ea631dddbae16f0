"""MindIE as a framework on Ascend (engine/sizing/budget.py, advice.py): npuMemSize -1 budget,
the config.json / mindieservice_daemon serve line, the refusal off Ascend, and vllm-ascend's 310P
--enforce-eager following the framework version."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from engine.memory import Settings, Workload, estimate
from engine.sizing.formats import SizingError
from engine.sizing.units import GiB


def test_budget_is_eighty_percent_of_the_card_minus_weights_activations_and_runtime() -> None:
    est = estimate("qwen3-8b", "ascend-910b", Workload(batch=1, context=4096), Settings(framework="mindie"))
    total = 64 * GiB
    usable = int(total * 0.8)  # NPU_MEMORY_FRACTION default
    assert est.usable_bytes_per_device == usable
    pool = usable - est.weight_bytes - est.activation_bytes - est.overhead_bytes
    assert est.kv_pool_bytes == pool
    # 128-token blocks of 147,456 B (36 layers x 8 KV heads x 128 x 2 x 2 B)
    assert est.kv_bytes_per_token == 147_456
    assert est.kv_room_tokens == pool // (147_456 * 128) * 128
    assert est.framework == "mindie" and est.fits


def test_serve_line_is_the_config_edits_and_the_daemon() -> None:
    est = estimate("qwen3-8b", "ascend-910b", Workload(batch=4, context=8192, prompt=6000),
                   Settings(framework="mindie", tp=2))
    cmd = est.serve_command
    assert cmd.endswith("./bin/mindieservice_daemon") and est.serve_heading == "MindIE"
    for field in ("npuDeviceIds = [[0,1]]", "maxSeqLen = 8192", "maxInputTokenLen = 6000", "worldSize = 2",
                  "npuMemSize = -1", "cacheBlockSize = 128", "maxPrefillTokens = 8192", "maxBatchSize = 4",
                  'modelWeightPath = "/models/Qwen3-8B"'):
        assert field in cmd, field
    assert "vllm" not in cmd


def test_refused_off_ascend_naming_the_field() -> None:
    with pytest.raises(SizingError, match="framework 'mindie'.*Ascend NPUs only"):
        estimate("qwen3-8b", "h100-sxm", settings=Settings(framework="mindie"))
    out = subprocess.run([sys.executable, "-m", "engine.memory", "--model", "qwen3-8b", "--hardware", "rtx-4090",
                          "--framework", "mindie"], capture_output=True, text=True)
    assert out.returncode == 2 and "framework 'mindie'" in out.stderr and "Traceback" not in out.stderr


def test_no_bf16_on_310p_and_the_decode_uses_the_mindie_rule() -> None:
    est = estimate("qwen3-8b", "atlas-300i-duo", settings=Settings(framework="mindie"))
    assert any("FP16-only" in w for w in est.warnings)
    assert not any("vllm-ascend's 310P path" in w for w in est.warnings)
    assert est.decode_backend == "mindie" and est.decode_overhead_s > 0
    assert est.decode_tokens_per_s < est.decode_tokens_per_s_roofline


@pytest.mark.parametrize(("version", "eager"), [(None, False), ("0.10.0rc1", True), ("0.17", True), ("0.18.0rc1", False)])
def test_vllm_ascend_310p_enforce_eager_follows_the_version(version: str | None, eager: bool) -> None:
    est = estimate("qwen3-8b", "atlas-300i-duo", settings=Settings(framework="vllm-ascend", framework_version=version))
    assert ("--enforce-eager" in est.serve_command) is eager


def test_cli_json_agrees() -> None:
    out = subprocess.run([sys.executable, "-m", "engine.memory", "--model", "qwen3-8b", "--hardware", "ascend-910b",
                          "--framework", "mindie", "--json"], capture_output=True, text=True, check=True)
    d = json.loads(out.stdout)
    est = estimate("qwen3-8b", "ascend-910b", settings=Settings(framework="mindie"))
    assert d["kv_room_tokens"] == est.kv_room_tokens and d["serve_command"] == est.serve_command
    assert d["decode_backend"] == "mindie"
