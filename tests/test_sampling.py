"""Sampling: seeded replays, batch-independence, top-k/top-p limits, stop rules, finish reasons."""
from __future__ import annotations

import math

import pytest
import torch

from engine.core.config import SamplingParams
from engine.serving.engine import LLMEngine
from engine.core.sampling import SamplingError, apply_top_k_top_p, sample, sample_one, sample_rows
from tests.conftest import run_to_completion

pytestmark = pytest.mark.usefixtures("torch_single_thread")

PROMPT = "The quick brown fox"


def generate(engine: LLMEngine, prompts, params) -> list[tuple[int, ...]]:
    if isinstance(params, SamplingParams):
        params = [params] * len(prompts)
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    run_to_completion(engine)
    return [engine.get_output(i).outputs[0].token_ids for i in ids]


def one(engine: LLMEngine, prompt, params: SamplingParams):
    rid = engine.add_request(prompt, params)
    run_to_completion(engine)
    return engine.get_output(rid).outputs[0]


# -- the sampling functions themselves ------------------------------------------------------

def test_top_k_keeps_exactly_the_k_largest():
    logits = torch.tensor([0.1, 3.0, -1.0, 2.0, 0.5])
    kept = torch.isfinite(apply_top_k_top_p(logits, 2, 1.0)).nonzero().flatten().tolist()
    assert kept == [1, 3]
    assert torch.isfinite(apply_top_k_top_p(logits, 0, 1.0)).all()  # 0 = off
    assert torch.isfinite(apply_top_k_top_p(logits, 99, 1.0)).all()  # k >= V keeps everything


@pytest.mark.parametrize("top_p, kept", [(0.4, [0]), (0.6, [0, 1]), (0.9, [0, 1, 2]), (0.99, [0, 1, 2, 3])])
def test_top_p_keeps_the_smallest_set_reaching_p(top_p, kept):
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()[[2, 0, 3, 1]]  # shuffled: ids 1, 3, 0, 2 hold 0.5, 0.3, 0.15, 0.05
    out = apply_top_k_top_p(logits, 0, top_p)
    order = [1, 3, 0, 2]
    assert sorted(torch.isfinite(out).nonzero().flatten().tolist()) == sorted(order[i] for i in kept)


def test_temperature_sampling_follows_the_softmax():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    g = torch.Generator().manual_seed(123)
    params = SamplingParams(temperature=0.5, seed=123)
    n = 6000
    counts = torch.bincount(torch.tensor([sample_one(logits, params, g) for _ in range(n)]), minlength=4)
    expected = (logits / 0.5).softmax(-1) * n
    for c, e in zip(counts.tolist(), expected.tolist()):
        assert abs(c - e) <= 5 * math.sqrt(e) + 5, (counts, expected)


def test_greedy_rows_take_the_argmax_even_in_a_mixed_batch():
    logits = torch.tensor([[0.0, 5.0, 1.0], [9.0, 0.0, 1.0], [0.0, 1.0, 7.0]])
    params = [SamplingParams(temperature=0), SamplingParams(temperature=1.0, top_k=1),
              SamplingParams(temperature=0)]
    gens = [None, torch.Generator().manual_seed(0), None]
    assert sample(logits, params, gens) == [1, 0, 2]


def test_greedy_ties_take_the_first_maximum_as_argmax():
    logits = torch.tensor([[1.0, 7.0, 7.0, 0.0], [3.0, 3.0, 3.0, 3.0]])
    assert sample(logits, [SamplingParams(temperature=0)] * 2, [None, None]) == [1, 0]


def test_non_finite_rows_fail_alone_and_huge_finite_rows_still_sample():
    """Each non-finite row (NaN, +inf, -inf) is its own SamplingError; a finite row whose sum
    overflows to inf (the cheap whole-batch check) is still sampled."""
    big = 3e38
    logits = torch.tensor([[0.0, 2.0, 1.0], [float("nan"), 0.0, 1.0], [0.0, float("inf"), 1.0],
                           [float("-inf"), 0.0, 1.0], [big, big, 0.0]])
    out = sample_rows(logits, [SamplingParams(temperature=0)] * 5, [None] * 5)
    assert out[0] == 1 and out[4] == 0
    assert all(isinstance(x, SamplingError) and x.row == i for i, x in enumerate(out) if i in (1, 2, 3))


# -- seeded sampling through the engine -----------------------------------------------------

def test_same_seed_replays_identically_across_engines(tiny):
    params = SamplingParams(temperature=1.0, max_tokens=32, seed=7, ignore_eos=True)
    a = one(LLMEngine(tiny), PROMPT, params).token_ids
    b = one(LLMEngine(tiny, block_size=4, max_num_batched_tokens=5), PROMPT, params).token_ids
    assert len(a) == 32
    assert a == b


def test_different_seeds_give_different_tokens(tiny):
    outs = generate(LLMEngine(tiny), [PROMPT] * 3,
                    [SamplingParams(temperature=1.0, max_tokens=32, seed=s, ignore_eos=True) for s in (1, 2, 3)])
    assert len({o for o in outs}) == 3


def test_same_seed_twice_in_one_batch_gives_the_same_tokens(tiny):
    p = SamplingParams(temperature=1.0, max_tokens=32, seed=11, ignore_eos=True)
    a, b = generate(LLMEngine(tiny), [PROMPT, PROMPT], [p, p])
    assert a == b


def test_seeded_request_does_not_depend_on_batch_composition(tiny):
    """Alone vs. among other sampled and greedy requests, chunked, with preemption."""
    params = SamplingParams(temperature=0.9, top_k=50, top_p=0.95, max_tokens=24, seed=42, ignore_eos=True)
    alone = one(LLMEngine(tiny), PROMPT, params).token_ids

    crowded = LLMEngine(tiny, block_size=4, num_blocks=24, max_num_batched_tokens=7, max_num_seqs=4)
    others = [
        ("Lorem ipsum dolor sit amet", SamplingParams(temperature=1.0, max_tokens=20, seed=1, ignore_eos=True)),
        ("abc", SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)),
        ("A longer prompt that takes several chunks to prefill", SamplingParams(temperature=0.7, max_tokens=10,
                                                                                 ignore_eos=True)),
    ]
    crowded.add_request(*others[0])
    rid = crowded.add_request(PROMPT, params, arrival_step=2)
    crowded.add_request(*others[1])
    crowded.add_request(*others[2], arrival_step=1)
    traces = run_to_completion(crowded)
    assert any(t.preempted for t in traces), "the crowded run was meant to preempt"
    assert crowded.get_output(rid).outputs[0].token_ids == alone


def test_unseeded_requests_follow_the_engine_seed(tiny):
    params = SamplingParams(temperature=1.0, max_tokens=32, ignore_eos=True)
    a = generate(LLMEngine(tiny, seed=5), [PROMPT, "xyz"], params)
    b = generate(LLMEngine(tiny, seed=5), [PROMPT, "xyz"], params)
    c = generate(LLMEngine(tiny, seed=6), [PROMPT, "xyz"], params)
    assert a == b
    assert a != c


@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.5])
def test_top_k_one_equals_greedy(tiny, temperature):
    greedy = one(LLMEngine(tiny), PROMPT, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    k1 = one(LLMEngine(tiny), PROMPT, SamplingParams(temperature=temperature, top_k=1, max_tokens=24, seed=3,
                                                     ignore_eos=True))
    assert k1.token_ids == greedy.token_ids


def test_tiny_top_p_equals_greedy(tiny):
    greedy = one(LLMEngine(tiny), PROMPT, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    p = one(LLMEngine(tiny), PROMPT, SamplingParams(temperature=1.0, top_p=1e-6, max_tokens=24, seed=3,
                                                    ignore_eos=True))
    assert p.token_ids == greedy.token_ids


# -- stopping -------------------------------------------------------------------------------

@pytest.mark.parametrize("max_tokens", [1, 2, 7, 20])
def test_max_tokens_is_respected(tiny, max_tokens):
    out = one(LLMEngine(tiny), PROMPT, SamplingParams(temperature=1.0, seed=0, max_tokens=max_tokens,
                                                      ignore_eos=True))
    assert len(out.token_ids) == max_tokens
    assert out.finish_reason == "length"
    assert out.stop_reason is None


def test_context_limit_ends_generation_with_length(tiny):
    engine = LLMEngine(tiny, max_model_len=16)
    out = one(engine, list(range(40, 50)), SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))
    assert len(out.token_ids) == 16 - 10
    assert out.finish_reason == "length"


def _find_eos_prompt(tiny) -> tuple[list[int], tuple[int, ...], int]:
    """A prompt whose greedy continuation emits EOS within 8 tokens (searched, not hard-coded)."""
    engine = LLMEngine(tiny, max_num_seqs=64, max_num_batched_tokens=1024)
    eos = engine.eos_token_ids
    candidates = [[a, b] for b in (21, 42, 266) for a in range(24)]
    outs = generate(engine, candidates, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    for prompt, toks in zip(candidates, outs):
        hits = [i for i, t in enumerate(toks) if t in eos]
        if hits and hits[0] < 7:
            return prompt, toks, hits[0]
    pytest.fail("no candidate prompt reaches EOS; the EOS tests need one")


def test_eos_stops_unless_ignore_eos(tiny):
    prompt, full, at = _find_eos_prompt(tiny)
    engine = LLMEngine(tiny)
    stopped = one(engine, prompt, SamplingParams(temperature=0, max_tokens=8))
    assert stopped.token_ids == full[: at + 1]  # the EOS token is the last output token
    assert stopped.token_ids[-1] in engine.eos_token_ids
    assert stopped.finish_reason == "stop"
    assert stopped.stop_reason is None
    assert "</s>" not in stopped.text

    ignored = one(LLMEngine(tiny), prompt, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert ignored.token_ids == full
    assert len(ignored.token_ids) == 8
    assert ignored.finish_reason == "length"


def _printable(tok: int) -> bool:
    return 0x21 <= tok <= 0x7E


def test_stop_string_stops_and_truncates_text(tiny):
    """A two-character stop string that spans a token boundary (byte tokenizer: 1 char/token)."""
    engine = LLMEngine(tiny)
    tok = engine.tokenizer
    prompts = ["Hello world", PROMPT, "Once upon a time", "0123456789", "stop here"]
    refs = generate(engine, prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    for prompt, ref in zip(prompts, refs):
        for k in range(1, len(ref) - 1):
            if _printable(ref[k]) and _printable(ref[k + 1]):
                stop = chr(ref[k]) + chr(ref[k + 1])
                if stop not in tok.decode(list(ref[: k + 1]), skip_special_tokens=True):
                    break
        else:
            continue
        break
    else:
        pytest.fail("no reference output has two printable characters in a row")

    out = one(LLMEngine(tiny), prompt, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True,
                                                      stop=["\x00never", stop]))
    assert out.finish_reason == "stop"
    assert out.stop_reason == stop
    assert out.token_ids == ref[: k + 2]  # generation ends on the token that completes the stop string
    full_text = tok.decode(list(ref[: k + 2]), skip_special_tokens=True)
    assert out.text == full_text[: full_text.index(stop)]
    assert stop not in out.text


def test_stop_string_in_the_prompt_does_not_stop(tiny):
    prompt = "abcdefghij klmnop"
    ref = one(LLMEngine(tiny), prompt, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    stops = [prompt[i:i + 2] for i in range(len(prompt) - 1) if prompt[i:i + 2] not in ref.text]
    assert stops, "every pair of prompt characters shows up in the output; pick another prompt"
    out = one(LLMEngine(tiny), prompt, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True,
                                                      stop=stops))
    assert out.token_ids == ref.token_ids
    assert out.finish_reason == "length" and out.stop_reason is None
    assert out.text == ref.text


def test_abort_finishes_with_reason_abort_and_keeps_partial_output(tiny):
    engine = LLMEngine(tiny)
    rid = engine.add_request(PROMPT, SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))
    for _ in range(4):
        engine.step()
        engine.check_integrity()
    engine.abort_request(rid)
    engine.check_integrity()
    out = engine.get_output(rid)
    assert out.finished
    assert out.outputs[0].finish_reason == "abort"
    assert 1 <= len(out.outputs[0].token_ids) < 50
    assert not engine.has_unfinished_requests()
    assert engine.kv.pool.num_used == 0
    engine.abort_request(rid)  # aborting a finished request is a no-op
    assert engine.get_output(rid).outputs[0].finish_reason == "abort"


def test_finish_reasons_of_a_mixed_batch(tiny):
    prompt, _, _ = _find_eos_prompt(tiny)
    engine = LLMEngine(tiny)
    r_eos = engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=8))
    r_len = engine.add_request(PROMPT, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    r_abort = engine.add_request(PROMPT, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    assert engine.get_output(r_len).outputs[0].finish_reason is None  # not finished yet
    engine.step()
    engine.abort_request(r_abort)
    run_to_completion(engine)
    reasons = {r: engine.get_output(r).outputs[0].finish_reason for r in (r_eos, r_len, r_abort)}
    assert reasons == {r_eos: "stop", r_len: "length", r_abort: "abort"}
    assert all(engine.get_output(r).finished for r in reasons)
