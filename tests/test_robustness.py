"""Regression tests for issue 7's engine defects: a failed step never leaves the engine hung,
every knob has an upper bound that memory allows, arrivals have a horizon, ``LLM.generate``
waits only on its own requests and never loops forever, and bad inputs are ValueErrors.

Each test here failed before its fix (see the commit that adds it).
"""
from __future__ import annotations

import pytest

import engine.core.scheduler as scheduler_module
import torch

import engine.serving.limits as limits_module
import engine.core.sampling as sampling_module
from engine.core.config import (MAX_NUM_BLOCKS, MAX_TOKENS, SAMPLING_EPS, EngineConfig, SamplingParams)
from engine.serving.llm import LLM
from engine.serving.limits import MAX_ARRIVAL_HORIZON
from engine.serving.engine import LLMEngine
from engine.core.request import RequestStatus
from engine.core.sampling import apply_top_k_top_p
from tests.conftest import run_to_completion
from tests.fuzz.harness import time_limit
from tests.test_validation import GOOD_PARAMS, GOOD_PROMPT, assert_rejected_cleanly, clean_tokens

pytestmark = pytest.mark.usefixtures("torch_single_thread")

SEEDED = SamplingParams(temperature=1.0, max_tokens=10, seed=5, ignore_eos=True)


def request_fields(engine: LLMEngine) -> dict[str, tuple]:
    """Every per-request field a step may change, for exact before/after comparisons."""
    return {rid: (r.status, r.num_computed_tokens, tuple(r.output_token_ids), r.num_preemptions,
                  r.finish_reason, r.first_scheduled_step, r.first_token_step,
                  tuple(engine.kv.block_tables.get(rid, ())))
            for rid, r in engine.requests.items()}


def engine_state(engine: LLMEngine) -> tuple:
    return (engine.snapshot(), request_fields(engine), engine.step_count,
            [r.request_id for r in engine.scheduler.waiting], [r.request_id for r in engine.scheduler.running],
            [r.request_id for r in engine.pending], list(engine.kv.pool.free_queue))


def two_request_engine(tiny, **knobs) -> tuple[LLMEngine, str, str]:
    engine = LLMEngine(tiny, **knobs)
    a = engine.add_request(GOOD_PROMPT, GOOD_PARAMS, request_id="greedy")
    b = engine.add_request("Seeded prompt", SEEDED, request_id="seeded")
    engine.add_request("late", GOOD_PARAMS, request_id="late", arrival_step=3)
    return engine, a, b


def clean_run(tiny, **knobs) -> dict[str, tuple[int, ...]]:
    engine, _, _ = two_request_engine(tiny, **knobs)
    run_to_completion(engine)
    return {rid: engine.get_output(rid).outputs[0].token_ids for rid in engine.requests}


# -- 1. a failed step -------------------------------------------------------------------------

def test_tiny_top_p_no_longer_fails_and_the_llm_stays_usable(tiny):
    """The reported hang: top_p=1e-300 raised from sampling, then every generate spun forever."""
    llm = LLM(tiny)
    with time_limit(20):
        (out,) = llm.generate(["Hi"], SamplingParams(temperature=1.0, top_p=1e-300, max_tokens=6, seed=1))
        (again,) = llm.generate(["Hi"], SamplingParams(temperature=0, max_tokens=6))
    assert out.finished and again.finished
    assert out.outputs[0].token_ids == again.outputs[0].token_ids  # top-p keeps only the top token
    llm.llm_engine.check_integrity()


def test_top_p_always_keeps_the_top_token():
    logits = torch.tensor([0.3, 2.0, -1.0, 1.9])
    for top_p in (1e-300, 1e-12, 0.01):
        kept = torch.isfinite(apply_top_k_top_p(logits, 0, top_p)).nonzero().flatten().tolist()
        assert kept == [1], top_p


@pytest.mark.parametrize("failure", [RuntimeError("boom"), KeyboardInterrupt(), MemoryError()],
                         ids=["RuntimeError", "KeyboardInterrupt", "MemoryError"])
@pytest.mark.parametrize("where", ["schedule", "execute", "update"])
def test_a_failed_step_leaves_every_request_as_before(tiny, monkeypatch, where, failure):
    """Rule: a step that raises is rolled back (requests, queues, block tables, free list,
    generators, step count), then the exception propagates; the next step redoes it exactly."""
    knobs = {"block_size": 4, "num_blocks": 12, "max_num_batched_tokens": 8}
    expected = clean_run(tiny, **knobs)
    engine, _, _ = two_request_engine(tiny, **knobs)
    for _ in range(3):  # the failing step is step 3, where "late" arrives
        engine.step()
    assert [r.request_id for r in engine.pending] == ["late"]
    before = engine_state(engine)
    target = {"schedule": (engine.scheduler, "schedule"), "execute": (engine.runner, "execute"),
              "update": (scheduler_module, "check_stop")}[where]
    original = getattr(*target)

    def fail_once(*args, **kwargs):
        monkeypatch.setattr(*target, original)
        raise failure

    monkeypatch.setattr(*target, fail_once)
    with pytest.raises(type(failure)):
        engine.step()
    assert engine_state(engine) == before
    engine.check_integrity()
    run_to_completion(engine)
    assert {rid: engine.get_output(rid).outputs[0].token_ids for rid in engine.requests} == expected


def test_block_pool_rollback_restores_ref_counts_and_free_queue_order():
    """allocate / cache / touch (reviving an evictable cached block, as a prefix hit does) /
    evict / free, then rollback: ref counts, cached flags and the free queue's order as before."""
    from engine.core.block_pool import BlockPool

    pool = BlockPool(8)
    held = pool.allocate(4)
    pool.mark_cached([held[1], held[3]])
    pool.free([held[1], held[3]])  # both evictable now
    state = lambda: ([b.ref_count for b in pool.blocks], [b.cached for b in pool.blocks],  # noqa: E731
                     list(pool.free_queue), pool.num_evictable)
    before = state()
    pool.begin()
    new = pool.allocate(2)
    pool.touch([held[1], held[0]])  # held[1] is revived from the evictable set
    pool.evict_cached([held[3]])  # back to the free queue
    pool.mark_cached([new[0]])
    pool.free([held[2], *new, held[0]])
    pool.rollback()
    assert state() == before
    pool.check_integrity()
    assert pool.journal is None


def test_a_sampling_failure_finishes_only_that_request_with_error(tiny, monkeypatch):
    """Rule: an error attributable to one request (its sampling) finishes it with
    finish_reason="error" and frees its blocks; the rest of the step completes."""
    expected = clean_run(tiny)
    original = sampling_module.sample_one

    def fail_for_seed_5(logits, params, generator):
        if params.seed == 5:
            raise RuntimeError("sampler exploded")
        return original(logits, params, generator)

    monkeypatch.setattr(sampling_module, "sample_one", fail_for_seed_5)
    engine, greedy, seeded = two_request_engine(tiny)
    traces = run_to_completion(engine)
    out = engine.get_output(seeded)
    assert out.finished and out.outputs[0].finish_reason == "error"
    assert "sampler exploded" in (out.outputs[0].error or "")
    assert any(seeded in t.finished for t in traces)
    assert engine.get_output(greedy).outputs[0].token_ids == expected[greedy]
    assert engine.get_output("late").outputs[0].token_ids == expected["late"]
    assert engine.kv.pool.num_used == 0


def test_non_finite_logits_finish_the_request_with_error(tiny, monkeypatch):
    """NaN logits never become a token (greedy argmax would silently pick one)."""
    engine = LLMEngine(tiny)
    rid = engine.add_request(GOOD_PROMPT, GOOD_PARAMS)
    original = engine.runner.execute

    def nan_logits(batch):
        return original(batch) * float("nan")

    monkeypatch.setattr(engine.runner, "execute", nan_logits)
    run_to_completion(engine)
    out = engine.get_output(rid).outputs[0]
    assert out.finish_reason == "error" and out.token_ids == () and "logits" in (out.error or "")


def test_check_integrity_detects_a_running_request_with_nothing_to_schedule(tiny):
    engine = LLMEngine(tiny)
    engine.add_request(GOOD_PROMPT, GOOD_PARAMS, request_id="r")
    engine.step()
    r = engine.requests["r"]
    r.num_computed_tokens = r.num_tokens  # the hung state: nothing left to compute, nothing sampled
    with pytest.raises(AssertionError, match="nothing to schedule"):
        engine.check_integrity()


def test_check_integrity_detects_a_lost_request(tiny):
    engine = LLMEngine(tiny, max_num_seqs=1)
    engine.add_request(GOOD_PROMPT, GOOD_PARAMS, request_id="a")
    engine.add_request(GOOD_PROMPT, GOOD_PARAMS, request_id="b")
    engine.step()
    engine.scheduler.waiting.remove(engine.requests["b"])  # in no queue, not finished: never runs
    with pytest.raises(AssertionError, match="in no queue"):
        engine.check_integrity()


def test_generate_raises_instead_of_spinning_when_no_step_makes_progress(tiny, monkeypatch):
    llm = LLM(tiny)
    engine = llm.llm_engine
    empty = engine.scheduler.schedule.__func__

    def schedule_nothing(self):
        out = empty(self)
        for s in out.scheduled:  # undo: a scheduler bug that schedules nothing, forever
            self_request = engine.requests[s.request_id]
            self_request.num_computed_tokens = s.start
        return type(out)((), (), 0)

    monkeypatch.setattr(engine.scheduler, "schedule", schedule_nothing.__get__(engine.scheduler))
    with time_limit(20), pytest.raises(RuntimeError, match="no progress"):
        llm.generate(["Hi"], GOOD_PARAMS)
    assert not engine.has_unfinished_requests()  # generate aborted what it had added


# -- 4. arrivals ------------------------------------------------------------------------------

def test_far_arrival_is_rejected_naming_arrival_step(tiny):
    assert_rejected_cleanly(tiny, lambda e: e.add_request("hi", arrival_step=10 ** 18), "arrival_step")
    engine = LLMEngine(tiny)
    engine.add_request("hi", arrival_step=MAX_ARRIVAL_HORIZON)  # exactly the horizon: fine
    with pytest.raises(ValueError, match="arrival_step"):
        engine.add_request("hi", arrival_step=MAX_ARRIVAL_HORIZON + 1)


def test_generate_does_not_wait_on_requests_it_did_not_add(tiny):
    llm = LLM(tiny)
    engine = llm.llm_engine
    engine.add_request("later", GOOD_PARAMS, request_id="later", arrival_step=MAX_ARRIVAL_HORIZON)
    with time_limit(20):
        (out,) = llm.generate([GOOD_PROMPT], GOOD_PARAMS)
    assert out.outputs[0].token_ids == clean_tokens(tiny, {})
    assert engine.step_count < 50
    assert engine.requests["later"].status is RequestStatus.PENDING


# -- 2. SamplingParams ------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, field", [
    ({"stop": 5}, "stop"), ({"stop": {"a"}}, "stop"), ({"stop": ["a", 3]}, "stop"), ({"stop": b"x"}, "stop"),
    ({"stop": ""}, "stop"), ({"seed": 2 ** 63}, "seed"), ({"seed": 1.0}, "seed"), ({"ignore_eos": "yes"}, "ignore_eos"),
    ({"ignore_eos": 1}, "ignore_eos"), ({"temperature": float("inf")}, "temperature"),
    ({"temperature": "1"}, "temperature"), ({"top_p": float("nan")}, "top_p"), ({"top_k": -1}, "top_k"),
    ({"max_tokens": MAX_TOKENS + 1}, "max_tokens"),
])
def test_sampling_params_reject_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_stop_none_means_no_stop_strings():
    assert SamplingParams(stop=None).stop == ()
    assert SamplingParams(stop="ab").stop == ("ab",)
    assert SamplingParams(stop=("a", "b")).stop == ("a", "b")


def test_tiny_temperature_is_greedy(tiny):
    """0 < temperature < SAMPLING_EPS (1e-5, vLLM's _SAMPLING_EPS) samples greedily."""
    assert SamplingParams(temperature=SAMPLING_EPS / 2).greedy
    assert not SamplingParams(temperature=SAMPLING_EPS).greedy
    llm = LLM(tiny)
    (out,) = llm.generate([GOOD_PROMPT], SamplingParams(temperature=1e-9, max_tokens=12, ignore_eos=True))
    assert out.outputs[0].token_ids == clean_tokens(tiny, {})


def test_the_largest_seed_and_engine_seed_work(tiny):
    engine = LLMEngine(tiny, seed=2 ** 63 - 1)
    rid = engine.add_request("hi", SamplingParams(temperature=1.0, max_tokens=3, ignore_eos=True))
    engine.add_request("hi", SamplingParams(temperature=1.0, max_tokens=3, seed=2 ** 63 - 1, ignore_eos=True))
    run_to_completion(engine)
    assert len(engine.get_output(rid).outputs[0].token_ids) == 3
    with pytest.raises(ValueError, match="seed"):
        EngineConfig(seed=2 ** 63)


# -- 3. upper bounds --------------------------------------------------------------------------

@pytest.mark.parametrize("knob, value", [("num_blocks", 10 ** 9), ("num_blocks", MAX_NUM_BLOCKS + 1),
                                         ("max_num_batched_tokens", 10 ** 12), ("max_num_seqs", 10 ** 9),
                                         ("max_model_len", 10 ** 15), ("block_size", 10 ** 6)])
def test_huge_knobs_are_rejected_at_once(knob, value):
    with time_limit(5), pytest.raises(ValueError, match=knob):
        EngineConfig.from_knobs(**{knob: value})


def test_memory_check_refuses_before_allocating(tiny, monkeypatch):
    monkeypatch.setattr(limits_module, "available_memory_bytes", lambda: 64 * 2 ** 20)
    with time_limit(5), pytest.raises(ValueError) as info:
        LLMEngine(tiny, num_blocks=MAX_NUM_BLOCKS, block_size=256)
    message = str(info.value)
    assert "num_blocks" in message and "need" in message and "available" in message and "MiB" in message
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        LLMEngine(tiny, max_num_batched_tokens=2 ** 20)
    monkeypatch.setattr(limits_module, "available_memory_bytes", lambda: 256 * 2 ** 20)
    LLMEngine(tiny)  # the defaults fit in half of 256 MiB for the tiny model
    monkeypatch.setattr(limits_module, "available_memory_bytes", lambda: None)
    LLMEngine(tiny, max_num_batched_tokens=2 ** 20)  # memory unknown: the hard caps alone apply


# -- 5. inputs that used to be TypeError / AttributeError / hangs -------------------------------

@pytest.mark.parametrize("prompts", [None, 123, 1.5, {"a"}, frozenset({"a"}), {"a": 1}, {"a": 1}.keys(), object()],
                         ids=["None", "int", "float", "set", "frozenset", "dict", "dict keys", "object"])
def test_generate_rejects_what_is_not_a_prompt_list(tiny, prompts):
    llm = LLM(tiny)
    with pytest.raises(ValueError, match="prompts"):
        llm.generate(prompts, GOOD_PARAMS)
    assert not llm.llm_engine.requests


def test_generate_materialises_a_generator_and_keeps_its_order(tiny):
    llm = LLM(tiny)
    outs = llm.generate((p for p in [GOOD_PROMPT, "second"]), GOOD_PARAMS)
    assert [o.prompt for o in outs] == [GOOD_PROMPT, "second"]
    assert outs[0].outputs[0].token_ids == clean_tokens(tiny, {})
    assert llm.generate([], GOOD_PARAMS) == []


def test_engine_config_must_be_an_engine_config(tiny):
    with pytest.raises(ValueError, match="config"):
        LLMEngine(tiny, config={"block_size": 4})


@pytest.mark.parametrize("bad", [["a"], 3, None, b"x"], ids=["list", "int", "None", "bytes"])
def test_request_id_lookups_reject_non_strings(tiny, bad):
    assert_rejected_cleanly(tiny, lambda e: e.abort_request(bad), "request_id")
    assert_rejected_cleanly(tiny, lambda e: e.get_output(bad), "request_id")


@pytest.mark.parametrize("prompt", ["\ud800", "ok \udfff then"])
def test_lone_surrogates_are_rejected_naming_prompt(tiny, prompt):
    assert_rejected_cleanly(tiny, lambda e: e.add_request(prompt), "prompt")
    llm = LLM(tiny)
    with pytest.raises(ValueError, match="prompt"):
        llm.generate(["fine", prompt])
    assert not llm.llm_engine.requests


# -- 3. the page's knobs ----------------------------------------------------------------------

@pytest.mark.parametrize("value", [10 ** 9, MAX_NUM_BLOCKS])
def test_page_knob_beyond_memory_is_a_message(monkeypatch, value):
    """The sidebar's num_blocks: 10**9 is beyond the widget's max (the engine's hard cap), and
    the cap itself with too little memory is the engine's refusal, shown as a message."""
    from app.session import K
    from tests.test_live_app import KV_CACHE, errors, open_app

    monkeypatch.setattr(limits_module, "available_memory_bytes", lambda: 64 * 2 ** 20)
    at = open_app(KV_CACHE)
    assert at.number_input(key=K.knob + "num_blocks").max == MAX_NUM_BLOCKS
    at.number_input(key=K.knob + "num_blocks").set_value(value)
    at.number_input(key=K.knob + "block_size").set_value(256)
    with time_limit(60):
        at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert len(errors(at)) == 1 and "num_blocks" in errors(at)[0], errors(at)
