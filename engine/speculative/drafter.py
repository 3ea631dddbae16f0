"""Drafters for speculative decoding: who proposes the k tokens the target verifies.

    propose([(request, k), ...]) -> {request_id: Draft(token_ids [<= k], probs [k, V] | None)}

A drafter runs before the scheduler, for running requests in decode (engine.LLMEngine). Its
drafts go to ``Request.spec_token_ids``; the target verifies them in the same flattened
forward as everything else (engine.core.scheduler, engine.speculative.spec_decode.rejection_sample). What a
drafter must also support, so that a step stays all-or-nothing and nothing leaks:

    rewind(request, n)    after verification: only positions < n are verified, so draft state
                          beyond them is stale (a model drafter's KV there is overwritten later)
    release(request_id)   the request finished, was aborted or preempted: free its draft state
    checkpoint()/restore  the drafter's state before a step, put back when the step fails
    check_integrity(live) its own invariants (no leaked or doubly owned draft blocks)

Two kinds: ``NgramDrafter`` here (prompt lookup: no model, no state, q one-hot), and
``engine.speculative.draft_runner.ModelDrafter`` (draft_model and early_exit: a model with its own paged
KV cache).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from engine.core.request import Request
from engine.speculative.spec_decode import ngram_propose


@dataclass(frozen=True)
class Draft:
    """What a drafter proposes for one request.

    token_ids  the draft tokens x_1..x_k' (k' <= the k asked for; may be empty)
    probs      q_1..q_k' [k', V] float32: the draft's distributions after the request's own
               sampling transform (engine.speculative.spec_decode.probs_from_logits); None when the drafter
               has no distribution (n-gram: q is one-hot at each draft, as vLLM) or the request
               is greedy (verification then only compares with the target's argmax)
    """

    token_ids: tuple[int, ...]
    probs: torch.Tensor | None = None


class Drafter(Protocol):
    method: str

    def propose(self, requests: Sequence[tuple[Request, int]]) -> dict[str, Draft]: ...

    def rewind(self, request: Request, num_verified: int) -> None: ...

    def release(self, request_id: str) -> None: ...

    def checkpoint(self) -> object: ...

    def restore(self, state: object) -> None: ...

    def check_integrity(self, live: Iterable[Request]) -> None: ...

    @property
    def num_used_blocks(self) -> int: ...


class NgramDrafter:
    """Prompt lookup (vLLM's ``ngram`` method): the tokens that followed the earliest occurrence
    of the context's longest matching suffix (engine.speculative.spec_decode.ngram_propose over prompt + output).
    Stateless, so rewind/release/checkpoint have nothing to do."""

    method = "ngram"

    def __init__(self, prompt_lookup_min: int, prompt_lookup_max: int) -> None:
        self.prompt_lookup_min = prompt_lookup_min
        self.prompt_lookup_max = prompt_lookup_max

    def propose(self, requests: Sequence[tuple[Request, int]]) -> dict[str, Draft]:
        out = {}
        for request, k in requests:
            tokens = ngram_propose(request.all_token_ids, k, self.prompt_lookup_min, self.prompt_lookup_max)
            if tokens:
                out[request.request_id] = Draft(tuple(tokens))
        return out

    def rewind(self, request: Request, num_verified: int) -> None:
        return None

    def release(self, request_id: str) -> None:
        return None

    def checkpoint(self) -> object:
        return None

    def restore(self, state: object) -> None:
        return None

    def check_integrity(self, live: Iterable[Request]) -> None:
        return None

    @property
    def num_used_blocks(self) -> int:
        return 0
