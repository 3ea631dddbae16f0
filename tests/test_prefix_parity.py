"""Issue #8: greedy outputs with prefix caching on equal Hugging Face ``generate`` (and the same
run with caching off), through every path the cache adds: shared system prompts, multi-turn
conversations, one prompt a prefix of another, hits that end inside a block, hits after
evictions, preemption with the cache on, and greedy parallel sampling (n=4).

Every run checks every manager's integrity after every step (``run_to_completion``). Prompts
are token ids (tokenized text), so a later prompt can extend an earlier prompt plus its
output exactly, as a chat client does, and the oracle gets the very same ids.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable

import pytest
import torch

from engine import LLMEngine, SamplingParams
from engine.model.shared import get_shared_model
from engine.core.trace import StepTrace
from tests.conftest import run_to_completion
from tests.parity import hf_model

pytestmark = pytest.mark.usefixtures("torch_single_thread")

# SmolLM2 (real, slower): one case per path. tiny-random: every path, instant.
MODELS = ["tiny-random", pytest.param("smollm2-135m", marks=pytest.mark.slow)]
MAX_TOKENS = 8

SYSTEM = ("You are a careful assistant for a small public library. Answer in one short sentence and never "
          "invent facts about opening hours, fees or events.\n")
QUESTIONS = [
    "Q: When does the library open on Sunday?\nA:",
    "Q: Can I renew a book online?\nA:",
    "Q: Is there a fee for a lost card?\nA:",
    "Q: Where are the children's books?\nA:",
]
STORY = ("The lighthouse keeper climbed the spiral stairs every evening at dusk, counting one hundred and "
         "twelve steps, lighting the great lamp, and writing the weather in a leather book that nobody read.")
OTHER = ("Bread dough rises because yeast eats sugar and breathes out carbon dioxide, which the gluten "
         "traps in thousands of tiny bubbles while the loaf rests somewhere warm.")


def encode(name: str, text: str) -> list[int]:
    return list(get_shared_model(name).tokenizer(text, add_special_tokens=False).input_ids)


@lru_cache(maxsize=256)
def hf_greedy_ids(name: str, ids: tuple[int, ...], max_tokens: int) -> tuple[int, ...]:
    """Hugging Face ``generate`` on token ids (greedy, batch 1, every position attended)."""
    shared = get_shared_model(name)
    x = torch.tensor([list(ids)])
    eos = sorted(set(shared.model.config.eos_token_ids) | {shared.tokenizer.eos_token_id})
    with torch.inference_mode():
        out = hf_model(name).generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_tokens,
                                      do_sample=False, eos_token_id=eos, pad_token_id=eos[0])
    return tuple(out[0, x.shape[1]:].tolist())


@dataclass
class Session:
    """One engine; requests submitted in waves, each wave run to completion (integrity checked
    after every step). ``done`` keeps (prompt ids, output ids, num_cached_tokens) per request."""

    engine: LLMEngine
    traces: list[StepTrace] = field(default_factory=list)
    done: dict[str, tuple[tuple[int, ...], tuple[int, ...], int]] = field(default_factory=dict)

    def wave(self, prompts: list[list[int]], params: SamplingParams | None = None,
             arrivals: list[int] | None = None) -> list[str]:
        params = params or SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
        start = self.engine.step_count
        ids = [self.engine.add_request(p, params, arrival_step=None if arrivals is None else start + a)
               for p, a in zip(prompts, arrivals or [0] * len(prompts))]
        self.traces += run_to_completion(self.engine, max_steps=5_000)
        for rid in ids:
            out = self.engine.get_output(rid)
            assert out.finished
            for c in out.outputs:
                assert c.finish_reason in ("stop", "length"), c
            assert out.num_cached_tokens == out.metrics.num_cached_tokens
            self.done[rid] = (out.prompt_token_ids, out.outputs[0].token_ids, out.num_cached_tokens)
        return ids

    def output(self, rid: str) -> tuple[int, ...]:
        return self.done[rid][1]

    def cached(self, rid: str) -> int:
        return self.done[rid][2]

    def results(self) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        return [(p, o) for p, o, _ in self.done.values()]


Scenario = Callable[[Session, str], None]


def run_both(name: str, scenario: Scenario, **knobs) -> tuple[Session, Session]:
    """The scenario with caching on and off: same (prompt, output) pairs, each equal to HF."""
    model = get_shared_model(name)
    on = Session(LLMEngine(model, enable_prefix_caching=True, **knobs))
    scenario(on, name)
    off = Session(LLMEngine(model, enable_prefix_caching=False, **knobs))
    scenario(off, name)
    assert on.results() == off.results(), "caching on and off gave different tokens"
    for prompt, out in on.results():
        assert out == hf_greedy_ids(name, prompt, MAX_TOKENS), f"prompt of {len(prompt)} tokens: engine != HF"
    assert not any(t.prefix.lookups for t in off.traces), "caching off looked up the cache"
    assert all(b.ref_count == 0 for b in on.engine.snapshot().blocks)
    return on, off


def aligned(n: int, bs: int) -> int:
    return n // bs * bs


def common(a: list[int] | tuple[int, ...], b: list[int] | tuple[int, ...]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def halves(ids: list[int]) -> list[int]:
    """The first half and one token (so, with block_size 4, not block-aligned)."""
    return ids[: len(ids) // 2 + 1] if (len(ids) // 2 + 1) % 4 else ids[: len(ids) // 2 + 2]


def _sized_pool(lengths: list[int], bs: int, slack: int) -> int:
    """Blocks for the longest request (prompt + output) plus ``slack``."""
    return -(-(max(lengths) + MAX_TOKENS) // bs) + slack


# -- the paths ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["tiny-random", pytest.param("smollm2-135m", marks=pytest.mark.sweep)])
def test_shared_system_prompt(name: str) -> None:  # SmolLM2's whole-block hits: test_multi_turn_conversation
    """The first request prefills the system prompt; the others arrive once it is cached and
    reuse its whole blocks (at least the block-aligned common prefix, never the last token)."""
    bs = 4
    prompts = [encode(name, SYSTEM + q) for q in QUESTIONS]

    def scenario(s: Session, _: str) -> None:
        s.wave(prompts, arrivals=[0, 1, 1, 2])

    on, _ = run_both(name, scenario, block_size=bs, num_blocks=256)
    rids = list(on.done)
    assert on.cached(rids[0]) == 0
    for rid, p in zip(rids[1:], prompts[1:]):
        shared = common(p, prompts[0])
        assert aligned(shared, bs) <= on.cached(rid) < len(p) and on.cached(rid) % bs == 0
    lookups = [h for t in on.traces for h in t.prefix.lookups]
    assert len(lookups) == len(prompts) and sum(h.num_cached_tokens for h in lookups) > 0


@pytest.mark.parametrize("name", MODELS)
def test_multi_turn_conversation(name: str) -> None:
    """Turn k = turn k-1's prompt + its output + a new user message, on one engine: each turn
    hits every whole block the previous turn computed (its prompt and all but its last token)."""
    bs = 4
    follow_ups = ["\nQ: And on Saturday?\nA:", "\nQ: Thanks. Is parking free?\nA:"]

    def scenario(s: Session, name: str) -> None:
        prompt = encode(name, SYSTEM + QUESTIONS[0])  # turn 0 is the shared-prefix test's first prompt
        for turn in range(len(follow_ups) + 1):
            (rid,) = s.wave([prompt])
            if turn < len(follow_ups):
                prompt = prompt + list(s.output(rid)) + encode(name, follow_ups[turn])

    on, _ = run_both(name, scenario, block_size=bs, num_blocks=256)
    turns = list(on.done.values())
    assert turns[0][2] == 0
    for (prev_prompt, prev_out, _), (prompt, _, cached) in zip(turns, turns[1:]):
        assert prompt[: len(prev_prompt) + len(prev_out)] == prev_prompt + prev_out
        computed = len(prev_prompt) + len(prev_out) - 1  # the last sampled token never had KV
        assert cached == aligned(min(computed, len(prompt) - 1), bs), "a turn missed the previous turn's blocks"


@pytest.mark.parametrize(("name", "order"), [("tiny-random", "short first"), ("tiny-random", "long first"),
                                             ("smollm2-135m", "long first")])  # one SmolLM2 case per path
def test_prompt_that_is_a_prefix_of_another(name: str, order: str) -> None:
    """A = the first tokens of B. Short first: B reuses A's whole blocks. Long first: A's match
    ends inside B's prompt node, which is split there; A still recomputes its last token."""
    bs = 4
    long = encode(name, STORY)
    short = halves(long)
    first, second = (short, long) if order == "short first" else (long, short)

    def scenario(s: Session, _: str) -> None:
        s.wave([first])
        s.wave([second])

    on, _ = run_both(name, scenario, block_size=bs, num_blocks=256)
    _, hit = (on.cached(r) for r in on.done)
    if order == "short first":
        assert hit >= aligned(len(short), bs)
    else:
        assert hit == aligned(len(short) - 1, bs)
        assert any(t.prefix.split for t in on.traces), "the match inside B's node did not split it"


@pytest.mark.parametrize("name", MODELS)
def test_hit_ending_inside_a_block(name: str) -> None:
    """Shared prefix length not a multiple of block_size: the hit is its block-aligned floor. An
    identical prompt (length a multiple of block_size) hits all but its last block: the last
    prompt token is always recomputed, its logits are needed to sample."""
    bs = 4
    base = encode(name, STORY)
    a = base[: aligned(len(base) - 8, bs)]  # len(a) % bs == 0
    shared = aligned(len(a) // 2, bs) + 3  # ends 3 tokens into a block
    b = a[:shared] + encode(name, OTHER)[:12]
    assert shared % bs and b[shared] != a[shared]

    def scenario(s: Session, _: str) -> None:
        s.wave([a])
        s.wave([b, a], arrivals=[0, 1])  # b arrives first; a again (identical) one step later

    on, _ = run_both(name, scenario, block_size=bs, num_blocks=256)
    first_a, hit_b, again_a = (on.cached(r) for r in on.done)
    assert first_a == 0
    assert hit_b == aligned(shared, bs) == shared - 3
    assert again_a == len(a) - bs < len(a)


@pytest.mark.parametrize("name", MODELS)
def test_hits_after_eviction(name: str) -> None:
    """A pool that keeps about one conversation's blocks: each new topic evicts the last one's
    (LRU), and a follow-up on the topic just computed still hits. Outputs stay exact."""
    bs = 4
    a1, b1 = encode(name, STORY), encode(name, OTHER)
    a2, b2 = halves(a1), halves(b1)  # a follow-up sharing most of its topic's blocks
    waves = [a1, a2, b1, b2, a1]
    num_blocks = _sized_pool([len(p) for p in waves], bs, slack=3)

    def scenario(s: Session, _: str) -> None:
        for p in waves:
            s.wave([p])

    on, _ = run_both(name, scenario, block_size=bs, num_blocks=num_blocks)
    evicted_at = [t.step for t in on.traces if t.prefix.evicted]
    assert evicted_at, "the small pool never evicted"
    hits_after = [h for t in on.traces if t.step > evicted_at[0] for h in t.prefix.lookups if h.num_cached_tokens]
    assert hits_after, "no cache hit after the first eviction"
    cached = [on.cached(r) for r in on.done]
    assert cached[1] > 0 and cached[3] > 0  # a2 hits a1, b2 hits b1
    assert cached[4] < aligned(len(a1) - 1, bs), "a1's blocks should have been evicted by b1/b2"


@pytest.mark.parametrize("name", MODELS)
def test_preemption_with_caching_on(name: str) -> None:
    """Four requests sharing the system prompt in a pool too small for all of them: running ones
    are preempted and recomputed (their cached prefix is reused); outputs stay exact."""
    bs = 4
    prompts = [encode(name, SYSTEM + q) for q in QUESTIONS]
    num_blocks = _sized_pool([len(p) for p in prompts], bs, slack=4)  # the shared prefix helps, not enough

    def scenario(s: Session, _: str) -> None:
        s.wave(prompts, arrivals=[0, 1, 1, 1])

    on, _ = run_both(name, scenario, block_size=bs, num_blocks=num_blocks, max_num_batched_tokens=64)
    assert any(t.preempted for t in on.traces), "the small pool never preempted"
    preempted = {r for t in on.traces for r in t.preempted}
    resumed = [h for t in on.traces for h in t.prefix.lookups
               if h.request_id in preempted and any(c.request_id == h.request_id and c.resumed for c in t.scheduled)]
    assert resumed and any(h.num_cached_tokens > 0 for h in resumed), "no recompute reused the cache"


@pytest.mark.parametrize("name", MODELS)
def test_parallel_sampling_greedy_n4(name: str) -> None:
    """n=4 with temperature 0: one prefill, four forked sequences (copy-on-write of the shared
    partial block), four identical outputs equal to HF greedy."""
    bs = 4
    prompt = encode(name, SYSTEM + QUESTIONS[0])
    if len(prompt) % bs == 0:
        prompt = prompt[:-1]
    outputs: dict[bool, list[tuple[int, ...]]] = {}

    for caching in (True, False):
        engine = LLMEngine(get_shared_model(name), block_size=bs, num_blocks=256, enable_prefix_caching=caching)
        rid = engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=MAX_TOKENS, n=4))
        traces = run_to_completion(engine)
        out = engine.get_output(rid)
        assert out.finished and len(out.outputs) == 4
        outputs[caching] = [c.token_ids for c in out.outputs]
        assert sum(len(t.prefix.forked) for t in traces) == 3
        assert sum(len(t.prefix.copies) for t in traces) == 3
        assert engine.kv.pool.num_used == 0
    assert outputs[True] == outputs[False]
    assert len(set(outputs[True])) == 1
    assert outputs[True][0] == hf_greedy_ids(name, tuple(prompt), MAX_TOKENS)
