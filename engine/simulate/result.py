"""What a serving run leaves behind: one record per request and one sample per step (immutable)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RequestRecord:
    request_id: str
    arrival_s: float
    first_token_s: float | None  # None: no token yet (a partial run)
    finish_s: float | None
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int  # prompt tokens served by the prefix cache at first admission
    preemptions: int
    priority: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_s is not None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first (vLLM's TPOT); None with fewer than 2 tokens."""
        if self.finish_s is None or self.first_token_s is None or self.output_tokens < 2:
            return None
        return (self.finish_s - self.first_token_s) / (self.output_tokens - 1)

    @property
    def e2e_s(self) -> float | None:
        return None if self.finish_s is None else self.finish_s - self.arrival_s

    def as_dict(self) -> dict[str, float | int | None]:
        return {"arrival_s": self.arrival_s, "first_token_s": self.first_token_s, "finish_s": self.finish_s,
                "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens}


@dataclass(frozen=True)
class StepSample:
    """One engine step on the run's clock."""

    start_s: float
    duration_s: float
    num_tokens: int  # scheduled tokens (prefill chunks + decodes)
    num_prefill_tokens: int
    num_decodes: int
    running: int  # after the step
    waiting: int  # after the step (arrived, not running)
    kv_blocks_used: int  # after the step (blocks held by requests; cached-evictable ones not counted)
    preempted: int
    prefix_hit_tokens: int  # prompt tokens found in the prefix cache at this step's admissions
    prefix_lookup_tokens: int  # prompt tokens of this step's admissions


@dataclass(frozen=True)
class RunResult:
    """A whole run: simulated (times predicted) or real (times measured on this machine)."""

    label: str  # what ran: the deployment's words, or "real engine: ..."
    simulated: bool
    requests: tuple[RequestRecord, ...]
    steps: tuple[StepSample, ...]
    kv_pool_tokens: int
    kv_pool_blocks: int
    partial: bool  # stopped at its time budget before every request finished
    wall_s: float  # how long the run took here

    @property
    def makespan_s(self) -> float:
        """First arrival to last finish (to the last step's end when partial)."""
        ends = [r.finish_s for r in self.requests if r.finish_s is not None]
        end = max(ends, default=0.0)
        if self.steps:
            end = max(end, self.steps[-1].start_s + self.steps[-1].duration_s) if self.partial else end
        start = min((r.arrival_s for r in self.requests), default=0.0)
        return max(0.0, end - start)
