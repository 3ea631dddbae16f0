"""Parallel sampling (``SamplingParams.n``, issue #8): one prefill for the prompt, n sequences
forked from it that share its blocks (ref counts, owners), copy-on-write of the shared partial
block at the first write, per-sequence seeded generators (seed + i), greedy sequences that
agree, abort of the whole request, and ``n`` against ``max_num_seqs``.

(HF parity of greedy n=4 is in test_prefix_parity.py; the n field's own validation is in the
fuzz suite.)
"""
from __future__ import annotations

import pytest

from engine.core.config import SamplingParams
from engine.serving.llm import LLM
from engine.serving.engine import LLMEngine
from engine.core.trace import StepTrace
from tests.conftest import run_to_completion

pytestmark = pytest.mark.usefixtures("torch_single_thread")

BS = 4
PROMPT = list(range(60, 70))  # 10 tokens: two full blocks and a partial one (10 % 4 != 0)


def family(rid: str, n: int) -> list[str]:
    return [rid] + [f"{rid}#{i}" for i in range(1, n)]


def step_until_forked(engine: LLMEngine) -> list[StepTrace]:
    traces = []
    while not (traces and traces[-1].prefix.forked):
        traces.append(engine.step())
        engine.check_integrity()
        assert len(traces) < 100
    return traces


@pytest.mark.parametrize("caching", [True, False])
def test_one_prefill_then_four_sequences_share_the_prompt_blocks(tiny, caching: bool) -> None:
    """The prompt is prefilled once (in chunks of 3 here); the fork makes every block of it
    shared by the 4 sequences; the first write into the shared partial block copies it for each
    sequence but the last one, which keeps the original."""
    engine = LLMEngine(tiny, block_size=BS, num_blocks=32, max_num_batched_tokens=3,
                       enable_prefix_caching=caching)
    rid = engine.add_request(PROMPT, SamplingParams(temperature=0.8, seed=1, n=4, max_tokens=6, ignore_eos=True))
    seqs = family(rid, 4)
    traces = step_until_forked(engine)
    assert traces[-1].prefix.forked == tuple(seqs[1:])
    prefill = [c for t in traces for c in t.scheduled]
    assert all(c.request_id == rid and c.kind == "prefill" for c in prefill)
    assert sum(c.num_tokens for c in prefill) == len(PROMPT)

    snap = engine.snapshot()
    tables = {r.request_id: r.block_table for r in snap.requests}
    assert set(tables) == set(seqs) and len({tables[s] for s in seqs}) == 1
    table = tables[rid]
    assert len(table) == 3
    for i, b in enumerate(table):
        block = snap.blocks[b]
        assert block.ref_count == 4 and sorted(block.owners) == sorted(seqs)
        assert block.cached == (caching and i < 2), "only the full blocks go to the prefix cache"
    if caching:
        nodes = snap.prefix_tree[1:]  # one chain (one node per chunk that filled a block)
        assert [b for n in nodes for b in n.block_ids] == list(table[:2])
        assert all(n.lock_count == 4 for n in nodes)

    # The next step writes each sequence's first sampled token into the shared partial block.
    trace = engine.step()
    engine.check_integrity()
    shared = table[2]
    copies = trace.prefix.copies
    assert len(copies) == 3 and all(c.src_block == shared for c in copies)
    assert len({c.dst_block for c in copies}) == 3 and shared not in {c.dst_block for c in copies}
    assert len({c.request_id for c in copies}) == 3
    snap = engine.snapshot()
    tables = {r.request_id: r.block_table for r in snap.requests}
    assert len({t[2] for t in tables.values()}) == 4, "each sequence writes its own partial block"
    assert snap.blocks[shared].ref_count == 1
    assert all(snap.blocks[b].ref_count == 4 for b in table[:2])
    rest = run_to_completion(engine)
    assert all(not t.prefix.copies for t in rest), "copy-on-write only once"
    # Never a second prefill: after the fork every chunk of every sequence is one decode token.
    assert all(c.kind == "decode" and c.num_tokens == 1 for t in [trace, *rest] for c in t.scheduled)
    assert all(len(c.token_ids) == 6 for c in engine.get_output(rid).outputs)
    assert engine.kv.pool.num_used == 0


def _sample(tiny, knobs: dict, params: SamplingParams, prompt=PROMPT) -> list[tuple[int, ...]]:
    engine = LLMEngine(tiny, **knobs)
    rid = engine.add_request(prompt, params)
    run_to_completion(engine)
    out = engine.get_output(rid)
    assert out.finished and [c.index for c in out.outputs] == list(range(params.n))
    assert engine.kv.pool.num_used == 0
    return [c.token_ids for c in out.outputs]


def test_seeded_parallel_sampling_replays_and_each_sequence_has_its_own_generator(tiny) -> None:
    params = SamplingParams(temperature=0.8, seed=123, n=4, max_tokens=12, ignore_eos=True)
    a = _sample(tiny, {"block_size": BS}, params)
    b = _sample(tiny, {"block_size": 8, "max_num_batched_tokens": 5, "enable_prefix_caching": False}, params)
    assert a == b, "the same seed replays every sequence, whatever the engine's knobs"
    assert len(set(a)) == 4, "the four sequences should differ"
    # Sequence i samples with seed + i, from the same logits: as if alone with that seed.
    for i, tokens in enumerate(a):
        alone = _sample(tiny, {"block_size": BS}, SamplingParams(temperature=0.8, seed=123 + i, max_tokens=12,
                                                                 ignore_eos=True))
        assert alone == [tokens]


@pytest.mark.parametrize("caching", [True, False])
def test_greedy_n4_gives_four_copies_of_the_n1_output(tiny, caching: bool) -> None:
    knobs = {"block_size": BS, "max_num_batched_tokens": 7, "enable_prefix_caching": caching}
    greedy = _sample(tiny, knobs, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    assert _sample(tiny, knobs, SamplingParams(temperature=0, n=4, max_tokens=12, ignore_eos=True)) == greedy * 4


@pytest.mark.parametrize("when", ["after the fork", "during the prefill"])
def test_abort_of_an_n4_request_frees_every_block(tiny, when: str) -> None:
    engine = LLMEngine(tiny, block_size=BS, num_blocks=32, max_num_batched_tokens=4)
    other = engine.add_request([7, 8, 9], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    rid = engine.add_request(PROMPT, SamplingParams(temperature=0.8, seed=5, n=4, max_tokens=20, ignore_eos=True))
    if when == "after the fork":
        step_until_forked(engine)
        engine.step()  # past the copy-on-write: every sequence holds a block of its own
    else:
        engine.step()
        assert engine.requests[rid].num_computed_tokens > 0 and engine.requests[rid].needs_fork
    held = {b for s in family(rid, 4) for b in engine.kv.block_tables.get(s, ())}
    assert held
    engine.abort_request(rid)
    engine.check_integrity()
    out = engine.get_output(rid)
    assert out.finished and len(out.outputs) == 4
    assert all(c.finish_reason == "abort" for c in out.outputs)
    if when != "after the fork":
        assert all(c.token_ids == () for c in out.outputs[1:])  # never forked: nothing sampled
    assert not set(engine.kv.block_tables) - {other}
    assert all(engine.kv.pool.blocks[b].ref_count == 0 for b in held)
    run_to_completion(engine)
    assert engine.kv.pool.num_used == 0


def test_n_above_max_num_seqs_is_rejected_naming_n(tiny) -> None:
    engine = LLMEngine(tiny, max_num_seqs=3)
    with pytest.raises(ValueError, match=r"^n: 4 .*max_num_seqs=3"):
        engine.add_request("hi", SamplingParams(n=4))
    assert not engine.requests and not engine.has_unfinished_requests()
    with pytest.raises(ValueError, match=r"^n: "):
        LLM(tiny, max_num_seqs=3).generate(["a", "b"], [SamplingParams(n=1), SamplingParams(n=5)])
    # n == max_num_seqs fits: all of its sequences run at once.
    rid = engine.add_request("hi", SamplingParams(temperature=0, n=3, max_tokens=4))
    traces = run_to_completion(engine)
    assert max(t.num_running for t in traces) == 3
    assert len(engine.get_output(rid).outputs) == 3


def test_n_sequences_count_against_max_num_seqs_when_admitting(tiny) -> None:
    """A waiting n=3 request takes 3 seats: with max_num_seqs=4 and one request running, it
    waits until that one finishes, and never more than 4 sequences run."""
    engine = LLMEngine(tiny, max_num_seqs=4, block_size=BS)
    first = engine.add_request([5, 6, 7], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    engine.add_request([5, 6, 7], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    rid = engine.add_request(PROMPT, SamplingParams(temperature=0, n=3, max_tokens=5, ignore_eos=True))
    traces = run_to_completion(engine)
    assert max(t.num_running for t in traces) <= 4
    started = min(t.step for t in traces for c in t.scheduled if c.request_id == rid)
    assert started > engine.get_output(first).metrics.finished_step
    assert all(len(c.token_ids) == 5 for c in engine.get_output(rid).outputs)
