"""The engine loop, in the shape of vLLM's ``LLMEngine`` (and nano-vllm's).

    engine = LLMEngine("smollm2-135m", block_size=4, num_blocks=64)
    engine.add_request("Hello", SamplingParams(temperature=0, max_tokens=8))
    while engine.has_unfinished_requests():
        trace = engine.step()        # StepTrace: what this step did
    engine.snapshot()                # Snapshot: block pool, tables, queues, metrics

One step (``_step``), each stage a call to a collaborator that returns a record:

    arrivals          intake.admit_arrivals      -> ids that arrived     (serving/intake.py)
    propose drafts    speculator.propose         -> drafts by request    (speculative/verify.py)
    schedule + run    batches.run                -> RanBatch             (core/batch.py, parallel/batch_queue.py)
    sample, verify    sample_and_verify          -> Samples              (serving/sampler.py)
    postprocess       scheduler.postprocess      -> PostprocessResult    (core/scheduler.py)
    trace             tracer.step_trace          -> StepTrace            (core/tracing.py)

Drafts are proposed before scheduling: the scheduler gives a request its 1 + k tokens. ``step``
holds the engine's lock, so concurrent callers (e.g. overlapping Streamlit reruns) never
interleave half-steps. A step is all or nothing: it completes, or every request, queue, block,
generator and collaborator is put back as it was (core/checkpoint.py) and the exception
propagates; only an error attributable to one request (its sampling, or non-finite logits in
its row) finishes that request with ``finish_reason="error"`` and lets the step complete.

Limits (each a ValueError naming the knob or field): the knobs' hard caps in
``engine.core.config``; the memory a configuration needs against a fraction of the memory the
OS reports available; arrivals at most ``MAX_ARRIVAL_HORIZON`` steps ahead; at most
``MAX_GENERATE_PROMPTS`` prompts in one ``LLM.generate`` (see ``engine.serving.limits``).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from engine.core.checkpoint import StepCheckpoint
from engine.core.config import EngineConfig, SamplingParams, check_priority, engine_config
from engine.core.kv_cache import KVCacheManager
from engine.core.request import Request
from engine.core.scheduler import Scheduler
from engine.core.trace import RequestMetrics, Snapshot, StepTrace
from engine.core.tracing import StepRecord, StepTimings, TraceBuilder, request_metrics
from engine.costmodel.model import SimulatedModel
from engine.model.runner import kv_cache_bytes_per_token
from engine.model.shared import SharedModel, shared_model_for
from engine.parallel.layout import stage_layouts
from engine.serving import limits
from engine.serving.intake import PreparedRequest, RequestIntake, detokenizer
from engine.serving.outputs import RequestOutput, request_output
from engine.serving.progress import ProgressWatch
from engine.serving.runners import RunnerContext, build_runner
from engine.serving.sampler import Samples, sample_and_verify
from engine.speculative.verify import Speculator, build_speculator, draft_kv_bytes_per_token


class LLMEngine:
    def __init__(self, model: str | SharedModel | SimulatedModel = "smollm2-135m", config: EngineConfig | None = None,
                 progress: Callable[[str], None] | None = None, clock: Callable[[], float] | None = None,
                 **knobs: Any) -> None:
        """Validate knobs, then the memory they need, then allocate (KV tensors, block pool).
        With pipeline_parallel_size x tensor_parallel_size > 1 the model runs in worker processes
        (engine/parallel/executor.py), started here (``progress`` hears how far start-up got); stop
        them with ``shutdown()`` (garbage collection and interpreter exit stop them too).
        ``clock``: the time arrivals, first tokens and finishes are stamped with (perf_counter; a
        SimulatedModel runs on a VirtualClock its runner advances, engine/simulate)."""
        self.config = c = engine_config(config, knobs)
        self.clock = clock or time.perf_counter
        self.shared = model if isinstance(model, SimulatedModel) else shared_model_for(model, c)
        self.facts = facts = self.shared.facts if isinstance(self.shared, SimulatedModel) \
            else self.shared.model.config.facts
        # The split must fit the model at every p, p = 1 included (no worker checks it there).
        stage_layouts(facts.num_hidden_layers, c.parallel_config.pipeline_parallel_size, c.parallel_config.pipeline_layer_split)
        self.tokenizer = self.shared.tokenizer
        self._decode = detokenizer(self.tokenizer)
        self.model_max_len = min(facts.max_position_embeddings,
                                 c.scheduler_config.max_model_len or facts.max_position_embeddings)
        self.max_model_len = min(self.model_max_len, c.cache_config.pool_tokens)
        self.memory_need = self._memory_need()
        limits.check_memory(c, self.memory_need, limits.available_memory_bytes())
        self.kv = KVCacheManager(c.cache_config.num_blocks, c.cache_config.block_size, c.cache_config.enable_prefix_caching)
        eos = set(facts.eos_token_ids)
        if self.tokenizer.eos_token_id is not None and not isinstance(self.shared, SimulatedModel):
            eos.add(self.tokenizer.eos_token_id)
        self.eos_token_ids = frozenset(eos)
        self.scheduler = Scheduler(c, self.kv, self.max_model_len, self.eos_token_ids, self._decode, self.clock)
        self.runner = build_runner(RunnerContext(model if isinstance(model, str) else self.shared.name,
                                                 self.shared, c, progress, self.clock))
        self.batches = self.runner.batch_stage()
        self.speculator = build_speculator(c, self.shared, self.max_model_len) \
            if isinstance(self.shared, SharedModel) else Speculator(None, 0, self.max_model_len, self.tokenizer)
        self.intake = RequestIntake(c, self.tokenizer, facts.vocab_size, self.model_max_len, self.max_model_len)
        self.tracer = TraceBuilder(c, self.kv, self.scheduler, self.tokenizer, self._decode)
        self.progress = ProgressWatch(ProgressWatch.limit_for(c, self.max_model_len))
        self.step_count = 0
        self.trace_seconds = 0.0  # time spent building StepTraces (for the benchmark)
        self.lock = threading.RLock()

    def _memory_need(self) -> limits.MemoryNeed:
        """What this process allocates: the KV tensors and a step's activations, or for a simulated
        model only the block pool's objects (its KV lives on the simulated hardware)."""
        c = self.config
        if isinstance(self.shared, SimulatedModel):
            return limits.block_pool_need(c)
        mc = self.shared.model.config
        kv_bytes = kv_cache_bytes_per_token(mc, c.kv_cache_dtype) + draft_kv_bytes_per_token(c.speculative_config,
                                                                                          self.shared)
        return limits.estimate_memory(c, mc, self.max_model_len, kv_bytes)

    @property
    def requests(self) -> dict[str, Request]:
        return self.intake.requests

    @property
    def pending(self) -> list[Request]:
        return self.intake.pending

    @property
    def kv_cache_bytes_per_token(self) -> int:
        return self.runner.kv_cache_bytes_per_token

    @property
    def kv_cache_total_bytes(self) -> int:
        return self.runner.kv_cache_total_bytes

    # -- requests -------------------------------------------------------------------------
    def add_request(self, prompt: str | Sequence[int], sampling_params: SamplingParams | None = None,
                    request_id: str | None = None, arrival_step: int | None = None, priority: int = 0,
                    arrival_time: float | None = None) -> str:
        """Validate everything first; a bad request raises ValueError and changes nothing.
        ``priority``: vLLM's meaning, lower is served earlier (ties by arrival); it orders requests
        only under ``scheduling_policy="priority"`` and is accepted and ignored under the others.
        ``arrival_time``: when it arrived on the engine's clock (None: when a step admits it)."""
        check_priority(priority)
        prepared = self.intake.prepare(prompt, sampling_params, arrival_step, self.step_count)
        return self.enqueue(prepared, request_id, arrival_step, priority, arrival_time)

    def enqueue(self, prepared: PreparedRequest, request_id: str | None = None,
                arrival_step: int | None = None, priority: int = 0, arrival_time: float | None = None) -> str:
        """Queue a request ``intake.prepare`` checked (its id is checked here, under the lock)."""
        with self.lock:
            return self.intake.enqueue(prepared, request_id, arrival_step, self.step_count, priority, arrival_time)

    def abort_request(self, request_id: str) -> None:
        """Finish a request (and, for parallel sampling, all its sequences) with "abort"."""
        with self.lock:
            for request in self.intake.sequences(self.intake.lookup(request_id)):
                if not request.is_finished:
                    self.intake.withdraw(request)
                    self.scheduler.finish(request, "abort", self.step_count)
                    self.speculator.release([request.request_id])

    def has_unfinished_requests(self) -> bool:
        return bool(self.intake.pending) or self.scheduler.has_work() or bool(self.batches.in_flight_ids())

    # -- the loop -------------------------------------------------------------------------
    def step(self) -> StepTrace:
        """One engine step, all or nothing (module doc): if anything in it raises (any exception,
        KeyboardInterrupt and MemoryError included), the engine is restored to exactly its
        state before the step and the exception propagates (the next step redoes the work)."""
        with self.lock:
            live = (*self.intake.pending, *self.scheduler.waiting, *self.scheduler.running)
            cp = StepCheckpoint.take(self.step_count, live, (self.intake, self.scheduler, self.speculator,
                                                             self.batches, self.progress))
            self.kv.begin()
            try:
                trace = self._step(cp)
            except BaseException:
                cp.restore()
                self.kv.rollback()
                self.step_count = cp.step_count
                raise
            self.kv.commit()
            self.batches.commit()
            return trace

    def _step(self, cp: StepCheckpoint) -> StepTrace:
        """arrivals -> propose drafts -> schedule and run the batch -> sample and verify ->
        postprocess -> trace (module doc); the timings split the step between the stages."""
        t0 = time.perf_counter()
        arrived = self.intake.admit_arrivals(self.step_count, self.scheduler, self.clock())
        drafts = self.speculator.propose(self.scheduler.running, cp)
        t_drafted = time.perf_counter()
        ran = self.batches.run(self.scheduler, self.requests, self.kv)
        t_ran = ran.scheduled_at if ran.output.is_empty else time.perf_counter()
        samples = Samples() if ran.output.is_empty or ran.logits is None else sample_and_verify(
            ran.output, ran.logits, self.intake, self.scheduler, self.speculator, drafts, cp)
        finished, appended = self.scheduler.postprocess(
            ran.output, self.requests, list(samples.sampled), list(samples.failed), samples.forked,
            self.step_count, samples.num_accepted)
        self.speculator.release((*finished, *ran.output.preempted))
        self.progress.observe(ran.output, bool(appended), finished)
        t_done = time.perf_counter()
        timings = StepTimings((t_drafted - t0) * 1e3, (ran.scheduled_at - t_drafted) * 1e3,
                              (t_ran - ran.scheduled_at) * 1e3, (t_done - t_ran) * 1e3)
        record = StepRecord(self.step_count, ran.output, arrived, finished, appended, samples.forked,
                            samples.spec, timings, self.runner.timeline)
        trace = self.tracer.step_trace(record, len(self.intake.pending))
        self.trace_seconds += time.perf_counter() - t_done
        self.step_count += 1
        return trace

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

    def shutdown(self) -> None:
        """Stop the worker processes, if any (idempotent; later steps raise WorkerError)."""
        self.runner.shutdown()

    def __enter__(self) -> LLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -- records --------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        """An immutable copy of the engine's state, taken under the lock."""
        with self.lock:
            return self.tracer.snapshot(self.step_count, self.requests, self.intake.pending,
                                        self.kv_cache_bytes_per_token, self.runner.layout)

    def metrics(self, r: Request) -> RequestMetrics:
        return request_metrics(r)

    def get_output(self, request_id: str) -> RequestOutput:
        """The request's output: one CompletionOutput per sequence; ``finished`` once every
        sequence is (engine/serving/outputs.py)."""
        with self.lock:
            r = self.intake.lookup(request_id)
            return request_output(r, self.intake.sequences(r), self.intake.is_finished(r), self._decode)

    def is_finished(self, request: Request) -> bool:
        """Every sequence of the request finished (a parallel-sampling request forks first)."""
        return self.intake.is_finished(request)

    def check_integrity(self) -> None:
        """Every manager's invariants, plus: each request is finished or in exactly one queue
        (pending, waiting, running) with the matching status; nothing is stuck (see
        Scheduler.check_integrity)."""
        with self.lock:
            self.scheduler.check_integrity(self.batches.in_flight_ids())
            self.kv.check_integrity([r for r in self.requests.values() if r not in self.intake.pending])
            self.intake.check_integrity(self.kv.block_tables, (*self.scheduler.waiting, *self.scheduler.running))
            idle = not self.has_unfinished_requests()
            if idle and self.kv.pool.num_used:
                raise AssertionError("all requests finished but blocks are still in use")
            self.runner.check_integrity()
            self.speculator.check_integrity(self.scheduler.running, idle)


__all__ = ["LLMEngine"]
