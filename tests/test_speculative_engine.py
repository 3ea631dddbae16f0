"""Speculative decoding inside the engine (issue #10, "Engine"): greedy parity with the plain
engine and Hugging Face for every drafter and k, under continuous batching, chunked prefill,
preemption and prefix caching; rollback invariants after every step; a failed step restores
target and draft state; sampled runs reproducible; records agree with the emitted tokens; a
speculative recording replays."""
from __future__ import annotations

import random

import pytest
import engine.core.scheduler as scheduler_module
from engine.core.config import EngineConfig, SamplingParams
from engine.serving.llm import LLM
from engine.serving.engine import LLMEngine
from tests.conftest import run_to_completion
from tests.parity import PROMPTS, assert_matches_hf, hf_greedy, run_engine

pytestmark = pytest.mark.usefixtures("torch_single_thread")

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
EARLY = {"method": "early_exit", "num_layers": 1, "num_speculative_tokens": 4}
DRAFT = {"method": "draft_model", "model": "tiny-random", "num_speculative_tokens": 4}
METHODS = {"ngram": NGRAM, "early_exit": EARLY, "draft_model": DRAFT}
MAX_TOKENS = 20


def spec(method: str, k: int) -> dict:
    return {**METHODS[method], "num_speculative_tokens": k}


@pytest.fixture(scope="module")
def baseline(tiny):
    """Non-speculative greedy outputs for the shared settings (batching, chunking, pool)."""
    cache: dict = {}

    def get(**knobs):
        key = tuple(sorted(knobs.items()))
        if key not in cache:
            cache[key] = run_engine(LLMEngine(tiny, **knobs), PROMPTS, MAX_TOKENS)[0]
        return cache[key]
    return get


# Each setting stresses one path: many requests in one batch, small budget (chunked prefill +
# trimmed drafts), small pool (preemption), prefix caching with shared prompt openings.
SETTINGS = {
    "batched": {"block_size": 4, "num_blocks": 256},
    "chunked": {"block_size": 4, "num_blocks": 256, "max_num_batched_tokens": 6},
    "preempt": {"block_size": 4, "num_blocks": 150, "max_num_batched_tokens": 64},
    "prefix": {"block_size": 2, "num_blocks": 512, "enable_prefix_caching": True},
}


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_greedy_speculation_is_token_identical(tiny, baseline, method, k):
    """Rule: greedy speculative decoding emits exactly the non-speculative engine's tokens, for
    every drafter and k, whatever the batch, budget, pool or cache (one setting per k, so every
    (method, setting) pair runs once)."""
    name = list(SETTINGS)[[1, 2, 4, 8].index(k)]
    knobs = SETTINGS[name]
    engine = LLMEngine(tiny, speculative_config=spec(method, k), **knobs)
    outputs, traces = run_engine(engine, PROMPTS, MAX_TOKENS)
    assert outputs == baseline(**knobs), (method, k, name)
    assert engine.kv.pool.num_used == 0 and engine.speculator.drafter.num_used_blocks == 0
    verified = [v for t in traces for v in t.spec]
    if method != "ngram":
        assert verified, "a model drafter verified nothing"
    if name == "preempt":
        assert any(t.preempted for t in traces) or k == 8  # the small pool preempts
    if method == "draft_model":  # tiny-random drafting for itself: a perfect drafter
        m = [engine.metrics(r) for r in engine.requests.values()]
        assert sum(x.num_draft_tokens for x in m) > 0
        assert sum(x.num_accepted_tokens for x in m) == sum(x.num_draft_tokens for x in m)
        assert all(x.acceptance_rate in (None, 1.0) for x in m)
    if k == 4:
        assert_matches_hf("tiny-random", PROMPTS, outputs, MAX_TOKENS)


def test_greedy_smollm2_int4_draft_matches_hf():
    """The real case: smollm2-135m verified against its own int4 quantization as the draft
    model (ONE smollm2 case per path: ngram and early_exit share the run by prompt)."""
    prompts = PROMPTS[:2]
    for cfg in ({"method": "draft_model", "model": "smollm2-135m", "quantization": "int4",
                 "num_speculative_tokens": 3},
                {"method": "early_exit", "num_layers": 10, "num_speculative_tokens": 2},
                {"method": "ngram", "num_speculative_tokens": 4}):
        engine = LLMEngine("smollm2-135m", block_size=16, num_blocks=32, speculative_config=cfg)
        outputs, traces = run_engine(engine, prompts, 12)
        assert_matches_hf("smollm2-135m", prompts, outputs, 12)
        if cfg["method"] == "draft_model":
            m = [engine.metrics(r) for r in engine.requests.values()]
            assert sum(x.num_accepted_tokens for x in m) > 0


@pytest.mark.parametrize("seed", range(6))
def test_random_speculative_runs_keep_every_invariant(tiny, seed):
    """check_integrity (target and draft pools) after every step of random runs: methods, k,
    budgets, pools, greedy and sampled requests, staggered arrivals, an abort; nothing leaks."""
    rng = random.Random(seed)
    method = list(METHODS)[seed % 3]
    engine = LLMEngine(tiny, speculative_config=spec(method, rng.choice([1, 3, 8])), block_size=rng.choice([2, 4]),
                       num_blocks=rng.choice([40, 64, 128]), max_num_batched_tokens=rng.choice([5, 9, 64]),
                       enable_prefix_caching=rng.random() < 0.5)
    ids = []
    for i in range(6):
        params = SamplingParams(temperature=rng.choice([0, 0.8]), top_k=rng.choice([0, 5]),
                                max_tokens=rng.randint(2, 24), seed=i, ignore_eos=rng.random() < 0.5)
        ids.append(engine.add_request(rng.choice(PROMPTS)[:60], params, arrival_step=rng.randint(0, 4)))
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        engine.check_integrity()
        steps += 1
        if steps == 6:
            engine.abort_request(ids[0])
            engine.check_integrity()
    assert engine.kv.pool.num_used == 0 and engine.speculator.drafter.num_used_blocks == 0
    for rid in ids[1:]:
        out = engine.get_output(rid).outputs[0]
        assert out.finish_reason in ("stop", "length") and len(out.token_ids) <= engine.requests[rid].sampling_params.max_tokens


def engine_state(engine: LLMEngine) -> tuple:
    req = {rid: (r.status, r.num_computed_tokens, tuple(r.output_token_ids), tuple(r.spec_token_ids),
                 r.num_draft_tokens, r.num_accepted_tokens, tuple(engine.kv.block_tables.get(rid, ())))
           for rid, r in engine.requests.items()}
    return (engine.snapshot(), req, engine.step_count, list(engine.kv.pool.free_queue),
            engine.speculator.drafter.checkpoint())


@pytest.mark.parametrize("where", ["execute", "update"])
@pytest.mark.parametrize("method", list(METHODS))
def test_a_failed_speculative_step_restores_target_and_draft_state(tiny, monkeypatch, method, where):
    """A step whose target forward (after drafting) or stop check (after verification and the
    KV rollback) raises leaves requests, target blocks and the draft cache exactly as before;
    the run then finishes as an unbroken one does."""
    knobs = {"block_size": 4, "num_blocks": 64, "speculative_config": spec(method, 3)}
    params = [SamplingParams(temperature=0, max_tokens=16), SamplingParams(temperature=0.8, max_tokens=16, seed=3)]

    def make():
        e = LLMEngine(tiny, **knobs)
        for i, p in enumerate(params):
            e.add_request(PROMPTS[i], p, request_id=str(i))
        return e
    clean = make()
    run_to_completion(clean)
    engine = make()
    for _ in range(3):
        engine.step()
    before = engine_state(engine)
    target = (engine.runner, "execute") if where == "execute" else (scheduler_module, "check_stop")
    original = getattr(*target)

    def fail_once(*args, **kwargs):
        monkeypatch.setattr(*target, original)
        raise RuntimeError("boom")
    monkeypatch.setattr(*target, fail_once)
    with pytest.raises(RuntimeError):
        engine.step()
    assert engine_state(engine) == before
    engine.check_integrity()
    run_to_completion(engine)
    for rid in ("0", "1"):
        assert engine.get_output(rid).outputs[0].token_ids == clean.get_output(rid).outputs[0].token_ids


@pytest.mark.parametrize("method", list(METHODS))
def test_sampled_speculation_is_reproducible_and_records_agree(tiny, method):
    """Seeded sampled runs (T = 0.8) replay token for token, differ from greedy, and every
    StepTrace.spec record agrees with the tokens the step appended (StepTrace.sampled)."""
    def run(temperature):
        e = LLMEngine(tiny, block_size=4, num_blocks=128, speculative_config=spec(method, 4))
        p = SamplingParams(temperature=temperature, max_tokens=24, seed=7, ignore_eos=True)
        ids = [e.add_request(prompt, p) for prompt in PROMPTS[:3]]
        traces = run_to_completion(e)
        return [e.get_output(i).outputs[0].token_ids for i in ids], traces, e
    a, traces, engine = run(0.8)
    b, _, _ = run(0.8)
    g, _, _ = run(0)
    assert a == b and a != g
    kinds = set()
    for t in traces:
        for v in t.spec:
            got = tuple(s.token_id for s in t.sampled if s.request_id == v.request_id)
            assert got == v.emitted[:len(got)] and len(got) >= 1
            n = v.num_accepted
            assert [d.token_id for d in v.drafts[:n]] == list(v.emitted[:n]) and len(v.emitted) == n + 1
            assert all(d.outcome == "accepted" for d in v.drafts[:n])
            assert all(d.outcome == "unverified" for d in v.drafts[n + 1:])
            assert v.final_kind == ("bonus" if n == len(v.drafts) else "recovered")
            if v.final_kind == "recovered":
                assert v.drafts[n].outcome == "rejected" and v.residual_top
            assert t.draft_ms >= 0 and t.total_ms >= t.draft_ms
            kinds.add(v.final_kind)
    if method != "draft_model":
        assert "recovered" in kinds
    m = [engine.metrics(r) for r in engine.requests.values()]
    assert sum(x.num_verify_steps for x in m) == sum(len(t.spec) for t in traces)


def test_config_validation_and_replay(tiny):
    """speculative_config reaches EngineConfig from LLM / LLMEngine; bad values name the field;
    n > 1 is refused naming n; a bad draft vocabulary names speculative_config.model; a
    speculative recording replays through from_json(to_json(record(run)))."""
    from engine.replay.recording import from_json, record, to_json

    from engine.replay.run import LiveRun, RunMeta

    llm = LLM("tiny-random", speculative_config=NGRAM, block_size=4, num_blocks=64)
    assert llm.llm_engine.config.speculative_config.num_speculative_tokens == 4
    with pytest.raises(ValueError, match="speculative_config.num_speculative_tokens"):
        EngineConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 99})
    with pytest.raises(ValueError, match="speculative_config.num_layers"):
        LLMEngine(tiny, speculative_config={"method": "early_exit", "num_layers": 2, "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="speculative_config.model"):
        LLMEngine(tiny, num_blocks=16, speculative_config={"method": "draft_model", "model": "smollm2-135m",
                                                           "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="n:"):
        llm.generate("Hi", SamplingParams(n=2))
    engine = LLMEngine(tiny, block_size=4, num_blocks=64, speculative_config=EARLY)
    meta = RunMeta(model="tiny-random", scenario="spec", title="spec", config=engine.config,
                   max_model_len=engine.max_model_len, kv_bytes_per_token=engine.kv_cache_bytes_per_token)
    run = LiveRun(engine, meta)
    for p in PROMPTS[:2]:
        engine.add_request(p, SamplingParams(temperature=0.8, max_tokens=12, seed=1))
    while engine.has_unfinished_requests():
        run.step()
    rec = record(run)
    assert any(t.spec for t in rec.traces)
    again = from_json(to_json(rec))
    assert again.traces == rec.traces and again.meta.config.speculative_config.method == "early_exit"
    bad = to_json(rec).replace('"num_speculative_tokens":4', '"num_speculative_tokens":0')
    with pytest.raises(ValueError, match="speculative_config"):
        from_json(bad)


def test_memory_check_counts_the_drafters_own_kv_pool(tiny):
    """A model drafter allocates its own pool (num_blocks x block_size) for its layers: the memory
    check counts it (draft_model = the same tiny model: exactly twice the KV; early exit with 1 of
    2 layers: half again; ngram: nothing)."""
    plain = LLMEngine(tiny, block_size=4, num_blocks=64).memory_need.kv_cache
    knobs = dict(block_size=4, num_blocks=64)
    assert LLMEngine(tiny, speculative_config=NGRAM, **knobs).memory_need.kv_cache == plain
    draft = {"method": "draft_model", "model": "tiny-random", "num_speculative_tokens": 2}
    assert LLMEngine(tiny, speculative_config=draft, **knobs).memory_need.kv_cache == 2 * plain
    early = {"method": "early_exit", "num_layers": 1, "num_speculative_tokens": 2}
    assert LLMEngine(tiny, speculative_config=early, **knobs).memory_need.kv_cache == plain + plain // 2
