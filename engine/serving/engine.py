"""The engine loop and the offline API, in the shape of vLLM's.

    engine = LLMEngine("smollm2-135m", block_size=4, num_blocks=64)
    engine.add_request("Hello", SamplingParams(temperature=0, max_tokens=8))
    while engine.has_unfinished_requests():
        trace = engine.step()        # StepTrace: what this step did
    engine.snapshot()                # Snapshot: block pool, tables, queues, metrics

One step = arrivals -> schedule -> one flattened forward -> sample -> postprocess (the
scheduler caches full blocks, appends tokens, checks stop rules, frees finished requests'
blocks) -> StepTrace. ``step`` holds the engine's lock,
so concurrent callers (e.g. overlapping Streamlit reruns) never interleave half-steps.

A step is all or nothing (``LLMEngine.step``): it completes, or it is rolled back to exactly
the state before it and the exception propagates; only an error attributable to one request
(its sampling, or non-finite logits in its row) finishes that request with
``finish_reason="error"`` and lets the step complete for the others.

Limits (each a ValueError naming the knob or field): the knobs' hard caps in
``engine.core.config``; the memory a configuration needs (KV cache + block-pool objects + one
step's activations) against a fraction of the memory the OS reports available; arrivals at
most ``MAX_ARRIVAL_HORIZON`` steps ahead; at most ``MAX_GENERATE_PROMPTS`` prompts in one
``LLM.generate`` (see ``engine.serving.limits``).
"""
from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.core.config import MAX_SEED, EngineConfig, SamplingParams, SpeculativeConfig
from engine.core.kv_cache import KVCacheManager, cdiv
from engine.core.prefix_cache import RadixNode
from engine.core.request import Request, RequestCheckpoint, RequestStatus
from engine.core.sampling import SamplingError, sample_rows
from engine.core.scheduler import ScheduledRequest, Scheduler, SchedulerOutput
from engine.model.llama import LlamaModel
from engine.model.runner import ModelRunner, kv_cache_bytes_per_token
from engine.model.shared import SharedModel, get_shared_model
from engine.parallel.executor import InFlightBatch, ParallelRunner
from engine.parallel.layout import stage_layouts
from engine.serving import limits
from engine.serving.limits import MAX_ARRIVAL_HORIZON, MAX_GENERATE_PROMPTS, estimate_memory
from engine.speculative.draft_runner import ModelDrafter
from engine.speculative.drafter import Draft, Drafter, NgramDrafter
from engine.speculative.spec_decode import probs_from_logits, rejection_sample
from engine.core.trace import (BlockState, DraftToken, PrefixCacheEvents, PrefixNode, RequestMetrics, RequestState,
                          ResidualToken, SampledToken, ScheduledChunk, Snapshot, SpecVerification, StepTrace)


TOP_ALTERNATIVES = 3  # the target's top entries kept per draft position (StepTrace.spec)


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


@dataclass
class ProgressWatch:
    """The no-progress backstop: steps since any request last made progress.

    Progress: a token appended, a request finished, or a scheduled chunk reaching past the most
    tokens its request ever had computed (its high-water mark). Without preemption every
    scheduled chunk is progress; a preempted request that is recomputed makes none until it
    passes where it was. Rule: ``stuck`` once ``limit`` steps in a row made no progress while
    preempting -- the schedule keeps undoing its own work (a livelock), which the scheduler's
    preemption order rules out; this only turns a bug into an error instead of a hang.
    """

    limit: int
    high_water: dict[str, int] = field(default_factory=dict)
    idle_steps: int = 0
    preemptions: int = 0  # during the idle steps

    @staticmethod
    def limit_for(config: EngineConfig, max_model_len: int) -> int:
        """Steps a correct schedule may go without progress, with a wide margin: the oldest
        request is never preempted and is scheduled at least every 2p steps (the batch queue
        can make it wait for an in-flight batch), so it passes its high-water mark after
        recomputing at most max_model_len tokens, max_num_batched_tokens per schedule."""
        p = config.pipeline_parallel_size
        return 4 * p * (cdiv(max_model_len, config.max_num_batched_tokens) + 2) + 16

    def observe(self, output: SchedulerOutput, appended: bool, finished: Sequence[str]) -> None:
        """Account one step: its (retired) scheduled chunks, whether it appended tokens, the
        requests that finished."""
        progressed = appended or bool(finished)
        for s in output.scheduled:
            end = s.start + s.num_new_tokens
            if end > self.high_water.get(s.request_id, 0):
                self.high_water[s.request_id] = end
                progressed = True
        for rid in finished:
            self.high_water.pop(rid, None)
        if progressed:
            self.idle_steps = self.preemptions = 0
        else:
            self.idle_steps += 1
            self.preemptions += len(output.preempted)

    @property
    def stuck(self) -> bool:
        return self.idle_steps >= self.limit and self.preemptions > 0

    def copy(self) -> ProgressWatch:
        return ProgressWatch(self.limit, dict(self.high_water), self.idle_steps, self.preemptions)


@dataclass(frozen=True)
class StepCheckpoint:
    """The engine's state before a step: what ``LLMEngine.step`` restores when the step fails."""

    step_count: int
    pending: tuple[Request, ...]
    queues: tuple[tuple[Request, ...], tuple[Request, ...]]
    requests: tuple[tuple[Request, RequestCheckpoint], ...]
    # Parallel-sampling sequences forked during the step (removed again on rollback).
    forked: list[Request] = field(default_factory=list)
    # Generator states, saved (``save_generators``) just before a request draws from its
    # generator -- sampling, a sampled draft, verification -- not for every live request up front.
    generators: list[tuple[torch.Generator, torch.Tensor]] = field(default_factory=list)
    # The drafter's state (draft block tables, draft KV lengths) before the step.
    drafter_state: object = None
    # Pipeline "batch_queue": the batches in flight before the step.
    in_flight: tuple[InFlightBatch, ...] = ()
    progress: ProgressWatch | None = None  # the no-progress backstop before the step

    def save_generators(self, requests: Iterable[Request]) -> None:
        """Remember the generator states of requests about to draw from them (restored in
        reverse, so the earliest state saved for a generator wins)."""
        self.generators.extend((r.generator, r.generator.get_state()) for r in requests if r.generator is not None)


def _detokenizer(tokenizer: Any) -> Callable[[Iterable[int]], str]:
    """Token ids -> text, special tokens left out (how outputs and stop strings read)."""
    def decode(token_ids: Iterable[int]) -> str:
        return str(tokenizer.decode(list(token_ids), skip_special_tokens=True))
    return decode


class LLMEngine:
    def __init__(self, model: str | SharedModel = "smollm2-135m", config: EngineConfig | None = None,
                 progress: Callable[[str], None] | None = None, **knobs: Any) -> None:
        """Validate knobs, then the memory they need, then allocate (KV tensors, block pool).
        With pipeline_parallel_size x tensor_parallel_size > 1 the model runs in worker processes
        (engine/parallel/executor.py), started here (``progress`` hears how far start-up got); stop them
        with ``shutdown()`` (garbage collection and interpreter exit stop them too)."""
        if config is not None and not isinstance(config, EngineConfig):
            raise ValueError(f"config: must be an EngineConfig (or pass knobs as keywords), got "
                             f"{type(config).__name__}")
        if config is not None and knobs:
            raise ValueError("pass either config or keyword knobs, not both")
        unknown = set(knobs) - set(EngineConfig.__dataclass_fields__)
        if unknown:
            raise ValueError(f"{sorted(unknown)[0]}: unknown engine option")
        self.config = config or EngineConfig(**knobs)
        if not isinstance(model, (str, SharedModel)):
            raise ValueError(f"model: must be a model name (a string), got {type(model).__name__}")
        c = self.config
        self.shared = model if isinstance(model, SharedModel) else get_shared_model(
            model, c.dtype, c.quantization, c.quantization_group_size, c.quantization_outlier_threshold,
            c.quantization_smoothing_strength, c.sparsity)
        if self.shared.sparsity != c.sparsity:
            raise ValueError(f"sparsity: the SharedModel passed was loaded with sparsity={self.shared.sparsity!r}, "
                             f"not {c.sparsity!r}; pass the model name, or get_shared_model(..., sparsity=...)")
        quant = self.shared.model.quantization
        if c.quantization is not None and (quant is None or (quant.scheme, quant.group_size, quant.outlier_threshold,
                                                             quant.smoothing_strength)
                                           != (c.quantization, c.quantization_group_size,
                                               c.quantization_outlier_threshold,
                                               c.quantization_smoothing_strength)):
            raise ValueError(f"quantization: the SharedModel passed was loaded with {quant}, not "
                             f"quantization={c.quantization!r}; pass the model name, or get_shared_model(..., "
                             f"quantization=...)")
        mc = self.shared.model.config
        # The split must fit the model at every p, p = 1 included (no worker checks it there).
        stage_layouts(mc.num_hidden_layers, c.pipeline_parallel_size, c.pipeline_layer_split)
        self.tokenizer = self.shared.tokenizer
        # A closure over the tokenizer, not a bound method: the scheduler keeps it, and a
        # reference back to the engine would put the engine in a cycle that only the garbage
        # collector frees (its worker processes would outlive the last reference).
        self._decode = _detokenizer(self.tokenizer)
        model_limit = min(mc.max_position_embeddings, self.config.max_model_len or mc.max_position_embeddings)
        self.model_max_len = model_limit
        self.max_model_len = min(model_limit, self.config.pool_tokens)
        kv_dtype = self.config.cache_dtype  # a name: float, "int8" or "fp8"
        self.memory_need = estimate_memory(self.config, mc, self.max_model_len,
                                           kv_cache_bytes_per_token(mc, kv_dtype) + self._draft_kv_bytes_per_token())
        limits.check_memory(self.config, self.memory_need, limits.available_memory_bytes())
        self.kv = KVCacheManager(self.config.num_blocks, self.config.block_size, self.config.enable_prefix_caching)
        eos = set(mc.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos_token_ids = frozenset(eos)
        self.scheduler = Scheduler(self.config, self.kv, self.max_model_len, self.eos_token_ids, self._decode)
        self.runner: ModelRunner | ParallelRunner
        if self.config.num_workers > 1:
            self.runner = ParallelRunner(model if isinstance(model, str) else self.shared.name, self.shared.model,
                                         self.config, progress)
        else:
            self.runner = ModelRunner(self.shared.model, self.config.num_blocks, self.config.block_size, kv_dtype)
        self.in_flight: deque[InFlightBatch] = deque()  # pipeline "batch_queue" (see _fill_batch_queue)
        self.drafter: Drafter | None = None
        if self.config.speculative_config is not None:
            self.drafter = self._build_drafter(self.config.speculative_config)
        self.requests: dict[str, Request] = {}
        self.reserved_ids: set[str] = set()  # ids of parallel-sampling sequences not forked yet
        self.pending: list[Request] = []  # added, arrival step not reached
        self.step_count = 0
        self.progress = ProgressWatch(ProgressWatch.limit_for(self.config, self.max_model_len))
        self.trace_seconds = 0.0  # time spent building StepTraces (for the benchmark)
        self.lock = threading.RLock()
        self._ids = itertools.count()

    def _draft_target(self, spec: SpeculativeConfig) -> tuple[LlamaModel, int]:
        """The model a model drafter runs and how many of its layers: the target's first
        num_layers (early_exit) or the whole draft model (draft_model, shared process-wide)."""
        if spec.method == "early_exit":
            assert spec.num_layers is not None
            return self.shared.model, spec.num_layers
        assert spec.model is not None
        try:
            model = get_shared_model(spec.model, quantization=spec.quantization).model
        except ValueError as e:  # "model: unknown model ..." is about the draft, not the target
            raise ValueError(f"speculative_config.{e}") from None
        return model, model.config.num_hidden_layers

    def _draft_kv_bytes_per_token(self) -> int:
        """KV bytes per token of a model drafter's own pool (same num_blocks x block_size as the
        target's, in the draft model's compute dtype), counted in the memory check: 0 for none and
        ngram; else its layers' share of ``kv_cache_bytes_per_token`` (linear in the layers)."""
        spec = self.config.speculative_config
        if spec is None or spec.method == "ngram":
            return 0
        model, layers = self._draft_target(spec)
        return kv_cache_bytes_per_token(model.config, model.dtype) * layers // model.config.num_hidden_layers

    def _build_drafter(self, spec: SpeculativeConfig) -> Drafter:
        """The speculative drafter (engine/speculative/drafter.py, engine/speculative/draft_runner.py), checked against
        the target: early_exit's num_layers below its layer count; a draft model's vocabulary
        equal to the target's (ValueError naming speculative_config.model otherwise). A model
        drafter's own KV pool has the target's num_blocks x block_size geometry (for its own
        layer count), counted by the memory check (``_draft_kv_bytes_per_token``)."""
        mc = self.shared.model.config
        spec.check_against_model(mc.num_hidden_layers)
        if spec.method == "ngram":
            assert spec.prompt_lookup_min is not None and spec.prompt_lookup_max is not None
            return NgramDrafter(spec.prompt_lookup_min, spec.prompt_lookup_max)
        model, layers = self._draft_target(spec)
        if model.config.vocab_size != mc.vocab_size:
            raise ValueError(f"speculative_config.model: the draft model {spec.model!r} has a vocabulary of "
                             f"{model.config.vocab_size} tokens, the target {self.shared.name!r} has "
                             f"{mc.vocab_size}; a draft model must share the target's tokenizer")
        return ModelDrafter(spec.method, model, layers, self.config.num_blocks, self.config.block_size)

    # -- properties the calculator and views read -----------------------------------------
    @property
    def kv_cache_bytes_per_token(self) -> int:
        return self.runner.kv_cache_bytes_per_token

    @property
    def kv_cache_total_bytes(self) -> int:
        return self.runner.kv_cache_total_bytes

    # -- requests -------------------------------------------------------------------------
    def add_request(self, prompt: str | Sequence[int], sampling_params: SamplingParams | None = None,
                    request_id: str | None = None, arrival_step: int | None = None) -> str:
        """Validate everything first; a bad request raises ValueError and changes nothing."""
        token_ids, text, params = self._prepare(prompt, sampling_params, arrival_step)
        return self._enqueue(token_ids, text, params, request_id, arrival_step)

    def _prepare(self, prompt: str | Sequence[int], sampling_params: SamplingParams | None,
                 arrival_step: int | None = None) -> tuple[list[int], str | None, SamplingParams]:
        """Every check that needs no engine state: (token ids, prompt text, sampling params)."""
        params = _check_params(sampling_params)
        if params.n > self.config.max_num_seqs:
            raise ValueError(f"n: {params.n} parallel sequences exceed max_num_seqs={self.config.max_num_seqs}")
        if params.n > 1 and self.config.speculative_config is not None:
            raise ValueError(f"n: parallel sampling (n={params.n}) cannot be combined with speculative decoding "
                             f"(speculative_config is set); use n=1")
        token_ids, text = self._tokenize(prompt)
        self._validate_request(token_ids, arrival_step)
        return token_ids, text, params

    def _enqueue(self, token_ids: list[int], text: str | None, params: SamplingParams,
                 request_id: str | None, arrival_step: int | None) -> str:
        """Queue a prepared request (the request id is checked here, under the lock)."""
        with self.lock:
            rid = self._new_request_id(request_id)
            children = [f"{rid}#{i}" for i in range(1, params.n)]
            taken = [c for c in children if c in self.requests or c in self.reserved_ids]
            if taken:
                raise ValueError(f"request_id: {rid!r} with n={params.n} needs the id {taken[0]!r} for a "
                                 f"sequence, and it is already in use")
            arrival = self.step_count if arrival_step is None else arrival_step
            seed = params.seed if params.seed is not None else \
                (self.config.seed * 1_000_003 + len(self.requests)) % (MAX_SEED + 1)
            request = Request(rid, text, token_ids, params, arrival_step=arrival, seed=seed,
                              generator=None if params.greedy else torch.Generator().manual_seed(seed))
            self.requests[rid] = request
            self.reserved_ids.update(children)
            self.pending.append(request)
            self.pending.sort(key=lambda r: r.arrival_step)  # stable: FCFS within a step
        return rid

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
        vocab = self.shared.model.config.vocab_size
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

    def _validate_request(self, token_ids: list[int], arrival_step: int | None) -> None:
        n = len(token_ids)
        if n + 1 > self.model_max_len:
            raise ValueError(f"prompt: {n} tokens is longer than the model's context "
                             f"(max_model_len={self.model_max_len}, one position kept for output)")
        if n + 1 > self.max_model_len:
            c = self.config
            raise ValueError(f"num_blocks: the KV pool ({c.num_blocks} blocks x {c.block_size} tokens "
                             f"= {c.pool_tokens} tokens) cannot hold this {n}-token prompt plus one output token")
        if not self.config.enable_chunked_prefill and n > self.config.max_num_batched_tokens:
            raise ValueError(f"prompt: {n} tokens exceed max_num_batched_tokens="
                             f"{self.config.max_num_batched_tokens} and chunked prefill is off")
        if arrival_step is not None:
            horizon = self.step_count + MAX_ARRIVAL_HORIZON
            if isinstance(arrival_step, bool) or not isinstance(arrival_step, int) or arrival_step < 0:
                raise ValueError(f"arrival_step: must be an integer >= 0, got {str(arrival_step)[:80]}")
            if arrival_step > horizon:
                raise ValueError(f"arrival_step: must be at most {horizon:,} (the current step {self.step_count:,} "
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

    def _lookup(self, request_id: str) -> Request:
        if not isinstance(request_id, str):
            raise ValueError(f"request_id: must be a string, got {type(request_id).__name__}")
        request = self.requests.get(request_id)
        if request is None:
            raise ValueError(f"request_id: unknown request {request_id[:200]!r}")
        return request

    def abort_request(self, request_id: str) -> None:
        """Finish a request (and, for parallel sampling, all its sequences) with "abort"."""
        with self.lock:
            for request in self._sequences(self._lookup(request_id)):
                if request.is_finished:
                    continue
                if request in self.pending:
                    self.pending.remove(request)
                    request.status = RequestStatus.WAITING  # so finish() finds it in no queue
                self.scheduler.finish(request, "abort", self.step_count)
                if self.drafter is not None:
                    self.drafter.release(request.request_id)

    def _sequences(self, request: Request) -> list[Request]:
        """A request and its parallel-sampling sequences (only those forked so far)."""
        if request.parent_id is not None or request.sampling_params.n == 1:
            return [request]
        rid = request.request_id
        return [request, *(self.requests[c] for i in range(1, request.sampling_params.n)
                           if (c := f"{rid}#{i}") in self.requests)]

    def has_unfinished_requests(self) -> bool:
        return bool(self.pending) or self.scheduler.has_work() or bool(self.in_flight)

    # -- the loop -------------------------------------------------------------------------
    def step(self) -> StepTrace:
        """One engine step, all or nothing.

        Rule: the step completes, or, if anything in it raises (any exception, including
        KeyboardInterrupt and MemoryError), every request, queue, block table, the block pool's
        free queue, the sampling generators and the step count are restored to exactly their
        state before the step, and the exception propagates (the next step redoes the same
        work). An error attributable to one request does not fail the step: a request whose
        sampling fails or whose logits are not finite is finished with finish_reason="error"
        (its blocks freed, the reason in ``CompletionOutput.error``).
        """
        with self.lock:
            checkpoint = self._checkpoint()
            try:
                trace = self._step(checkpoint)
            except BaseException:
                self._rollback(checkpoint)
                raise
            self.kv.commit()
            if isinstance(self.runner, ParallelRunner):
                self.runner.retain(self.in_flight)  # results of retired and rolled-back batches go
            return trace

    def shutdown(self) -> None:
        """Stop the worker processes, if any (idempotent; later steps raise WorkerError)."""
        self.runner.shutdown()

    def __enter__(self) -> LLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _checkpoint(self) -> StepCheckpoint:
        """Copy what a step may change (live requests only), then open the KV journal."""
        live = (*self.pending, *self.scheduler.waiting, *self.scheduler.running)
        checkpoint = StepCheckpoint(self.step_count, tuple(self.pending), self.scheduler.queues(),
                                    tuple((r, r.checkpoint()) for r in live),
                                    drafter_state=None if self.drafter is None else self.drafter.checkpoint(),
                                    in_flight=tuple(self.in_flight), progress=self.progress.copy())
        self.kv.begin()
        return checkpoint

    def _rollback(self, cp: StepCheckpoint) -> None:
        for request, saved in cp.requests:
            request.restore(saved)
        for child in cp.forked:
            del self.requests[child.request_id]
            self.reserved_ids.add(child.request_id)
        for generator, state in reversed(cp.generators):  # the earliest saved state wins
            generator.set_state(state)
        if self.drafter is not None:
            self.drafter.restore(cp.drafter_state)
        self.pending = list(cp.pending)
        self.scheduler.restore_queues(cp.queues)
        self.kv.rollback()
        self.in_flight = deque(cp.in_flight)
        if cp.progress is not None:
            self.progress = cp.progress
        self.step_count = cp.step_count

    def _step(self, cp: StepCheckpoint) -> StepTrace:
        t0 = time.perf_counter()
        arrived = self._admit_arrivals()
        drafts = self._propose_drafts(cp)
        td = time.perf_counter()
        runner = self.runner
        if isinstance(runner, ParallelRunner) and runner.max_batches > 1:
            filled = self._fill_batch_queue(runner)
            t1 = time.perf_counter()
            output, logits = self._retire_oldest(runner, filled)
        else:
            output = self.scheduler.schedule()
            t1 = time.perf_counter()
            logits = None if output.is_empty else runner.forward(output, self.requests, self.kv)
        sampled: list[tuple[Request, int]] = []
        failed: list[tuple[Request, str]] = []
        spec: list[SpecVerification] = []
        num_accepted: dict[str, int] = {}
        if not output.is_empty:
            assert logits is not None
            t2 = time.perf_counter()
            row_of = self._logits_rows(output)
            to_sample, rows = self._sampling_targets(output, cp, row_of)
            cp.save_generators(to_sample)
            results = sample_rows(logits[rows], [r.sampling_params for r in to_sample],
                                  [r.generator for r in to_sample])
            for r, result in zip(to_sample, results):
                if isinstance(result, SamplingError):
                    failed.append((r, str(result)))
                else:
                    sampled.append((r, result))
            for s in output.scheduled:
                if s.num_spec_tokens:
                    self._verify(s, logits[row_of[s.request_id]:row_of[s.request_id] + s.num_spec_tokens + 1],
                                 drafts, cp, sampled, failed, spec, num_accepted)
        else:
            t2 = t1
        finished, appended = self.scheduler.postprocess(output, self.requests, sampled, failed, cp.forked,
                                                        self.step_count, num_accepted)
        if self.drafter is not None:
            for rid in (*finished, *output.preempted):
                self.drafter.release(rid)
        self.progress.observe(output, bool(appended), finished)
        t3 = time.perf_counter()
        trace = self._build_trace(output, arrived, finished, appended, cp.forked,
                                  (t1 - td) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3, tuple(spec), (td - t0) * 1e3)
        self.trace_seconds += time.perf_counter() - t3
        self.step_count += 1
        return trace

    def _fill_batch_queue(self, runner: ParallelRunner) -> list[SchedulerOutput]:
        """vLLM's batch queue for pipeline parallelism (``step_with_batch_queue``): fill, then
        retire the oldest (``_retire_oldest``).

            in flight:  [B]         schedule A' over the requests not in B, send it -> [B, A']
                        wait for B's logits, retire B (this step samples, appends, traces B)

        Rule: while fewer than p batches are in flight, schedule one more over the requests no
        in-flight batch holds (it may neither schedule nor preempt those), each with at most
        ceil(requests / p) requests so the work spreads over the batches, and send it: stage 0
        starts it as soon as it is done with the previous one, so the pipeline stays full
        across steps. Then take the oldest batch's results. Invariant: a request is in at most
        one in-flight batch; its KV and ``num_computed_tokens`` run ahead of its tokens only
        while it is in flight. Progress (as the single-process scheduler): a request is only
        preempted for an older one, and one whose newer requests are all in flight waits for
        them (Scheduler.schedule); once a batch of the step preempted, no later batch of the
        step admits (a victim is not re-admitted in the step that preempted it). -> the outputs
        scheduled (the last one empty when the requests ran out before the queue was full)."""
        p = runner.max_batches
        filled: list[SchedulerOutput] = []
        while len(self.in_flight) < p:
            busy = self._in_flight_ids()
            cap = max(1, -(-(len(self.scheduler.running) + len(self.scheduler.waiting)) // p))
            output = self.scheduler.schedule(exclude=busy, max_requests=cap,
                                             may_admit=not any(o.preempted for o in filled))
            filled.append(output)
            if output.is_empty:
                break
            self.in_flight.append(runner.submit(output, self.requests, self.kv))
        return filled

    def _in_flight_ids(self) -> frozenset[str]:
        """The requests of the batches in flight in the pipeline (batch_queue; else none)."""
        return frozenset().union(*(b.request_ids for b in self.in_flight))

    def _retire_oldest(self, runner: ParallelRunner,
                       filled: list[SchedulerOutput]) -> tuple[SchedulerOutput, torch.Tensor | None]:
        """Wait for the oldest in-flight batch -> (its output, with this step's preemptions,
        lookups and copies from ``filled``; its logits), or an empty output and None when
        nothing is in flight."""
        preempted = tuple(r for o in filled for r in o.preempted)
        lookups = tuple(x for o in filled for x in o.lookups)
        copies = tuple(c for o in filled for c in o.copies)
        if not self.in_flight:
            return SchedulerOutput((), preempted, 0, lookups, copies), None
        batch = self.in_flight.popleft()
        logits = runner.collect(batch)
        # Its requests, less any aborted while it was in flight (and their logits rows).
        scheduled = tuple(s for s in batch.output.scheduled if not self.requests[s.request_id].is_finished)
        row_of = self._logits_rows(batch.output)
        rows = [r for s in scheduled if not s.is_prefill
                for r in range(row_of[s.request_id], row_of[s.request_id] + 1 + s.num_spec_tokens)]
        output = SchedulerOutput(scheduled, preempted, sum(s.num_new_tokens for s in scheduled), lookups, copies)
        return output, logits[rows]

    # -- speculative decoding ------------------------------------------------------------
    def _propose_drafts(self, cp: StepCheckpoint) -> dict[str, Draft]:
        """Before scheduling: up to k drafts for each running request in decode, into its
        ``spec_token_ids``. Rule: k is capped so that the request can emit all of them plus one
        token within max_tokens and the context (num_tokens + k < max_model_len). The
        generators of the drafted requests are saved first (a sampled draft draws from them)."""
        if self.drafter is None or self.config.speculative_config is None:
            return {}
        k_max = self.config.speculative_config.num_speculative_tokens
        todo: list[tuple[Request, int]] = []
        for r in self.scheduler.running:
            if r.spec_token_ids or r.num_computed_tokens != r.num_tokens - 1 or not r.output_token_ids:
                continue
            k = min(k_max, r.sampling_params.max_tokens - len(r.output_token_ids) - 1,
                    self.max_model_len - r.num_tokens - 1)
            if k > 0:
                todo.append((r, k))
        if not todo:
            return {}
        cp.save_generators(r for r, _ in todo)
        drafts = self.drafter.propose(todo)
        for r, _ in todo:
            draft = drafts.get(r.request_id)
            if draft is not None:
                r.spec_token_ids = list(draft.token_ids)
        return drafts

    def _verify(self, s: ScheduledRequest, rows: torch.Tensor, drafts: dict[str, Draft], cp: StepCheckpoint,
                sampled: list[tuple[Request, int]], failed: list[tuple[Request, str]],
                spec: list[SpecVerification], num_accepted: dict[str, int]) -> None:
        """Verify one request's k drafts against the target's rows [k + 1, V] (the logits at its
        last token and at each draft). Greedy: accept while the draft is the argmax. Sampled:
        engine.spec_decode.rejection_sample with p = the request's transform of the rows and q
        from the drafter (None: one-hot, n-gram), drawing from the request's generator. The
        emitted tokens go to ``sampled`` in order; an error here (non-finite logits) fails only
        this request, as in plain sampling."""
        r = self.requests[s.request_id]
        k = s.num_spec_tokens
        ids = r.spec_token_ids[:k]
        params = r.sampling_params
        cp.save_generators([r])
        try:
            if not bool(torch.isfinite(rows).all()):
                raise ValueError("the model produced non-finite logits (NaN or inf)")
            p = probs_from_logits(rows, params.temperature, params.top_k, params.top_p)  # [k+1, V]
            draft = drafts.get(r.request_id)
            q = None if params.greedy or draft is None or draft.probs is None else draft.probs[:k]
            result = rejection_sample(p, q, ids, r.generator, greedy=params.greedy)
        except Exception as e:  # noqa: BLE001 - attributed to this request, as sample_rows does
            failed.append((r, f"verification failed: {e}"))
            return
        sampled.extend((r, t) for t in result.token_ids)
        num_accepted[r.request_id] = result.num_accepted
        r.num_draft_tokens += k
        r.num_accepted_tokens += result.num_accepted
        r.num_verify_steps += 1
        assert self.drafter is not None
        self.drafter.rewind(r, s.start + 1 + result.num_accepted)
        pieces = self.tokenizer.convert_ids_to_tokens(list(ids) + [t for t, _ in result.residual_top])
        top_p, top_ids = p[:k].topk(min(TOP_ALTERNATIVES, p.shape[-1]), dim=-1)  # [k, 3]: what the target wanted
        alternatives = [tuple(ResidualToken(int(t), text, _prob(float(v)))
                              for t, v, text in zip(row_ids.tolist(), row_p.tolist(),
                                                    self.tokenizer.convert_ids_to_tokens(row_ids.tolist())) if v > 0)
                        for row_ids, row_p in zip(top_ids, top_p)]
        spec.append(SpecVerification(
            request_id=r.request_id, method=self.drafter.method,  # type: ignore[arg-type]
            drafts=tuple(DraftToken(t, text, _prob(pv), _prob(qv), outcome, alt)
                         for t, text, pv, qv, outcome, alt in
                         zip(ids, pieces, result.draft_p, result.draft_q, result.outcomes, alternatives)),
            emitted=result.token_ids, final_kind=result.final_kind,
            residual_top=tuple(ResidualToken(t, text, _prob(v))
                               for (t, v), text in zip(result.residual_top, pieces[k:]))))

    def _logits_rows(self, output: SchedulerOutput) -> dict[str, int]:
        """The first logits row of each scheduled request that samples: one row per request,
        1 + k consecutive rows for one verifying k drafts."""
        row_of, row = {}, 0
        for s in output.scheduled:
            if not s.is_prefill:
                row_of[s.request_id] = row
                row += 1 + s.num_spec_tokens
        return row_of

    def _sampling_targets(self, output: SchedulerOutput, cp: StepCheckpoint,
                          row_of: dict[str, int]) -> tuple[list[Request], torch.Tensor]:
        """The sequences that sample one token this step (not the speculative verifications) and
        the logits row each samples from. A parallel-sampling request at its first sample forks
        here, and its new sequences sample from its row."""
        to_sample: list[Request] = []
        rows: list[int] = []
        for s in (s for s in output.scheduled if not s.is_prefill and not s.num_spec_tokens):
            r = self.requests[s.request_id]
            row = row_of[s.request_id]
            group = [r]
            if r.needs_fork:
                children = self.scheduler.fork(r)
                for child in children:
                    self.requests[child.request_id] = child
                    self.reserved_ids.discard(child.request_id)
                cp.forked.extend(children)
                group += children
            to_sample += group
            rows += [row] * len(group)
        return to_sample, torch.tensor(rows, dtype=torch.long)

    def made_no_progress(self, trace: StepTrace) -> bool:
        """True when the engine is stuck (``no_progress_reason``)."""
        return self.no_progress_reason(trace) is not None

    def no_progress_reason(self, trace: StepTrace) -> str | None:
        """Why the engine is stuck after ``trace``'s step, or None. Stuck: (1) the step
        scheduled and preempted nothing although requests were waiting or running (with
        nothing running every block is free and every queued request fits the pool, checked at
        add_request); (2) the backstop (ProgressWatch): ``limit`` steps in a row preempted and
        recomputed without any request getting past where it had been."""
        if not trace.scheduled and not trace.preempted and self.scheduler.has_work():
            return "nothing could be scheduled"
        w = self.progress
        if w.stuck and self.has_unfinished_requests():
            return (f"{w.idle_steps} steps in a row without any request gaining a token, while "
                    f"{w.preemptions} preemptions undid computed work (a preemption livelock)")
        return None

    def _admit_arrivals(self) -> tuple[str, ...]:
        arrived = []
        now = time.perf_counter()
        while self.pending and self.pending[0].arrival_step <= self.step_count:
            request = self.pending.pop(0)
            request.arrival_time = now
            self.scheduler.add(request)
            arrived.append(request.request_id)
        return tuple(arrived)

    # -- records --------------------------------------------------------------------------
    def _build_trace(self, output: SchedulerOutput, arrived: tuple[str, ...], finished: tuple[str, ...],
                     sampled: Sequence[tuple[Request, int]], forked: list[Request],
                     schedule_ms: float, forward_ms: float, sample_ms: float,
                     spec: tuple[SpecVerification, ...] = (), draft_ms: float = 0.0) -> StepTrace:
        allocated, freed, events = self.kv.drain_events()
        tokens = [t for _, t in sampled]
        pieces = self.tokenizer.convert_ids_to_tokens(tokens) if tokens else []
        return StepTrace(
            step=self.step_count,
            scheduled=tuple(ScheduledChunk(s.request_id, s.num_new_tokens, s.kind, s.start, s.resumed, s.num_spec_tokens)
                            for s in output.scheduled),
            token_budget=self.config.max_num_batched_tokens,
            num_batched_tokens=output.num_batched_tokens,
            arrived=arrived,
            preempted=output.preempted,
            finished=finished,
            sampled=tuple(SampledToken(r.request_id, t, p) for (r, t), p in zip(sampled, pieces)),
            blocks_allocated=allocated,
            blocks_freed=freed,
            num_free_blocks=self.kv.num_free_blocks,
            num_used_blocks=self.kv.pool.num_used,
            num_waiting=len(self.scheduler.waiting) + len(self.pending),
            num_running=len(self.scheduler.running),
            schedule_ms=schedule_ms,
            forward_ms=forward_ms,
            sample_ms=sample_ms,
            prefix=PrefixCacheEvents(
                lookups=output.lookups, inserted=tuple(events.inserted), split=tuple(events.split),
                evicted=tuple(self._prefix_node(n) for n in events.evicted), copies=output.copies,
                forked=tuple(r.request_id for r in forked)),
            num_cached_blocks=sum(1 for b in self.kv.pool.blocks if b.cached),
            num_evictable_blocks=self.kv.pool.num_evictable,
            spec=spec,
            draft_ms=draft_ms,
            pipeline=None if output.is_empty else self.runner.timeline,
        )

    def _prefix_node(self, node: RadixNode) -> PrefixNode:
        return PrefixNode(node.node_id, None if node.parent is None else node.parent.node_id, tuple(node.key),
                          tuple(node.block_ids), node.lock_count, node.last_access, node.hit_count,
                          self._decode(node.key) if node.key else "")

    def metrics(self, r: Request) -> RequestMetrics:
        ttft_ms = tpot_ms = e2e_ms = None
        if r.first_token_time is not None and r.arrival_time is not None:
            ttft_ms = (r.first_token_time - r.arrival_time) * 1e3
        if r.finished_time is not None and r.arrival_time is not None:
            e2e_ms = (r.finished_time - r.arrival_time) * 1e3
            if len(r.output_token_ids) > 1 and r.first_token_time is not None:
                tpot_ms = (r.finished_time - r.first_token_time) * 1e3 / (len(r.output_token_ids) - 1)
        return RequestMetrics(
            request_id=r.request_id, arrival_step=r.arrival_step,
            first_token_step=r.first_token_step, finished_step=r.finished_step,
            num_output_tokens=len(r.output_token_ids),
            ttft_steps=None if r.first_token_step is None else r.first_token_step - r.arrival_step + 1,
            ttft_ms=ttft_ms, tpot_ms=tpot_ms, e2e_ms=e2e_ms, num_preemptions=r.num_preemptions,
            num_cached_tokens=r.num_cached_tokens or 0, num_draft_tokens=r.num_draft_tokens,
            num_accepted_tokens=r.num_accepted_tokens, num_verify_steps=r.num_verify_steps)

    def snapshot(self) -> Snapshot:
        """An immutable copy of the engine's state, taken under the lock."""
        with self.lock:
            bs = self.config.block_size
            owners: dict[int, list[tuple[Request, int]]] = {}
            for rid, table in self.kv.block_tables.items():
                for logical, block_id in enumerate(table):
                    owners.setdefault(block_id, []).append((self.requests[rid], logical))
            tree = [self._prefix_node(n) for n in self.kv.prefix_cache.nodes()]
            cached_ids = {b: node.token_ids[i * bs:(i + 1) * bs] for node in tree for i, b in enumerate(node.block_ids)}
            blocks = []
            for block in self.kv.pool.blocks:
                held = owners.get(block.block_id, [])
                ids: tuple[int, ...] = cached_ids.get(block.block_id, ())
                if held and not ids:
                    r, logical = held[0]
                    lo = logical * bs
                    ids = tuple(r.all_token_ids[lo: min(lo + bs, r.num_computed_tokens)])
                blocks.append(BlockState(block.block_id, block.ref_count,
                                         tuple(r.request_id for r, _ in held), len(ids), ids,
                                         self._decode(ids) if ids else "", block.cached))
            requests = tuple(self._request_state(r) for r in self.requests.values())
            return Snapshot(
                step=self.step_count, block_size=bs, num_blocks=self.config.num_blocks,
                kv_bytes_per_token=self.kv_cache_bytes_per_token, blocks=tuple(blocks),
                requests=requests,
                waiting=tuple(r.request_id for r in self.pending) + tuple(
                    r.request_id for r in self.scheduler.waiting),
                running=tuple(r.request_id for r in self.scheduler.running),
                metrics=tuple(self.metrics(r) for r in self.requests.values()),
                prefix_tree=tuple(tree), parallel=self.runner.layout)

    def _request_state(self, r: Request) -> RequestState:
        return RequestState(
            request_id=r.request_id, status=r.status, arrival_step=r.arrival_step,
            num_prompt_tokens=r.num_prompt_tokens, num_output_tokens=len(r.output_token_ids),
            num_computed_tokens=r.num_computed_tokens, max_tokens=r.sampling_params.max_tokens,
            block_table=tuple(self.kv.block_tables.get(r.request_id, ())),
            num_preemptions=r.num_preemptions,
            prompt=r.prompt if r.prompt is not None else self._decode(r.prompt_token_ids),
            output_text=r.output_text if r.is_finished else self._decode(r.output_token_ids),
            finish_reason=r.finish_reason, num_cached_tokens=r.num_cached_tokens or 0, parent_id=r.parent_id)

    def get_output(self, request_id: str) -> RequestOutput:
        """The request's output: one CompletionOutput per sequence (n of them, in index order;
        a sequence not forked yet is empty, and ends as the request did when the request ended
        before its first sample: aborted or failed). ``finished`` once every sequence is."""
        with self.lock:
            r = self._lookup(request_id)
            seqs = self._sequences(r)
            outputs = [self._completion(i, seq) for i, seq in enumerate(seqs)]
            if r.parent_id is None:
                outputs += [CompletionOutput(i, "", (), r.finish_reason, None, r.error)
                            for i in range(len(seqs), r.sampling_params.n)]
            return RequestOutput(r.request_id, r.prompt, tuple(r.prompt_token_ids), tuple(outputs),
                                 self.is_finished(r), self.metrics(r), r.num_cached_tokens)

    def _completion(self, index: int, r: Request) -> CompletionOutput:
        text = r.output_text if r.is_finished else self._decode(r.output_token_ids)
        return CompletionOutput(index, text, tuple(r.output_token_ids), r.finish_reason, r.stop_reason, r.error)

    def is_finished(self, request: Request) -> bool:
        """Every sequence of the request finished (a parallel-sampling request forks first)."""
        return not request.needs_fork and all(s.is_finished for s in self._sequences(request))

    def check_integrity(self) -> None:
        """Every manager's invariants, plus: each request is finished or in exactly one queue
        (pending, waiting, running) with the matching status; nothing is stuck (see
        Scheduler.check_integrity)."""
        with self.lock:
            self.scheduler.check_integrity(self._in_flight_ids())
            live = [r for r in self.requests.values() if r not in self.pending]
            self.kv.check_integrity(live)
            for r in self.pending:
                if r.request_id in self.kv.block_tables:
                    raise AssertionError(f"pending request {r.request_id} holds blocks")
                if r.status is not RequestStatus.PENDING:
                    raise AssertionError(f"pending request {r.request_id} has status {r.status.value}")
            self._check_every_request_is_somewhere()
            if not self.has_unfinished_requests() and self.kv.pool.num_used:
                raise AssertionError("all requests finished but blocks are still in use")
            self.runner.check_integrity()
            if self.drafter is not None:
                self.drafter.check_integrity(self.scheduler.running)
                if not self.has_unfinished_requests() and self.drafter.num_used_blocks:
                    raise AssertionError("all requests finished but draft blocks are still in use")

    def _check_every_request_is_somewhere(self) -> None:
        queued: dict[int, int] = {}
        for r in (*self.pending, *self.scheduler.waiting, *self.scheduler.running):
            queued[id(r)] = queued.get(id(r), 0) + 1
        for r in self.requests.values():
            n = queued.get(id(r), 0)
            if r.is_finished and n:
                raise AssertionError(f"finished request {r.request_id} is still queued")
            if not r.is_finished and n != 1:
                raise AssertionError(f"unfinished request {r.request_id} ({r.status.value}) is in no queue"
                                     if n == 0 else f"request {r.request_id} is queued {n} times")


class LLM:
    """Offline batch generation, as vLLM's ``LLM``: ``LLM(model).generate(prompts, params)``.
    ``with LLM(..., pipeline_parallel_size=2) as llm:`` stops its worker processes on exit."""

    def __init__(self, model: str = "smollm2-135m", **knobs: Any) -> None:
        self.llm_engine = LLMEngine(model, **knobs)

    def shutdown(self) -> None:
        """Stop the worker processes, if any (idempotent; later steps raise WorkerError)."""
        self.llm_engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def get_tokenizer(self) -> Any:
        return self.llm_engine.tokenizer

    def generate(self, prompts: str | Sequence[int] | Iterable[str | Sequence[int]],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[RequestOutput]:
        """Outputs in the order of ``prompts``; ``[]`` for no prompts.

        Rules: every prompt is validated before any is added (a bad one adds nothing); the
        engine is stepped only until the requests added here are finished (requests added
        earlier through ``llm_engine`` are stepped along but never waited for); a step that
        makes no progress raises RuntimeError instead of spinning; if a step raises, the
        requests added here are aborted and the exception propagates.
        """
        prompt_list = _prompt_list(prompts)
        params = _params_list(sampling_params, len(prompt_list))
        engine = self.llm_engine
        prepared = [engine._prepare(p, sp) for p, sp in zip(prompt_list, params)]
        ids = [engine._enqueue(*request, request_id=None, arrival_step=None) for request in prepared]
        try:
            self._run_until_finished(ids)
        except BaseException:
            for rid in ids:
                engine.abort_request(rid)
            raise
        return [engine.get_output(i) for i in ids]

    def _run_until_finished(self, ids: list[str]) -> None:
        engine = self.llm_engine
        remaining = [engine.requests[i] for i in ids]
        while remaining:
            trace = engine.step()
            reason = engine.no_progress_reason(trace)
            if reason is not None:
                raise RuntimeError(f"generate: no progress at step {trace.step} ({reason}; {len(remaining)} "
                                   f"unfinished requests); the engine is stuck")
            remaining = [r for r in remaining if not engine.is_finished(r)]


def _prompt_list(prompts: object) -> list[Any]:
    """Rule: one prompt (a string, or a list of token ids) or an ordered collection of prompts
    (list, tuple, or an iterator such as a generator, read in order). Sets and mappings are
    refused: their iteration order would decide which output belongs to which prompt."""
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, (Set, Mapping)):
        raise ValueError(f"prompts: a {type(prompts).__name__} has no order, and the order of the prompts is "
                         f"the order of the outputs; pass a list")
    if isinstance(prompts, (bytes, bytearray)) or not isinstance(prompts, (Sequence, Iterator)):
        raise ValueError(f"prompts: must be a string, a list of token ids, or a list of those, got "
                         f"{type(prompts).__name__}")
    items = list(itertools.islice(prompts, MAX_GENERATE_PROMPTS + 1))
    if len(items) > MAX_GENERATE_PROMPTS:
        raise ValueError(f"prompts: at most {MAX_GENERATE_PROMPTS:,} prompts in one generate call")
    if items and isinstance(items[0], int) and not isinstance(items[0], bool):
        return [items]  # one prompt given as token ids
    return items


def _params_list(sampling_params: object, n: int) -> list[SamplingParams | None]:
    if isinstance(sampling_params, SamplingParams) or sampling_params is None:
        return [sampling_params] * n
    if not isinstance(sampling_params, (list, tuple)):
        raise ValueError(f"sampling_params: a SamplingParams or a list of them, got {type(sampling_params).__name__}")
    if len(sampling_params) != n:
        raise ValueError("sampling_params: one per prompt, or a single one for all")
    return list(sampling_params)


def _prob(x: float) -> float:
    """A probability for a record: float rounding can put p a hair outside [0, 1]."""
    return min(1.0, max(0.0, float(x)))


def _check_params(params: SamplingParams | None) -> SamplingParams:
    if params is None:
        return SamplingParams()
    if not isinstance(params, SamplingParams):
        raise ValueError(f"sampling_params: must be a SamplingParams, got {type(params).__name__}")
    return params


__all__ = ["LLM", "LLMEngine", "RequestOutput", "CompletionOutput", "SharedModel", "get_shared_model",
           "cdiv"]
