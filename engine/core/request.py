"""A request's live state: its tokens and how many of them have KV in the cache.

Token-centric bookkeeping (vLLM v1): a request needs ``num_tokens`` (+ speculative tokens)
positions computed; ``num_computed_tokens`` says how many are. The scheduler closes the gap
a chunk at a time; decode is simply a gap of one.

    prompt_token_ids      output_token_ids
    [p0 p1 p2 p3 p4 p5 p6][o0 o1]
    |<-- num_computed_tokens -->|   gap = num_tokens - num_computed_tokens = 2
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from engine.core.config import SamplingParams
from engine.core.trace import RequestStatus as RequestStatus  # re-exported: the vocabulary lives with the records


@dataclass(slots=True, eq=False)
class Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_step: int = 0
    priority: int = 0  # add_request(priority=): lower is served earlier (the "priority" scheduling policy)
    arrival_seq: int = 0  # the order the scheduler received it in (Scheduler.add): ties "by arrival"
    output_token_ids: list[int] = field(default_factory=list)
    spec_token_ids: list[int] = field(default_factory=list)  # seam for speculative decoding
    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.PENDING
    finish_reason: str | None = None
    stop_reason: str | None = None
    num_preemptions: int = 0
    generator: torch.Generator | None = None
    seed: int = 0  # the seed of ``generator`` (parallel-sampling sequence i uses seed + i)
    parent_id: str | None = None  # parallel sampling: the request this sequence belongs to
    forked: bool = False  # parallel sampling: its n - 1 sibling sequences exist
    num_cached_tokens: int | None = None  # prompt tokens served from the prefix cache (first admission)
    output_text: str = ""
    error: str | None = None  # why the request finished with finish_reason "error"
    # Speculative decoding: drafts verified, drafts accepted, target steps that verified drafts.
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_verify_steps: int = 0
    # Timing, in engine steps and in wall-clock seconds (perf_counter).
    arrival_time: float | None = None
    first_scheduled_step: int | None = None
    first_token_step: int | None = None
    first_token_time: float | None = None
    finished_step: int | None = None
    finished_time: float | None = None

    def checkpoint(self) -> "RequestCheckpoint":
        """Every field a step may change (output tokens are only appended, so their count is
        enough). The generator's state is saved by the engine, only for the requests it samples."""
        return RequestCheckpoint(
            status=self.status, num_computed_tokens=self.num_computed_tokens,
            num_output_tokens=len(self.output_token_ids), spec_token_ids=list(self.spec_token_ids),
            num_preemptions=self.num_preemptions, forked=self.forked,
            num_cached_tokens=self.num_cached_tokens, finish_reason=self.finish_reason,
            stop_reason=self.stop_reason, output_text=self.output_text, error=self.error,
            num_draft_tokens=self.num_draft_tokens, num_accepted_tokens=self.num_accepted_tokens,
            num_verify_steps=self.num_verify_steps,
            arrival_seq=self.arrival_seq, arrival_time=self.arrival_time, first_scheduled_step=self.first_scheduled_step,
            first_token_step=self.first_token_step, first_token_time=self.first_token_time,
            finished_step=self.finished_step, finished_time=self.finished_time)

    def restore(self, cp: "RequestCheckpoint") -> None:
        """Back to ``cp`` exactly (the inverse of ``checkpoint``)."""
        del self.output_token_ids[cp.num_output_tokens:]
        self.spec_token_ids = list(cp.spec_token_ids)
        for name in ("status", "num_computed_tokens", "num_preemptions", "forked", "num_cached_tokens",
                     "finish_reason", "stop_reason", "num_draft_tokens", "num_accepted_tokens", "num_verify_steps",
                     "output_text", "error", "arrival_seq", "arrival_time", "first_scheduled_step", "first_token_step",
                     "first_token_time", "finished_step", "finished_time"):
            setattr(self, name, getattr(cp, name))

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
    def needs_fork(self) -> bool:
        """Parallel sampling: its first sample creates the n - 1 sibling sequences."""
        return (self.sampling_params.n > 1 and self.parent_id is None and not self.forked
                and self.status is not RequestStatus.FINISHED)

    @property
    def num_seats(self) -> int:
        """Places in the running batch (max_num_seqs) this request takes or will take."""
        return self.sampling_params.n if self.needs_fork else 1

    @property
    def is_prefill(self) -> bool:
        """True while the request's next chunk has no token to sample from (prompt or recompute)."""
        return self.num_computed_tokens < self.num_tokens - 1


class RequestCheckpoint(NamedTuple):
    """A request's mutable fields at the start of a step (see ``Request.checkpoint``); a
    NamedTuple, not a frozen dataclass: every live request makes one every step, and building
    a frozen dataclass of 21 fields costs several times a tuple."""

    status: RequestStatus
    num_computed_tokens: int
    num_output_tokens: int
    spec_token_ids: list[int]
    num_preemptions: int
    forked: bool
    num_cached_tokens: int | None
    finish_reason: str | None
    stop_reason: str | None
    output_text: str
    error: str | None
    num_draft_tokens: int
    num_accepted_tokens: int
    num_verify_steps: int
    arrival_seq: int
    arrival_time: float | None
    first_scheduled_step: int | None
    first_token_step: int | None
    first_token_time: float | None
    finished_step: int | None
    finished_time: float | None
