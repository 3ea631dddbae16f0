"""Activation statistics of the inputs of every linear layer, from real prompts.

One flattened prefill of the calibration prompts through the engine's own model, with the
``observer`` seam of ``LlamaModel.run_layers`` seeing the input x [T, K] of each layer's four
linear calls (T = every token of every prompt):

    qkv      RMSNorm(hidden)              K = hidden
    o        attention output, flattened  K = heads * head_dim
    gate_up  RMSNorm(hidden)              K = hidden
    down     silu(gate) * up              K = intermediate

Recorded (frozen records, plain Python numbers so a page can draw them without torch):

    absmax[linear][layer][k]  = max over tokens of |x[t, k]|          [L][K] per linear
    outliers                  = every (layer, linear, k) with absmax > threshold
                                (LLM.int8()'s rule: magnitude > 6.0 in a feature dimension)
    histogram                 = counts of one chosen (layer, linear)'s T*K values in fixed bins

The arithmetic of the forward is unchanged (the observer only reads), so the model's outputs
are bit-identical with and without statistics.
"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.model.llama import LlamaModel, Observer
from engine.model.private_prefill import PrivatePrefill

__all__ = ["ActivationHistogram", "ActivationRecorder", "ActivationStats", "LINEARS", "LinearAbsmax", "OutlierChannel",
           "calibration_prompts", "model_activation_stats", "observe_prefill"]

LINEARS = ("qkv", "o", "gate_up", "down")
CALIBRATION_FILE = Path(__file__).resolve().parents[2] / "presets" / "calibration.json"
DEFAULT_THRESHOLD = 6.0  # LLM.int8() (Dettmers et al., 2022): outlier features have |x| > 6
DEFAULT_BINS = 64
MAX_BINS = 1000
MAX_PROMPTS = 256
MAX_TOTAL_TOKENS = 16_384


@dataclass(frozen=True)
class LinearAbsmax:
    """Per-input-channel absmax of one linear's input, every layer: absmax[layer][k]."""

    linear: str
    absmax: tuple[tuple[float, ...], ...]  # [L][K]

    def layer_max(self) -> tuple[float, ...]:
        """[L] the largest channel absmax of each layer."""
        return tuple(max(row) for row in self.absmax)


@dataclass(frozen=True)
class OutlierChannel:
    layer: int
    linear: str
    channel: int
    absmax: float


@dataclass(frozen=True)
class ActivationHistogram:
    """counts[i] = values in [edges[i], edges[i+1]) (the last bin closed); sum = num_values.

    With the default range (the tensor's own absmax) no value lies outside; with a fixed
    ``histogram_range`` values beyond it are counted in the end bins (clamped)."""

    layer: int
    linear: str
    edges: tuple[float, ...]  # [bins + 1]
    counts: tuple[int, ...]  # [bins]
    num_values: int  # T * K
    num_clamped: int  # values outside the range, counted in the end bins


@dataclass(frozen=True)
class ActivationStats:
    prompts: tuple[Prompt, ...]  # as given: texts or token-id tuples
    num_tokens: int  # T, every prompt token
    threshold: float
    absmax: tuple[LinearAbsmax, ...]  # one per linear, in LINEARS order
    outliers: tuple[OutlierChannel, ...]  # sorted by absmax, largest first
    histogram: ActivationHistogram

    def absmax_of(self, linear: str) -> tuple[tuple[float, ...], ...]:
        """[L][K] of one linear ("qkv", "o", "gate_up" or "down")."""
        for entry in self.absmax:
            if entry.linear == linear:
                return entry.absmax
        raise ValueError(f"linear: must be one of {LINEARS}, got {linear!r}")


def calibration_prompts(path: Path = CALIBRATION_FILE) -> tuple[str, ...]:
    """The shipped calibration prompts (presets/calibration.json, written for InferScope)."""
    data = json.loads(Path(path).read_text("utf-8"))
    prompts = _check_prompts(data.get("prompts") if isinstance(data, dict) else None)
    if not all(isinstance(p, str) for p in prompts):
        raise ValueError(f"prompts: {path.name} must hold strings")
    return tuple(str(p) for p in prompts)


Prompt = str | Sequence[int]  # text, or token ids (e.g. a live request's prompt + output so far)


def _is_token_ids(p: object) -> bool:
    return (not isinstance(p, str) and isinstance(p, Sequence) and len(p) > 0
            and all(isinstance(t, int) and not isinstance(t, bool) for t in p))


def _check_prompts(prompts: object) -> tuple[Prompt, ...]:
    if isinstance(prompts, str) or not isinstance(prompts, Sequence):
        raise ValueError(f"prompts: must be a list of strings or token-id lists, got {type(prompts).__name__}")
    if not 1 <= len(prompts) <= MAX_PROMPTS:
        raise ValueError(f"prompts: must hold 1 to {MAX_PROMPTS} prompts, got {len(prompts)}")
    for i, p in enumerate(prompts):
        if not (isinstance(p, str) and p.strip()) and not _is_token_ids(p):
            raise ValueError(f"prompts: prompt {i} must be a non-empty string or token-id list, got {str(p)[:40]!r}")
    return tuple(p if isinstance(p, str) else tuple(p) for p in prompts)


def _histogram(values: torch.Tensor, layer: int, linear: str, bins: int,
               value_range: float | None) -> ActivationHistogram:
    """Fixed, symmetric bins over [-r, r]: r = value_range, or the values' own absmax."""
    flat = values.float().reshape(-1)  # [T * K]
    r = value_range if value_range is not None else float(flat.abs().max()) if flat.numel() else 1.0
    r = r if r > 0 else 1.0
    clamped = int((flat.abs() > r).sum())
    counts = torch.histc(flat.clamp(-r, r), bins=bins, min=-r, max=r)  # [bins], float counts
    edges = [-r + 2 * r * i / bins for i in range(bins + 1)]
    edges[-1] = r
    return ActivationHistogram(layer, linear, tuple(edges), tuple(int(c) for c in counts.tolist()),
                               int(flat.numel()), clamped)


@torch.inference_mode()
def model_activation_stats(model: LlamaModel, tokenizer: Any, max_len: int, block_size: int, kv_cache_dtype: str,
                           prompts: Sequence[Prompt] | None = None, threshold: float = DEFAULT_THRESHOLD,
                           histogram_layer: int | None = None, histogram_linear: str = "qkv",
                           bins: int = DEFAULT_BINS, histogram_range: float | None = None) -> ActivationStats:
    """Statistics of every linear input over one prefill of ``prompts`` through ``model`` (module
    doc), in a private KV pool of ``block_size`` blocks in ``kv_cache_dtype``; each prompt at most
    ``max_len`` tokens. ``engine.studies.evaluation.activation_stats`` is the same for an LLM.

    ``prompts``: texts (tokenized without special tokens) or token-id lists (run as given: a
    live run's own tokens); default ``calibration_prompts()``. The histogram is of
    (histogram_layer, histogram_linear); histogram_layer None picks the layer whose input to
    that linear holds the largest magnitude. Outliers: channels with absmax > threshold.
    """
    prompt_list = calibration_prompts() if prompts is None else _check_prompts(prompts)
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not (
            math.isfinite(threshold) and threshold > 0):
        raise ValueError(f"threshold: must be a finite number > 0, got {threshold!r}")
    if histogram_linear not in LINEARS:
        raise ValueError(f"histogram_linear: must be one of {LINEARS}, got {str(histogram_linear)[:40]!r}")
    num_layers = model.config.num_hidden_layers
    if histogram_layer is not None and (isinstance(histogram_layer, bool) or not isinstance(histogram_layer, int)
                                        or not 0 <= histogram_layer < num_layers):
        raise ValueError(f"histogram_layer: must be an integer in [0, {num_layers}), got {histogram_layer!r}")
    if isinstance(bins, bool) or not isinstance(bins, int) or not 1 <= bins <= MAX_BINS:
        raise ValueError(f"bins: must be an integer in [1, {MAX_BINS}], got {bins!r}")
    if histogram_range is not None and (isinstance(histogram_range, bool)
                                        or not isinstance(histogram_range, (int, float))
                                        or not (math.isfinite(histogram_range) and histogram_range > 0)):
        raise ValueError(f"histogram_range: must be a finite number > 0 or None, got {histogram_range!r}")

    chunks = [list(tokenizer(p, add_special_tokens=False).input_ids) if isinstance(p, str) else list(p)
              for p in prompt_list]
    vocab = model.config.vocab_size
    for i, ids in enumerate(chunks):
        if any(not 0 <= t < vocab for t in ids):
            raise ValueError(f"prompts: prompt {i} holds a token id outside [0, {vocab})")
        if not 1 <= len(ids) <= max_len:
            raise ValueError(f"prompts: prompt {i} has {len(ids)} tokens; must have 1 to {max_len}")
    total = sum(len(c) for c in chunks)
    if total > MAX_TOTAL_TOKENS:
        raise ValueError(f"prompts: {total} tokens in all; at most {MAX_TOTAL_TOKENS}")

    absmax: dict[tuple[int, str], torch.Tensor] = {}  # (layer, linear) -> [K]
    kept: dict[int, torch.Tensor] = {}  # layer -> [T, K] input of histogram_linear

    def observe(layer: int, linear: str, x: torch.Tensor) -> None:  # x [T, K], read only
        absmax[(layer, linear)] = x.abs().amax(dim=0).float()  # one call per (layer, linear)
        if linear == histogram_linear and histogram_layer in (None, layer):
            kept[layer] = x.detach().clone()

    observe_prefill(model, block_size, kv_cache_dtype, chunks, observe)

    layer = histogram_layer if histogram_layer is not None else loudest_layer(absmax, histogram_linear, num_layers)
    histogram = _histogram(kept[layer], layer, histogram_linear, bins, histogram_range)
    per_linear, outliers = _absmax_records(absmax, num_layers, float(threshold))
    return ActivationStats(prompt_list, total, float(threshold), per_linear, outliers, histogram)


@torch.inference_mode()
def observe_prefill(model: LlamaModel, block_size: int, kv_cache_dtype: str, chunks: Sequence[Sequence[int]],
                    observer: Observer) -> None:
    """One flattened prefill of ``chunks`` (token ids) through ``model``, in a private KV pool
    (an engine's own is untouched), with ``observer`` seeing every linear input."""
    total = sum(len(c) for c in chunks)
    # Each prompt is a fresh request: positions from 0, its own slots (start 0, whole chunk).
    prefill = PrivatePrefill(model, total, block_size, kv_cache_dtype)
    prefill.observe(chunks, observer)


def loudest_layer(absmax: dict[tuple[int, str], torch.Tensor], linear: str, num_layers: int) -> int:
    """The layer whose input to ``linear`` holds the largest magnitude (the first on a tie)."""
    return max(range(num_layers), key=lambda i: (float(absmax[(i, linear)].max()), -i))


def _absmax_records(absmax: dict[tuple[int, str], torch.Tensor], num_layers: int,
                    threshold: float) -> tuple[tuple[LinearAbsmax, ...], tuple[OutlierChannel, ...]]:
    """Per-linear [L][K] records and every channel above ``threshold``, largest first."""
    per_linear = tuple(
        LinearAbsmax(lin, tuple(tuple(absmax[(layer, lin)].tolist()) for layer in range(num_layers)))
        for lin in LINEARS)
    outliers = sorted(
        (OutlierChannel(layer, entry.linear, k, v)
         for entry in per_linear for layer, row in enumerate(entry.absmax) for k, v in enumerate(row)
         if v > threshold),
        key=lambda o: (-o.absmax, o.layer, LINEARS.index(o.linear), o.channel))
    return per_linear, tuple(outliers)


class ActivationRecorder:
    """Running statistics of every linear input a live engine computes: an ``Observer`` for
    ``ModelRunner.observer``, so the views show the activations of the run's own steps.

    Kept per (layer, linear): the running per-channel absmax [K], and a histogram of every value
    seen in ``bins`` (even) equal bins over [-R, R], R a power of two that doubles when a larger
    value arrives; doubling merges neighbour pairs into the middle half, so counts stay exact:

        over [-R, R]:    [ a | b | c | d | e | f | g | h ]
        over [-2R, 2R]:  [ 0 | 0 |a+b|c+d|e+f|g+h| 0 | 0 ]      new[bins/4 + i] = old[2i] + old[2i+1]

    Invariant: sum(counts) = values seen; every value lies in [-R, R]. Reading only (the
    forward's arithmetic is unchanged). Per step it costs one abs-max and one histogram per
    linear call (~10 % of a SmolLM2 prefill step, less in decode).
    """

    def __init__(self, num_layers: int, bins: int = DEFAULT_BINS) -> None:
        if bins % 2 or not 2 <= bins <= MAX_BINS:
            raise ValueError(f"bins: must be an even integer in [2, {MAX_BINS}], got {bins!r}")
        self.num_layers = num_layers
        self.bins = bins
        self.num_tokens = 0
        self.absmax: dict[tuple[int, str], torch.Tensor] = {}  # [K] float32
        self.ranges: dict[tuple[int, str], float] = {}  # R
        self.counts: dict[tuple[int, str], torch.Tensor] = {}  # [bins] float64 (exact integers)

    def __call__(self, layer: int, linear: str, x: torch.Tensor) -> None:  # x [T, K], read only
        key = (layer, linear)
        xf = x.detach().float()
        if layer == 0 and linear == "qkv":
            self.num_tokens += xf.shape[0]
        if xf.numel() == 0:
            return
        am = xf.abs().amax(dim=0)  # [K]
        prev = self.absmax.get(key)
        self.absmax[key] = am if prev is None else torch.maximum(prev, am)
        top = float(am.max())
        r = self.ranges.get(key) or 2.0 ** math.ceil(math.log2(max(top, 1e-30)))
        counts = self.counts[key] if key in self.counts else torch.zeros(self.bins, dtype=torch.float64)
        while top > r:  # merge neighbour pairs into the middle half
            merged = counts.view(-1, 2).sum(dim=1)  # [bins / 2]
            counts = torch.zeros_like(counts)
            counts[self.bins // 4: self.bins // 4 + self.bins // 2] = merged
            r *= 2
        counts += torch.histc(xf, bins=self.bins, min=-r, max=r).double()
        self.ranges[key], self.counts[key] = r, counts

    def check_integrity(self) -> None:
        """Every (layer, linear) has absmax, range and counts; counts are whole and non-negative."""
        assert self.absmax.keys() == self.ranges.keys() == self.counts.keys()
        for key, counts in self.counts.items():
            assert counts.shape == (self.bins,) and bool((counts >= 0).all())
            assert bool((counts == counts.round()).all()), key
            assert float(self.absmax[key].max()) <= self.ranges[key]

    def stats(self, threshold: float = DEFAULT_THRESHOLD, histogram_layer: int | None = None,
              histogram_linear: str = "qkv") -> ActivationStats | None:
        """The statistics so far as an ``ActivationStats`` (None before the first forward)."""
        if len(self.absmax) < self.num_layers * len(LINEARS):
            return None
        if histogram_linear not in LINEARS:
            raise ValueError(f"histogram_linear: must be one of {LINEARS}, got {str(histogram_linear)[:40]!r}")
        if histogram_layer is not None and (isinstance(histogram_layer, bool) or not isinstance(histogram_layer, int)
                                            or not 0 <= histogram_layer < self.num_layers):
            raise ValueError(f"histogram_layer: must be an integer in [0, {self.num_layers}), got {histogram_layer!r}")
        layer = histogram_layer if histogram_layer is not None else loudest_layer(
            self.absmax, histogram_linear, self.num_layers)
        key = (layer, histogram_linear)
        r, counts = self.ranges[key], self.counts[key]
        edges = [-r + 2 * r * i / self.bins for i in range(self.bins + 1)]
        total = int(counts.sum())
        histogram = ActivationHistogram(layer, histogram_linear, tuple(edges),
                                        tuple(int(c) for c in counts.tolist()), total, 0)
        per_linear, outliers = _absmax_records(self.absmax, self.num_layers, float(threshold))
        return ActivationStats((), self.num_tokens, float(threshold), per_linear, outliers, histogram)
