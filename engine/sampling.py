"""Next-token sampling: greedy, temperature, top-k, top-p, each request with its own generator.

Rule: temperature 0 takes the argmax (exact against Hugging Face greedy ``generate``).
Otherwise logits / T, keep the top-k, keep the smallest set whose probability reaches top-p,
and draw from the request's own ``torch.Generator`` so a seeded request replays identically
regardless of what else shares its batch.
"""
from __future__ import annotations

import torch

from engine.config import SamplingParams


def apply_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """logits [V] -> logits with the excluded tokens at -inf."""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        drop = cumulative - sorted_logits.softmax(-1) >= top_p  # keep the token that crosses top_p
        logits = logits.clone()
        logits[order[drop]] = float("-inf")
    return logits


def sample_one(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """logits [V] fp32 -> one token id."""
    if params.greedy:
        return int(torch.argmax(logits))
    logits = apply_top_k_top_p(logits / params.temperature, params.top_k, params.top_p)
    probs = logits.softmax(-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None]) -> list[int]:
    """logits [S, V] -> S token ids; greedy rows are taken in one argmax."""
    if all(p.greedy for p in params):
        return torch.argmax(logits, dim=-1).tolist()
    return [sample_one(logits[i], p, g) for i, (p, g) in enumerate(zip(params, generators))]
