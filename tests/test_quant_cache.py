"""The disk cache of quantized weights (engine/model/quant_cache.py): a warm load gives exactly
the tensors a cold one built, and a truncated or corrupted file is detected and rebuilt."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.model.llama import PROJECTIONS, LlamaModel
from engine.model.loader import load_model
from engine.model.quant_cache import TENSORS, entry_key, entry_path, weights_digest
from engine.model.quantization import QuantConfig, QuantizedLinear


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("INFERSCOPE_CACHE", str(tmp_path))  # the cache root (engine/model/cache.py)
    monkeypatch.delenv("INFERSCOPE_NO_QUANT_CACHE", raising=False)
    return tmp_path


def _build(config: QuantConfig) -> LlamaModel:
    m = load_model("tiny-random")
    return LlamaModel(m.config, m.weights, torch.bfloat16, config)


def _same(a: QuantizedLinear, b: QuantizedLinear) -> bool:
    return (a.weight.dtype == b.weight.dtype and torch.equal(a.weight.view(torch.uint8), b.weight.view(torch.uint8))
            and torch.equal(a.scales.view(torch.int16), b.scales.view(torch.int16)) and a.error == b.error
            and (a.scheme, a.group_size, a.outlier_threshold) == (b.scheme, b.group_size, b.outlier_threshold))


def _assert_identical(a: LlamaModel, b: LlamaModel) -> None:
    for la, lb in zip(a.layers, b.layers):
        for p in PROJECTIONS:
            qa, qb = getattr(la, p), getattr(lb, p)
            assert isinstance(qa, QuantizedLinear) and isinstance(qb, QuantizedLinear) and _same(qa, qb)
    assert isinstance(a.lm_head, QuantizedLinear) and isinstance(b.lm_head, QuantizedLinear)
    assert _same(a.lm_head, b.lm_head)
    x = torch.randn(3, a.config.hidden_size, generator=torch.Generator().manual_seed(0)).bfloat16()
    from engine.model.quantization import linear
    for la, lb in zip(a.layers, b.layers):  # the same outputs, bit for bit
        assert torch.equal(linear(x, la.qkv).view(torch.int16), linear(x, lb.qkv).view(torch.int16))


@pytest.mark.parametrize("scheme", ["int8", "int4", "fp8", "w8a8"])
def test_warm_cache_gives_the_cold_tensors(cache_dir: Path, scheme: str) -> None:
    config = QuantConfig(scheme)
    cold = _build(config)
    warm = _build(config)
    assert (cold.quant_cache_status, warm.quant_cache_status) == ("miss", "hit")
    _assert_identical(cold, warm)
    # Loaded tensors are fresh 64-byte-aligned copies: views at the file's offsets (16-byte
    # aligned) made the int8pack kernel segfault in the full suite.
    for layer in warm.layers:
        for w in (layer.qkv, layer.o, layer.gate_up, layer.down):
            assert w.weight.data_ptr() % 64 == 0 and w.scales.data_ptr() % 64 == 0


@pytest.mark.parametrize("damage", ["truncate", "flip", "marker"])
def test_damaged_entry_is_rebuilt(cache_dir: Path, damage: str) -> None:
    config = QuantConfig("int4", 32)
    cold = _build(config)
    entry = entry_path(entry_key(weights_digest(load_model("tiny-random").weights), config))
    f = entry / TENSORS
    data = bytearray(f.read_bytes())
    if damage == "truncate":
        f.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        data[-5] ^= 0xFF
        f.write_bytes(bytes(data))
    else:
        (entry / "inferscope-source.json").write_text("{not json")
    again = _build(config)
    assert again.quant_cache_status == "rebuilt"
    _assert_identical(cold, again)
    assert _build(config).quant_cache_status == "hit"  # the rebuilt entry is whole again
    assert sorted(p.name for p in (cache_dir / "quantized").iterdir()) == [entry.name]


def test_key_names_only_the_parameters_that_matter() -> None:
    d = "0" * 64
    assert entry_key(d, QuantConfig("int8", 32)) == entry_key(d, QuantConfig("int8", 64, 3.0))
    assert entry_key(d, QuantConfig("int4", 32)) != entry_key(d, QuantConfig("int4", 64))
    assert entry_key(d, QuantConfig("w8a8", 32, 6.0)) != entry_key(d, QuantConfig("w8a8", 32, 3.0))
    assert entry_key(d, QuantConfig("int8")) != entry_key(d, QuantConfig("fp8"))
    assert entry_key(d, QuantConfig("int8")) != entry_key("1" * 64, QuantConfig("int8"))
