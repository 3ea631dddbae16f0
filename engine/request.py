"""A request's live state: its tokens and how many of them have KV in the cache.

Token-centric bookkeeping (vLLM v1): a request needs ``num_tokens`` (+ speculative tokens)
positions computed; ``num_computed_tokens`` says how many are. The scheduler closes the gap
a chunk at a time; decode is simply a gap of one.

    prompt_token_ids      output_token_ids
    [p0 p1 p2 p3 p4 p5 p6][o0 o1]
    |<-- num_computed_tokens -->|   gap = num_tokens - num_computed_tokens = 2
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from engine.config import SamplingParams


class RequestStatus(enum.Enum):
    PENDING = "pending"  # added, its arrival step has not come yet
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # waiting again, its KV dropped, to be recomputed
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_step: int = 0
    output_token_ids: list[int] = field(default_factory=list)
    spec_token_ids: list[int] = field(default_factory=list)  # seam for speculative decoding
    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.PENDING
    finish_reason: str | None = None
    stop_reason: str | None = None
    num_preemptions: int = 0
    generator: torch.Generator | None = None
    output_text: str = ""
    # Timing, in engine steps and in wall-clock seconds (perf_counter).
    arrival_time: float | None = None
    first_scheduled_step: int | None = None
    first_token_step: int | None = None
    first_token_time: float | None = None
    finished_step: int | None = None
    finished_time: float | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return self.num_tokens + len(self.spec_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids + self.spec_token_ids

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    @property
    def is_prefill(self) -> bool:
        """True while the request's next chunk has no token to sample from (prompt or recompute)."""
        return self.num_computed_tokens < self.num_tokens - 1
