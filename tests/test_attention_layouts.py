"""Issue #21 item 6: the Attention architectures page's studies.

The live part: MHA, GQA and MQA tiny-random engines given the same KV-cache bytes hold 1 : 2 : 4
times the blocks, so on one workload MQA admits at least as many sequences as GQA and GQA as
MHA; every engine keeps its invariants after every step (the study checks them; the records are
checked against each other here). The calculator part: rows copy the calculator's answers.
"""
from __future__ import annotations

import pytest

from engine.memory import estimate, kv_bytes_per_token, model_from_config, Settings, SizingError, Workload
from engine.model.loader import TINY_RANDOM_CONFIGS
from engine.studies.architectures import ARCHITECTURES, compare_architectures
from engine.studies.attention_layouts import LAYOUTS, LayoutWorkload, run_layouts


@pytest.fixture(scope="module")
def study(torch_single_thread):
    return run_layouts(LayoutWorkload())


def test_same_budget_more_blocks_for_fewer_kv_heads(study) -> None:
    mha, gqa, mqa = study.runs
    assert [r.layout for r in study.runs] == ["MHA", "GQA", "MQA"]
    assert [r.num_kv_heads for r in study.runs] == [4, 2, 1]
    assert {(r.num_query_heads, r.head_dim, r.num_layers) for r in study.runs} == {(4, 16, 2)}
    assert mha.num_blocks < gqa.num_blocks < mqa.num_blocks
    for run in study.runs:  # the pool the engine allocated is the blocks the budget buys, within it
        assert run.kv_pool_bytes == run.num_blocks * run.block_size * run.kv_bytes_per_token
        assert run.kv_pool_bytes <= study.workload.kv_budget_bytes


def test_fewer_kv_heads_admit_more_sequences_and_preempt_less(study) -> None:
    mha, gqa, mqa = study.runs
    assert mqa.peak_running >= gqa.peak_running >= mha.peak_running
    assert mqa.peak_running > mha.peak_running  # the default workload shows a difference, not a tie
    assert mqa.preemptions <= gqa.preemptions <= mha.preemptions
    assert mqa.num_steps <= gqa.num_steps <= mha.num_steps


@pytest.mark.parametrize("layout", [name for name, _ in LAYOUTS])
def test_kv_bytes_per_token_equal_the_calculator(study, layout: str) -> None:
    run = next(r for r in study.runs if r.layout == layout)
    spec = model_from_config(dict(TINY_RANDOM_CONFIGS[run.model]), run.model)
    assert run.kv_bytes_per_token == kv_bytes_per_token(spec, "fp32") == 2 * 2 * run.num_kv_heads * 16 * 4


def test_every_step_agrees_with_itself(study) -> None:
    n = study.workload.num_requests
    for run in study.runs:
        assert run.steps[0].waiting == n and run.steps[0].blocks_used == 0
        last = run.steps[-1]
        assert (last.finished, last.running, last.waiting, last.blocks_used) == (n, 0, 0, 0)
        for i, s in enumerate(run.steps):
            assert s.steps_done == i and s.num_blocks == run.num_blocks == len(s.block_owners)
            assert s.blocks_used == sum(o is not None for o in s.block_owners) <= s.num_blocks
            assert s.running + s.waiting + s.finished == n
            owners = {o for o in s.block_owners if o is not None}
            assert len(owners) == s.running  # every running sequence holds blocks, nobody else does
            assert all(0 <= t <= run.block_size for t in s.block_tokens)
        assert sum(len(s.preempted_now) for s in run.steps) == run.preemptions
        assert run.at(10_000) == last and run.at(-1) == run.steps[0]


def test_a_budget_below_one_request_names_the_limit() -> None:
    with pytest.raises(ValueError, match=r"kv_budget_bytes: MHA .* one request needs"):
        run_layouts(LayoutWorkload(kv_budget_bytes=8 * 1024))
    with pytest.raises(ValueError, match="num_requests"):
        LayoutWorkload(num_requests=0)


def test_architecture_rows_are_the_calculators_answers() -> None:
    rows = compare_architectures("h200", 4096)
    assert [r.model for r in rows] == [c.model for c in ARCHITECTURES]
    settings = Settings(weights="bf16", tp=1, pp=1)
    for row in rows:
        est = estimate(row.model, "h200", Workload(batch=1, context=4096), settings, detail=False)
        assert (row.kv_bytes_per_token, row.kv_bytes_per_sequence, row.max_sequences) == (
            est.kv_bytes_per_token, est.kv_bytes, est.max_batch)
        assert row.decode_tokens_per_s == est.decode_tokens_per_s_roofline
        assert dict(row.formulas)["KV (or state) per token"] == est.formulas["kv_per_token"]
        assert row.max_sequences >= 1 and row.full_decode_tokens_per_s > 0  # all seven fit on an H200
    by_kind = {r.kind: r for r in rows}
    # the architectures' order of KV per token: MHA > GQA > MQA; SSM none; MLA below GQA
    assert by_kind["MHA"].kv_bytes_per_token > by_kind["GQA"].kv_bytes_per_token > by_kind["MQA"].kv_bytes_per_token
    assert by_kind["MLA"].kv_bytes_per_token < by_kind["GQA"].kv_bytes_per_token
    assert by_kind["SSM"].kv_bytes_per_token == 0 < by_kind["SSM"].kv_bytes_per_sequence
    with pytest.raises(SizingError, match="context"):
        compare_architectures("h200", 0)
