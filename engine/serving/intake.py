"""Request intake: from ``add_request`` to the scheduler.

Validation (all of it before anything changes: a bad request raises ValueError naming the
field and leaves the engine as it was), tokenization, request ids, the pending queue (requests
whose arrival step is still ahead) and the registry of every request by id, with the ids
reserved for the sequences a parallel-sampling request forks at its first sample.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import torch

from engine.core.config import MAX_SEED, EngineConfig, SamplingParams
from engine.core.request import Request, RequestStatus
from engine.core.scheduler import Scheduler
from engine.serving.limits import MAX_ARRIVAL_HORIZON


def format_prompt(tokenizer: Any, prompt: str, chat_template: bool) -> str:
    """Wrap a user message in the model's chat template when asked and the tokenizer has one."""
    if chat_template and getattr(tokenizer, "chat_template", None):
        text: str = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                  add_generation_prompt=True)
        return text
    return prompt


def detokenizer(tokenizer: Any) -> Callable[[Iterable[int]], str]:
    """Token ids -> text, special tokens left out (how outputs and stop strings read). A closure
    over the tokenizer, not a bound method of the engine: the scheduler keeps it, and a reference
    back to the engine would put the engine in a cycle that only the garbage collector frees
    (its worker processes would outlive the last reference)."""
    def decode(token_ids: Iterable[int]) -> str:
        return str(tokenizer.decode(list(token_ids), skip_special_tokens=True))
    return decode


class PreparedRequest(NamedTuple):
    """A request that passed every check that needs no engine state."""

    token_ids: list[int]
    prompt: str | None  # the text, when given as text
    params: SamplingParams


class RequestIntake:
    """Requests by id, the pending queue, and the checks a request passes before it is queued."""

    def __init__(self, config: EngineConfig, tokenizer: Any, vocab_size: int, model_max_len: int,
                 max_model_len: int) -> None:
        self.config, self.tokenizer, self.vocab_size = config, tokenizer, vocab_size
        self.model_max_len, self.max_model_len = model_max_len, max_model_len
        self.requests: dict[str, Request] = {}
        self.reserved_ids: set[str] = set()  # ids of parallel-sampling sequences not forked yet
        self.pending: list[Request] = []  # added, arrival step not reached
        self.forked: list[Request] = []  # sequences forked in the current step (undone by restore)
        self._ids = itertools.count()

    def prepare(self, prompt: str | Sequence[int], sampling_params: SamplingParams | None,
                arrival_step: int | None, step_count: int) -> PreparedRequest:
        """Every check that needs no engine state (the request id is checked at ``enqueue``)."""
        params = _check_params(sampling_params)
        if params.n > self.config.scheduler_config.max_num_seqs:
            raise ValueError(f"n: {params.n} parallel sequences exceed max_num_seqs={self.config.scheduler_config.max_num_seqs}")
        if params.n > 1 and self.config.speculative_config is not None:
            raise ValueError(f"n: parallel sampling (n={params.n}) cannot be combined with speculative decoding "
                             f"(speculative_config is set); use n=1")
        token_ids, text = self._tokenize(prompt)
        self._validate(token_ids, arrival_step, step_count)
        return PreparedRequest(token_ids, text, params)

    def enqueue(self, prepared: PreparedRequest, request_id: str | None, arrival_step: int | None,
                step_count: int, priority: int = 0, arrival_time: float | None = None) -> str:
        """Queue a prepared request (the request id is checked here; the caller holds the engine's lock).
        ``arrival_time``: when it arrived on the engine's clock (a simulated run's arrivals fall
        between steps); None: when a step hands it to the scheduler."""
        if arrival_time is not None and (isinstance(arrival_time, bool) or not isinstance(arrival_time, (int, float))
                                         or not math.isfinite(arrival_time)):
            raise ValueError(f"arrival_time: must be a finite number of seconds, got {str(arrival_time)[:40]!r}")
        token_ids, text, params = prepared
        rid = self._new_request_id(request_id)
        children = [f"{rid}#{i}" for i in range(1, params.n)]
        taken = [c for c in children if c in self.requests or c in self.reserved_ids]
        if taken:
            raise ValueError(f"request_id: {rid!r} with n={params.n} needs the id {taken[0]!r} for a "
                             f"sequence, and it is already in use")
        arrival = step_count if arrival_step is None else arrival_step
        seed = params.seed if params.seed is not None else \
            (self.config.seed * 1_000_003 + len(self.requests)) % (MAX_SEED + 1)
        request = Request(rid, text, token_ids, params, arrival_step=arrival, seed=seed, priority=priority,
                          generator=None if params.greedy else torch.Generator().manual_seed(seed),
                          arrival_time=None if arrival_time is None else float(arrival_time))
        self.requests[rid] = request
        self.reserved_ids.update(children)
        self.pending.append(request)
        self.pending.sort(key=lambda r: r.arrival_step)  # stable: FCFS within a step
        return rid

    def admit_arrivals(self, step_count: int, scheduler: Scheduler, now: float) -> tuple[str, ...]:
        """Hand the requests whose arrival step has come to the scheduler -> their ids."""
        arrived = []
        while self.pending and self.pending[0].arrival_step <= step_count:
            request = self.pending.pop(0)
            if request.arrival_time is None:  # (a simulated arrival comes with its own time)
                request.arrival_time = now
            scheduler.add(request)
            arrived.append(request.request_id)
        return tuple(arrived)

    def register_forks(self, children: Sequence[Request]) -> None:
        """Sequences a parallel-sampling request forked this step: now requests of their own."""
        for child in children:
            self.requests[child.request_id] = child
            self.reserved_ids.discard(child.request_id)
        self.forked.extend(children)

    def withdraw(self, request: Request) -> bool:
        """Take a request out of the pending queue (an abort before arrival) -> whether it was there."""
        if request not in self.pending:
            return False
        self.pending.remove(request)
        request.status = RequestStatus.WAITING  # so Scheduler.finish finds it in no queue
        return True

    def lookup(self, request_id: str) -> Request:
        if not isinstance(request_id, str):
            raise ValueError(f"request_id: must be a string, got {type(request_id).__name__}")
        request = self.requests.get(request_id)
        if request is None:
            raise ValueError(f"request_id: unknown request {request_id[:200]!r}")
        return request

    def sequences(self, request: Request) -> list[Request]:
        """A request and its parallel-sampling sequences (only those forked so far)."""
        if request.parent_id is not None or request.sampling_params.n == 1:
            return [request]
        rid = request.request_id
        return [request, *(self.requests[c] for i in range(1, request.sampling_params.n)
                           if (c := f"{rid}#{i}") in self.requests)]

    def is_finished(self, request: Request) -> bool:
        """Every sequence of the request finished (a parallel-sampling request forks first)."""
        return not request.needs_fork and all(s.is_finished for s in self.sequences(request))

    def checkpoint(self) -> object:
        self.forked = []
        return tuple(self.pending)

    def restore(self, state: object) -> None:
        """The pending queue as it was; the sequences forked since are gone (their ids reserved again)."""
        assert isinstance(state, tuple)
        for child in self.forked:
            del self.requests[child.request_id]
            self.reserved_ids.add(child.request_id)
        self.forked = []
        self.pending = list(state)

    def check_integrity(self, block_tables: Iterable[str], queued: Iterable[Request]) -> None:
        """Pending requests hold no blocks and are PENDING; each request is finished or in exactly
        one queue (pending, or the scheduler's ``queued``: waiting and running)."""
        tables = set(block_tables)
        for r in self.pending:
            if r.request_id in tables:
                raise AssertionError(f"pending request {r.request_id} holds blocks")
            if r.status is not RequestStatus.PENDING:
                raise AssertionError(f"pending request {r.request_id} has status {r.status.value}")
        count: dict[int, int] = {}
        for r in (*self.pending, *queued):
            count[id(r)] = count.get(id(r), 0) + 1
        for r in self.requests.values():
            n = count.get(id(r), 0)
            if r.is_finished and n:
                raise AssertionError(f"finished request {r.request_id} is still queued")
            if not r.is_finished and n != 1:
                raise AssertionError(f"unfinished request {r.request_id} ({r.status.value}) is in no queue"
                                     if n == 0 else f"request {r.request_id} is queued {n} times")

    def _tokenize(self, prompt: str | Sequence[int]) -> tuple[list[int], str | None]:
        if isinstance(prompt, str):
            return self._encode_text(prompt), prompt
        if isinstance(prompt, (bytes, bytearray)) or not isinstance(prompt, Sequence):
            raise ValueError(f"prompt: must be a string or a list of token ids, got {type(prompt).__name__}")
        ids: list[Any] = list(prompt)  # each element is checked below
        if not ids:
            raise ValueError("prompt: must not be empty")
        if len(ids) + 1 > self.model_max_len:
            raise ValueError(f"prompt: {len(ids):,} tokens is longer than the model's context "
                             f"(max_model_len={self.model_max_len}, one position kept for output)")
        vocab = self.vocab_size
        if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab for t in ids):
            raise ValueError(f"prompt: token ids must be integers in [0, {vocab})")
        return ids, None

    def _encode_text(self, prompt: str) -> list[int]:
        """Text -> token ids; text the tokenizer cannot take (lone surrogates) is a ValueError."""
        if not prompt:
            raise ValueError("prompt: must not be empty")
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"prompt: not valid Unicode text ({prompt[e.start]!r}, a lone surrogate, at "
                             f"character {e.start})") from None
        try:
            ids = list(self.tokenizer(prompt, add_special_tokens=False).input_ids)
        except Exception as e:  # noqa: BLE001 - any tokenizer failure is about this prompt
            raise ValueError(f"prompt: the tokenizer could not encode it ({type(e).__name__}: {e})") from None
        if not ids:
            raise ValueError("prompt: encodes to no tokens")
        return ids

    def _validate(self, token_ids: list[int], arrival_step: int | None, step_count: int) -> None:
        n = len(token_ids)
        if n + 1 > self.model_max_len:
            raise ValueError(f"prompt: {n} tokens is longer than the model's context "
                             f"(max_model_len={self.model_max_len}, one position kept for output)")
        if n + 1 > self.max_model_len:
            c = self.config
            raise ValueError(f"num_blocks: the KV pool ({c.cache_config.num_blocks} blocks x {c.cache_config.block_size} tokens "
                             f"= {c.cache_config.pool_tokens} tokens) cannot hold this {n}-token prompt plus one output token")
        if not self.config.scheduler_config.enable_chunked_prefill and n > self.config.scheduler_config.max_num_batched_tokens:
            raise ValueError(f"prompt: {n} tokens exceed max_num_batched_tokens="
                             f"{self.config.scheduler_config.max_num_batched_tokens} and chunked prefill is off")
        if arrival_step is not None:
            horizon = step_count + MAX_ARRIVAL_HORIZON
            if isinstance(arrival_step, bool) or not isinstance(arrival_step, int) or arrival_step < 0:
                raise ValueError(f"arrival_step: must be an integer >= 0, got {str(arrival_step)[:80]}")
            if arrival_step > horizon:
                raise ValueError(f"arrival_step: must be at most {horizon:,} (the current step {step_count:,} "
                                 f"+ MAX_ARRIVAL_HORIZON {MAX_ARRIVAL_HORIZON:,}), got {arrival_step:,}")

    def _new_request_id(self, request_id: str | None) -> str:
        if request_id is None:
            request_id = str(next(self._ids))
            while request_id in self.requests:
                request_id = str(next(self._ids))
        elif not isinstance(request_id, str) or not request_id:
            raise ValueError("request_id: must be a non-empty string")
        elif request_id in self.requests or request_id in self.reserved_ids:
            raise ValueError(f"request_id: {request_id!r} is already in use")
        return request_id


def _check_params(params: SamplingParams | None) -> SamplingParams:
    if params is None:
        return SamplingParams()
    if not isinstance(params, SamplingParams):
        raise ValueError(f"sampling_params: must be a SamplingParams, got {type(params).__name__}")
    return params
