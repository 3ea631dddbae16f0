"""Token-budget scheduler: continuous batching with chunked prefill and recompute preemption.

One step gets ``max_num_batched_tokens`` tokens. Running requests are served first (decodes
and unfinished prefill chunks), then waiting requests are admitted FCFS while budget, blocks
and ``max_num_seqs`` allow. A prompt that does not fit the remaining budget is chunked, so
prefill and decode share a step:

    budget 8 | r0 decode | r1 decode | r2 prefill chunk (6 of 20 tokens) |

When a running request needs a block and none is free, the newest running request is
preempted: its blocks are freed and it goes back to the front of the queue, to be recomputed
(prompt + outputs so far) when it is admitted again.

The ``static`` policy is the baseline that continuous batching improves on: a batch is formed
only when nothing is running and no request joins until the whole batch has finished.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from engine.config import EngineConfig
from engine.kv_cache import KVCacheManager, cdiv
from engine.request import Request, RequestStatus
from engine.trace import ChunkKind


@dataclass(frozen=True)
class ScheduledRequest:
    request_id: str
    num_new_tokens: int
    start: int  # first position computed this step (num_computed_tokens before the step)
    is_prefill: bool  # True when the chunk ends before the last known token (no sample)
    resumed: bool = False  # admitted again after a preemption
    after_prompt: bool = False  # the chunk starts past the prompt (a generated token)

    @property
    def kind(self) -> ChunkKind:
        """"decode" when this computes one generated token and samples the next, else "prefill"."""
        return "prefill" if self.is_prefill or self.num_new_tokens > 1 or not self.after_prompt else "decode"


@dataclass(frozen=True)
class SchedulerOutput:
    scheduled: tuple[ScheduledRequest, ...]
    preempted: tuple[str, ...]
    num_batched_tokens: int

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(self, config: EngineConfig, kv: KVCacheManager, max_model_len: int) -> None:
        self.config = config
        self.kv = kv
        self.max_model_len = max_model_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    # -- queue management ---------------------------------------------------------------
    def add(self, request: Request) -> None:
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def remove(self, request: Request) -> None:
        """Take a request out of whichever queue holds it and free its blocks."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.kv.free(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def queues(self) -> tuple[tuple[Request, ...], tuple[Request, ...]]:
        """(waiting, running) as they are now, for a step's rollback."""
        return tuple(self.waiting), tuple(self.running)

    def restore_queues(self, queues: tuple[tuple[Request, ...], tuple[Request, ...]]) -> None:
        self.waiting = deque(queues[0])
        self.running = list(queues[1])

    # -- the algorithm ------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """Decide this step's tokens per request.

        Invariants: the sum of scheduled tokens <= max_num_batched_tokens; every scheduled
        request's block table covers num_computed_tokens + its new tokens; a request
        preempted this step is not scheduled; nothing is admitted in a step that preempted.
        ``num_computed_tokens`` advances optimistically here.
        """
        budget = self.config.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        preempted: list[str] = []

        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            n = self._chunk_size(request.num_tokens_with_spec - request.num_computed_tokens, budget)
            if n <= 0:
                i += 1
                continue
            while not self.kv.allocate_slots(request, n):
                victim = self.running.pop()  # newest first
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is request:
                    n = 0
                    break
            if n == 0:
                break
            scheduled.append(self._commit(request, n))
            budget -= n
            i += 1

        if not preempted and self._may_admit():
            budget = self._admit(budget, scheduled)

        total = self.config.max_num_batched_tokens - budget
        return SchedulerOutput(tuple(scheduled), tuple(preempted), total)

    def _may_admit(self) -> bool:
        return self.config.policy == "continuous" or not self.running

    def _admit(self, budget: int, scheduled: list[ScheduledRequest]) -> int:
        """Admit waiting requests FCFS; stop at the first that does not fit (no overtaking)."""
        static = self.config.policy == "static"
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            hits, num_hit = self.kv.get_computed_blocks(request)
            n = self._chunk_size(request.num_tokens - num_hit, budget)
            if n == 0 and not static:
                break
            if not self.kv.allocate_slots(request, n, computed_blocks=hits):
                break
            self.waiting.popleft()
            resumed = request.status is RequestStatus.PREEMPTED
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = num_hit
            self.running.append(request)
            if n > 0:
                scheduled.append(self._commit(request, n, resumed))
                budget -= n
        return budget

    def _chunk_size(self, remaining: int, budget: int) -> int:
        """Tokens to schedule for a request with ``remaining`` uncomputed tokens.

        With chunked prefill on: as many as the budget allows. Off: all of them or none
        (a recompute longer than the whole budget is still chunked, or it could never run).
        """
        n = min(remaining, budget)
        if (not self.config.enable_chunked_prefill and n < remaining
                and remaining <= self.config.max_num_batched_tokens):
            return 0
        return n

    def _commit(self, request: Request, n: int, resumed: bool = False) -> ScheduledRequest:
        start = request.num_computed_tokens
        request.num_computed_tokens += n
        return ScheduledRequest(
            request_id=request.request_id,
            num_new_tokens=n,
            start=start,
            is_prefill=start + n < request.num_tokens,
            resumed=resumed,
            after_prompt=start >= request.num_prompt_tokens,
        )

    def _preempt(self, request: Request) -> None:
        self.kv.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.waiting.appendleft(request)

    def check_integrity(self) -> None:
        """Queues consistent with statuses, and no request stuck: every running request has a
        token to compute (a running request with none can never be scheduled again), and every
        waiting request fits the pool on its own (or it could never be admitted)."""
        ids = [r.request_id for r in self.running] + [r.request_id for r in self.waiting]
        if len(ids) != len(set(ids)):
            raise AssertionError("scheduler: a request is queued twice")
        if len(self.running) > self.config.max_num_seqs:
            raise AssertionError("scheduler: more running requests than max_num_seqs")
        for r in self.running:
            if r.status is not RequestStatus.RUNNING:
                raise AssertionError(f"scheduler: {r.request_id} in running with status {r.status}")
            if r.num_computed_tokens > r.num_tokens_with_spec:
                raise AssertionError(f"scheduler: {r.request_id} computed beyond its tokens")
            if r.num_computed_tokens == r.num_tokens_with_spec:
                raise AssertionError(f"scheduler: running {r.request_id} has nothing to schedule "
                                     f"({r.num_computed_tokens} of {r.num_tokens_with_spec} tokens computed, "
                                     f"nothing sampled): it would never finish")
        for r in self.waiting:
            if r.status not in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
                raise AssertionError(f"scheduler: {r.request_id} in waiting with status {r.status}")
            if r.num_computed_tokens != 0:
                raise AssertionError(f"scheduler: waiting {r.request_id} has computed tokens")
            if cdiv(r.num_tokens, self.kv.block_size) > self.kv.num_blocks:
                raise AssertionError(f"scheduler: waiting {r.request_id} needs more blocks than the pool has")
