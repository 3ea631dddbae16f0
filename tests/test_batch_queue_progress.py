"""Issue #26 item 1: every schedule finishes every workload; preemption never livelocks.

The batch queue (pipeline_schedule="batch_queue") schedules each batch over the requests no
in-flight batch holds. It used to let the oldest running request preempt itself whenever the
newer ones were in flight, so two requests that did not fit the pool together took turns
undoing each other's progress forever (``LLM.generate`` never returned). The rule now
(Scheduler.schedule, as vLLM): a request is preempted only for an older one, and the oldest
waits for an in-flight batch rather than give up its own progress. ``ProgressWatch`` is the
backstop that turns any remaining livelock into an error instead of a hang.

Worker processes are slow to start, so each parallel engine is module-scoped and reused by
every example (its geometry fixed, the workload drawn); the single-process engine is built per
example and draws its geometry too. Every run is bounded in steps, checked every step
(``check_integrity``, the trace's accounting, the backstop silent) and its greedy outputs equal
the single-process reference run token for token.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from engine.core.config import PREFILL_SCHEDULES, SCHEDULING_POLICIES, SamplingParams
from engine.serving.llm import LLM
from engine.serving.engine import LLMEngine
from engine.model.shared import SharedModel
from engine.core.kv_cache import cdiv
from tests.test_scheduler_properties import CI, check_trace, expected_tokens, reference_tokens

pytestmark = pytest.mark.usefixtures("torch_single_thread")

# The workload of the report: 3 requests that do not fit 11 blocks of 8 tokens together.
STORY = ["Story: once upon a time gfcacecad ee deaacc    ce  fc ebgegaeca",
         "Story: once upon a time edgebaecafdgaefef ecdcbcgg cb bgbd",
         "You are a helpful bot. a ede gdgca a eddc dcddd gacac "]
STORY_MAX_TOKENS = [8, 19, 10]
STORY_KNOBS: dict[str, Any] = dict(block_size=8, num_blocks=11, max_num_batched_tokens=5)
STORY_MAX_STEPS = 300  # single process and gpipe need 68 (61 with prefix caching); it used to spin forever

# The parallel engines of the property test: p = 2, tight pools, small budgets (preemption and
# chunked prefill in most examples); geometries differ across the schedules.
PARALLEL: dict[str, dict[str, Any]] = {
    "batch_queue": dict(STORY_KNOBS, pipeline_parallel_size=2, pipeline_schedule="batch_queue"),
    "batch_queue-no-prefix-cache": dict(STORY_KNOBS, pipeline_parallel_size=2, pipeline_schedule="batch_queue",
                                        enable_prefix_caching=False),
    "gpipe-m1": dict(block_size=4, num_blocks=12, max_num_batched_tokens=7, pipeline_parallel_size=2),
    "gpipe-m2": dict(block_size=2, num_blocks=20, max_num_batched_tokens=4, max_num_seqs=3,
                     pipeline_parallel_size=2, num_microbatches=2),
}


@pytest.fixture(scope="module")
def parallel_llms() -> Iterator[dict[str, LLM]]:
    """One LLM per parallel schedule, started on first use, shut down with the module."""
    llms: dict[str, LLM] = {}

    yield llms
    for llm in llms.values():
        llm.shutdown()


def parallel_llm(llms: dict[str, LLM], name: str) -> LLM:
    if name not in llms:
        llms[name] = LLM("tiny-random", **PARALLEL[name])
    llm = llms[name]
    drain(llm.llm_engine)
    return llm


def drain(engine: LLMEngine) -> None:
    """Abort whatever a failed example left behind and retire its in-flight batches, so the
    reused engine starts the next example idle."""
    for rid, r in list(engine.requests.items()):
        if not r.is_finished and r.parent_id is None:
            engine.abort_request(rid)
    for _ in range(16):
        if not engine.has_unfinished_requests():
            return
        engine.step()
    assert not engine.has_unfinished_requests(), "could not drain the reused engine"


def step_bound(engine: LLMEngine, lengths: list[int]) -> int:
    """Steps a run may take: linear in the work (each request, once oldest, is never preempted
    and recomputes at most its whole length, a budget per schedule, at least every 2p steps)."""
    c = engine.config
    return 20 + sum(4 * c.parallel_config.pipeline_parallel_size * (cdiv(n, c.scheduler_config.max_num_batched_tokens) + 2) for n in lengths)


def run_bounded(engine: LLMEngine, max_steps: int) -> tuple[int, int]:
    """Step until idle, checking every step; -> (steps taken, preemptions). Fails past
    ``max_steps`` (instead of hanging) and when the no-progress backstop fires."""
    engine.check_integrity()
    steps = preemptions = 0
    while engine.has_unfinished_requests():
        trace = engine.step()
        engine.check_integrity()
        check_trace(engine, trace)
        assert engine.no_progress_reason(trace) is None
        preemptions += len(trace.preempted)
        steps += 1
        assert steps <= max_steps, f"not finished after {max_steps} steps: livelock or starvation"
    assert engine.kv.pool.num_used == 0 and not engine.kv.block_tables
    return steps, preemptions


def story_reference(tiny: SharedModel, **knobs: Any) -> list[tuple[int, ...]]:
    engine = LLMEngine(tiny, **STORY_KNOBS, **knobs)
    ids = [engine.add_request(p, SamplingParams(temperature=0, max_tokens=m)) for p, m in zip(STORY, STORY_MAX_TOKENS)]
    run_bounded(engine, STORY_MAX_STEPS)
    return [engine.get_output(i).outputs[0].token_ids for i in ids]


# -- the reported workload --------------------------------------------------------------------

@pytest.mark.parametrize("name", ["batch_queue", "batch_queue-no-prefix-cache"])
def test_reported_batch_queue_workload_finishes_with_single_process_outputs(tiny, parallel_llms, name: str) -> None:
    llm = parallel_llm(parallel_llms, name)
    engine = llm.llm_engine
    ids = [engine.add_request(p, SamplingParams(temperature=0, max_tokens=m)) for p, m in zip(STORY, STORY_MAX_TOKENS)]
    steps, _ = run_bounded(engine, STORY_MAX_STEPS)
    got = [engine.get_output(i).outputs[0].token_ids for i in ids]
    assert got == story_reference(tiny, enable_prefix_caching=engine.config.cache_config.enable_prefix_caching)
    assert [len(t) for t in got] == STORY_MAX_TOKENS
    assert sum(engine.requests[i].num_preemptions for i in ids) > 0, "the workload must exercise preemption"
    # And through the offline API, which used to never return.
    outs = llm.generate(STORY, [SamplingParams(temperature=0, max_tokens=m) for m in STORY_MAX_TOKENS])
    assert [o.outputs[0].token_ids for o in outs] == got
    assert steps <= STORY_MAX_STEPS


def test_a_preemption_livelock_raises_instead_of_spinning(parallel_llms, monkeypatch) -> None:
    """The backstop: with the old victim rule put back (the newest request not in flight, even
    the oldest running request itself), the reported workload livelocks; ``generate`` must
    raise a clear RuntimeError within the watch's limit instead of spinning."""
    llm = parallel_llm(parallel_llms, "batch_queue-no-prefix-cache")
    engine = llm.llm_engine
    scheduler = engine.scheduler

    def old_victim(request, running, exclude):
        return next((r for r in reversed(running) if r.request_id not in exclude), None)

    monkeypatch.setattr(scheduler.policy, "victim", old_victim)
    real_step, steps = engine.step, [0]

    def counted_step():
        steps[0] += 1
        if steps[0] > 3000:
            raise AssertionError("generate spun for 3000 steps: no backstop")
        return real_step()

    monkeypatch.setattr(engine, "step", counted_step)
    with pytest.raises(RuntimeError, match=r"no progress .*preemption livelock"):
        llm.generate(STORY, [SamplingParams(temperature=0, max_tokens=m) for m in STORY_MAX_TOKENS])
    assert steps[0] <= 100 + engine.progress.limit
    monkeypatch.undo()
    drain(engine)


# -- every schedule, random workloads -----------------------------------------------------------

@st.composite
def workloads(draw: Any, max_model_len: int, chunked: bool = True, budget: int = 1 << 20,
              ) -> list[tuple[tuple[int, ...], int, int]]:
    """1 to 4 requests (prompt, max_tokens, arrival), each a quarter to all of the context
    long, so that most workloads do not fit the pool together (preemption); a request may
    extend the previous one's prompt (prefix-cache hits). Prompts the engine would refuse are
    cut to fit."""
    out: list[tuple[tuple[int, ...], int, int]] = []
    for _ in range(draw(st.integers(1, 4))):
        max_tokens = draw(st.integers(1, 12))
        length = draw(st.integers(max(1, max_model_len // 4), max(1, max_model_len - 1)))
        prompt = tuple(draw(st.lists(st.integers(1, 255), min_size=length, max_size=length)))
        if out and draw(st.booleans()):
            prompt = out[-1][0][: draw(st.integers(1, len(out[-1][0])))] + prompt
        prompt = prompt[: max_model_len - 1] if chunked else prompt[: min(budget, max_model_len - 1)]
        out.append((prompt, max_tokens, draw(st.integers(0, 3))))
    return out


def run_workload(engine: LLMEngine, tiny: SharedModel, workload: list[tuple[tuple[int, ...], int, int]]) -> None:
    """Add the workload (arrivals relative to now), run it bounded and checked, compare."""
    refs = reference_tokens(tiny, [p for p, _, _ in workload])
    now = engine.step_count
    # Later arrivals rank first under scheduling_policy="priority" (they preempt on arrival); the
    # other policies ignore it.
    ids = [engine.add_request(list(p), SamplingParams(temperature=0, max_tokens=m), arrival_step=now + a, priority=-a)
           for p, m, a in workload]
    _, preemptions = run_bounded(engine, step_bound(engine, [len(p) + m for p, m, _ in workload]) + 4)
    if preemptions:
        event("preempted")
    for (p, m, _), rid in zip(workload, ids):
        want, reason = expected_tokens(refs[p], len(p), m, engine.max_model_len, engine.eos_token_ids)
        out = engine.get_output(rid).outputs[0]
        assert out.token_ids == want, f"{rid}: the schedule changed the greedy output"
        assert out.finish_reason == reason


@settings(max_examples=50, **CI)
@given(block_size=st.integers(1, 16), num_blocks=st.integers(1, 24), budget=st.integers(1, 24),
       max_num_seqs=st.integers(1, 4), chunked=st.booleans(), prefix=st.booleans(),
       policy=st.sampled_from(SCHEDULING_POLICIES), schedule=st.sampled_from(PREFILL_SCHEDULES), data=st.data())
def test_single_process_engine_finishes_every_workload(tiny, block_size, num_blocks, budget, max_num_seqs, chunked,
                                                       prefix, policy, schedule, data) -> None:
    """Under every scheduling policy and prefill schedule too (engine/core/policies/)."""
    engine = LLMEngine(tiny, block_size=block_size, num_blocks=max(num_blocks, cdiv(8, block_size)),
                       max_num_batched_tokens=budget, max_num_seqs=max_num_seqs, enable_chunked_prefill=chunked,
                       enable_prefix_caching=prefix, scheduling_policy=policy, prefill_schedule=schedule)
    run_workload(engine, tiny, data.draw(workloads(min(engine.max_model_len, 48), chunked, budget)))


@pytest.mark.parametrize("name", list(PARALLEL))
@settings(max_examples=10, **CI)
@given(data=st.data())
def test_parallel_schedules_finish_every_workload(tiny, parallel_llms, name: str, data) -> None:
    engine = parallel_llm(parallel_llms, name).llm_engine
    run_workload(engine, tiny, data.draw(workloads(engine.max_model_len)))
