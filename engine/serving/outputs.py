"""What a caller gets back for a request (vLLM's RequestOutput / CompletionOutput)."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from engine.core.request import Request
from engine.core.trace import RequestMetrics
from engine.core.tracing import request_metrics


@dataclass(frozen=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None
    stop_reason: str | None = None
    error: str | None = None  # the reason, when finish_reason == "error"


@dataclass(frozen=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: tuple[int, ...]
    outputs: tuple[CompletionOutput, ...]
    finished: bool
    metrics: RequestMetrics
    num_cached_tokens: int | None = None  # prompt tokens served by the prefix cache (vLLM's name)


def request_output(r: Request, sequences: list[Request], finished: bool,
                   decode: Callable[[Iterable[int]], str]) -> RequestOutput:
    """One CompletionOutput per sequence (n of them, in index order; a sequence not forked yet is
    empty, and ends as the request did when the request ended before its first sample: aborted
    or failed)."""
    outputs = [_completion(i, seq, decode) for i, seq in enumerate(sequences)]
    if r.parent_id is None:
        outputs += [CompletionOutput(i, "", (), r.finish_reason, None, r.error)
                    for i in range(len(sequences), r.sampling_params.n)]
    return RequestOutput(r.request_id, r.prompt, tuple(r.prompt_token_ids), tuple(outputs), finished,
                         request_metrics(r), r.num_cached_tokens)


def _completion(index: int, r: Request, decode: Callable[[Iterable[int]], str]) -> CompletionOutput:
    text = r.output_text if r.is_finished else decode(r.output_token_ids)
    return CompletionOutput(index, text, tuple(r.output_token_ids), r.finish_reason, r.stop_reason, r.error)
