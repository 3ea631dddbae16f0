"""Bad input: a ValueError that names the problem, raised before any work, leaving every other
request exactly as it was (same state now, same tokens at the end as in a clean run)."""
from __future__ import annotations

import pytest

from engine.core.config import EngineConfig, SamplingParams
from engine.serving.llm import LLM
from engine.serving.engine import LLMEngine
from tests.conftest import run_to_completion

pytestmark = pytest.mark.usefixtures("torch_single_thread")

GOOD_PROMPT = "Hello there"
GOOD_PARAMS = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
VOCAB = 320  # tiny-random
CONTEXT = 2048  # tiny-random max_position_embeddings

_CLEAN: dict[tuple, tuple[int, ...]] = {}


def clean_tokens(tiny, knobs: dict, prompt=GOOD_PROMPT, params=GOOD_PARAMS) -> tuple[int, ...]:
    key = (tuple(sorted(knobs.items())), str(prompt), params)
    if key not in _CLEAN:
        engine = LLMEngine(tiny, **knobs)
        rid = engine.add_request(prompt, params)
        run_to_completion(engine)
        _CLEAN[key] = engine.get_output(rid).outputs[0].token_ids
    return _CLEAN[key]


def engine_mid_run(tiny, knobs: dict, prompt=GOOD_PROMPT, params=GOOD_PARAMS, steps: int = 2):
    """An engine with one good request, a couple of steps in."""
    engine = LLMEngine(tiny, **knobs)
    rid = engine.add_request(prompt, params, request_id="good")
    for _ in range(steps):
        engine.step()
        engine.check_integrity()
    assert engine.has_unfinished_requests()
    return engine, rid


def assert_rejected_cleanly(tiny, bad_call, field: str, knobs: dict | None = None, prompt=GOOD_PROMPT,
                            params=GOOD_PARAMS, steps: int = 2) -> str:
    knobs = knobs or {}
    engine, rid = engine_mid_run(tiny, knobs, prompt, params, steps)
    before = engine.snapshot()
    ids_before = list(engine.requests)
    with pytest.raises(ValueError) as info:
        bad_call(engine)
    message = str(info.value)
    assert field in message, f"the message {message!r} does not name {field!r}"
    # Nothing changed: no request added, the good one untouched, state identical.
    assert list(engine.requests) == ids_before
    assert engine.snapshot() == before
    engine.check_integrity()
    run_to_completion(engine)
    assert engine.get_output(rid).outputs[0].token_ids == clean_tokens(tiny, knobs, prompt, params)
    assert engine.kv.pool.num_used == 0
    return message


# -- add_request ----------------------------------------------------------------------------

BAD_REQUESTS = {
    "empty str prompt": (lambda e: e.add_request(""), "prompt"),
    "empty token list": (lambda e: e.add_request([]), "prompt"),
    "prompt is None": (lambda e: e.add_request(None), "prompt"),
    "token id = vocab size": (lambda e: e.add_request([5, VOCAB]), "prompt"),
    "negative token id": (lambda e: e.add_request([5, -1]), "prompt"),
    "float token id": (lambda e: e.add_request([5, 1.5]), "prompt"),
    "prompt fills the whole context": (lambda e: e.add_request([7] * CONTEXT), "max_model_len"),
    "prompt longer than the context": (lambda e: e.add_request([7] * (CONTEXT + 100)), "prompt"),
    "max_tokens 0": (lambda e: e.add_request("hi", SamplingParams(max_tokens=0)), "max_tokens"),
    "max_tokens -1": (lambda e: e.add_request("hi", SamplingParams(max_tokens=-1)), "max_tokens"),
    "max_tokens float": (lambda e: e.add_request("hi", SamplingParams(max_tokens=2.5)), "max_tokens"),
    "temperature < 0": (lambda e: e.add_request("hi", SamplingParams(temperature=-0.1)), "temperature"),
    "temperature NaN": (lambda e: e.add_request("hi", SamplingParams(temperature=float("nan"))), "temperature"),
    "top_p 0": (lambda e: e.add_request("hi", SamplingParams(top_p=0.0)), "top_p"),
    "top_p > 1": (lambda e: e.add_request("hi", SamplingParams(top_p=1.5)), "top_p"),
    "top_p < 0": (lambda e: e.add_request("hi", SamplingParams(top_p=-0.2)), "top_p"),
    "top_k < 0": (lambda e: e.add_request("hi", SamplingParams(top_k=-1)), "top_k"),
    "seed < 0": (lambda e: e.add_request("hi", SamplingParams(seed=-1)), "seed"),
    "empty stop string": (lambda e: e.add_request("hi", SamplingParams(stop=[""])), "stop"),
    "sampling_params not a SamplingParams": (lambda e: e.add_request("hi", {"max_tokens": 3}), "sampling_params"),
    "duplicate request_id": (lambda e: e.add_request("hi", request_id="good"), "request_id"),
    "empty request_id": (lambda e: e.add_request("hi", request_id=""), "request_id"),
    "negative arrival_step": (lambda e: e.add_request("hi", arrival_step=-1), "arrival_step"),
    "abort unknown request": (lambda e: e.abort_request("no-such-request"), "request_id"),
    "get_output unknown request": (lambda e: e.get_output("no-such-request"), "request_id"),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_request_is_rejected_and_leaves_others_untouched(tiny, case):
    bad_call, field = BAD_REQUESTS[case]
    assert_rejected_cleanly(tiny, bad_call, field)


def test_prompt_length_limit_is_exact(tiny):
    """The longest prompt that leaves one position for output is accepted and gets one token."""
    engine = LLMEngine(tiny)
    rid = engine.add_request([7] * (CONTEXT - 1), SamplingParams(temperature=0, max_tokens=5))
    run_to_completion(engine)
    out = engine.get_output(rid).outputs[0]
    assert len(out.token_ids) == 1 and out.finish_reason == "length"
    with pytest.raises(ValueError, match="max_model_len"):
        engine.add_request([7] * CONTEXT)


@pytest.mark.parametrize("limit", [16, 33])
def test_prompt_longer_than_the_max_model_len_knob(tiny, limit):
    message = assert_rejected_cleanly(tiny, lambda e: e.add_request(list(range(limit))), "max_model_len",
                                      knobs={"max_model_len": limit}, prompt="Hi",
                                      params=SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    assert str(limit) in message
    engine = LLMEngine(tiny, max_model_len=limit)
    engine.add_request(list(range(limit - 1)))  # one position left for output: fine


@pytest.mark.parametrize("num_blocks, block_size", [(1, 2), (3, 2)])
def test_pool_too_small_for_one_request(tiny, num_blocks, block_size):
    knobs = {"num_blocks": num_blocks, "block_size": block_size}
    message = assert_rejected_cleanly(tiny, lambda e: e.add_request(list(range(10))), "num_blocks",
                                      knobs=knobs, prompt=[5], steps=0,
                                      params=SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    assert "block" in message


def test_prompt_over_budget_with_chunked_prefill_off(tiny):
    knobs = {"enable_chunked_prefill": False, "max_num_batched_tokens": 16}
    assert_rejected_cleanly(tiny, lambda e: e.add_request(list(range(17))), "max_num_batched_tokens",
                            knobs=knobs)


def test_bad_request_before_any_step_adds_nothing(tiny):
    engine = LLMEngine(tiny)
    with pytest.raises(ValueError, match="prompt"):
        engine.add_request("")
    assert not engine.requests and not engine.has_unfinished_requests()
    rid = engine.add_request(GOOD_PROMPT, GOOD_PARAMS)
    run_to_completion(engine)
    assert engine.get_output(rid).outputs[0].token_ids == clean_tokens(tiny, {})


# -- engine construction --------------------------------------------------------------------

BAD_KNOBS = [
    *[({name: v}, name) for name in ("block_size", "num_blocks", "max_num_batched_tokens", "max_num_seqs")
      for v in (0, -1)],
    ({"block_size": 257}, "block_size"),
    ({"num_blocks": 2.5}, "num_blocks"),
    ({"num_blocks": True}, "num_blocks"),
    ({"max_model_len": 1}, "max_model_len"),
    ({"policy": "fifo"}, "policy"),
    ({"dtype": "int3"}, "dtype"),
    ({"kv_cache_dtype": "fp4"}, "kv_cache_dtype"),
    ({"kv_cache_dtype": "int4"}, "kv_cache_dtype"),
    ({"kv_cache_dtype": 3}, "kv_cache_dtype"),
    ({"enable_chunked_prefill": "yes"}, "enable_chunked_prefill"),
    ({"seed": -1}, "seed"),
    ({"blok_size": 4}, "blok_size"),  # unknown knob name
]


@pytest.mark.parametrize("knobs, field", BAD_KNOBS, ids=[f"{k}" for k, _ in BAD_KNOBS])
def test_bad_knob_is_rejected_naming_it(tiny, knobs, field):
    # Another engine mid-run is unaffected by the failed construction.
    engine, rid = engine_mid_run(tiny, {})
    before = engine.snapshot()
    with pytest.raises(ValueError) as info:
        LLMEngine(tiny, **knobs)
    assert field in str(info.value)
    with pytest.raises(ValueError) as info:
        LLM(tiny, **knobs)
    assert field in str(info.value)
    if field != "blok_size":
        with pytest.raises(ValueError) as info:
            EngineConfig.from_knobs(**knobs)
        assert field in str(info.value)
    assert engine.snapshot() == before
    run_to_completion(engine)
    assert engine.get_output(rid).outputs[0].token_ids == clean_tokens(tiny, {})


def test_unknown_model_name():
    with pytest.raises(ValueError) as info:
        LLMEngine("no-such-model")
    assert "model" in str(info.value) and "no-such-model" in str(info.value)
    with pytest.raises(ValueError, match="model"):
        LLM("no-such-model")


def test_unknown_knob_is_rejected_before_loading_the_model():
    # "no-such-model" would raise too; the knob must be reported first (no load is attempted).
    with pytest.raises(ValueError, match="blok_size"):
        LLMEngine("no-such-model", blok_size=4)


def test_config_and_knobs_together_are_rejected(tiny):
    with pytest.raises(ValueError, match="config"):
        LLMEngine(tiny, config=EngineConfig(), block_size=4)


# -- LLM.generate ----------------------------------------------------------------------------

BAD_BATCHES = {
    "empty prompt in the middle": (["Hello", "", "there"], None, "prompt"),
    "out-of-vocab prompt last": ([[1, 2, 3], [4, 5], [6, VOCAB + 5]], None, "prompt"),
    "prompt too long": (["Hello", [9] * (CONTEXT + 1)], None, "prompt"),
    "None prompt": (["Hello", None], None, "prompt"),
    "params count mismatch": (["Hello", "there"], [GOOD_PARAMS], "sampling_params"),
    "params not SamplingParams": (["Hello", "there"], [GOOD_PARAMS, "greedy"], "sampling_params"),
}


@pytest.mark.parametrize("case", list(BAD_BATCHES))
def test_generate_with_one_bad_prompt_adds_none(tiny, case):
    prompts, params, field = BAD_BATCHES[case]
    llm = LLM(tiny)
    with pytest.raises(ValueError) as info:
        llm.generate(prompts, params if params is not None else GOOD_PARAMS)
    assert field in str(info.value)
    engine = llm.llm_engine
    assert not engine.requests, f"generate queued {list(engine.requests)} before failing"
    assert not engine.has_unfinished_requests()
    engine.check_integrity()
    # The same LLM still works, and gives the clean-run tokens.
    (out,) = llm.generate([GOOD_PROMPT], GOOD_PARAMS)
    assert out.outputs[0].token_ids == clean_tokens(tiny, {})


# -- errors that name the right thing (issue #26 item 7) -------------------------------------

def test_unknown_draft_model_names_speculative_config_model(tiny):
    """The target model is fine; the error is about the draft model."""
    spec = {"method": "draft_model", "model": "no-such-draft", "num_speculative_tokens": 2}
    with pytest.raises(ValueError, match=r"^speculative_config\.model: unknown model 'no-such-draft'"):
        LLMEngine(tiny, speculative_config=spec)
    with pytest.raises(ValueError, match=r"^speculative_config\.model: "):
        LLMEngine(tiny, speculative_config={**spec, "model": "a\x00b"})


@pytest.mark.parametrize("split", [(7,), (1,), (3,)])
def test_layer_split_that_does_not_fit_the_model_is_rejected_at_one_stage(tiny, split):
    """tiny-random has 2 layers: at p = 1 the split must be (2,), as at any p it must sum to
    the model's layers (no worker exists at p = 1 to check it)."""
    with pytest.raises(ValueError, match=r"^pipeline_layer_split: .*2 layers"):
        LLMEngine(tiny, pipeline_layer_split=split)
    assert LLMEngine(tiny, pipeline_layer_split=(2,)).config.parallel_config.pipeline_layer_split == (2,)


@pytest.mark.parametrize("keyword, value, hint", [
    ("best_of", 4, "use n"),
    ("use_beam_search", True, "beam search is not supported"),
    ("presence_penalty", 0.5, "penalties are not supported"),
    ("repetition_penalty", 1.1, "penalties are not supported"),
    ("min_p", 0.1, "top_p"),
    ("stop_token_ids", [2], "use stop"),
    ("logprobs", 5, "not returned"),
])
def test_vllm_sampling_keywords_we_do_not_support_are_a_value_error_naming_them(keyword, value, hint):
    with pytest.raises(ValueError, match=rf"^{keyword}: InferScope does not support .*{hint}"):
        SamplingParams(**{keyword: value})


@pytest.mark.parametrize("keyword, suggestion", [("max_token", "did you mean max_tokens"), ("bogus", "fields: ")])
def test_unknown_sampling_keyword_is_named_with_the_fields(keyword, suggestion):
    """Not a vLLM keyword either: still refused by name (a typo is never silently dropped)."""
    with pytest.raises(ValueError, match=rf"^{keyword}: unknown SamplingParams field.*{suggestion}"):
        SamplingParams(temperature=0, **{keyword: 1})
