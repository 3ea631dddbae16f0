"""Every stop rule in one pure function (vLLM's ``check_stop``).

    EOS (unless ignore_eos) -> "stop"; a stop string in the text -> "stop", the text cut
    before it; max_tokens outputs or the context full -> "length"; else keep going.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from engine.core.request import Request

StopReason = Literal["stop", "length"]


@dataclass(frozen=True)
class StopDecision:
    finish_reason: StopReason
    stop_string: str | None = None  # the stop string that matched
    output_text: str | None = None  # the text cut before the stop string (None: decode it all)


def check_stop(request: Request, token: int, eos_token_ids: frozenset[int], max_model_len: int,
               decode: Callable[[Iterable[int]], str]) -> StopDecision | None:
    """Whether ``request`` stops after appending ``token`` (already in its output), and why.

    Order: EOS, then stop strings (earliest listed first), then the length limits."""
    p = request.sampling_params
    if not p.ignore_eos and token in eos_token_ids:
        return StopDecision("stop")
    if p.stop:
        text = decode(request.output_token_ids)
        for s in p.stop:
            if s in text:
                return StopDecision("stop", s, text[: text.index(s)])
    if len(request.output_token_ids) >= p.max_tokens or request.num_tokens >= max_model_len:
        return StopDecision("length")
    return None
