"""2:4 sparsity (engine/model/sparsity.py): the pattern, the magnitude rule, and exact greedy parity in
fp32 with Hugging Face LlamaForCausalLM loaded with the same pruned weights."""
from __future__ import annotations

import pytest
import torch

from engine import LLMEngine
from engine.core.config import EngineConfig
from engine.model.shared import get_shared_model
from engine.model.loader import load_model
from engine.model.sparsity import prune_2_4, sparsified_weights
from tests.parity import PROMPTS, hf_from_weights, hf_outputs, run_engine


def test_two_largest_of_every_four_are_kept() -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 64, generator=g)
    w[0, :4] = torch.tensor([0.0, 0.0, 0.0, 1.0])  # fewer than 2 nonzeros: the zeros stay zeros
    p = prune_2_4(w)
    groups, orig = p.view(48, 16, 4), w.view(48, 16, 4)
    nz = (groups != 0).sum(-1)
    assert (nz <= 2).all() and (nz == torch.minimum((orig != 0).sum(-1), torch.tensor(2))).all()
    kept = groups != 0
    assert torch.equal(groups[kept], orig[kept])  # kept weights unchanged
    smallest_kept = torch.where(kept, orig.abs(), torch.inf).amin(-1)
    largest_dropped = torch.where(kept, -torch.inf, orig.abs()).amax(-1)
    assert (smallest_kept >= largest_dropped).all()


def test_only_the_projections_are_pruned() -> None:
    weights = load_model("tiny-random").weights
    pruned = sparsified_weights(weights, "2:4")
    for name, w in weights.items():
        if name.startswith("model.layers.") and name.endswith("_proj.weight"):
            assert ((pruned[name].view(w.shape[0], -1, 4) != 0).sum(-1) <= 2).all()
        else:
            assert pruned[name] is w
    assert sparsified_weights(weights, None) is weights


@pytest.mark.parametrize("bad", ["2:8", "1:4", "", 24, True])
def test_bad_value_names_sparsity(bad: object) -> None:
    with pytest.raises(ValueError, match="^sparsity:"):
        EngineConfig(sparsity=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="^sparsity:"):
        get_shared_model("tiny-random", sparsity=bad)  # type: ignore[arg-type]


def test_input_dim_not_multiple_of_four() -> None:
    with pytest.raises(ValueError, match="^sparsity:"):
        prune_2_4(torch.ones(3, 6))


def test_shared_model_mismatch_is_refused() -> None:
    dense = get_shared_model("tiny-random")
    with pytest.raises(ValueError, match="^sparsity:"):
        LLMEngine(dense, sparsity="2:4", num_blocks=16)


def _hf_pruned(name: str) -> object:
    return hf_from_weights(name, sparsified_weights(load_model(name).weights, "2:4"))


@pytest.mark.parametrize("name, n_prompts, n_tokens", [("tiny-random", 3, 12), ("smollm2-135m", 1, 8)])
def test_fp32_greedy_parity_with_hf_on_pruned_weights(name: str, n_prompts: int, n_tokens: int) -> None:
    shared = get_shared_model(name, sparsity="2:4")
    assert shared.sparsity == "2:4" and shared.model.dtype == torch.float32
    prompts = PROMPTS[:n_prompts]
    outputs, _ = run_engine(LLMEngine(shared, sparsity="2:4", num_blocks=64), prompts, n_tokens)
    for prompt, got, want in zip(prompts, outputs, hf_outputs(_hf_pruned(name), shared, prompts, n_tokens)):
        assert got == want, prompt


def test_sparse_then_quantized_runs_and_differs_from_dense() -> None:
    """Prune first, then quantize: the quantized projections' dequantized weights keep the zeros."""
    from engine.model.quantization import dequantize_linear, QuantizedLinear
    shared = get_shared_model("tiny-random", quantization="int8", sparsity="2:4")
    qkv = shared.model.layers[0].qkv
    assert isinstance(qkv, QuantizedLinear)
    deq = dequantize_linear(qkv)
    assert ((deq.view(deq.shape[0], -1, 4) != 0).sum(-1) <= 2).all()
    outputs, _ = run_engine(LLMEngine(shared, quantization="int8", sparsity="2:4", num_blocks=32), PROMPTS[:1], 4)
    assert len(outputs[0]) == 4
