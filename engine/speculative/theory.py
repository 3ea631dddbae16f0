"""The cost model of speculative decoding (Leviathan et al. 2023, §3): expected tokens per
target step and expected speedup for an acceptance rate alpha, k drafts and a draft cost c.

Plain arithmetic, no torch: the views import it without loading the engine's tensors.
"""
from __future__ import annotations

import math

from engine.core.config import MAX_SPECULATIVE_TOKENS


def _check_alpha_k(alpha: float, k: int) -> None:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha <= 1:
        raise ValueError(f"alpha: must be a number in [0, 1], got {alpha!r}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k: must be an integer >= 0, got {k!r}")


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """Tokens one target step emits with k drafts each accepted with probability alpha
    (independently): E = (1 - alpha^(k+1)) / (1 - alpha); k + 1 at alpha == 1; 1 at k == 0."""
    _check_alpha_k(alpha, k)
    if alpha == 1:
        return float(k + 1)
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def expected_speedup(alpha: float, k: int, c: float) -> float:
    """Speedup over plain decoding when a draft step costs c target steps and verifying k
    drafts costs one target step: E / (k c + 1) = (1 - alpha^(k+1)) / ((1 - alpha)(k c + 1))."""
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not (math.isfinite(c) and c >= 0):
        raise ValueError(f"c: must be a finite number >= 0 (draft step cost / target step cost), got {c!r}")
    return expected_tokens_per_step(alpha, k) / (k * c + 1)


def best_k(alpha: float, c: float, k_max: int = MAX_SPECULATIVE_TOKENS) -> int:
    """The k in 0..k_max with the largest expected_speedup (smallest k on ties); 0 means
    speculation does not pay (speedup 1)."""
    if isinstance(k_max, bool) or not isinstance(k_max, int) or k_max < 0:
        raise ValueError(f"k_max: must be an integer >= 0, got {k_max!r}")
    _check_alpha_k(alpha, 0)
    speedups = [expected_speedup(alpha, k, c) for k in range(k_max + 1)]
    return max(range(k_max + 1), key=lambda k: (speedups[k], -k))
