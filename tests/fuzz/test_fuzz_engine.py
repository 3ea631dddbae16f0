"""Fuzz cases over the engine API: bad or extreme knobs, sampling parameters, prompts, request
ids, arrivals, ``LLM.generate`` inputs, ``abort_request``, and steps after a failure.

Each case asserts its documented outcome through tests/fuzz/harness.py (a ValueError naming
the field, or a documented acceptance checked for its effect), under a time limit. Rejections
run against one shared tiny engine that is mid-run; after each, its state must be unchanged.
"""
from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import engine.serving.limits as limits_module
import engine.core.sampling as sampling_module
import engine.core.scheduler as scheduler_module
from engine.core.config import (MAX_BLOCK_SIZE, MAX_MODEL_LEN, MAX_N, MAX_NUM_BATCHED_TOKENS, MAX_NUM_BLOCKS,
                           MAX_NUM_SEQS, MAX_SEED, MAX_TOKENS, EngineConfig, SamplingParams)
from engine.serving.llm import LLM
from engine.serving.limits import MAX_ARRIVAL_HORIZON, MAX_GENERATE_PROMPTS
from engine.serving.engine import LLMEngine
from tests.conftest import run_to_completion
from tests.fuzz.harness import expect_accepted, expect_rejected

pytestmark = pytest.mark.usefixtures("torch_single_thread")

NAN, INF = math.nan, math.inf
VOCAB = 320  # tiny-random
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
PROMPT = "Hello there"


@pytest.fixture(scope="module")
def shared(tiny) -> Iterator[LLMEngine]:
    """One tiny engine, two steps into a request ("good"); rejected calls must not change it."""
    engine = LLMEngine(tiny)
    engine.add_request(PROMPT, SamplingParams(temperature=0, max_tokens=50, ignore_eos=True), request_id="good")
    engine.step()
    engine.step()
    yield engine


@pytest.fixture(scope="module")
def llm(tiny) -> LLM:
    return LLM(tiny)


@pytest.fixture(scope="module")
def greedy_tokens(tiny) -> tuple[int, ...]:
    (out,) = LLM(tiny).generate([PROMPT], GREEDY)
    return out.outputs[0].token_ids


def rejected_without_change(engine: LLMEngine, call: Callable[[], object], field: str) -> None:
    before = engine.snapshot()
    expect_rejected(call, field)
    assert engine.snapshot() == before
    engine.check_integrity()


# -- EngineConfig knobs -----------------------------------------------------------------------

INT_KNOB_CAPS = {"block_size": MAX_BLOCK_SIZE, "num_blocks": MAX_NUM_BLOCKS,
                 "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS, "max_num_seqs": MAX_NUM_SEQS,
                 "max_model_len": MAX_MODEL_LEN}
BAD_INT_VALUES: dict[str, Callable[[int], Any]] = {
    "zero": lambda cap: 0, "negative": lambda cap: -1, "cap+1": lambda cap: cap + 1,
    "10**9": lambda cap: 10 ** 9, "10**30": lambda cap: 10 ** 30, "float": lambda cap: 2.5,
    "whole float": lambda cap: 16.0, "bool": lambda cap: True, "str": lambda cap: "16", "NaN": lambda cap: NAN,
    "inf": lambda cap: INF,
}
KNOB_CASES = [(k, name) for k in INT_KNOB_CAPS for name in BAD_INT_VALUES]


@pytest.mark.parametrize("knob, bad", KNOB_CASES, ids=[f"{k}={n}" for k, n in KNOB_CASES])
def test_int_knob_rejected(knob: str, bad: str) -> None:
    value = BAD_INT_VALUES[bad](INT_KNOB_CAPS[knob])
    if knob == "max_model_len" and bad == "zero":
        value = 1  # 0 .. 1 are all below the minimum of 2
    expect_rejected(lambda: EngineConfig.from_knobs(**{knob: value}), knob, seconds=2)


OTHER_KNOBS = [
    ("policy", "fifo"), ("policy", ""), ("policy", None), ("policy", ["static"]), ("policy", 1),
    ("scheduling_policy", "lifo"), ("scheduling_policy", ""), ("scheduling_policy", None),
    ("scheduling_policy", ["fcfs"]), ("scheduling_policy", "FCFS"), ("prefill_schedule", "decode_first"),
    ("prefill_schedule", True), ("prefill_schedule", None),
    ("dtype", "int3"), ("dtype", None), ("dtype", 32), ("dtype", "FLOAT32"),
    ("kv_cache_dtype", "fp4"), ("kv_cache_dtype", 8), ("kv_cache_dtype", ["float32"]),
    ("kv_cache_dtype", "int4"), ("kv_cache_dtype", 3), ("kv_cache_dtype", "INT8"), ("kv_cache_dtype", "fp8_e5m2"),
    ("kv_cache_dtype", "float8_e4m3fn"), ("kv_cache_dtype", "uint8"), ("kv_cache_dtype", ""), ("kv_cache_dtype", b"int8"),
    ("enable_chunked_prefill", "yes"), ("enable_chunked_prefill", 1), ("enable_chunked_prefill", None),
    ("seed", -1), ("seed", MAX_SEED + 1), ("seed", 1.5), ("seed", "0"), ("seed", True), ("seed", None),
    ("enable_prefix_caching", "yes"), ("enable_prefix_caching", 1), ("enable_prefix_caching", 0),
    ("enable_prefix_caching", None), ("enable_prefix_caching", "False"), ("enable_prefix_caching", [True]),
    ("quantization", "int3"), ("quantization", "INT8"), ("quantization", ""), ("quantization", 8),
    ("quantization", ["int8"]), ("quantization", True),
    ("quantization_group_size", 48), ("quantization_group_size", 0), ("quantization_group_size", -32),
    ("quantization_group_size", 32.0), ("quantization_group_size", "32"), ("quantization_group_size", True),
    ("quantization_group_size", 10 ** 30), ("quantization_group_size", None),
    ("quantization_outlier_threshold", 0), ("quantization_outlier_threshold", -6.0),
    ("quantization_outlier_threshold", NAN), ("quantization_outlier_threshold", INF),
    ("quantization_outlier_threshold", "6"), ("quantization_outlier_threshold", True),
    ("quantization_outlier_threshold", None),
    ("sparsity", "2:8"), ("sparsity", "2-4"), ("sparsity", "4:8"), ("sparsity", ""), ("sparsity", 0.5),
    ("sparsity", 24), ("sparsity", True), ("sparsity", ["2:4"]), ("sparsity", "2:4 "),
]

# A quantization needs bfloat16 (the kernels' SIMD paths): an explicit other dtype is refused.
QUANT_DTYPE_CASES = [(q, d) for q in ("int8", "int4", "fp8", "w8a8") for d in ("float32", "float16")]


@pytest.mark.parametrize("quantization, dtype", QUANT_DTYPE_CASES, ids=[f"{q}+{d}" for q, d in QUANT_DTYPE_CASES])
def test_quantization_with_a_non_bf16_dtype_rejected(quantization: str, dtype: str) -> None:
    expect_rejected(lambda: EngineConfig.from_knobs(quantization=quantization, dtype=dtype), "dtype", seconds=2)


@pytest.mark.parametrize("group_size", [128, 256])
def test_int4_group_size_not_dividing_the_model_rejected_at_start(group_size: int) -> None:
    """tiny-random's hidden size is 64: groups of 128 or 256 do not fit its rows."""
    expect_rejected(lambda: LLMEngine("tiny-random", quantization="int4", quantization_group_size=group_size),
                    "quantization_group_size", seconds=10)


@pytest.mark.parametrize("value", [1e-30, 1e30])
def test_extreme_outlier_threshold_accepted(tiny, value: float) -> None:
    """A tiny threshold sends every column through the float path, a huge one none: both run."""
    from engine.model.shared import get_shared_model

    shared = get_shared_model("tiny-random", quantization="w8a8", quantization_outlier_threshold=value)
    llm = expect_accepted(lambda: LLM(shared, quantization="w8a8", quantization_outlier_threshold=value), seconds=10)
    (out,) = expect_accepted(lambda: llm.generate([PROMPT], GREEDY), seconds=10)
    assert len(out.outputs[0].token_ids) == GREEDY.max_tokens


@pytest.mark.parametrize("quantization", [None, "int4", "fp8"])
def test_sparsity_alone_or_with_a_scheme_runs(tiny, quantization: str | None) -> None:
    """2:4 prunes first and any scheme quantizes the pruned weights: every combination runs."""
    llm = expect_accepted(lambda: LLM("tiny-random", quantization=quantization, sparsity="2:4"), seconds=20)
    (out,) = expect_accepted(lambda: llm.generate([PROMPT], GREEDY), seconds=10)
    assert len(out.outputs[0].token_ids) == GREEDY.max_tokens


# SmoothQuant's alpha (engine/model/smoothing.py): a number in [0, 1], and only with w8a8.
BAD_SMOOTHING = [(-0.1, "w8a8"), (1.0000001, "w8a8"), (NAN, "w8a8"), (INF, "w8a8"), (-INF, "w8a8"),
                 ("0.5", "w8a8"), (True, "w8a8"), ([0.5], "w8a8"), (10 ** 30, "w8a8"),
                 (0.5, "int8"), (0.5, "int4"), (0.5, "fp8"), (0.5, None), (0.0, None)]


@pytest.mark.parametrize("value, quantization", BAD_SMOOTHING, ids=[f"{v!r}+{q}" for v, q in BAD_SMOOTHING])
def test_bad_smoothing_strength_rejected(value: object, quantization: str | None) -> None:
    expect_rejected(lambda: EngineConfig.from_knobs(quantization=quantization, quantization_smoothing_strength=value),
                    "quantization_smoothing_strength", seconds=2)
    expect_rejected(lambda: LLMEngine("tiny-random", quantization=quantization,
                                      quantization_smoothing_strength=value),
                    "quantization_smoothing_strength", seconds=2)


@pytest.mark.parametrize("value", [0, 1.0])
def test_extreme_smoothing_strength_accepted(tiny, value: float) -> None:
    """alpha 0 puts every channel's range into the activations, 1 into the weights: both run."""
    llm = expect_accepted(lambda: LLM("tiny-random", quantization="w8a8", quantization_smoothing_strength=value),
                          seconds=20)
    (out,) = expect_accepted(lambda: llm.generate([PROMPT], GREEDY), seconds=10)
    assert len(out.outputs[0].token_ids) == GREEDY.max_tokens


def test_sparsity_bad_value_rejected_by_get_shared_model() -> None:
    from engine.model.shared import get_shared_model

    expect_rejected(lambda: get_shared_model("tiny-random", sparsity="1:2"), "sparsity", seconds=2)


@pytest.mark.parametrize("knob, value", OTHER_KNOBS, ids=[f"{k}={v!r}" for k, v in OTHER_KNOBS])
def test_other_knob_rejected(knob: str, value: object) -> None:
    expect_rejected(lambda: EngineConfig.from_knobs(**{knob: value}), knob, seconds=2)


@pytest.mark.parametrize("kv", [None, "int8", "fp8"])
def test_kv_cache_dtype_none_and_quantized_accepted(tiny, kv: object) -> None:
    """None keeps today's meaning (the weights' dtype); "int8"/"fp8" build a quantized pool that
    generates (a short greedy run, every block free afterwards)."""
    engine = expect_accepted(lambda: LLMEngine(tiny, kv_cache_dtype=kv, num_blocks=16, block_size=4), seconds=5)
    engine.add_request([5, 6, 7, 8, 9], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
        engine.check_integrity()
    assert engine.kv_cache_bytes_per_token == (512 if kv is None else 160)


@pytest.mark.parametrize("knob", list(INT_KNOB_CAPS))
def test_knob_at_its_cap_is_accepted_by_the_config(knob: str) -> None:
    config = expect_accepted(lambda: EngineConfig.from_knobs(**{knob: INT_KNOB_CAPS[knob]}), seconds=2)
    assert config.to_knobs()[knob] == INT_KNOB_CAPS[knob]


@pytest.mark.parametrize("name", ["blok_size", "num_block", "temperature", ""])
def test_unknown_knob_rejected_before_loading(name: str) -> None:
    expect_rejected(lambda: LLMEngine("no-such-model", **{name: 4}), name or "unknown", seconds=5)


# -- engine construction and memory -----------------------------------------------------------

CONSTRUCTION = {
    "config dict": (lambda t: LLMEngine(t, config={"block_size": 4}), "config"),
    "config str": (lambda t: LLMEngine(t, config="EngineConfig()"), "config"),
    "config and knobs": (lambda t: LLMEngine(t, config=EngineConfig(), block_size=4), "config"),
    "model int": (lambda t: LLMEngine(123), "model"),
    "model None": (lambda t: LLMEngine(None), "model"),
    "model list": (lambda t: LLMEngine(["tiny-random"]), "model"),
    "LLM config dict": (lambda t: LLM(t, config={"block_size": 4}), "config"),
}


@pytest.mark.parametrize("case", list(CONSTRUCTION))
def test_construction_rejected(tiny, case: str) -> None:
    build, field = CONSTRUCTION[case]
    expect_rejected(lambda: build(tiny), field, seconds=5)


MEMORY = [
    ({"num_blocks": MAX_NUM_BLOCKS, "block_size": MAX_BLOCK_SIZE}, "num_blocks"),
    ({"num_blocks": MAX_NUM_BLOCKS}, "num_blocks"),
    ({"max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS}, "max_num_batched_tokens"),
    ({"max_num_seqs": MAX_NUM_SEQS, "max_num_batched_tokens": MAX_NUM_SEQS}, "max_num_seqs"),
]


@pytest.mark.parametrize("knobs, field", MEMORY, ids=[f for _, f in MEMORY])
def test_knobs_beyond_memory_rejected_before_allocating(tiny, monkeypatch, knobs: dict, field: str) -> None:
    monkeypatch.setattr(limits_module, "available_memory_bytes", lambda: 64 * 2 ** 20)
    error = expect_rejected(lambda: LLMEngine(tiny, **knobs), field, seconds=5)
    assert "available" in str(error)


def test_knobs_within_memory_accepted(tiny, monkeypatch) -> None:
    monkeypatch.setattr(limits_module, "available_memory_bytes", lambda: 256 * 2 ** 20)
    engine = expect_accepted(lambda: LLMEngine(tiny, num_blocks=2048, block_size=16), seconds=10)
    assert engine.kv.num_free_blocks == 2048


# -- SamplingParams ---------------------------------------------------------------------------

BAD_SAMPLING = [
    ("temperature", -1), ("temperature", -1e-9), ("temperature", NAN), ("temperature", INF), ("temperature", -INF),
    ("temperature", "1"), ("temperature", None), ("temperature", True), ("temperature", 1j),
    ("top_p", 0), ("top_p", 0.0), ("top_p", -0.1), ("top_p", 1.0001), ("top_p", NAN), ("top_p", INF),
    ("top_p", "0.5"), ("top_p", None), ("top_p", True),
    ("top_k", -1), ("top_k", -5), ("top_k", 1.5), ("top_k", "3"), ("top_k", None), ("top_k", True),
    ("max_tokens", 0), ("max_tokens", -1), ("max_tokens", 1.5), ("max_tokens", MAX_TOKENS + 1),
    ("max_tokens", 10 ** 30), ("max_tokens", None), ("max_tokens", "5"), ("max_tokens", True),
    ("seed", -1), ("seed", MAX_SEED + 1), ("seed", 10 ** 30), ("seed", 1.5), ("seed", "7"), ("seed", True),
    ("stop", 5), ("stop", {"a"}), ("stop", ["a", 3]), ("stop", [""]), ("stop", ""), ("stop", b"x"),
    ("stop", [None]), ("stop", ("a", "")), ("stop", object()), ("stop", iter(["a"])),
    ("ignore_eos", "yes"), ("ignore_eos", 1), ("ignore_eos", None), ("ignore_eos", 0.0),
]


@pytest.mark.parametrize("field, value", BAD_SAMPLING,  # ids without memory addresses: the same in every process
                         ids=[re.sub(r" at 0x[0-9a-f]+", "", f"{f}={v!r}")[:40] for f, v in BAD_SAMPLING])
def test_sampling_param_rejected(field: str, value: object) -> None:
    expect_rejected(lambda: SamplingParams(**{field: value}), field, seconds=2)


BAD_N = [0, -1, MAX_N + 1, 10 ** 30, "4", 2.5, 4.0, True, None, NAN, INF, [4]]


@pytest.mark.parametrize("value", BAD_N, ids=[f"n={v!r}" for v in BAD_N])
def test_n_rejected(value: object) -> None:
    """``n`` (parallel sequences): an int in 1 .. MAX_N; the message starts with the field."""
    expect_rejected(lambda: SamplingParams(n=value), r"^n: ", seconds=2)


def _tokens(llm: LLM, params: SamplingParams, prompt: str = PROMPT) -> tuple[int, ...]:
    (out,) = llm.generate([prompt], params)
    assert out.finished
    return out.outputs[0].token_ids


GREEDY_EQUIVALENT = {
    "temperature 1e-9 (below SAMPLING_EPS)": SamplingParams(temperature=1e-9, max_tokens=6, ignore_eos=True),
    "temperature 5e-6": SamplingParams(temperature=5e-6, max_tokens=6, ignore_eos=True, seed=3),
    "top_p 1e-300": SamplingParams(temperature=1.0, top_p=1e-300, max_tokens=6, ignore_eos=True, seed=1),
    "top_p 5e-324": SamplingParams(temperature=2.0, top_p=5e-324, max_tokens=6, ignore_eos=True, seed=2),
    "top_k 1": SamplingParams(temperature=1.5, top_k=1, max_tokens=6, ignore_eos=True, seed=4),
}


@pytest.mark.parametrize("case", list(GREEDY_EQUIVALENT))
def test_extreme_params_documented_as_greedy(llm: LLM, greedy_tokens, case: str) -> None:
    tokens = expect_accepted(lambda: _tokens(llm, GREEDY_EQUIVALENT[case]), seconds=10)
    assert tokens == greedy_tokens


EXTREME_ACCEPTED = {
    "temperature 1e300": SamplingParams(temperature=1e300, max_tokens=6, ignore_eos=True, seed=1),
    "temperature 1e-5 (SAMPLING_EPS itself samples)": SamplingParams(temperature=1e-5, max_tokens=6, ignore_eos=True),
    "top_k 10**9 (off)": SamplingParams(temperature=1.0, top_k=10 ** 9, max_tokens=6, ignore_eos=True, seed=1),
    "seed 2**63-1": SamplingParams(temperature=1.0, seed=MAX_SEED, max_tokens=6, ignore_eos=True),
    "seed 0": SamplingParams(temperature=1.0, seed=0, max_tokens=6, ignore_eos=True),
    "stop None": SamplingParams(temperature=0, stop=None, max_tokens=6, ignore_eos=True),
    "stop tuple": SamplingParams(temperature=0, stop=("\x00\x01", "zz-never"), max_tokens=6, ignore_eos=True),
}


@pytest.mark.parametrize("case", list(EXTREME_ACCEPTED))
def test_extreme_params_accepted_and_sampled(llm: LLM, case: str) -> None:
    tokens = expect_accepted(lambda: _tokens(llm, EXTREME_ACCEPTED[case]), seconds=10)
    assert len(tokens) == 6 and all(0 <= t < VOCAB for t in tokens)


def test_max_tokens_at_its_cap_ends_at_the_context(tiny) -> None:
    llm = LLM(tiny, max_model_len=24)
    (out,) = expect_accepted(lambda: llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=MAX_TOKENS,
                                                                           ignore_eos=True)), seconds=10)
    assert out.outputs[0].finish_reason == "length" and len(out.prompt_token_ids) + len(out.outputs[0].token_ids) == 24


# -- add_request ------------------------------------------------------------------------------

BAD_ADD = {
    "prompt None": (lambda e: e.add_request(None), "prompt"),
    "prompt empty": (lambda e: e.add_request(""), "prompt"),
    "prompt empty list": (lambda e: e.add_request([]), "prompt"),
    "prompt int": (lambda e: e.add_request(123), "prompt"),
    "prompt bytes": (lambda e: e.add_request(b"abc"), "prompt"),
    "prompt set": (lambda e: e.add_request({1, 2}), "prompt"),
    "prompt dict": (lambda e: e.add_request({"a": 1}), "prompt"),
    "prompt object": (lambda e: e.add_request(object()), "prompt"),
    "token -1": (lambda e: e.add_request([5, -1]), "prompt"),
    "token = vocab": (lambda e: e.add_request([5, VOCAB]), "prompt"),
    "token 10**30": (lambda e: e.add_request([10 ** 30]), "prompt"),
    "token float": (lambda e: e.add_request([1.5]), "prompt"),
    "token bool": (lambda e: e.add_request([True]), "prompt"),
    "token str": (lambda e: e.add_request(["a"]), "prompt"),
    "nested list": (lambda e: e.add_request([[1, 2]]), "prompt"),
    "lone surrogate": (lambda e: e.add_request("\ud800"), "prompt"),
    "surrogate mid-text": (lambda e: e.add_request("ok \udc80 then"), "prompt"),
    "10**6 tokens": (lambda e: e.add_request([7] * 10 ** 6), "prompt"),
    "100k-char prompt": (lambda e: e.add_request("x" * 100_000), "prompt"),
    "request_id int": (lambda e: e.add_request("hi", request_id=5), "request_id"),
    "request_id empty": (lambda e: e.add_request("hi", request_id=""), "request_id"),
    "request_id list": (lambda e: e.add_request("hi", request_id=["a"]), "request_id"),
    "request_id duplicate": (lambda e: e.add_request("hi", request_id="good"), "request_id"),
    "arrival -1": (lambda e: e.add_request("hi", arrival_step=-1), "arrival_step"),
    "arrival float": (lambda e: e.add_request("hi", arrival_step=1.5), "arrival_step"),
    "arrival str": (lambda e: e.add_request("hi", arrival_step="3"), "arrival_step"),
    "arrival bool": (lambda e: e.add_request("hi", arrival_step=True), "arrival_step"),
    "arrival 10**18": (lambda e: e.add_request("hi", arrival_step=10 ** 18), "arrival_step"),
    "arrival past horizon": (lambda e: e.add_request("hi", arrival_step=e.step_count + MAX_ARRIVAL_HORIZON + 1),
                             "arrival_step"),
    "n > max_num_seqs": (lambda e: e.add_request("hi", SamplingParams(n=e.config.scheduler_config.max_num_seqs + 1)),
                         r"^n: .*max_num_seqs"),
    "n = MAX_N > max_num_seqs": (lambda e: e.add_request("hi", SamplingParams(n=MAX_N)), r"^n: .*max_num_seqs"),
    "priority str": (lambda e: e.add_request("hi", priority="1"), "priority"),
    "priority float": (lambda e: e.add_request("hi", priority=0.5), "priority"),
    "priority bool": (lambda e: e.add_request("hi", priority=True), "priority"),
    "priority 2**31": (lambda e: e.add_request("hi", priority=2 ** 31), "priority"),
    "priority 10**100": (lambda e: e.add_request("hi", priority=-10 ** 100), "priority"),
    "params dict": (lambda e: e.add_request("hi", {"max_tokens": 3}), "sampling_params"),
    "params str": (lambda e: e.add_request("hi", "greedy"), "sampling_params"),
    "abort list id": (lambda e: e.abort_request(["a"]), "request_id"),
    "abort int id": (lambda e: e.abort_request(5), "request_id"),
    "abort None": (lambda e: e.abort_request(None), "request_id"),
    "abort unknown": (lambda e: e.abort_request("nope"), "request_id"),
    "get_output list id": (lambda e: e.get_output(["a"]), "request_id"),
    "get_output unknown": (lambda e: e.get_output("nope"), "request_id"),
}


@pytest.mark.parametrize("case", list(BAD_ADD))
def test_add_request_rejected_leaving_the_engine_unchanged(shared: LLMEngine, case: str) -> None:
    call, field = BAD_ADD[case]
    rejected_without_change(shared, lambda: call(shared), field)


def test_sequence_id_taken_rejected(tiny) -> None:
    """Sequence i of request "x" is "x#i": an id already in use there is refused up front."""
    engine = LLMEngine(tiny)
    engine.add_request("hi", GREEDY, request_id="x#2")
    rejected_without_change(engine, lambda: engine.add_request("hi", SamplingParams(n=3), request_id="x"),
                            r"^request_id: .*x#2")
    expect_accepted(lambda: engine.add_request("hi", SamplingParams(n=2), request_id="x"), seconds=5)  # x#1 is free


def test_n_at_its_cap_accepted(tiny) -> None:
    llm = LLM(tiny, max_num_seqs=MAX_N)
    (out,) = expect_accepted(lambda: llm.generate([PROMPT], SamplingParams(temperature=0, n=MAX_N, max_tokens=3,
                                                                           ignore_eos=True)), seconds=20)
    assert len(out.outputs) == MAX_N and len({c.token_ids for c in out.outputs}) == 1
    assert llm.llm_engine.kv.pool.num_used == 0


def test_arrival_at_the_horizon_accepted(tiny) -> None:
    engine = LLMEngine(tiny)
    rid = expect_accepted(lambda: engine.add_request("hi", arrival_step=MAX_ARRIVAL_HORIZON), seconds=5)
    assert engine.requests[rid].arrival_step == MAX_ARRIVAL_HORIZON


# -- LLM.generate -----------------------------------------------------------------------------

BAD_GENERATE: dict[str, tuple[Callable[[], Any], Any, str]] = {
    "None": (lambda: None, GREEDY, "prompts"),
    "int": (lambda: 123, GREEDY, "prompts"),
    "float": (lambda: 1.5, GREEDY, "prompts"),
    "set": (lambda: {"a", "b"}, GREEDY, "prompts"),
    "frozenset": (lambda: frozenset({"a"}), GREEDY, "prompts"),
    "dict": (lambda: {"a": 1}, GREEDY, "prompts"),
    "object": (lambda: object(), GREEDY, "prompts"),
    "bytes": (lambda: b"xy", GREEDY, "prompt"),
    "list with None": (lambda: ["ok", None], GREEDY, "prompt"),
    "list with empty": (lambda: ["ok", ""], GREEDY, "prompt"),
    "list with surrogate": (lambda: ["ok", "\ud800"], GREEDY, "prompt"),
    "infinite generator": (lambda: (f"p{i}" for i in itertools.count()), GREEDY, "prompts"),
    "infinite token iterator": (lambda: itertools.count(), GREEDY, "prompt"),
    "params count mismatch": (lambda: ["a", "b"], [GREEDY], "sampling_params"),
    "params str": (lambda: ["a"], "greedy", "sampling_params"),
    "params dict": (lambda: ["a"], {"temperature": 0}, "sampling_params"),
    "params list with str": (lambda: ["a", "b"], [GREEDY, "x"], "sampling_params"),
}


@pytest.mark.parametrize("case", list(BAD_GENERATE))
def test_generate_rejected_adding_nothing(llm: LLM, case: str) -> None:
    prompts, params, field = BAD_GENERATE[case]
    before = set(llm.llm_engine.requests)
    expect_rejected(lambda: llm.generate(prompts(), params), field, seconds=10)
    assert set(llm.llm_engine.requests) == before
    assert MAX_GENERATE_PROMPTS >= 1


ACCEPTED_GENERATE: dict[str, tuple[Callable[[], Any], int]] = {
    "empty list": (lambda: [], 0),
    "empty tuple": (lambda: (), 0),
    "generator": (lambda: (p for p in [PROMPT, "second"]), 2),
    "one string": (lambda: PROMPT, 1),
    "one token list": (lambda: [5, 6, 7], 1),
    "tuple of token lists": (lambda: ([5, 6], (7, 8)), 2),
}


@pytest.mark.parametrize("case", list(ACCEPTED_GENERATE))
def test_generate_accepts_ordered_prompts(llm: LLM, case: str) -> None:
    prompts, n = ACCEPTED_GENERATE[case]
    outs = expect_accepted(lambda: llm.generate(prompts(), GREEDY), seconds=10)
    assert len(outs) == n and all(o.finished for o in outs)
    if case == "generator":
        assert [o.prompt for o in outs] == [PROMPT, "second"]


def test_generate_does_not_wait_on_a_far_arrival(tiny, greedy_tokens) -> None:
    llm = LLM(tiny)
    llm.llm_engine.add_request("later", GREEDY, arrival_step=MAX_ARRIVAL_HORIZON)
    (out,) = expect_accepted(lambda: llm.generate([PROMPT], GREEDY), seconds=10)
    assert out.outputs[0].token_ids == greedy_tokens and llm.llm_engine.pending


# -- steps after a failure --------------------------------------------------------------------

def _fail_once(monkeypatch, target: tuple[object, str], failure: BaseException) -> None:
    original = getattr(*target)

    def fail(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(*target, original)
        raise failure

    monkeypatch.setattr(*target, fail)


FAILURES = {
    "forward RuntimeError": (lambda e: (e.runner, "execute"), RuntimeError("forward boom"), "forward boom"),
    "forward MemoryError": (lambda e: (e.runner, "execute"), MemoryError("no memory"), "no memory"),
    "forward KeyboardInterrupt": (lambda e: (e.runner, "execute"), KeyboardInterrupt("stop"), "stop"),
    "prepare ValueError": (lambda e: (e.runner, "prepare"), ValueError("bad batch"), "bad batch"),
    "schedule RuntimeError": (lambda e: (e.scheduler, "schedule"), RuntimeError("sched boom"), "sched boom"),
    "stop check RuntimeError": (lambda e: (scheduler_module, "check_stop"), RuntimeError("stop boom"), "stop boom"),
    # after the radix tree took this step's full blocks (insert, then move the request's lock to the new node)
    "prefix lock RuntimeError": (lambda e: (e.kv.prefix_cache, "move_lock"), RuntimeError("lock boom"), "lock boom"),
    "trace RuntimeError": (lambda e: (e.tracer, "step_trace"), RuntimeError("trace boom"), "trace boom"),
}


@pytest.mark.parametrize("case", list(FAILURES))
def test_step_after_a_failed_step_redoes_it(tiny, monkeypatch, case: str) -> None:
    """Documented: the failed step raises and is rolled back; the run then ends as a clean one."""
    def fresh() -> LLMEngine:
        e = LLMEngine(tiny, block_size=4, num_blocks=16, max_num_batched_tokens=8)
        e.add_request(PROMPT, GREEDY, request_id="a")
        e.add_request("Seeded", SamplingParams(temperature=1.0, seed=9, max_tokens=6, ignore_eos=True), request_id="b")
        return e

    clean = fresh()
    run_to_completion(clean)
    engine = fresh()
    engine.step()
    before = engine.snapshot()
    target, failure, match = FAILURES[case]
    _fail_once(monkeypatch, target(engine), failure)
    expect_rejected(engine.step, match, exc=type(failure), seconds=10)
    assert engine.snapshot() == before
    expect_accepted(lambda: run_to_completion(engine), seconds=20)
    for rid in ("a", "b"):
        assert engine.get_output(rid).outputs[0].token_ids == clean.get_output(rid).outputs[0].token_ids


def test_sampling_failure_is_an_error_finish(tiny, monkeypatch) -> None:
    original = sampling_module.sample_one

    def fail_seed_9(logits: Any, params: SamplingParams, generator: Any) -> int:
        if params.seed == 9:
            raise RuntimeError("sampler boom")
        return original(logits, params, generator)

    monkeypatch.setattr(sampling_module, "sample_one", fail_seed_9)
    llm = LLM(tiny)
    outs = expect_accepted(lambda: llm.generate(
        [PROMPT, "x"], [GREEDY, SamplingParams(temperature=1.0, seed=9, max_tokens=6)]), seconds=10)
    assert outs[1].outputs[0].finish_reason == "error" and "sampler boom" in (outs[1].outputs[0].error or "")
    assert outs[0].outputs[0].finish_reason == "length"
    assert llm.llm_engine.kv.pool.num_used == 0


def test_generate_after_a_failed_generate_works(tiny, monkeypatch, greedy_tokens) -> None:
    llm = LLM(tiny)
    _fail_once(monkeypatch, (llm.llm_engine.runner, "execute"), RuntimeError("first call fails"))
    expect_rejected(lambda: llm.generate([PROMPT], GREEDY), "first call fails", exc=RuntimeError)
    assert not llm.llm_engine.has_unfinished_requests()  # its request was aborted
    (out,) = expect_accepted(lambda: llm.generate([PROMPT], GREEDY))
    assert out.outputs[0].token_ids == greedy_tokens


def test_generate_that_cannot_progress_raises(tiny, monkeypatch) -> None:
    llm = LLM(tiny)
    from engine.core.scheduler import SchedulerOutput

    monkeypatch.setattr(llm.llm_engine.scheduler, "schedule", lambda: SchedulerOutput((), (), 0))
    expect_rejected(lambda: llm.generate([PROMPT], GREEDY), "no progress", exc=RuntimeError, seconds=10)
