"""speculative_config parsing (engine.core.config.SpeculativeConfig) and the speculation cost model
(engine.speculative.spec_decode: expected_tokens_per_step, expected_speedup, best_k)."""
from __future__ import annotations

import re

import pytest

from engine.core.config import MAX_SPECULATIVE_TOKENS, SpeculativeConfig, parse_speculative_config
from engine.speculative.theory import best_k, expected_speedup, expected_tokens_per_step


# -- config -------------------------------------------------------------------------------------

def test_every_method_and_key():
    c = parse_speculative_config({"method": "ngram", "num_speculative_tokens": 4,
                                  "prompt_lookup_min": 1, "prompt_lookup_max": 5})
    assert (c.method, c.num_speculative_tokens, c.prompt_lookup_min, c.prompt_lookup_max) == ("ngram", 4, 1, 5)
    assert c.model is None and c.num_layers is None
    d = parse_speculative_config({"method": "draft_model", "model": "smollm2-135m", "quantization": "int4",
                                  "num_speculative_tokens": 2})
    assert (d.model, d.quantization, d.prompt_lookup_min) == ("smollm2-135m", "int4", None)
    assert parse_speculative_config({"method": "draft_model", "model": "tiny-random",
                                     "num_speculative_tokens": 1}).quantization is None
    e = parse_speculative_config({"method": "early_exit", "num_layers": 8, "num_speculative_tokens": 16})
    assert (e.num_layers, e.num_speculative_tokens) == (8, 16)
    assert parse_speculative_config(None) is None
    assert parse_speculative_config(e) is e


def test_ngram_lookup_defaults_follow_vllm():
    def parse(**kw):
        c = parse_speculative_config({"method": "ngram", "num_speculative_tokens": 3, **kw})
        return c.prompt_lookup_min, c.prompt_lookup_max
    assert parse() == (2, 4)
    assert parse(prompt_lookup_max=6) == (6, 6)  # one absent: it takes the other's value
    assert parse(prompt_lookup_min=3) == (3, 3)


def test_round_trip_through_the_dict():
    for d in ({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4},
              {"method": "draft_model", "num_speculative_tokens": 2, "model": "smollm2-135m", "quantization": None},
              {"method": "early_exit", "num_speculative_tokens": 3, "num_layers": 4}):
        c = parse_speculative_config(d)
        assert c.to_dict() == d and parse_speculative_config(c.to_dict()) == c
    with pytest.raises(Exception):
        c.method = "ngram"  # type: ignore[misc]  # frozen


@pytest.mark.parametrize("d, message", [
    ({"method": "eagle", "num_speculative_tokens": 2},
     "speculative_config.method: must be one of ('ngram', 'draft_model', 'early_exit'), got 'eagle'"),
    ({"method": 3, "num_speculative_tokens": 2}, "speculative_config.method:"),
    ({"num_speculative_tokens": 2}, "speculative_config.method: required"),
    ({"method": "ngram"}, "speculative_config.num_speculative_tokens: required"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "speculative_config.num_speculative_tokens:"),
    ({"method": "ngram", "num_speculative_tokens": MAX_SPECULATIVE_TOKENS + 1},
     "speculative_config.num_speculative_tokens: must be an integer in 1 .. 16"),
    ({"method": "ngram", "num_speculative_tokens": 2.0}, "speculative_config.num_speculative_tokens:"),
    ({"method": "ngram", "num_speculative_tokens": True}, "speculative_config.num_speculative_tokens:"),
    ({"method": "ngram", "num_speculative_tokens": 2, "typo": 1}, "speculative_config.typo: unknown key"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 0}, "speculative_config.prompt_lookup_min:"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 33}, "speculative_config.prompt_lookup_max:"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 5, "prompt_lookup_max": 4},
     "speculative_config.prompt_lookup_min: must be <= prompt_lookup_max (4), got 5"),
    ({"method": "ngram", "num_speculative_tokens": 2, "model": "smollm2-135m"},
     "speculative_config.model: not a key of method 'ngram'"),
    ({"method": "ngram", "num_speculative_tokens": 2, "num_layers": 3}, "speculative_config.num_layers: not a key"),
    ({"method": "draft_model", "num_speculative_tokens": 2}, "speculative_config.model: method 'draft_model' needs"),
    ({"method": "draft_model", "num_speculative_tokens": 2, "model": ""}, "speculative_config.model:"),
    ({"method": "draft_model", "num_speculative_tokens": 2, "model": "m", "quantization": "int3"},
     "speculative_config.quantization: must be None or one of"),
    ({"method": "draft_model", "num_speculative_tokens": 2, "model": "m", "prompt_lookup_max": 3},
     "speculative_config.prompt_lookup_max: not a key of method 'draft_model'"),
    ({"method": "early_exit", "num_speculative_tokens": 2}, "speculative_config.num_layers: method 'early_exit' needs"),
    ({"method": "early_exit", "num_speculative_tokens": 2, "num_layers": 0}, "speculative_config.num_layers:"),
    ({"method": "early_exit", "num_speculative_tokens": 2, "num_layers": 2, "model": "m"},
     "speculative_config.model: not a key of method 'early_exit'"),
])
def test_bad_values_are_named(d, message):
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        parse_speculative_config(d)


def test_not_a_dict():
    with pytest.raises(ValueError, match="^speculative_config: must be a dict or None, got list"):
        parse_speculative_config([("method", "ngram")])


def test_early_exit_layers_checked_against_the_model():
    c = SpeculativeConfig(method="early_exit", num_speculative_tokens=2, num_layers=29)
    c.check_against_model(30)  # SmolLM2-135M has 30 layers
    with pytest.raises(ValueError, match=r"^speculative_config.num_layers: must be in 1 \.\. 1 \(the target has 2"):
        SpeculativeConfig(method="early_exit", num_speculative_tokens=2, num_layers=2).check_against_model(2)
    SpeculativeConfig(method="ngram", num_speculative_tokens=2).check_against_model(1)  # no-op


# -- cost model ---------------------------------------------------------------------------------

def test_expected_tokens_per_step():
    assert expected_tokens_per_step(0.0, 4) == 1.0
    assert expected_tokens_per_step(1.0, 4) == 5.0
    assert expected_tokens_per_step(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens_per_step(0.8, 0) == 1.0
    # the series sum_{i=0..k} alpha^i
    assert expected_tokens_per_step(0.7, 5) == pytest.approx(sum(0.7 ** i for i in range(6)))


def test_expected_speedup_and_best_k():
    assert expected_speedup(0.8, 4, 0.0) == pytest.approx(expected_tokens_per_step(0.8, 4))
    assert expected_speedup(0.8, 3, 0.1) == pytest.approx((1 - 0.8 ** 4) / (0.2 * 1.3))
    assert expected_speedup(1.0, 3, 0.5) == pytest.approx(4 / 2.5)
    for alpha, c in [(0.8, 0.05), (0.6, 0.2), (0.95, 0.01), (0.3, 0.5), (1.0, 0.0), (0.0, 0.1)]:
        speedups = [expected_speedup(alpha, k, c) for k in range(17)]
        assert best_k(alpha, c) == speedups.index(max(speedups))
    assert best_k(0.3, 0.5) == 0  # speculation does not pay
    assert best_k(1.0, 0.0) == 16 and best_k(1.0, 0.0, k_max=4) == 4
    assert best_k(0.0, 0.0) == 0  # all k tie at 1: the smallest


@pytest.mark.parametrize("call, field", [
    (lambda: expected_tokens_per_step(1.1, 2), "alpha"), (lambda: expected_tokens_per_step(-0.1, 2), "alpha"),
    (lambda: expected_tokens_per_step(float("nan"), 2), "alpha"), (lambda: expected_tokens_per_step(0.5, -1), "k"),
    (lambda: expected_tokens_per_step(0.5, 1.5), "k"), (lambda: expected_speedup(0.5, 2, -0.1), "c"),
    (lambda: expected_speedup(0.5, 2, float("inf")), "c"), (lambda: best_k(0.5, 0.1, k_max=-1), "k_max"),
    (lambda: best_k(2.0, 0.1), "alpha"), (lambda: best_k(0.5, -1.0), "c"),
])
def test_out_of_range_inputs(call, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        call()
