"""Several engine instances on one timeline: disaggregated prefill/decode against colocation.

    disaggregated (DistServe, Splitwise): P prefill instances run each prompt and its first
        token; the prompt's KV then travels over the link to one of D decode instances, which
        generates the rest. Prefills never stall decodes; each request pays a transfer.
    colocated: P + D instances, each running prefill and decode, requests spread round robin.

Every instance is a real engine with a simulated runner and its own virtual clock. The loop
always steps the instance whose clock is earliest (among those with work), after handing every
instance the requests due by then; an idle instance's clock jumps to its next delivery. A
request delivered while its instance is mid-step waits for the step's end (as a real engine's
would), so deliveries are exact to one step.

A decode instance receives prompt + first token, with the prompt's KV marked transferred
(``SimulatedRunner.imported``): its blocks are allocated, its positions cost nothing, and
only the first token is computed before decoding goes on. Decode instances get a token budget
of a whole context, so an arriving prompt's KV never waits for budget (vLLM's P/D connectors
load KV outside the step's token budget).
"""
from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from engine.core.config import SamplingParams
from engine.costmodel.clock import VirtualClock
from engine.costmodel.model import SimulatedModel
from engine.costmodel.runner import SimulatedRunner
from engine.serving.engine import LLMEngine
from engine.simulate.result import RequestRecord, RunResult, StepSample
from engine.simulate.simulator import Progress, ServingKnobs, prepare_workload, simulated_engine, step_sample
from engine.simulate.workload import Workload

Role = Literal["prefill", "decode", "both"]
#: latency of one KV transfer besides its bytes (connection setup, a handshake): an assumption
KV_TRANSFER_LATENCY_S = 1e-4


@dataclass
class _Instance:
    role: Role
    engine: LLMEngine
    clock: VirtualClock
    inbox: list[tuple[float, int, int]]  # heap of (due time, seq, request index)
    steps: list[StepSample]

    def busy(self) -> bool:
        return self.engine.has_unfinished_requests()

    @property
    def runner(self) -> SimulatedRunner:
        runner = self.engine.runner
        assert isinstance(runner, SimulatedRunner)
        return runner


def kv_transfer_seconds(sim: SimulatedModel, tokens: int, link_bytes_per_s: float) -> float:
    """A prompt's KV (every layer) over the link between a prefill and a decode instance."""
    return KV_TRANSFER_LATENCY_S + tokens * sim.deployment.kv_bytes_per_token / link_bytes_per_s


def _instances(sim: SimulatedModel, roles: Sequence[Role], knobs: ServingKnobs) -> list[_Instance]:
    out = []
    for role in roles:
        k = knobs if role != "decode" else replace(knobs, max_num_batched_tokens=sim.deployment.max_model_len)
        engine, clock = simulated_engine(sim, k)
        out.append(_Instance(role, engine, clock, [], []))
    return out


def _params(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def run_cluster(sim: SimulatedModel, workload: Workload, roles: Sequence[Role], knobs: ServingKnobs = ServingKnobs(),
                *, link_bytes_per_s: float | None = None, time_limit_s: float | None = None,
                progress: Callable[[Progress], None] | None = None, label: str = "",
                after_step: Callable[[LLMEngine], None] | None = None) -> RunResult:
    """Serve ``workload`` on instances of ``sim`` with these roles (module doc) -> one RunResult."""
    if not roles or ("prefill" in roles) != ("decode" in roles) or ("both" in roles and "prefill" in roles):
        raise ValueError("instances: prefill and decode instances together (disaggregated), or 'both' instances")
    link = link_bytes_per_s or sim.deployment.link_bytes_per_s
    if not (math.isfinite(link) and link > 0):
        raise ValueError(f"kv_link: must be a bandwidth > 0 bytes/s, got {link!r}")
    inst = _instances(sim, roles, knobs)
    prompts = [p.token_ids for p in prepare_workload(inst[0].engine, workload)]  # checked and tokenized once
    front = [k for k, x in enumerate(inst) if x.role != "decode"]
    back = [k for k, x in enumerate(inst) if x.role == "decode"]
    reqs = workload.requests
    n = len(reqs)
    first: dict[int, tuple[int, str]] = {}  # request -> (its front instance, its id there)
    second: dict[int, tuple[int, str]] = {}  # request -> (its decode instance, its id there)
    done_front: set[int] = set()
    seq = 0
    for i, r in enumerate(reqs):  # round robin over the instances that take arrivals
        heapq.heappush(inst[front[i % len(front)]].inbox, (r.arrival_s + sim.serving.frontend_s, seq, i))
        seq += 1
    wall0 = last = time.perf_counter()
    partial = False
    finished = 0
    while True:
        busy = [x for x in inst if x.busy()]
        t = min((x.clock() for x in busy), default=math.inf)
        due = min((x.inbox[0][0] for x in inst if x.inbox), default=math.inf)
        if not busy and due == math.inf:
            break
        if not busy:  # everyone idle: jump to the next delivery
            t = due
        for k, x in enumerate(inst):  # deliver what is due by t
            while x.inbox and x.inbox[0][0] <= max(t, x.clock()):
                at, _, i = heapq.heappop(x.inbox)
                if not x.busy():
                    x.clock.wait_until(at)
                r = reqs[i]
                if x.role == "decode":
                    ids = [*prompts[i], 0]
                    rid = x.engine.add_request(ids, _params(r.max_tokens - 1), f"r{i}", priority=r.priority,
                                               arrival_time=r.arrival_s)
                    x.runner.imported[rid] = len(ids) - 1
                    second[i] = (k, rid)
                else:
                    tokens = 1 if x.role == "prefill" else r.max_tokens
                    first[i] = (k, x.engine.add_request(prompts[i], _params(tokens), f"r{i}",
                                                        priority=r.priority, arrival_time=r.arrival_s))
        busy = [x for x in inst if x.busy()]
        if not busy:
            continue
        x = min(busy, key=lambda y: y.clock())
        start = x.clock()
        trace = x.engine.step()
        x.steps.append(step_sample(start, x.clock(), trace))
        if after_step is not None:
            after_step(x.engine)
        for rid in trace.finished:
            i = int(rid[1:])
            if x.role == "prefill" and reqs[i].max_tokens > 1 and i not in done_front:
                done_front.add(i)
                target = min(back, key=lambda b: len(inst[b].engine.scheduler.running) + len(inst[b].inbox)
                             + len(inst[b].engine.scheduler.waiting))
                heapq.heappush(inst[target].inbox,
                               (x.clock() + kv_transfer_seconds(sim, len(prompts[i]), link), seq, i))
                seq += 1
            else:
                finished += 1
        wall = time.perf_counter()
        if progress is not None and wall - last >= 0.25:
            progress(Progress(finished, n, start, wall - wall0))
            last = wall
        if time_limit_s is not None and wall - wall0 > time_limit_s:
            partial = True
            break
    records = tuple(_record(inst, reqs[i].arrival_s, i, first.get(i), second.get(i)) for i in range(n))
    steps = tuple(sorted((s for x in inst for s in x.steps), key=lambda s: s.start_s))
    blocks = sum(x.engine.config.cache_config.num_blocks for x in inst)
    return RunResult(label or _label(sim, roles), True, records, steps, blocks * sim.deployment.block_size, blocks,
                     partial, time.perf_counter() - wall0)


def _record(inst: list[_Instance], arrival: float, i: int, first: tuple[int, str] | None,
            second: tuple[int, str] | None) -> RequestRecord:
    if first is None:
        return RequestRecord(f"r{i}", arrival, None, None, 0, 0, 0, 0)
    a = inst[first[0]].engine.requests[first[1]]
    if second is None:  # colocated, a one-token request, or its KV still on the way
        whole = inst[first[0]].role == "both" or a.sampling_params.max_tokens == 1
        return RequestRecord(f"r{i}", arrival, a.first_token_time, a.finished_time if whole else None,
                             a.num_prompt_tokens, len(a.output_token_ids), a.num_cached_tokens or 0, a.num_preemptions)
    b = inst[second[0]].engine.requests[second[1]]
    return RequestRecord(f"r{i}", arrival, a.first_token_time, b.finished_time, a.num_prompt_tokens,
                         1 + len(b.output_token_ids), a.num_cached_tokens or 0, a.num_preemptions + b.num_preemptions)


def _label(sim: SimulatedModel, roles: Sequence[Role]) -> str:
    p, d, c = (sum(1 for r in roles if r == k) for k in ("prefill", "decode", "both"))
    where = f"{sim.deployment.tp * sim.deployment.pp} x {sim.deployment.hardware_name} each"
    return (f"disaggregated: {p} prefill + {d} decode instances ({where})" if p
            else f"colocated: {c} instances ({where})")


def disaggregated(sim: SimulatedModel, workload: Workload, prefill: int, decode: int,
                  knobs: ServingKnobs = ServingKnobs(), *, link_bytes_per_s: float | None = None,
                  time_limit_s: float | None = None,
                  after_step: Callable[[LLMEngine], None] | None = None) -> RunResult:
    """``prefill`` prefill instances and ``decode`` decode instances of ``sim``'s deployment."""
    _check_count("prefill", prefill)
    _check_count("decode", decode)
    pre: list[Role] = ["prefill"]
    dec: list[Role] = ["decode"]
    roles = pre * prefill + dec * decode
    return run_cluster(sim, workload, roles, knobs, link_bytes_per_s=link_bytes_per_s, time_limit_s=time_limit_s,
                       after_step=after_step)


def colocated(sim: SimulatedModel, workload: Workload, instances: int, knobs: ServingKnobs = ServingKnobs(), *,
              time_limit_s: float | None = None, after_step: Callable[[LLMEngine], None] | None = None) -> RunResult:
    """``instances`` instances of ``sim``'s deployment, each serving prefill and decode."""
    _check_count("instances", instances)
    roles: list[Role] = ["both"] * instances
    return run_cluster(sim, workload, roles, knobs, time_limit_s=time_limit_s, after_step=after_step)


MAX_INSTANCES = 64


def _check_count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_INSTANCES:
        raise ValueError(f"{name}: must be a whole number of instances 1 .. {MAX_INSTANCES}, got {value!r}")
