"""Next-token sampling: greedy, temperature, top-k, top-p, each request with its own generator.

Rule: temperature 0 (or below SAMPLING_EPS, as vLLM) takes the argmax (exact against Hugging
Face greedy ``generate``). Otherwise logits / T, keep the top-k, keep the smallest set whose
probability reaches top-p (never less than the top token), and draw from the request's own
``torch.Generator`` so a seeded request replays identically regardless of what else shares
its batch.

Valid parameters never make sampling raise. A row whose logits are not finite (NaN or +inf
from the model) is a ``SamplingError`` for that row only: the engine finishes that request
with ``finish_reason="error"`` and samples the others normally.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from engine.core.config import SamplingParams


class SamplingError(RuntimeError):
    """Sampling failed for one row (one request) of the batch."""

    def __init__(self, row: int, message: str) -> None:
        super().__init__(message)
        self.row = row


def apply_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """logits [V] -> logits with the excluded tokens at -inf; the top token is always kept."""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs >= top_p  # keep the token that crosses top_p
        drop[0] = False  # rounding may put the first "before" sum above a tiny top_p
        logits = logits.clone()
        logits[order[drop]] = float("-inf")
    return logits


def sampling_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [V] -> probs [V] that a non-greedy request draws from: softmax of the top-k/top-p
    filtered logits / T (the one transform; speculative decoding applies it to p and q too)."""
    return apply_top_k_top_p(logits / params.temperature, params.top_k, params.top_p).softmax(-1)


def sample_one(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """logits [V] fp32 -> one token id."""
    if params.greedy:
        return int(torch.argmax(logits))
    probs = sampling_probs(logits, params)
    return int(torch.multinomial(probs, 1, generator=generator))


#: Greedy rows' pick: logits [S, V] -> each row's first argmax, or None where a row is not finite
#: (``sample_rows`` then takes each row on its own).
GreedyPick = Callable[[torch.Tensor], list[int] | None]


def torch_greedy(logits: torch.Tensor) -> list[int] | None:
    """The torch pick: a finite sum of every row proves every value finite (any NaN or inf makes
    it NaN or inf) in one cheap reduction (the elementwise test costs ~20x as much over a 49k
    vocabulary); max's indices are the first maximum, as argmax's (a third of argmax's time)."""
    if not bool(torch.isfinite(logits.sum(dim=-1)).all()):
        return None
    return logits.max(dim=-1).indices.tolist()


def sample_rows(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None],
                greedy: GreedyPick = torch_greedy) -> list[int | SamplingError]:
    """logits [S, V] -> per row a token id, or the SamplingError of that row alone.

    When every row is greedy, ``greedy`` picks them all at once (the engine passes a C pick on
    CPU, engine/model/cpu_decode.py). Otherwise, or where it does not pick (a row not finite), every
    row is taken on its own, so a failure (non-finite logits, or an exception in the sampler) stays
    in its row.
    """
    if all(p.greedy for p in params):
        tokens = greedy(logits)
        if tokens is not None:
            picked: list[int | SamplingError] = list(tokens)
            return picked
    finite = torch.isfinite(logits).all(dim=-1).tolist()
    results: list[int | SamplingError] = []
    for row, (p, g) in enumerate(zip(params, generators)):
        if not finite[row]:
            results.append(SamplingError(row, "the model produced non-finite logits (NaN or inf)"))
            continue
        try:
            results.append(sample_one(logits[row], p, g))
        except Exception as e:  # noqa: BLE001 - attributed to this row; the engine reports it
            results.append(SamplingError(row, f"sampling failed: {type(e).__name__}: {e}"))
    return results


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None]) -> list[int]:
    """logits [S, V] -> S token ids; raises the first row's SamplingError, if any."""
    out = sample_rows(logits, params, generators)
    for item in out:
        if isinstance(item, SamplingError):
            raise item
    return [int(t) for t in out]  # type: ignore[arg-type]
