"""Perplexity (engine/studies/evaluation.py) against Hugging Face's strided loop on the same weights."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from engine import LLM, LLMEngine, perplexity
from engine.studies.evaluation import PerplexityResult, strided_windows
from tests.parity import hf_model

TEXT = (Path(__file__).resolve().parents[1] / "presets" / "texts" / "sqlite3_h_comments.txt").read_text("utf-8")
# fp32 both sides; the logits agree to ~1e-5 (test_parity), the summed NLL to far better
# than this relative tolerance on the perplexity.
RTOL = 1e-4


def hf_strided_perplexity(name: str, ids: list[int], window: int, stride: int) -> tuple[float, float, int]:
    """The standard strided loop (transformers docs, "Perplexity of fixed-length models"),
    labels = input ids with the context-only part set to -100. The docs weight each window's
    mean loss by ``valid - 1``; that is exact only when a window's first label counts, so the
    weight here is the number of labels the shifted loss really averaged over."""
    model = hf_model(name)
    nll, count, prev_end = 0.0, 0, 0
    for begin in range(0, len(ids), stride):
        end = min(begin + window, len(ids))
        trg_len = end - prev_end
        input_ids = torch.tensor([ids[begin:end]])
        target_ids = input_ids.clone()
        target_ids[:, :-trg_len] = -100
        with torch.inference_mode():
            loss = model(input_ids, labels=target_ids).loss
        n = int((target_ids[:, 1:] != -100).sum())
        nll += float(loss.double()) * n
        count += n
        prev_end = end
        if end == len(ids):
            break
    return math.exp(nll / count), nll, count


@pytest.mark.parametrize(("name", "num_tokens", "window", "stride"), [
    ("tiny-random", 300, 64, 32),
    ("tiny-random", 300, 64, 64),  # disjoint windows: each window's first token unscored
    ("tiny-random", 257, 100, 77),  # a ragged last window
    ("smollm2-135m", 320, 128, 96),  # the one SmolLM2 case: 3 windows, 384 tokens fed
])
def test_equals_hf(name: str, num_tokens: int, window: int, stride: int) -> None:
    llm = LLM(name)
    got = perplexity(llm, TEXT, window=window, stride=stride, max_tokens=num_tokens)
    ids = list(llm.get_tokenizer()(TEXT, add_special_tokens=False).input_ids)[:num_tokens]
    want_ppl, want_nll, want_n = hf_strided_perplexity(name, ids, window, stride)
    assert got.num_tokens == want_n
    assert got.num_text_tokens == num_tokens
    assert got.ppl == pytest.approx(want_ppl, rel=RTOL)
    assert got.nll_sum == pytest.approx(want_nll, rel=RTOL)
    assert got.nll_sum == pytest.approx(sum(w.nll_sum for w in got.windows))
    assert got.num_tokens == sum(w.num_scored for w in got.windows)


def test_text_is_long_enough_and_engine_untouched() -> None:
    engine = LLMEngine("tiny-random")
    result = perplexity(engine, TEXT, window=256, stride=256)
    assert isinstance(result, PerplexityResult)
    assert len(engine.tokenizer(TEXT, add_special_tokens=False).input_ids) >= 2000
    assert engine.kv.num_free_blocks == engine.config.cache_config.num_blocks
    assert all(not k.any() and not v.any() for k, v in engine.runner.kv_caches)  # its own pool unwritten
    engine.check_integrity()
    assert not engine.has_unfinished_requests()


@pytest.mark.parametrize("num_tokens", list(range(2, 40)))
@pytest.mark.parametrize(("window", "stride"), [(2, 1), (2, 2), (5, 3), (7, 7), (8, 1), (9, 4)])
def test_windows_score_each_token_once(num_tokens: int, window: int, stride: int) -> None:
    wins = strided_windows(num_tokens, window, stride)
    scored = [p for begin, end, score_begin in wins for p in range(score_begin, end)]
    assert len(scored) == len(set(scored))
    assert all(end - begin <= window and score_begin >= begin + 1 for begin, end, score_begin in wins)
    assert wins[-1][1] == num_tokens
    if stride < window:
        assert scored == list(range(1, num_tokens))


def test_from_engine_import_perplexity_is_the_function() -> None:
    import engine.studies.evaluation
    from engine import perplexity as p

    assert p is engine.studies.evaluation.perplexity
    assert p(LLM("tiny-random"), TEXT[:500], window=16, stride=8).ppl > 1.0


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"window": 1}, "window"), ({"window": 0}, "window"), ({"window": True}, "window"),
    ({"window": 2.0}, "window"), ({"window": 10**9}, "window"),
    ({"stride": 0}, "stride"), ({"window": 8, "stride": 9}, "stride"), ({"stride": "4"}, "stride"),
    ({"max_tokens": 1}, "max_tokens"), ({"text": "a"}, "text"), ({"text": ""}, "text"),
    ({"text": b"bytes"}, "text"), ({"text": None}, "text"), ({"llm": "tiny-random"}, "llm"),
])
def test_bad_input_names_the_field(kwargs: dict[str, object], field: str) -> None:
    args: dict[str, object] = {"llm": LLM("tiny-random"), "text": TEXT[:400], "window": 16, "stride": 8}
    args.update(kwargs)
    with pytest.raises(ValueError, match=f"^{field}:"):
        perplexity(**args)  # type: ignore[arg-type]
