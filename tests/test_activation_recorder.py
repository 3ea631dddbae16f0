"""The live activation recorder (engine/model/activations.py ActivationRecorder on ModelRunner.observer):
exact range-doubling histograms, statistics equal to one prefill of the same tokens, and a run's
tokens unchanged by watching it."""
from __future__ import annotations

import pytest
import torch

from engine.model.activations import LINEARS, ActivationRecorder
from engine.studies.evaluation import activation_stats
from engine.model.shared import get_shared_model
from engine.replay.run import LiveRun
from engine.replay.scenario import load_scenario

TINY = "tiny-random"


def test_doubling_histogram_equals_one_histogram_over_the_final_range() -> None:
    rec = ActivationRecorder(num_layers=1, bins=16)
    g = torch.Generator().manual_seed(0)
    seen = []
    for scale in (0.3, 0.3, 2.5, 0.1, 40.0, 1.0):  # the range doubles several times, in steps
        x = torch.randn(7, 5, generator=g) * scale
        seen.append(x)
        for linear in LINEARS:
            rec(0, linear, x)
        rec.check_integrity()
    every = torch.cat(seen)
    r = rec.ranges[(0, "qkv")]
    assert r == 2.0 ** torch.ceil(torch.log2(every.abs().max())).item()
    assert rec.counts[(0, "qkv")].tolist() == torch.histc(every, bins=16, min=-r, max=r).double().tolist()
    assert torch.equal(rec.absmax[(0, "o")], every.abs().amax(dim=0))
    assert rec.num_tokens == every.shape[0]
    stats = rec.stats(threshold=3.0, histogram_linear="down")
    assert stats is not None and stats.histogram.num_values == every.numel()
    assert {o.channel for o in stats.outliers if o.linear == "qkv"} == {
        k for k in range(5) if every[:, k].abs().max() > 3.0}


def test_bad_arguments_name_their_field() -> None:
    with pytest.raises(ValueError, match="bins"):
        ActivationRecorder(2, bins=15)
    rec = ActivationRecorder(1, bins=4)
    for linear in LINEARS:
        rec(0, linear, torch.ones(2, 3))
    with pytest.raises(ValueError, match="histogram_layer"):
        rec.stats(histogram_layer=1)
    with pytest.raises(ValueError, match="histogram_linear"):
        rec.stats(histogram_linear="lm_head")


def test_live_run_records_what_its_engine_computed() -> None:
    scenario = load_scenario("chat-burst")
    watched = LiveRun.from_scenario(scenario, get_shared_model(TINY), enable_prefix_caching=False)
    plain = LiveRun.from_scenario(scenario, get_shared_model(TINY), enable_prefix_caching=False)
    assert watched.activation_recorder().stats() is None  # nothing computed yet
    for _ in range(6):
        watched.step(1)
        plain.step(1)
        watched.activation_recorder().check_integrity()
        watched.engine.check_integrity()
    rec = watched.activation_recorder()
    # Watching changes nothing the engine computes.
    assert [t.sampled for t in watched.traces] == [t.sampled for t in plain.traces]
    # Every token computed so far, prompts and outputs, in one prefill of the same tokens.
    done = [tuple(r.all_token_ids[:r.num_computed_tokens]) for r in watched.engine.requests.values()
            if r.num_computed_tokens > 0]
    assert rec.num_tokens == sum(len(d) for d in done)
    ref = activation_stats(watched.engine, done)
    live = rec.stats()
    assert live is not None
    for linear in LINEARS:
        got, want = torch.tensor(live.absmax_of(linear)), torch.tensor(ref.absmax_of(linear))
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)  # chunked vs one prefill: fp32 rounding
    k = len(live.absmax_of("qkv")[0])
    assert live.histogram.num_values == rec.num_tokens * k


def test_attaching_mid_run_backfills_the_tokens_computed_so_far() -> None:
    run = LiveRun.from_scenario(load_scenario("chat-burst"), get_shared_model(TINY))
    run.step(3)
    rec = run.activation_recorder()
    done = sum(r.num_computed_tokens for r in run.engine.requests.values())
    assert rec.num_tokens == done > 0
    run.step(1)
    assert rec.num_tokens == sum(r.num_computed_tokens for r in run.engine.requests.values())
    assert run.activation_recorder() is rec
