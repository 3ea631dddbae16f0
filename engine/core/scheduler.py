"""Token-budget scheduler: continuous batching with chunked prefill and recompute preemption.

One step gets ``max_num_batched_tokens`` tokens. Running requests are served first (decodes
and unfinished prefill chunks), then waiting requests are admitted while budget, blocks and
``max_num_seqs`` allow. A prompt that does not fit the remaining budget is chunked, so prefill
and decode share a step (``prefill_schedule="mixed"``, stall-free batching as in Sarathi-Serve):

    budget 8 | r0 decode | r1 decode | r2 prefill chunk (6 of 20 tokens) |

``prefill_schedule="prefill_first"`` (vLLM V0): a step that has new prompt work (an admission, or
a running request's unfinished prompt) runs only that, and running decodes stall for it; the
decodes run in the steps without any. A preempted request's recompute is scheduled the mixed way
(after the running requests), so a preemption can never undo prompt work that stalled the oldest
request, step after step.

When a running request needs a block and none is free (after evicting unused prefix-cache
blocks), a running request is preempted: its blocks are freed and it goes back to the waiting
queue, to be recomputed (prompt + outputs so far) when it is admitted again; its cached prefix
usually spares most of that.

Who is admitted first and who is the victim is the scheduling policy's to say
(``scheduling_policy``, engine/core/policies/): FCFS by default (admission in arrival order,
the newest running request preempted), or priority, SJF, LPM, MLFQ. The scheduler keeps the
mechanics (budget, chunks, blocks, the batch queue's exclusions) and asks the policy for orders.

After the forward, ``postprocess`` owns the rest of the request lifecycle: newly full blocks
go to the prefix cache, sampled tokens are appended, the stop rules are checked, finished
requests release their blocks. Parallel sampling (``n > 1``) forks the sibling sequences at
the request's first sample (``fork``).

The ``static`` policy is the baseline that continuous batching improves on: a batch is formed
only when nothing is running and no request joins until the whole batch has finished.
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from engine.core.config import MAX_SEED, EngineConfig
from engine.core.kv_cache import NO_BLOCKS, KVCacheBlocks, KVCacheManager, cdiv
from engine.core.policies import make_policy
from engine.core.request import Request, RequestStatus
from engine.core.stop import check_stop
from engine.core.trace import BlockCopy, ChunkKind, PrefixLookup


# Defer an admission whose next tokens a running request is computing (SGLang uses 32).
IN_BATCH_PREFIX_TOKENS = 32


@dataclass(frozen=True)
class ScheduledRequest:
    request_id: str
    num_new_tokens: int
    start: int  # first position computed this step (num_computed_tokens before the step)
    is_prefill: bool  # True when the chunk ends before the last known token (no sample)
    resumed: bool = False  # admitted again after a preemption
    after_prompt: bool = False  # the chunk starts past the prompt (a generated token)
    num_spec_tokens: int = 0  # speculative drafts verified in this chunk (it has 1 + this many tokens)

    @property
    def kind(self) -> ChunkKind:
        """"decode" when this computes one generated token (plus the drafts it verifies) and
        samples the next, else "prefill"."""
        return "prefill" if self.is_prefill or self.num_new_tokens > 1 + self.num_spec_tokens \
            or not self.after_prompt else "decode"


@dataclass(frozen=True)
class SchedulerOutput:
    scheduled: tuple[ScheduledRequest, ...]
    preempted: tuple[str, ...]
    num_batched_tokens: int
    lookups: tuple[PrefixLookup, ...] = ()  # one per admission (prefix-cache hits)
    copies: tuple[BlockCopy, ...] = ()  # copy-on-write: the runner copies before the forward

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class PostprocessResult(NamedTuple):
    """What ``Scheduler.postprocess`` did with a step's samples."""

    finished: tuple[str, ...]  # requests that finished this step, in order
    appended: tuple[tuple[Request, int], ...]  # the sampled tokens the stop rules kept, in order


class Scheduler:
    def __init__(self, config: EngineConfig, kv: KVCacheManager, max_model_len: int,
                 eos_token_ids: frozenset[int] = frozenset(),
                 decode: Callable[[Iterable[int]], str] = lambda ids: "",
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.config = config
        self.clock = clock  # first-token and finish times (a simulated run's clock is virtual)
        self.kv = kv
        self.max_model_len = max_model_len
        self.eos_token_ids = eos_token_ids
        self.decode = decode
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.policy = make_policy(config.scheduler_config.scheduling_policy)
        self._arrivals = 0  # requests received so far: the next one's arrival_seq
        # Per-step scratch, reset by schedule(): prefix lookups and copy-on-write copies.
        self._lookups: list[PrefixLookup] = []
        self._copies: list[BlockCopy] = []

    # -- queue management ---------------------------------------------------------------
    def add(self, request: Request) -> None:
        request.status = RequestStatus.WAITING
        request.arrival_seq = self._arrivals
        self._arrivals += 1
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

    def checkpoint(self) -> object:
        """(waiting, running, arrivals, the policy's state) as they are now, for a step's rollback
        (engine/core/checkpoint.py)."""
        return tuple(self.waiting), tuple(self.running), self._arrivals, self.policy.checkpoint()

    def restore(self, state: object) -> None:
        assert isinstance(state, tuple)
        waiting, running, self._arrivals, policy_state = state
        self.waiting = deque(waiting)
        self.running = list(running)
        self.policy.restore(policy_state)

    # -- the algorithm ------------------------------------------------------------------
    def schedule(self, exclude: frozenset[str] = frozenset(), max_requests: int | None = None,
                 may_admit: bool = True) -> SchedulerOutput:
        """Decide this step's tokens per request.

        Pipeline batch queue (engine/parallel/batch_queue.py): ``exclude`` holds the running
        requests of batches still in flight, which are neither scheduled nor preempted (a
        request is never in two in-flight batches); ``max_requests`` caps the batch's requests;
        ``may_admit=False`` admits no waiting request (an earlier batch of the step preempted).

        Invariants: the sum of scheduled tokens <= max_num_batched_tokens; every scheduled
        request's block table covers num_computed_tokens + its new tokens; a request
        preempted this step is not scheduled; nothing is admitted in a step that preempted.
        ``num_computed_tokens`` advances optimistically here.

        Preemption follows the policy's running order (``policy.running_order``; FCFS: admission
        order, oldest first, as vLLM): a request that needs blocks preempts the last request
        ranked after it, or itself when none is (``policy.victim``); never one ranked before it.
        So the first running request is never preempted while another runs and always
        progresses. When every request ranked after it is in flight, it waits for their batch to
        retire (no preemption, no admission, this batch ends) instead of preempting itself:
        giving up the older request's progress to a newer one that is immune while in flight is
        how the batch queue used to livelock (two requests taking turns preempting each other,
        neither ever finishing). Running requests are served in that same order, so a victim is
        never one already scheduled this step. A policy that preempts for admission (priority)
        does so before anything is scheduled (``_make_room``), and that step admits nothing.

        Speculative decoding: a running request with drafts (``spec_token_ids``) is scheduled
        for 1 + k query tokens (its last token and the k drafts), all or none: when the budget
        cannot hold them all its drafts are trimmed to fit (a verification is never split), and
        when its blocks cannot be allocated its drafts are dropped before anyone is preempted.
        A running request not scheduled this step loses its drafts (they are re-proposed).
        """
        config = self.config.scheduler_config
        budget = config.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        preempted: list[str] = []
        self._lookups, self._copies = [], []
        limit = max_requests if max_requests is not None else len(self.running) + len(self.waiting)
        admitting = may_admit and self._may_admit()
        if admitting and config.policy == "continuous" and self.policy.preempts_for_admission:
            preempted += self._make_room(exclude)
        order = self.policy.running_order(self.running)
        if config.prefill_schedule == "prefill_first" and admitting and not preempted:
            # Prompt work only (vLLM V0): new prompts, running or admitted now; the decodes wait for
            # a step without any. A preempted request's recompute goes the mixed way (after the
            # running requests): were it to stall the decodes too, its own preemption could undo
            # it step after step while the oldest request never advanced (a livelock).
            prompt_work = [r for r in order if r.num_preemptions == 0 and r.num_computed_tokens < r.num_prompt_tokens]
            budget, stalled = self._serve(prompt_work, budget, scheduled, preempted, exclude, limit)
            if not preempted and not stalled:
                budget = self._admit(budget, scheduled, limit, only_new=True)
            if scheduled or preempted or stalled:
                return self._output(budget, scheduled, preempted, exclude)
        budget, stalled = self._serve(order, budget, scheduled, preempted, exclude, limit)
        if admitting and not preempted and not stalled:
            budget = self._admit(budget, scheduled, limit)
        return self._output(budget, scheduled, preempted, exclude)

    def _output(self, budget: int, scheduled: list[ScheduledRequest], preempted: list[str],
                exclude: frozenset[str]) -> SchedulerOutput:
        """The step's SchedulerOutput; a running request not scheduled loses its drafts."""
        chosen = {s.request_id for s in scheduled} | exclude
        for request in self.running:
            if request.spec_token_ids and request.request_id not in chosen:
                request.spec_token_ids.clear()

        total = self.config.scheduler_config.max_num_batched_tokens - budget
        return SchedulerOutput(tuple(scheduled), tuple(preempted), total, tuple(self._lookups), tuple(self._copies))

    def _serve(self, order: list[Request], budget: int, scheduled: list[ScheduledRequest], preempted: list[str],
               exclude: frozenset[str], limit: int) -> tuple[int, bool]:
        """Schedule the running requests of ``order`` (the policy's running order, or a part of
        it) within ``budget``, preempting for blocks -> (budget left, stalled: a request has to
        wait for in-flight ones, so this batch ends)."""
        for request in order:
            if budget <= 0 or len(scheduled) >= limit:
                break
            if request.status is not RequestStatus.RUNNING or request.request_id in exclude:
                continue  # preempted by one served before it, or in an in-flight batch
            if request.spec_token_ids and 1 + len(request.spec_token_ids) > budget:
                del request.spec_token_ids[max(budget - 1, 0):]
            n = self._chunk_size(request.num_tokens_with_spec - request.num_computed_tokens, budget)
            if n <= 0:
                continue
            ok = self._allocate(request, n)
            if not ok and request.spec_token_ids:
                request.spec_token_ids.clear()  # drafts never cost a preemption
                n = self._chunk_size(request.num_tokens_with_spec - request.num_computed_tokens, budget)
                ok = self._allocate(request, n)
            while not ok:
                victim = self.policy.victim(request, self.running, exclude)
                if victim is None:  # the requests ranked after it are in flight: wait for them
                    return budget, True
                self.running.remove(victim)
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is request:
                    return budget, False
                ok = self._allocate(request, n)
            scheduled.append(self._commit(request, n))
            budget -= n
        return budget, False

    def _make_room(self, exclude: frozenset[str]) -> list[str]:
        """Preempt running requests (``policy.admission_victim``) while the first waiting request
        in the policy's order could not be admitted for lack of seats or blocks -> their ids."""
        if not self.waiting:
            return []
        candidate = self.policy.admission_order(self.waiting, self.kv)[0]
        preempted: list[str] = []
        while not self._could_admit(candidate):
            victim = self.policy.admission_victim(candidate, self.running, exclude)
            if victim is None:
                break
            self.running.remove(victim)
            self._preempt(victim)
            preempted.append(victim.request_id)
        return preempted

    def _could_admit(self, request: Request) -> bool:
        """Seats and blocks for ``request``'s first chunk with the whole budget, before this step
        schedules anything (the running requests' own needs this step are not counted)."""
        config = self.config.scheduler_config
        if sum(r.num_seats for r in self.running) + request.num_seats > config.max_num_seqs:
            return False
        hit = self.kv.get_computed_blocks(request)
        n = self._chunk_size(request.num_tokens - hit.num_tokens, config.max_num_batched_tokens)
        return self.kv.can_allocate(request, n, hit)

    def _allocate(self, request: Request, n: int, computed: KVCacheBlocks = NO_BLOCKS) -> bool:
        """allocate_slots, keeping its copy-on-write copies for the runner."""
        allocation = self.kv.allocate_slots(request, n, computed)
        if allocation is None:
            return False
        self._copies.extend(BlockCopy(request.request_id, src, dst) for src, dst in allocation.copies)
        return True

    def _may_admit(self) -> bool:
        return self.config.scheduler_config.policy == "continuous" or not self.running

    def _admit(self, budget: int, scheduled: list[ScheduledRequest], limit: int, only_new: bool = False) -> int:
        """Admit waiting requests in the policy's order (FCFS: queue order); stop at the first that
        does not fit (no overtaking within that order), when the batch holds ``limit`` requests,
        or (``only_new``) at the first preempted one."""
        static = self.config.scheduler_config.policy == "static"
        seats = sum(r.num_seats for r in self.running)
        for request in self.policy.admission_order(self.waiting, self.kv):
            if (seats + request.num_seats > self.config.scheduler_config.max_num_seqs or len(scheduled) >= limit
                    or (only_new and request.status is RequestStatus.PREEMPTED)):
                break
            hit = self.kv.get_computed_blocks(request)
            if not static and self._prefix_in_flight(request, hit):
                break  # (a static batch would make it wait for the whole batch instead)
            n = self._chunk_size(request.num_tokens - hit.num_tokens, budget)
            if n == 0 and not static:
                break
            if not self._allocate(request, n, hit):
                break
            self.waiting.remove(request)
            seats += request.num_seats
            resumed = request.status is RequestStatus.PREEMPTED
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = hit.num_tokens
            if request.num_cached_tokens is None:
                request.num_cached_tokens = hit.num_tokens
            if self.kv.prefix_cache.enabled:
                self._lookups.append(PrefixLookup(request.request_id, request.num_tokens, hit.num_tokens,
                                                  tuple(n.node_id for n in hit.node.path()) if hit.node else ()))
            self.running.append(request)
            if n > 0:
                scheduled.append(self._commit(request, n, resumed))
                budget -= n
        return budget

    def _prefix_in_flight(self, request: Request, hit: KVCacheBlocks) -> bool:
        """True when at least ``IN_BATCH_PREFIX_TOKENS`` tokens of ``request`` past its cache hit
        (whole blocks) are being computed right now by a running request and are not cached yet:
        admitting it would compute the same KV a second time, so it waits a step or two and then
        hits the cache (SGLang's in-batch prefix check, with SGLang's 32-token threshold so a
        short common opening does not delay anyone). Only with prefix caching on, and only for
        the continuous policy."""
        if not self.kv.prefix_cache.enabled:
            return False
        bs = self.kv.block_size
        first = hit.num_tokens // bs  # the first block not served from the cache
        full = (request.num_tokens - 1) // bs  # blocks that could be shared (last token recomputed)
        need = cdiv(IN_BATCH_PREFIX_TOKENS, bs)
        if full - first < need:
            return False
        ids = request.all_token_ids
        for r in self.running:
            cached = self.kv.cached_prefix.get(r.request_id)
            start = cached.num_blocks if cached else 0
            if start > first:
                continue  # those blocks are cached already: the next admission pass hits them
            end = min(full, cdiv(r.num_tokens, bs), first + need)
            if end - first >= need and r.all_token_ids[first * bs:end * bs] == ids[first * bs:end * bs]:
                return True
        return False

    def _chunk_size(self, remaining: int, budget: int) -> int:
        """Tokens to schedule for a request with ``remaining`` uncomputed tokens.

        With chunked prefill on: as many as the budget allows. Off: all of them or none
        (a recompute longer than the whole budget is still chunked, or it could never run).
        """
        n = min(remaining, budget)
        if (not self.config.scheduler_config.enable_chunked_prefill and n < remaining
                and remaining <= self.config.scheduler_config.max_num_batched_tokens):
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
            num_spec_tokens=max(0, start + n - request.num_tokens),
        )

    # -- after the forward: the request lifecycle ---------------------------------------------
    def fork(self, request: Request) -> list[Request]:
        """Parallel sampling: create sequences 1 .. n-1 of ``request`` at its first sample. Each
        starts as a copy of the request (tokens, computed KV) with its own generator seeded
        ``seed + i``; they are placed right after it in the running queue and sample their first
        token from the same logits row. They take the request's blocks in ``postprocess``, once
        its full blocks are in the prefix cache, so they share the cached ones too."""
        children = []
        for i in range(1, request.sampling_params.n):
            seed = (request.seed + i) % (MAX_SEED + 1)
            child = Request(f"{request.request_id}#{i}", request.prompt, list(request.prompt_token_ids),
                            request.sampling_params, arrival_step=request.arrival_step,
                            priority=request.priority, arrival_seq=request.arrival_seq,
                            output_token_ids=list(request.output_token_ids),
                            num_computed_tokens=request.num_computed_tokens, status=RequestStatus.RUNNING,
                            generator=None if request.generator is None else torch.Generator().manual_seed(seed),
                            seed=seed, parent_id=request.request_id, num_cached_tokens=request.num_cached_tokens,
                            arrival_time=request.arrival_time, first_scheduled_step=request.first_scheduled_step)
            children.append(child)
        request.forked = True
        at = self.running.index(request) + 1
        self.running[at:at] = children
        return children

    def postprocess(self, output: SchedulerOutput, requests: Mapping[str, Request],
                    sampled: list[tuple[Request, int]], failed: list[tuple[Request, str]],
                    forked: Sequence[Request], step: int,
                    num_accepted: Mapping[str, int] | None = None) -> PostprocessResult:
        """Everything after the forward (nano-vllm's ``Scheduler.postprocess``).

        For every scheduled request: newly full blocks go to the prefix cache (not for a
        request whose sampling failed: its logits, and so maybe its KV, are not to be trusted).
        Sequences ``forked`` this step then share their parent's blocks (ref counts + 1, the
        parent's lock in the tree). For every sampled one: append the token, apply the stop rules (``engine.core.stop``), free a
        finished request's blocks. A failed request finishes with reason "error".
        -> the ids of the requests that finished.

        Speculative decoding: ``num_accepted[request_id]`` = drafts accepted for each request
        that verified drafts; ``sampled`` then holds its emitted tokens in order (accepted
        drafts, then the bonus or recovered token). First the rejected drafts roll back:
        ``num_computed_tokens`` rewinds to start + 1 + accepted (the verified length), blocks
        beyond what those positions need return to the pool (``KVCacheManager.truncate``) and
        ``spec_token_ids`` is cleared, so only verified tokens are ever cached. The emitted
        tokens then pass the stop rules one by one; tokens after the one that finishes the
        request are dropped.
        """
        now = self.clock()
        bad = {id(r) for r, _ in failed}
        accepted = num_accepted or {}
        for s in output.scheduled:
            request = requests[s.request_id]
            if request.first_scheduled_step is None:
                request.first_scheduled_step = step
            if s.num_spec_tokens:
                request.spec_token_ids.clear()
                request.num_computed_tokens = s.start + 1 + accepted.get(s.request_id, 0)
                self.kv.truncate(request, request.num_computed_tokens)
            if id(request) not in bad:
                self.kv.cache_blocks(request)
        for child in forked:
            assert child.parent_id is not None
            self.kv.fork(requests[child.parent_id], child)
        finished = []
        appended = []
        for request, token in sampled:
            if request.is_finished:
                continue  # a speculative token after the one that ended the request
            request.output_token_ids.append(token)
            appended.append((request, token))
            if request.first_token_step is None:
                request.first_token_step, request.first_token_time = step, now
            decision = check_stop(request, token, self.eos_token_ids, self.max_model_len, self.decode)
            if decision is not None:
                request.stop_reason = decision.stop_string
                if decision.output_text is not None:
                    request.output_text = decision.output_text
                self.finish(request, decision.finish_reason, step)
                finished.append(request.request_id)
        for request, reason in failed:
            request.error = reason
            self.finish(request, "error", step)
            finished.append(request.request_id)
        return PostprocessResult(tuple(finished), tuple(appended))

    def finish(self, request: Request, reason: str, step: int) -> None:
        """Take ``request`` out of its queue, free its blocks (cached ones stay in the tree) and
        mark it finished with ``reason``."""
        self.remove(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        request.finished_step, request.finished_time = step, self.clock()
        request.num_computed_tokens = min(request.num_computed_tokens, request.num_tokens)
        if request.stop_reason is None:
            request.output_text = self.decode(request.output_token_ids)

    def _preempt(self, request: Request) -> None:
        self.kv.free(request)
        request.spec_token_ids.clear()
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.waiting.appendleft(request)

    def check_integrity(self, in_flight: frozenset[str] = frozenset()) -> None:
        """Queues consistent with statuses, and no request stuck: every running request has a
        token to compute (a running request with none can never be scheduled again) unless it
        is ``in_flight`` (in a pipeline batch whose token is still on its way), and every
        waiting request fits the pool on its own (or it could never be admitted)."""
        ids = [r.request_id for r in self.running] + [r.request_id for r in self.waiting]
        if len(ids) != len(set(ids)):
            raise AssertionError("scheduler: a request is queued twice")
        if len(self.running) > self.config.scheduler_config.max_num_seqs:
            raise AssertionError("scheduler: more running requests than max_num_seqs")
        for r in self.running:
            if r.status is not RequestStatus.RUNNING:
                raise AssertionError(f"scheduler: {r.request_id} in running with status {r.status}")
            if r.num_computed_tokens > r.num_tokens_with_spec:
                raise AssertionError(f"scheduler: {r.request_id} computed beyond its tokens")
            if r.num_computed_tokens == r.num_tokens_with_spec and r.request_id not in in_flight:
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
