"""A simulated run as the session's run: a real LLMEngine whose runner predicts each step's time
(engine.simulate.simulated_engine), stepped by the live pages like any LiveRun.

What differs from a scenario's LiveRun: requests arrive at times in seconds on the run's virtual
clock (the workload's ``arrival_s``, after the framework's frontend delay), not at step numbers,
so each step first hands the engine every request whose time has come and, when nothing is left
to run, skips the clock to the next arrival (the loop of engine.simulate.simulator, one step at
a time). There are no weights: ``engine.runner.model`` is None.

The pool drawn is the deployment's (the calculator's KV room) cut to ``MAX_DRAWN_BLOCKS``
blocks, because a page of 80,000 squares draws nothing legible and a snapshot per step of them
costs seconds. The cut is sized to hold every request's prompt and output at once, so no step
ever lacks a block: scheduling, admissions and prefix hits are exactly those of the full pool.
Only when the workload needs more than the cap may the cut pool evict or preempt where the full
one would not, and ``pool_note`` says so.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from engine.core.config import SamplingParams
from engine.costmodel.clock import VirtualClock
from engine.costmodel.model import SimulatedModel
from engine.core.trace import StepTrace
from engine.replay.run import LiveRun, RunMeta, RunView, history_view
from engine.serving.engine import LLMEngine
from engine.serving.intake import PreparedRequest
from engine.simulate.simulator import ServingKnobs
from engine.simulate.workload import Workload

#: most blocks the step-through draws (64 columns x 64 rows of the KV page's grid)
MAX_DRAWN_BLOCKS = 4096
#: fewest blocks it draws when the deployment has them (a pool with room to see)
MIN_DRAWN_BLOCKS = 256
SIMULATED_BADGE = "SIMULATED — predicted times"


@dataclass(frozen=True)
class SimulatedRecipe:
    """What a simulated run is built from (Reset builds it again from this)."""

    sim: SimulatedModel
    workload: Workload
    knobs: ServingKnobs
    title: str


def drawn_blocks(sim: SimulatedModel, workload: Workload) -> tuple[int, str]:
    """(blocks of the pool drawn, a sentence on how it relates to the deployment's pool)."""
    d = sim.deployment
    bs = d.block_size
    need = sum(math.ceil((len(w.prompt_token_ids or ()) + len((w.prompt or "").encode()) + w.max_tokens) / bs)
               for w in workload.requests)
    blocks = min(d.num_blocks, max(need, MIN_DRAWN_BLOCKS), MAX_DRAWN_BLOCKS)
    if blocks == d.num_blocks:
        return blocks, f"The pool is the deployment's whole KV pool: {blocks:,} blocks of {bs} tokens."
    if need <= blocks:
        return blocks, (f"The pool drawn is {blocks:,} of the deployment's {d.num_blocks:,} blocks ({bs} tokens"
                        f" each): enough for every request's prompt and output at once ({need:,} blocks), so no step"
                        f" lacks a block and the run is the one the full pool would give.")
    return blocks, (f"The pool drawn is cut to {blocks:,} of the deployment's {d.num_blocks:,} blocks ({bs} tokens"
                    f" each); this workload needs up to {need:,}, so evictions and preemptions here may not happen"
                    f" on the full pool.")


class SimulatedRun(LiveRun):
    """A LiveRun over a simulated engine; requests arrive on its virtual clock (module doc)."""

    is_simulated = True

    def __init__(self, recipe: SimulatedRecipe) -> None:
        sim, workload, knobs = recipe.sim, recipe.workload, recipe.knobs
        d = sim.deployment
        blocks, self.pool_note = drawn_blocks(sim, workload)
        self.clock = VirtualClock()
        engine = LLMEngine(sim, clock=self.clock, num_blocks=blocks, block_size=d.block_size,
                           max_model_len=d.max_model_len, **knobs.engine_knobs(d.max_num_batched_tokens))
        meta = RunMeta(model=d.model_name[:200], scenario="simulated", title=recipe.title[:500], config=engine.config,
                       max_model_len=engine.max_model_len, kv_bytes_per_token=max(1, d.kv_bytes_per_token))
        super().__init__(engine, meta)
        self.recipe = recipe
        self.frontend_s = sim.serving.frontend_s
        # (when the engine receives it, request id, the request checked)
        self.arrivals: deque[tuple[float, str, float, PreparedRequest]] = deque()
        for i, w in enumerate(workload.requests):
            prompt = w.prompt if w.prompt is not None else list(w.prompt_token_ids or ())
            params = SamplingParams(temperature=0.0, max_tokens=w.max_tokens, ignore_eos=True)
            try:
                prepared = engine.intake.prepare(prompt, params, None, 0)
            except ValueError as e:
                raise ValueError(f"workload request {i}: {e}") from None
            self.arrivals.append((w.arrival_s + self.frontend_s, f"r{i}", w.arrival_s, prepared))
        self.step_seconds: list[float] = []  # each step's predicted duration
        self.step_starts: list[float] = []  # each step's start on the virtual clock

    def restart(self) -> SimulatedRun:
        """A fresh run of the same recipe, at step 0."""
        return SimulatedRun(self.recipe)

    def _has_work(self) -> bool:
        return bool(self.arrivals) or self.engine.has_unfinished_requests()

    @property
    def done(self) -> bool:
        with self.lock:
            return not self._has_work()

    def _receive(self) -> None:
        """Hand the engine every request whose time has come; idle: skip to the next arrival."""
        while True:
            while self.arrivals and self.arrivals[0][0] <= self.clock():
                _, rid, sent, prepared = self.arrivals.popleft()
                self.engine.enqueue(prepared, rid, arrival_time=sent)  # TTFT counts from the client's send
            if self.engine.has_unfinished_requests() or not self.arrivals:
                return
            self.clock.wait_until(self.arrivals[0][0])

    def step(self, n: int = 1) -> list[StepTrace]:
        out = []
        with self.lock:
            for _ in range(n):
                self._receive()
                if not self.engine.has_unfinished_requests():
                    break
                start = self.clock()
                trace = self.engine.step()
                self.step_starts.append(start)
                self.step_seconds.append(self.clock() - start)
                self.traces.append(trace)
                self.snapshots.append(self.engine.snapshot())
                out.append(trace)
                reason = self.engine.no_progress_reason(trace)
                if reason is not None:
                    raise RuntimeError(f"the engine is stuck at step {trace.step}: {reason}")
        return out

    def view(self, at: int | None = None) -> RunView:
        with self.lock:
            return history_view(self.meta, self.traces, self.snapshots, at, not self._has_work(), False,
                                self.comparison)

    def clock_at(self, step: int) -> float:
        """The virtual clock after ``step`` steps (0: the start)."""
        with self.lock:
            if step <= 0 or not self.step_starts:
                return 0.0
            i = min(step, len(self.step_starts)) - 1
            return self.step_starts[i] + self.step_seconds[i]

    def last_step_seconds(self, step: int) -> float | None:
        """The predicted duration of step ``step`` (1-based; None before the first)."""
        with self.lock:
            return self.step_seconds[step - 1] if 1 <= step <= len(self.step_seconds) else None

