"""The Serving-under-load page's studies: a workload served by a simulated deployment (the real
scheduler, predicted step times), per scheduling policy, and the capacity sweep.

Results are cached process-wide by the frozen inputs (``Results``), so a rerun with the
same inputs is instant and one session's run never touches another's. Every bad input is a
ValueError (or the calculator's SizingError) naming the field; the page shows it as a message.
"""
from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import streamlit as st

from app.simulated_run import SimulatedRecipe, SimulatedRun
from engine.costmodel.model import SimulatedModel, simulated_model
from engine.simulate.capacity import Capacity, find_capacity
from engine.simulate.metrics import SLO, Summary, summarize
from engine.simulate.result import RunResult
from engine.core.config import SCHEDULING_POLICIES
from engine.simulate.simulator import Progress, ServingKnobs, simulate
from engine.simulate.workload import Workload, check_rate, generate, parse_lengths, parse_workload
from engine.sizing import Settings

#: requests of the step-through run the live pages draw (a few dozen steps to click through)
STEP_REQUESTS = 12
#: requests per rate of the capacity sweep (about ten runs: kept well under a minute)
CAPACITY_REQUESTS = 100
MAX_WORKLOAD_BYTES = 8 << 20
T = TypeVar("T")


def scheduling_policies() -> tuple[str, ...]:
    """The engine's scheduling policies (``scheduling_policy``; engine/core/policies)."""
    return SCHEDULING_POLICIES


@dataclass(frozen=True)
class ServingInputs:
    """Everything a run depends on (the cache key)."""

    model: str
    hardware: str
    framework: str = "auto"
    framework_version: str = ""
    tp: int | None = None
    pp: int = 1
    rate: float = 10.0
    num_requests: int = 100
    prompt_len: str = "sharegpt"
    output_len: str = "sharegpt"
    seed: int = 0
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    time_limit_s: float = 30.0
    workload_json: str = ""  # an uploaded workload file's text ("": a generated workload)
    workload_name: str = ""

    @property
    def slo(self) -> SLO:
        return SLO(self.slo_ttft_s, self.slo_tpot_s)

    @property
    def from_file(self) -> bool:
        return bool(self.workload_json)


@st.cache_resource(show_spinner=False, max_entries=16)
def simulated(model: str, hardware: str, framework: str, framework_version: str, tp: int | None,
              pp: int) -> SimulatedModel:
    """The deployment: the calculator's model on the hardware preset, with its KV pool and cost model."""
    settings = Settings(tp=tp, pp=pp, framework=framework, framework_version=framework_version or None)
    return simulated_model(model, hardware, settings)


def deployment(inputs: ServingInputs) -> SimulatedModel:
    return simulated(inputs.model, inputs.hardware, inputs.framework, inputs.framework_version, inputs.tp, inputs.pp)


def workload_at(inputs: ServingInputs, rate: float, num_requests: int | None = None) -> Workload:
    """The generated workload at ``rate`` (the same seed at every rate: the same requests, scaled in time)."""
    prompt = parse_lengths(inputs.prompt_len, "prompt lengths", "prompt")
    output = parse_lengths(inputs.output_len, "output lengths", "output")
    return generate(num_requests or inputs.num_requests, rate, prompt, output, seed=inputs.seed)


def workload(inputs: ServingInputs) -> Workload:
    """The uploaded file's workload, or the generated one at the page's rate."""
    if inputs.from_file:
        if len(inputs.workload_json) > MAX_WORKLOAD_BYTES:
            raise ValueError(f"workload: larger than {MAX_WORKLOAD_BYTES >> 20} MiB")
        return parse_workload(inputs.workload_json, name=inputs.workload_name or "workload file")
    if isinstance(inputs.rate, (int, float)) and not math.isfinite(inputs.rate):
        raise ValueError(f"rate: must be a finite number of requests per second > 0, got {inputs.rate!r}")
    return workload_at(inputs, check_rate(inputs.rate))


def knobs(policy: str) -> ServingKnobs:
    """The serving knobs with ``policy`` as the scheduling order."""
    if policy not in SCHEDULING_POLICIES:
        raise ValueError(f"scheduling_policy: choose one of {', '.join(SCHEDULING_POLICIES)}, got {policy[:40]!r}")
    return ServingKnobs(scheduling_policy=policy)


class Results:
    """A process-wide LRU of finished results by their frozen inputs. Not ``st.cache_data``: its
    computation reports progress to a bar the page drew outside it, which Streamlit's cache cannot
    replay; the results are immutable records, so every session may share them."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.lock = threading.Lock()
        self.items: OrderedDict[Hashable, Any] = OrderedDict()

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        with self.lock:
            if key in self.items:
                self.items.move_to_end(key)
                return cast(T, self.items[key])
        value = compute()  # outside the lock: another session's run need not wait for this one
        with self.lock:
            self.items[key] = value
            while len(self.items) > self.size:
                self.items.popitem(last=False)
        return value


@st.cache_resource(show_spinner=False)
def _results() -> Results:
    return Results(64)


def cached(inputs: ServingInputs, policy: str, what: str) -> bool:
    """The result is cached (a rerun draws it without a progress bar)."""
    return (what, inputs, policy) in _results().items


def run(inputs: ServingInputs, policy: str, progress: Callable[[Progress], None] | None = None) -> RunResult:
    """``inputs``' workload on its deployment under ``policy`` (cached by inputs and policy)."""
    return _results().get(("run", inputs, policy), lambda: simulate(
        deployment(inputs), workload(inputs), knobs(policy), time_limit_s=inputs.time_limit_s, progress=progress))


def summary(result: RunResult, inputs: ServingInputs) -> Summary:
    return summarize(result, inputs.slo)


def capacity(inputs: ServingInputs, policy: str, progress: Callable[[str], None] | None = None) -> Capacity:
    """The highest rate meeting the p90 SLOs, by a rate sweep of ``CAPACITY_REQUESTS`` requests (cached)."""
    if inputs.from_file:
        raise ValueError("capacity: sweeps the rate of a generated workload; it cannot take a workload file")
    sim, k = deployment(inputs), knobs(policy)
    n = min(inputs.num_requests, CAPACITY_REQUESTS)
    return _results().get(("capacity", inputs, policy), lambda: find_capacity(
        lambda w: simulate(sim, w, k, time_limit_s=inputs.time_limit_s), lambda rate: workload_at(inputs, rate, n),
        inputs.slo, progress=progress))


def step_through(inputs: ServingInputs, policy: str) -> SimulatedRun:
    """A small run of the same deployment and workload (its first ``STEP_REQUESTS`` requests) for the
    live pages to step through (app/simulated_run.py)."""
    sim, full = deployment(inputs), workload(inputs)
    small = Workload(full.name, full.requests[:STEP_REQUESTS])
    d = sim.deployment
    title = (f"Simulated: {len(small.requests)} requests"
             + (f" of {inputs.workload_name or 'a workload file'}" if inputs.from_file else f" at {inputs.rate:g} req/s")
             + f" on {d.tp * d.pp} x {d.hardware_name}")
    return SimulatedRun(SimulatedRecipe(sim, small, knobs(policy), title))
