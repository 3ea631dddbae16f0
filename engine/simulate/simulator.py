"""The serving loop in time: requests arrive at their ``arrival_s``, the engine steps, the clock
moves by each step's duration (predicted on a simulated run, measured on a real one).

    while requests are due or unfinished:
        hand the engine every request whose arrival time has come (stamped with that time)
        nothing to run?  -> wait for the next arrival (a virtual clock skips the gap)
        step             -> the clock has moved by the step's duration
        record the step (StepSample); past the time limit -> stop, the result marked partial

The same loop drives the real engine on this machine (``run_real``) so the two can be compared
request by request on one workload.
"""
from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from engine.core.config import SamplingParams
from engine.core.trace import StepTrace
from engine.costmodel.clock import RunClock, VirtualClock, WallClock
from engine.costmodel.frameworks import IN_PROCESS, ServingRule
from engine.costmodel.model import DEFAULT_MAX_NUM_SEQS, SimulatedModel
from engine.serving.engine import LLMEngine
from engine.serving.intake import PreparedRequest
from engine.simulate.result import RequestRecord, RunResult, StepSample
from engine.simulate.workload import Workload, WorkloadRequest

PROGRESS_EVERY_S = 0.25  # wall seconds between progress reports


@dataclass(frozen=True)
class ServingKnobs:
    """The engine's serving knobs for a run (vLLM's names). None: the deployment's default (the
    framework's token budget; its serving rule's prefill schedule and chunking, frameworks.py)."""

    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool | None = None
    scheduling_policy: str = "fcfs"
    prefill_schedule: str | None = None

    def engine_knobs(self, default_batched_tokens: int, rule: ServingRule = IN_PROCESS) -> dict[str, Any]:
        chunked = rule.chunked_prefill if self.enable_chunked_prefill is None else self.enable_chunked_prefill
        return {"max_num_seqs": self.max_num_seqs,
                "max_num_batched_tokens": self.max_num_batched_tokens or default_batched_tokens,
                "enable_prefix_caching": self.enable_prefix_caching, "enable_chunked_prefill": chunked,
                "scheduling_policy": self.scheduling_policy,
                "prefill_schedule": self.prefill_schedule or rule.prefill_schedule}


class Progress(NamedTuple):
    finished: int
    total: int
    clock_s: float  # the run's clock
    wall_s: float  # seconds spent here


def simulated_engine(sim: SimulatedModel, knobs: ServingKnobs = ServingKnobs()) -> tuple[LLMEngine, VirtualClock]:
    """An engine serving ``sim`` on a fresh virtual clock, with the calculator's KV pool."""
    d, clock = sim.deployment, VirtualClock()
    if d.num_blocks < 1:
        raise ValueError(f"hardware: no KV block fits beside the weights ({d.words})")
    engine = LLMEngine(sim, clock=clock, num_blocks=d.num_blocks, block_size=d.block_size,
                       max_model_len=d.max_model_len, **knobs.engine_knobs(d.max_num_batched_tokens, sim.serving))
    return engine, clock


def prepare_workload(engine: LLMEngine, workload: Workload) -> list[PreparedRequest]:
    """Every request checked before the run starts: a request that can never run fails here,
    named, and nothing has run."""
    prepared = []
    for i, w in enumerate(workload.requests):
        prompt = w.prompt if w.prompt is not None else list(w.prompt_token_ids or ())
        params = SamplingParams(temperature=0.0, max_tokens=w.max_tokens, ignore_eos=True)
        try:
            prepared.append(engine.intake.prepare(prompt, params, None, 0))
        except ValueError as e:
            raise ValueError(f"workload request {i}: {e}") from None
        need = len(prepared[-1].token_ids) + w.max_tokens
        if need > engine.max_model_len:
            raise ValueError(f"workload request {i}: prompt + max_tokens = {need:,} tokens can never fit: the"
                             f" deployment holds {engine.max_model_len:,} tokens per sequence (max_model_len and"
                             f" the KV pool)")
    return prepared


def step_sample(start: float, end: float, trace: StepTrace) -> StepSample:
    """One step of a run, from its trace, on the run's clock."""
    lookups = trace.prefix.lookups
    return StepSample(start_s=start, duration_s=end - start, num_tokens=trace.num_batched_tokens,
                      num_prefill_tokens=trace.num_prefill_tokens,
                      num_decodes=sum(1 for c in trace.scheduled if c.kind == "decode"),
                      running=trace.num_running, waiting=trace.num_waiting,
                      kv_blocks_used=trace.num_used_blocks - trace.num_evictable_blocks,
                      preempted=len(trace.preempted), prefix_hit_tokens=trace.prefix.num_cached_tokens,
                      prefix_lookup_tokens=sum(h.num_tokens for h in lookups))


def _records(engine: LLMEngine, ids: dict[int, str], sent: dict[int, float], workload: Workload,
             prepared: list[PreparedRequest]) -> tuple[RequestRecord, ...]:
    """One record per workload request, arriving when its client sent it; those the engine had
    not received when a partial run stopped have their planned arrival only."""
    out = []
    for i, w in enumerate(workload.requests):
        if i not in ids:
            out.append(RequestRecord(f"r{i}", w.arrival_s, None, None, len(prepared[i].token_ids), 0, 0, 0, w.priority))
            continue
        r = engine.requests[ids[i]]
        out.append(RequestRecord(ids[i], sent[i], r.first_token_time, r.finished_time, r.num_prompt_tokens,
                                 len(r.output_token_ids), r.num_cached_tokens or 0, r.num_preemptions, w.priority))
    return tuple(out)


def run_workload(engine: LLMEngine, clock: RunClock, workload: Workload, *, label: str, simulated: bool,
                 frontend_s: float = 0.0, max_concurrency: int | None = None, time_limit_s: float | None = None,
                 progress: Callable[[Progress], None] | None = None,
                 after_step: Callable[[LLMEngine], None] | None = None) -> RunResult:
    """Serve ``workload`` on ``engine`` whose clock is ``clock`` (module doc) -> RunResult.

    ``frontend_s``: a request reaches the engine this long after its client sent it (the API
    server's share, engine/costmodel/frameworks.py); its TTFT counts from the send.
    ``max_concurrency``: a closed-loop client (vLLM's ``bench serve --max-concurrency``): at
    most this many requests outstanding, the next sent when one finishes.
    ``time_limit_s``: wall seconds here, after which the run stops with what it has.
    ``after_step`` sees the engine after every step (tests check its integrity there)."""
    if max_concurrency is not None and (isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int)
                                        or max_concurrency < 1):
        raise ValueError(f"max_concurrency: must be a whole number >= 1, got {max_concurrency!r}")
    prepared = prepare_workload(engine, workload)
    reqs: list[WorkloadRequest] = list(workload.requests)
    ids: dict[int, str] = {}
    sent: dict[int, float] = {}
    in_frontend: deque[tuple[float, int]] = deque()  # (when it reaches the engine, request index)
    steps: list[StepSample] = []
    wall0 = last_report = time.perf_counter()
    partial = False
    i, n, finished = 0, len(reqs), 0
    seats = max_concurrency or n
    while i < n or in_frontend or engine.has_unfinished_requests():
        now = clock()
        while i < n and reqs[i].arrival_s <= now and i - finished < seats:  # clients send
            sent[i] = max(reqs[i].arrival_s, now) if max_concurrency else reqs[i].arrival_s
            in_frontend.append((sent[i] + frontend_s, i))
            i += 1
        while in_frontend and in_frontend[0][0] <= now:  # the engine receives
            _, j = in_frontend.popleft()
            ids[j] = engine.enqueue(prepared[j], f"r{j}", priority=reqs[j].priority, arrival_time=sent[j])
        if not engine.has_unfinished_requests():
            nxt = min(in_frontend[0][0] if in_frontend else math.inf,
                      reqs[i].arrival_s if i < n and i - finished < seats else math.inf)
            clock.wait_until(nxt)
            continue
        start = clock()
        trace = engine.step()
        steps.append(step_sample(start, clock(), trace))
        if after_step is not None:
            after_step(engine)
        finished += len(trace.finished)
        reason = engine.no_progress_reason(trace)
        if reason is not None:
            raise RuntimeError(f"the engine is stuck at step {trace.step}: {reason}")
        wall = time.perf_counter()
        if progress is not None and wall - last_report >= PROGRESS_EVERY_S:
            progress(Progress(finished, n, clock(), wall - wall0))
            last_report = wall
        if time_limit_s is not None and wall - wall0 > time_limit_s:
            partial = i < n or bool(in_frontend) or engine.has_unfinished_requests()
            break
    records = _records(engine, ids, sent, workload, prepared)
    if progress is not None:
        progress(Progress(sum(r.finished for r in records), n, clock(), time.perf_counter() - wall0))
    cc = engine.config.cache_config
    return RunResult(label, simulated, records, tuple(steps), cc.num_blocks * cc.block_size, cc.num_blocks, partial,
                     time.perf_counter() - wall0)


def simulate(sim: SimulatedModel, workload: Workload, knobs: ServingKnobs = ServingKnobs(), *,
             max_concurrency: int | None = None, time_limit_s: float | None = None,
             progress: Callable[[Progress], None] | None = None,
             after_step: Callable[[LLMEngine], None] | None = None) -> RunResult:
    """``workload`` served by ``sim``'s deployment, in predicted time."""
    engine, clock = simulated_engine(sim, knobs)
    return run_workload(engine, clock, workload, label=sim.deployment.words, simulated=True,
                        frontend_s=sim.serving.frontend_s, max_concurrency=max_concurrency, time_limit_s=time_limit_s, progress=progress,
                        after_step=after_step)


def run_real(model: str, workload: Workload, knobs: ServingKnobs, *, num_blocks: int, block_size: int = 16,
             time_limit_s: float | None = None, progress: Callable[[Progress], None] | None = None,
             **engine_knobs: Any) -> RunResult:
    """``workload`` served by the real engine on this machine, in wall-clock time."""
    clock = WallClock()
    with LLMEngine(model, clock=clock, num_blocks=num_blocks, block_size=block_size,
                   **knobs.engine_knobs(512), **engine_knobs) as engine:
        clock.t0 = time.perf_counter()  # the run starts now, not when the engine was built
        return run_workload(engine, clock, workload, label=f"real engine: {model} on this machine", simulated=False,
                            time_limit_s=time_limit_s, progress=progress)
