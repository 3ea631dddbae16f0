"""2:4 semi-structured sparsity (issue #9): magnitude pruning of the decoder layers' linear
projections to 2 nonzeros in every 4 consecutive input weights (NVIDIA's sparse tensor-core
pattern, as in SparseGPT / Wanda's "2:4" setting, here with plain |w| as the criterion).

Rule: for every output row n and every group W[n, 4j : 4j+4] the two entries of largest |w| are
kept and the other two set to 0 (on ties torch.topk picks; a group that already has fewer than
two nonzeros keeps its zeros). Pruned: q/k/v/o and gate/up/down of every layer (rows prune
independently, so pruning q, k, v alone equals pruning the fused qkv); not the embedding table,
the LM head, the norms or biases.

Storage stays dense on CPU: the pruned weights are ordinary tensors with zeros (or the codes of a
quantized scheme, which prunes first and quantizes after), so there is no speedup and no memory
saving here: that needs sparse kernels (cuSPARSELt / torch's to_sparse_semi_structured, GPU
only). What the knob shows is the accuracy cost of the pattern.
"""
from __future__ import annotations

import torch

from engine.core.config import SPARSITY_PATTERNS, check_sparsity
from engine.model.quantization import is_linear_weight

__all__ = ["SPARSITY_PATTERNS", "check_sparsity", "prune_2_4", "sparsified_weights"]


def prune_2_4(w: torch.Tensor) -> torch.Tensor:
    """w [N, K] (K a multiple of 4) -> the same dtype and shape with the 2 smallest |w| of every 4
    consecutive input weights of a row set to 0."""
    n, k = w.shape
    if k % 4:
        raise ValueError(f"sparsity: '2:4' needs input dimensions that are multiples of 4, got {k}")
    groups = w.reshape(n, k // 4, 4)  # [N, K/4, 4]
    keep = groups.abs().topk(2, dim=-1).indices  # [N, K/4, 2]
    mask = torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, keep, True)
    return (groups * mask).reshape(n, k)  # masked entries become exactly 0 (a*0; inputs finite)


def sparsified_weights(weights: dict[str, torch.Tensor], sparsity: str | None) -> dict[str, torch.Tensor]:
    """Hugging Face-named weights with every decoder-layer projection pruned (``sparsity=None``:
    the dict itself). The result loads into LlamaForCausalLM as it is (the parity reference)."""
    check_sparsity(sparsity)
    if sparsity is None:
        return weights
    return {name: prune_2_4(w) if is_linear_weight(name) else w for name, w in weights.items()}
