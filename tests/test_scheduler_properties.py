"""Property tests of the scheduler and the KV cache manager under random workloads.

(a) The control plane alone: Scheduler + KVCacheManager driven by synthetic requests and a
    fake model (a fake KV pool records which request/position/token each slot holds, so a
    block handed to the wrong request, or reused while still needed, is caught on read).
(b) The real engine on tiny-random: random knobs, arrivals and aborts; integrity after every
    step; and greedy outputs equal to a reference run with a big pool and budget -- the
    scheduler decides *when* tokens are computed, never *which* tokens come out.

Hypothesis runs derandomized (fixed examples), sized for a 2-core CI machine.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from engine.core.config import EngineConfig, SamplingParams
from engine.serving.engine import LLMEngine
from engine.core.kv_cache import KVCacheManager, cdiv
from engine.core.request import Request, RequestStatus
from engine.core.scheduler import Scheduler
from tests.conftest import run_to_completion

pytestmark = pytest.mark.usefixtures("torch_single_thread")

CI = dict(deadline=None, derandomize=True, database=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])


# -- workloads ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Spec:
    prompt: tuple[int, ...]
    max_tokens: int
    arrival: int


@st.composite
def knobs(draw, max_blocks: int = 48):
    return dict(
        block_size=draw(st.integers(1, 16)),
        num_blocks=draw(st.integers(1, max_blocks)),
        max_num_batched_tokens=draw(st.integers(1, 64)),
        max_num_seqs=draw(st.integers(1, 6)),
        enable_chunked_prefill=draw(st.booleans()),
        policy=draw(st.sampled_from(["continuous", "static"])),
        enable_prefix_caching=draw(st.booleans()),
    )


def specs(max_requests: int, max_prompt: int, max_out: int, vocab: int = 256):
    spec = st.builds(
        Spec,
        prompt=st.lists(st.integers(0, vocab - 1), min_size=1, max_size=max_prompt).map(tuple),
        max_tokens=st.integers(1, max_out),
        arrival=st.integers(0, 6),
    )
    return st.lists(spec, min_size=1, max_size=max_requests)


def admissible(spec: Spec, cfg: EngineConfig, max_model_len: int) -> bool:
    """The engine's add_request rules (validated separately in test_validation.py)."""
    n = len(spec.prompt)
    if n + 1 > max_model_len:
        return False
    return cfg.scheduler_config.enable_chunked_prefill or n <= cfg.scheduler_config.max_num_batched_tokens


# -- (a) the control plane alone --------------------------------------------------------------

def fake_token(request_id: str, position: int) -> int:
    return hashlib.sha256(f"{request_id}:{position}".encode()).digest()[0]


class ControlPlane:
    """Scheduler + KVCacheManager + a fake runner that mirrors LLMEngine.step's update."""

    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        self.kv = KVCacheManager(cfg.cache_config.num_blocks, cfg.cache_config.block_size)
        self.max_model_len = cfg.cache_config.pool_tokens  # the engine caps it by the pool, too
        self.scheduler = Scheduler(cfg, self.kv, self.max_model_len)
        self.slots: dict[int, tuple[str, int, int]] = {}  # fake KV: slot -> (rid, pos, token)
        self.requests: dict[str, Request] = {}
        self.preempted: list[str] = []

    def live(self) -> list[Request]:
        return list(self.requests.values())

    def check(self) -> None:
        self.scheduler.check_integrity()
        self.kv.check_integrity(self.live())
        pool = self.kv.pool
        # free + used == total, counted independently: free = ref 0, used = held by a table.
        owned = [b for t in self.kv.block_tables.values() for b in t]
        assert len(owned) == len(set(owned)), "a block is in two block tables"
        assert sum(b.ref_count == 0 for b in pool.blocks) + len(owned) == self.cfg.cache_config.num_blocks
        assert pool.num_free == sum(b.ref_count == 0 for b in pool.blocks)
        assert len(self.scheduler.running) <= self.cfg.scheduler_config.max_num_seqs
        for r in self.scheduler.running:
            assert len(self.kv.block_tables.get(r.request_id, ())) * self.cfg.cache_config.block_size >= r.num_computed_tokens

    def step(self) -> None:
        sched, kv, cfg = self.scheduler, self.kv, self.cfg
        had_work = sched.has_work()
        running_before = [r.request_id for r in sched.running]
        waiting_before = [r.request_id for r in sched.waiting]
        out = sched.schedule()
        ids = [s.request_id for s in out.scheduled]

        # Budget, uniqueness and progress.
        assert sum(s.num_new_tokens for s in out.scheduled) == out.num_batched_tokens
        assert out.num_batched_tokens <= cfg.scheduler_config.max_num_batched_tokens
        assert len(ids) == len(set(ids))
        assert all(s.num_new_tokens >= 1 for s in out.scheduled)
        assert len(sched.running) <= cfg.scheduler_config.max_num_seqs
        if had_work:
            assert out.scheduled, "work was queued but nothing was scheduled"
        # Preemption: victims are not scheduled, and nothing is admitted in such a step.
        assert not set(out.preempted) & set(ids)
        assert list(out.preempted) == running_before[::-1][: len(out.preempted)], "victims are not newest-first"
        self.preempted.extend(out.preempted)
        admitted = [r.request_id for r in sched.running if r.request_id not in running_before]
        if out.preempted:
            assert not admitted
        # FCFS: admitted requests are a prefix of the waiting queue (no overtaking).
        assert admitted == waiting_before[: len(admitted)]
        if cfg.scheduler_config.policy == "static" and running_before:
            assert not admitted, "static policy admitted into a running batch"

        # Fake forward: read every cached position, then write this chunk's KV.
        bs = cfg.cache_config.block_size
        written: set[int] = set()
        for s in out.scheduled:
            r = self.requests[s.request_id]
            assert r.status is RequestStatus.RUNNING
            table = kv.block_tables[s.request_id]
            assert len(table) * bs >= s.start + s.num_new_tokens
            assert s.start + s.num_new_tokens <= r.num_tokens
            if not cfg.scheduler_config.enable_chunked_prefill and s.start == 0 and r.num_preemptions == 0:
                assert s.num_new_tokens == r.num_prompt_tokens, "prompt chunked with chunked prefill off"
            tokens = r.all_token_ids
            slots = kv.slot_mapping(s.request_id, 0, s.start + s.num_new_tokens)
            for pos in range(s.start):
                assert self.slots.get(slots[pos]) == (r.request_id, pos, tokens[pos]), (
                    f"{r.request_id} position {pos}: its KV slot was overwritten or never written")
            for pos in range(s.start, s.start + s.num_new_tokens):
                assert slots[pos] not in written, "two tokens write one slot in one step"
                written.add(slots[pos])
                self.slots[slots[pos]] = (r.request_id, pos, tokens[pos])

        # Update, as LLMEngine._update: sample where the chunk reached the end, stop, free.
        for s in out.scheduled:
            if s.is_prefill:
                continue
            r = self.requests[s.request_id]
            assert r.num_computed_tokens == r.num_tokens
            r.output_token_ids.append(fake_token(r.request_id, r.num_tokens))
            if len(r.output_token_ids) >= r.sampling_params.max_tokens or r.num_tokens >= self.max_model_len:
                sched.remove(r)
                r.status = RequestStatus.FINISHED
                r.finish_reason = "length"
        self.check()

    def abort(self, request: Request) -> None:
        self.scheduler.remove(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = "abort"
        self.check()


@settings(max_examples=400, **CI)
@given(cfg=knobs(max_blocks=20), workload=specs(max_requests=8, max_prompt=48, max_out=12),
       aborts=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 7)), max_size=3))
def test_control_plane_invariants_hold_every_step(cfg, workload, aborts):
    cfg = EngineConfig.from_knobs(**cfg)
    cp = ControlPlane(cfg)
    pending = [(i, s) for i, s in enumerate(workload) if admissible(s, cfg, cp.max_model_len)]
    pending.sort(key=lambda x: x[1].arrival)
    by_index: dict[int, Request] = {}
    aborts = sorted(aborts)
    step = 0
    # Generous bound: every token computed once per preemption round; it never comes close.
    bound = 50 + 4 * sum(len(s.prompt) + s.max_tokens for _, s in pending) * (len(pending) + 1)
    while pending or cp.scheduler.has_work():
        while pending and pending[0][1].arrival <= step:
            i, s = pending.pop(0)
            r = Request(f"r{i}", None, list(s.prompt), SamplingParams(temperature=0, max_tokens=s.max_tokens),
                        arrival_step=s.arrival)
            cp.requests[r.request_id] = r
            by_index[i] = r
            cp.scheduler.add(r)
        while aborts and aborts[0][0] <= step:
            _, target = aborts.pop(0)
            r = by_index.get(target)
            if r is not None and not r.is_finished:
                cp.abort(r)
        cp.step()
        step += 1
        assert step <= bound, "the workload did not finish: livelock or starvation"
    if cp.preempted:
        event("preempted")
    if any(r.finish_reason == "abort" for r in cp.requests.values()):
        event("aborted")

    for r in cp.requests.values():
        assert r.is_finished
        if r.finish_reason == "length":
            expected = min(r.sampling_params.max_tokens, cp.max_model_len - r.num_prompt_tokens)
            assert len(r.output_token_ids) == expected
    assert cp.kv.pool.num_used == 0
    assert not cp.kv.block_tables
    cp.check()


def test_control_plane_preempts_newest_and_recomputes():
    """A pool that fits one request at a time forces recompute preemption; it still finishes."""
    cfg = EngineConfig.from_knobs(block_size=2, num_blocks=4, max_num_batched_tokens=64, max_num_seqs=4)
    cp = ControlPlane(cfg)
    for i in range(3):
        r = Request(f"r{i}", None, [1 + i] * 3, SamplingParams(temperature=0, max_tokens=4))
        cp.requests[r.request_id] = r
        cp.scheduler.add(r)
    for _ in range(200):
        if not cp.scheduler.has_work():
            break
        cp.step()
    assert not cp.scheduler.has_work()
    assert cp.preempted, "this pool is too small for three requests at once: expected preemption"
    assert all(len(r.output_token_ids) == 4 for r in cp.requests.values())
    assert cp.kv.pool.num_used == 0


# -- (b) the real engine on tiny-random -----------------------------------------------------

_REFERENCE: dict[tuple[int, ...], tuple[int, ...]] = {}
REF_MAX_TOKENS = 16


def reference_tokens(tiny, prompts: list[tuple[int, ...]]) -> dict[tuple[int, ...], tuple[int, ...]]:
    """Greedy outputs from an engine with room for everything at once (computed once per prompt)."""
    missing = sorted({p for p in prompts if p not in _REFERENCE})
    if missing:
        engine = LLMEngine(tiny, block_size=16, num_blocks=1024, max_num_batched_tokens=8192,
                           max_num_seqs=256)
        ids = {p: engine.add_request(list(p), SamplingParams(temperature=0, max_tokens=REF_MAX_TOKENS))
               for p in missing}
        run_to_completion(engine)
        for p, rid in ids.items():
            _REFERENCE[p] = engine.get_output(rid).outputs[0].token_ids
    return {p: _REFERENCE[p] for p in prompts}


def expected_tokens(ref: tuple[int, ...], prompt_len: int, max_tokens: int, max_model_len: int,
                    eos: frozenset[int]) -> tuple[tuple[int, ...], str]:
    """Cut a reference continuation where this run must stop: EOS, max_tokens or the context."""
    limit = min(max_tokens, max_model_len - prompt_len)
    assert limit <= REF_MAX_TOKENS
    out = ref[:limit]
    for i, t in enumerate(out):
        if t in eos:
            return out[: i + 1], "stop"
    assert len(out) == limit, "the reference stopped early without EOS"
    return out, "length"


def check_trace(engine: LLMEngine, trace) -> None:
    cfg = engine.config
    assert trace.num_batched_tokens == sum(c.num_tokens for c in trace.scheduled)
    assert trace.num_batched_tokens <= cfg.scheduler_config.max_num_batched_tokens
    assert trace.num_running <= cfg.scheduler_config.max_num_seqs
    assert len({c.request_id for c in trace.scheduled}) == len(trace.scheduled)
    assert all(c.num_tokens >= 1 for c in trace.scheduled)
    assert not set(trace.preempted) & {c.request_id for c in trace.scheduled}
    # free + used + cached-evictable == total, counted independently: used = blocks held by a
    # table; only prefix-cache blocks may be in two tables.
    owned = [b for t in engine.kv.block_tables.values() for b in t]
    shared = {b for b in owned if owned.count(b) > 1}
    assert all(engine.kv.pool.blocks[b].cached for b in shared), "an uncached block is in two block tables"
    evictable = sum(1 for b in engine.kv.pool.blocks if b.cached and b.block_id not in set(owned))
    assert trace.num_used_blocks == len(set(owned))
    assert trace.num_evictable_blocks == evictable
    assert trace.num_free_blocks + len(set(owned)) + evictable == cfg.cache_config.num_blocks
    assert set(trace.finished) <= {r for r, q in engine.requests.items() if q.is_finished}


@settings(max_examples=100, **CI)
@given(cfg=knobs(max_blocks=16), workload=specs(max_requests=6, max_prompt=24, max_out=REF_MAX_TOKENS),
       aborts=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 4)), max_size=2))
def test_engine_with_random_knobs_and_aborts_matches_reference(tiny, cfg, workload, aborts):
    engine = LLMEngine(tiny, **cfg)
    specs_ok = [(i, s) for i, s in enumerate(workload) if admissible(s, engine.config, engine.max_model_len)]
    refs = reference_tokens(tiny, [s.prompt for _, s in specs_ok])
    ids = {}
    for i, s in specs_ok:
        ids[i] = engine.add_request(list(s.prompt), SamplingParams(temperature=0, max_tokens=s.max_tokens),
                                    request_id=f"r{i}", arrival_step=s.arrival)
    engine.check_integrity()
    aborts = sorted(aborts)
    aborted = set()
    steps = 0
    bound = 50 + 4 * sum(len(s.prompt) + s.max_tokens for _, s in specs_ok) * (len(specs_ok) + 1)
    while engine.has_unfinished_requests():
        while aborts and aborts[0][0] <= steps:
            _, target = aborts.pop(0)
            if target in ids and not engine.requests[ids[target]].is_finished:
                engine.abort_request(ids[target])
                aborted.add(ids[target])
                event("aborted")
                engine.check_integrity()
        trace = engine.step()
        engine.check_integrity()
        check_trace(engine, trace)
        if trace.preempted:
            event("preempted")
        steps += 1
        assert steps <= bound, "the workload did not finish: livelock or starvation"

    assert engine.kv.pool.num_used == 0
    assert not engine.kv.block_tables
    for i, s in specs_ok:
        out = engine.get_output(ids[i])
        assert out.finished
        got = out.outputs[0].token_ids
        want, reason = expected_tokens(refs[s.prompt], len(s.prompt), s.max_tokens, engine.max_model_len,
                                       engine.eos_token_ids)
        if ids[i] in aborted:
            assert out.outputs[0].finish_reason == "abort"
            assert got == want[: len(got)], f"aborted {ids[i]}: tokens diverged from the reference"
        else:
            assert got == want, f"{ids[i]} with {cfg}: scheduler changed the greedy output"
            assert out.outputs[0].finish_reason == reason


@settings(max_examples=60, **CI)
@given(block_size=st.integers(1, 16), budget=st.integers(1, 64), max_num_seqs=st.integers(1, 8),
       chunked=st.booleans(), policy=st.sampled_from(["continuous", "static"]),
       room=st.integers(0, 100),
       workload=specs(max_requests=6, max_prompt=24, max_out=REF_MAX_TOKENS))
def test_greedy_outputs_do_not_depend_on_the_schedule(tiny, block_size, budget, max_num_seqs, chunked,
                                                      policy, room, workload):
    """Pools from "just the longest request" (constant preemption, room=0) to "everything fits"."""
    longest = max(len(s.prompt) + s.max_tokens for s in workload)
    total = sum(len(s.prompt) + s.max_tokens for s in workload)
    num_blocks = cdiv(longest + (total - longest) * room // 100, block_size)
    engine = LLMEngine(tiny, block_size=block_size, num_blocks=num_blocks, max_num_batched_tokens=budget,
                       max_num_seqs=max_num_seqs, enable_chunked_prefill=chunked, policy=policy)
    assert engine.max_model_len >= longest
    ok = [(i, s) for i, s in enumerate(workload) if admissible(s, engine.config, engine.max_model_len)]
    refs = reference_tokens(tiny, [s.prompt for _, s in ok])
    ids = {i: engine.add_request(list(s.prompt), SamplingParams(temperature=0, max_tokens=s.max_tokens),
                                 arrival_step=s.arrival) for i, s in ok}
    steps = 0
    while engine.has_unfinished_requests():
        trace = engine.step()
        check_trace(engine, trace)
        engine.check_integrity()
        if trace.preempted:
            event("preempted")
        steps += 1
        assert steps <= 10_000
    assert engine.kv.pool.num_used == 0
    for i, s in ok:
        want, reason = expected_tokens(refs[s.prompt], len(s.prompt), s.max_tokens, engine.max_model_len,
                                       engine.eos_token_ids)
        out = engine.get_output(ids[i]).outputs[0]
        assert out.token_ids == want
        assert out.finish_reason == reason


def test_preemption_is_exercised_and_outputs_still_match(tiny):
    """A deterministic case the property tests must cover: heavy recompute preemption."""
    prompts = [tuple(range(10 + i, 30 + i)) for i in range(4)]
    refs = reference_tokens(tiny, prompts)
    engine = LLMEngine(tiny, block_size=4, num_blocks=12, max_num_batched_tokens=16, max_num_seqs=4)
    ids = [engine.add_request(list(p), SamplingParams(temperature=0, max_tokens=REF_MAX_TOKENS)) for p in prompts]
    traces = run_to_completion(engine)
    assert any(t.preempted for t in traces), "expected preemption with 48 KV slots for 4 x 36 tokens"
    assert any(c.resumed for t in traces for c in t.scheduled)
    assert sum(engine.requests[i].num_preemptions for i in ids) >= 1
    for p, rid in zip(prompts, ids):
        want, _ = expected_tokens(refs[p], len(p), REF_MAX_TOKENS, engine.max_model_len, engine.eos_token_ids)
        assert engine.get_output(rid).outputs[0].token_ids == want
    assert engine.kv.pool.num_used == 0


def test_static_policy_never_chunks_a_prompt_when_chunked_prefill_is_off(tiny):
    """Minimal case found by the control-plane property test: the static policy admits a whole
    batch at once (requests that got no budget join with 0 tokens), and the next step's
    running loop must not then split their prompts to fit what is left of the budget."""
    engine = LLMEngine(tiny, policy="static", enable_chunked_prefill=False, max_num_batched_tokens=4,
                       max_num_seqs=3)
    prompts = [[1, 2], [3, 4, 5], [6, 7, 8]]
    ids = [engine.add_request(p, SamplingParams(temperature=0, max_tokens=1)) for p in prompts]
    traces = run_to_completion(engine)
    lengths = dict(zip(ids, map(len, prompts)))
    for t in traces:
        for c in t.scheduled:
            if c.start == 0:
                assert c.num_tokens == lengths[c.request_id], (
                    f"step {t.step}: prompt of {c.request_id} chunked ({c.num_tokens} of "
                    f"{lengths[c.request_id]} tokens) with enable_chunked_prefill=False")
