"""Speculative-decoding scenarios and the with/without comparison (issue #10, "Scenarios" and
"Side by side"): the three presets load with their vLLM-shaped speculative_config, a bad key
is named, and ``compare_speculation`` runs the same scenario twice on the real engine — greedy
text identical request by request, fewer target steps with speculation."""
from __future__ import annotations

from dataclasses import replace

import pytest

from engine.core.config import SpeculativeConfig
from engine.replay.run import SPECULATION_RUNS, compare_speculation
from engine.replay.scenario import load_scenario, parse_scenario, without_speculation

pytestmark = pytest.mark.usefixtures("torch_single_thread")

SPEC_SCENARIOS = ("spec-copy", "spec-chat", "spec-sampled")
WITH, WITHOUT = SPECULATION_RUNS


@pytest.mark.parametrize("name", SPEC_SCENARIOS)
def test_spec_scenarios_load_with_ngram_k4(name):
    sc = load_scenario(name)
    assert sc.chat_template and sc.model == "smollm2-135m"
    assert sc.knobs["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 4}
    config = sc.engine_config()
    assert isinstance(config.speculative_config, SpeculativeConfig)
    assert config.speculative_config.num_speculative_tokens == 4
    sampled = [r for r in sc.requests if r.temperature > 0]
    if name == "spec-sampled":
        assert sampled and all(r.temperature == 0.8 and r.seed is not None for r in sc.requests)
    else:
        assert not sampled  # greedy: the two runs must write the same text
    assert "speculative_config" not in without_speculation(sc).knobs
    assert without_speculation(sc).engine_config().speculative_config is None


def test_scenario_speculative_config_overrides_and_bad_keys_are_named():
    sc = load_scenario("spec-copy")
    early = sc.engine_config(speculative_config={"method": "early_exit", "num_layers": 8,
                                                 "num_speculative_tokens": 2})
    assert early.speculative_config is not None and early.speculative_config.num_layers == 8
    data = {"requests": ["hello"], "knobs": {"speculative_config": {"method": "ngram",
                                                                    "num_speculative_tokens": 4, "lookahead": 3}}}
    with pytest.raises(ValueError, match=r"speculative_config\.lookahead: unknown key"):
        parse_scenario(data)
    data["knobs"]["speculative_config"] = {"method": "medusa", "num_speculative_tokens": 4}
    with pytest.raises(ValueError, match=r"speculative_config\.method"):
        parse_scenario(data)
    data["knobs"]["speculative_config"] = {"method": "ngram", "num_speculative_tokens": 0}
    with pytest.raises(ValueError, match=r"speculative_config\.num_speculative_tokens"):
        parse_scenario(data)
    data["knobs"]["speculative_config"] = "ngram"
    with pytest.raises(ValueError, match=r"speculative_config: must be a dict"):
        parse_scenario(data)


def _same_requests(a, b):
    """Per request: the same text and the same number of tokens on both sides."""
    assert a.outputs == b.outputs
    counts = lambda run: {r.request_id: r.num_output_tokens for r in run.final.requests}  # noqa: E731
    assert counts(a) == counts(b)


@pytest.mark.parametrize("name", ["spec-copy", "spec-chat"])
def test_compare_speculation_greedy_tiny(tiny, name):
    """Rule: the side-by-side runs differ only in speculation: same greedy text per request,
    same tokens out, and fewer target steps (forwards) with drafts verified."""
    runs = compare_speculation(load_scenario(name), tiny)
    assert list(runs) == [WITH, WITHOUT]
    on, off = runs[WITH], runs[WITHOUT]
    _same_requests(on, off)
    assert on.num_output_tokens == off.num_output_tokens > 0
    assert on.num_steps < off.num_steps
    assert on.num_draft_tokens > 0 and off.num_draft_tokens == 0 and not any(t.spec for t in off.traces)
    assert 0 < on.num_accepted_tokens <= on.num_draft_tokens
    assert on.engine_ms == pytest.approx(sum(t.total_ms for t in on.traces)) and off.engine_ms > 0
    assert on.policy == off.policy == "continuous"


def test_compare_speculation_overrides_method_and_knobs(tiny):
    """The page's method / k and other knobs apply to the speculative side; the other knobs
    to both sides alike."""
    seen: list[tuple[str, int]] = []
    sc = replace(load_scenario("spec-chat"), requests=load_scenario("spec-chat").requests[:2])
    runs = compare_speculation(sc, tiny, {"speculative_config": {"method": "early_exit", "num_layers": 1,
                                                                 "num_speculative_tokens": 2},
                                          "max_num_batched_tokens": 64},
                               on_step=lambda label, n: seen.append((label, n)))
    on, off = runs[WITH], runs[WITHOUT]
    _same_requests(on, off)
    verified = [v for t in on.traces for v in t.spec]
    assert verified and {v.method for v in verified} == {"early_exit"}
    assert all(len(v.drafts) <= 2 for v in verified)
    assert all(t.num_batched_tokens <= 64 for r in runs.values() for t in r.traces)
    assert [n for label, n in seen if label == WITH] == list(range(1, on.num_steps + 1))
    assert [n for label, n in seen if label == WITHOUT] == list(range(1, off.num_steps + 1))


def test_compare_speculation_needs_a_speculative_config(tiny):
    with pytest.raises(ValueError, match="speculative_config"):
        compare_speculation(without_speculation(load_scenario("spec-copy")), tiny)


def test_compare_speculation_spec_copy_smollm2():
    """SmolLM2 on the copy-heavy scenario's spelling-fix request (ngram, k 4): the corrected
    paragraph is the prompt's own text, so prompt lookup drafts most of it — identical text,
    far fewer target steps."""
    from engine.model.shared import get_shared_model

    sc = load_scenario("spec-copy")
    sc = replace(sc, requests=sc.requests[:1])
    runs = compare_speculation(sc, get_shared_model("smollm2-135m"))
    on, off = runs[WITH], runs[WITHOUT]
    _same_requests(on, off)
    assert "lighthouse stood on the rocky point" in on.outputs["0"]
    assert on.num_steps < off.num_steps
    assert on.num_accepted_tokens >= on.num_draft_tokens // 2
