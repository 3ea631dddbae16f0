"""Perplexity of a text under the engine's own forward (prefill only, teacher forcing).

Strided sliding windows, Hugging Face's standard method for fixed-length models
(transformers docs, "Perplexity of fixed-length models"):

    tokens      t0 t1 t2 ... t(N-1)                      window W, stride S (1 <= S <= W)
    window k    begins at b = k*S, ends at e = min(b + W, N); fed tokens t[b:e], positions 0..e-b-1
    targets     the tokens t[p] with prev_end <= p < e (prev_end = the end of window k-1, 0 at first)
                and p >= b + 1 (a window's first token has no context inside it): each scored
                once, predicted by the logits at row p - 1 - b from context t[b:p]
    stop        after the first window that reaches N

    nll_sum = sum over scored p of  -log softmax(logits(t[b:p]))[t[p]]
    ppl     = exp(nll_sum / num_scored)

With S < W every token but t0 is scored exactly once, each with at least W - S tokens of
context (except in the first window). With S == W the windows are disjoint and each window's
first token is not scored (HF's loop drops it too: its label has no preceding logit).

The forward is the engine's: the model object of the given ``LLM`` / ``LLMEngine`` (whatever
dtype or weights it holds) over a ForwardBatch whose ``logits_indices`` are the scoring rows,
with a private KV pool of the engine's KV dtype, so the engine's own pool and requests are
untouched.

``activation_stats`` (the statistics of every linear input, engine/model/activations.py) takes
an LLM the same way.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.model.activations import DEFAULT_BINS, DEFAULT_THRESHOLD, ActivationStats, Prompt, model_activation_stats
from engine.model.llama import LlamaModel
from engine.model.private_prefill import PrivatePrefill
from engine.serving.llm import LLM
from engine.serving.engine import LLMEngine

__all__ = ["PerplexityResult", "PerplexityWindow", "activation_stats", "perplexity", "strided_windows"]

DEFAULT_WINDOW = 512
DEFAULT_STRIDE = 256


@dataclass(frozen=True)
class PerplexityWindow:
    """One forward: tokens [begin, end) fed; the targets [score_begin, end) scored."""

    begin: int
    end: int
    score_begin: int
    nll_sum: float

    @property
    def num_scored(self) -> int:
        return self.end - self.score_begin


@dataclass(frozen=True)
class PerplexityResult:
    ppl: float  # exp(nll_sum / num_tokens)
    nll_sum: float  # natural log, summed over the scored tokens
    num_tokens: int  # tokens scored (each once)
    windows: tuple[PerplexityWindow, ...]
    window: int
    stride: int
    num_text_tokens: int  # tokens of the (possibly truncated) text

    @property
    def mean_nll(self) -> float:
        return self.nll_sum / self.num_tokens


def _check_int(name: str, value: object, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: must be an integer, got {type(value).__name__}")
    if value < lo or (hi is not None and value > hi):
        upper = f" and <= {hi}" if hi is not None else ""
        raise ValueError(f"{name}: must be >= {lo}{upper}, got {value}")
    return value


def strided_windows(num_tokens: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """-> (begin, end, score_begin) of every window, by the rule in the module doc.

    Invariant: the scored ranges [max(score_begin, begin + 1), end) are disjoint and, when
    stride < window, cover 1 .. num_tokens - 1 exactly.
    """
    out: list[tuple[int, int, int]] = []
    prev_end = 0
    for begin in range(0, num_tokens, stride):
        end = min(begin + window, num_tokens)
        out.append((begin, end, max(prev_end, begin + 1)))
        prev_end = end
        if end == num_tokens:
            break
    return out


def engine_of(llm: Any) -> LLMEngine:
    """The LLMEngine behind ``llm`` (an LLM or an LLMEngine); anything else a ValueError."""
    if isinstance(llm, LLM):
        return llm.llm_engine
    if isinstance(llm, LLMEngine):
        return llm
    raise ValueError(f"llm: must be an LLM or an LLMEngine, got {type(llm).__name__}")


def local_model(engine: LLMEngine) -> LlamaModel:
    """The engine's model in this process; an engine whose layers run in worker processes has
    none here (ValueError, as for a run's activation recorder)."""
    model = engine.runner.model
    if model is None:
        raise ValueError("llm: its model is split over worker processes (pipeline/tensor parallel); this study "
                         "needs the single-process engine (pipeline_parallel_size = tensor_parallel_size = 1)")
    return model


@torch.inference_mode()
def perplexity(llm: Any, text: str, window: int = DEFAULT_WINDOW, stride: int = DEFAULT_STRIDE,
               max_tokens: int | None = None) -> PerplexityResult:
    """Strided-window perplexity of ``text`` (module doc) under ``llm``'s model.

    ``max_tokens`` keeps only the text's first tokens (a slice, for speed). Rules: window >= 2
    and at most the model's context; 1 <= stride <= window; the text must have >= 2 tokens.
    """
    engine = engine_of(llm)
    if not isinstance(text, str):
        raise ValueError(f"text: must be a string, got {type(text).__name__}")
    window = _check_int("window", window, 2, engine.model_max_len)
    stride = _check_int("stride", stride, 1, window)
    ids: list[int] = list(engine.tokenizer(text, add_special_tokens=False).input_ids)
    if max_tokens is not None:
        ids = ids[:_check_int("max_tokens", max_tokens, 2)]
    if len(ids) < 2:
        raise ValueError(f"text: too short, needs at least 2 tokens to score one, got {len(ids)}")
    # The engine's own weights (any dtype / quantization it holds); a private pool, reused by
    # every window: the window's tokens at slots 0 .. span - 1.
    prefill = PrivatePrefill(local_model(engine), min(window, len(ids)), engine.config.cache_config.block_size,
                             engine.runner.kv_cache_dtype)
    records: list[PerplexityWindow] = []
    for begin, end, score_begin in strided_windows(len(ids), window, stride):
        if score_begin >= end:  # a last window of one token already scored: nothing to add
            records.append(PerplexityWindow(begin, end, end, 0.0))
            continue
        rows = torch.arange(score_begin - 1 - begin, end - 1 - begin, dtype=torch.long)  # [n]
        logits = prefill.logits(ids[begin:end], rows)  # [n, V] fp32: every scoring row, not just the last
        targets = torch.tensor(ids[score_begin:end], dtype=torch.long)  # [n]
        logp = torch.log_softmax(logits.float(), dim=-1).gather(1, targets.unsqueeze(1))  # [n, 1]
        records.append(PerplexityWindow(begin, end, score_begin, float(-logp.double().sum())))
    nll = math.fsum(w.nll_sum for w in records)
    n = sum(w.num_scored for w in records)
    return PerplexityResult(ppl=math.exp(nll / n), nll_sum=nll, num_tokens=n, windows=tuple(records),
                            window=window, stride=stride, num_text_tokens=len(ids))


def activation_stats(llm: Any, prompts: Sequence[Prompt] | None = None, threshold: float = DEFAULT_THRESHOLD,
                     histogram_layer: int | None = None, histogram_linear: str = "qkv",
                     bins: int = DEFAULT_BINS, histogram_range: float | None = None) -> ActivationStats:
    """Statistics of every linear input over one prefill of ``prompts`` through ``llm``'s model
    (an LLM or an LLMEngine), in a private pool of its block size and KV dtype
    (engine.model.activations.model_activation_stats has the rules)."""
    engine = engine_of(llm)
    return model_activation_stats(local_model(engine), engine.tokenizer, engine.model_max_len,
                                  engine.config.cache_config.block_size, engine.runner.kv_cache_dtype, prompts, threshold,
                                  histogram_layer, histogram_linear, bins, histogram_range)
