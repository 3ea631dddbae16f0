"""The Speculative decoding views from real speculative runs of the engine (tiny-random): every
cell, count and curve is checked against the StepTrace.spec records it was drawn from; every
figure passes Plotly's validation."""
from __future__ import annotations

import pytest

from engine import LLMEngine, SamplingParams
from engine.model.shared import get_shared_model
from engine.speculative.theory import best_k, expected_speedup, expected_tokens_per_step
from visualizers import speculative as sv
from visualizers.figures import validated

PROMPT = "one two three four five six one two three four five six one two three four five six one two"


def run(method: dict, temperature: float = 0.0, n: int = 3, top_k: int = 0) -> list:
    engine = LLMEngine(get_shared_model("tiny-random"), block_size=4, num_blocks=256, speculative_config=method)
    for i in range(n):
        engine.add_request(PROMPT, SamplingParams(temperature=temperature, top_k=top_k, max_tokens=24, seed=i,
                                                   ignore_eos=True))
    traces = []
    while engine.has_unfinished_requests():
        traces.append(engine.step())
        engine.check_integrity()
    return traces


@pytest.fixture(scope="module")
def early_sampled():
    """The sampled path (rejection sampling with residuals). tiny-random's early exit agrees with
    the full model almost always at top_k = 0 (its layers barely move the residual stream);
    top_k = 5 applied to both p and q makes their supports differ, so some drafts are rejected."""
    return run({"method": "early_exit", "num_layers": 1, "num_speculative_tokens": 4}, temperature=0.8, top_k=5)


@pytest.fixture(scope="module")
def ngram_greedy():
    return run({"method": "ngram", "num_speculative_tokens": 3})


def test_drafts_figure_has_one_cell_per_draft_and_final_token(early_sampled) -> None:
    trace = next(t for t in early_sampled if t.spec and any(v.final_kind == "recovered" for v in t.spec))
    fig = validated(sv.drafts_figure(trace, step=trace.step))
    by_name = {t.name: t for t in fig.data}
    for kind, label in sv.SPEC_LABELS.items():
        want = sum(1 for v in trace.spec for d in v.drafts if d.outcome == kind) + sum(
            1 for v in trace.spec if v.final_kind == kind)
        assert len(by_name[label].x) == want, kind
    assert fig.layout.meta["step"] == trace.step
    rec = next(v for v in trace.spec if v.final_kind == "recovered")
    assert rec.residual_top and "residual" in " ".join(by_name[sv.SPEC_LABELS["recovered"]].hovertext)
    # every draft carries the target's top choices at its position, largest first, and shows them
    draft = rec.drafts[0]
    assert draft.alternatives and list(a.prob for a in draft.alternatives) == sorted(
        (a.prob for a in draft.alternatives), reverse=True)
    assert "the target's top choices" in " ".join(by_name[sv.SPEC_LABELS[draft.outcome]].hovertext)


def test_pq_figure_shows_each_drafts_p_and_q(early_sampled) -> None:
    v = next(v for t in early_sampled for v in t.spec if v.drafts)
    fig = validated(sv.pq_figure(v))
    assert list(fig.data[0].y) == [d.p for d in v.drafts] and list(fig.data[1].y) == [d.q for d in v.drafts]
    assert all(0 <= y <= 1 for y in fig.data[2].y)


def test_acceptance_counts_agree_with_the_records(early_sampled) -> None:
    vs = [v for t in early_sampled for v in t.spec]
    summary = sv.spec_summary(early_sampled)
    assert summary.proposed == sum(len(v.drafts) for v in vs) > 0
    assert summary.accepted == sum(v.num_accepted for v in vs)
    pos = sv.acceptance_by_position(early_sampled)
    assert pos["accepted"].sum() == summary.accepted
    assert pos.iloc[0]["verified"] == sum(1 for v in vs if v.drafts)  # every first draft is tested
    assert list(pos["verified"]) == sorted(pos["verified"], reverse=True)
    per = sv.spec_requests_frame(early_sampled)
    assert per["proposed"].sum() == summary.proposed and len(per) == 3


def test_marked_text_covers_every_output_token(ngram_greedy) -> None:
    kinds = sv.token_kinds(ngram_greedy, "0")
    assert len(kinds) == 24
    assert any(k == "accepted" for _, _, k in kinds), "the repeated prompt gives n-gram drafts that are accepted"
    md = sv.spec_text_markdown(ngram_greedy, "0")
    assert ":green-background[" in md
    greedy_mean = sv.spec_summary(ngram_greedy).tokens_per_verification
    assert greedy_mean is not None and greedy_mean > 1


def test_theory_figure_matches_the_formulas() -> None:
    fig = validated(sv.theory_figure(0.7, 4, 0.3, measured_tokens=2.5, measured_speedup=1.4))
    tokens, speed = fig.data[0], fig.data[2]
    assert tokens.y[4] == pytest.approx(expected_tokens_per_step(0.7, 4))
    assert speed.y[3] == pytest.approx(expected_speedup(0.7, 3, 0.3))
    assert any(a.text == f"best k = {best_k(0.7, 0.3, 12)}" for a in fig.layout.annotations)


def test_tokens_per_step_and_empty_inputs(ngram_greedy) -> None:
    fig = validated(sv.tokens_per_step_figure(ngram_greedy))
    assert len(fig.data[0].x) == sum(1 for t in ngram_greedy if t.spec)
    validated(sv.drafts_figure(None))
    assert sv.spec_summary([]).alpha is None and sv.acceptance_by_position([]).empty
