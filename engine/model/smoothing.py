"""SmoothQuant (Xiao et al., 2022): move activation range into the weights before w8a8.

Knob: ``quantization_smoothing_strength`` (llm-compressor's ``SmoothQuantModifier
(smoothing_strength=...)``, the paper's alpha; vLLM itself has no such runtime knob, it loads
checkpoints smoothed offline). None = off; a number in [0, 1] (0.5 is the paper's default, 0.8
llm-compressor's). Only with ``quantization="w8a8"``: it is the scheme that quantizes
activations, which is what smoothing helps.

Rule, per input channel j of a linear with input X [T, K] and weight W [N, K]:

    s_j = max|X_j|^alpha / max_n |W_nj|^(1 - alpha)        (both floored at 1e-5, as the paper's code)
    X' = X / s      W' = W * s (per input column)           so X' @ W'^T == X @ W^T exactly

The division of X has to be folded into whatever produces X, so only linears whose input comes
out of an elementwise-scalable op are smoothed (llm-compressor's default Llama mappings):

    qkv      X = RMSNorm(h) * gamma_in      -> gamma_in  /= s    (q, k, v columns *= s)
    gate_up  X = RMSNorm(h) * gamma_post    -> gamma_post /= s   (gate, up columns *= s)
    down     X = silu(gate) * up            -> up_proj rows /= s (down columns *= s)

``o`` is not smoothed: its input (attention output) is linear in v, but with grouped-query
attention one v channel feeds several heads' o input channels, which would all need the same
scale. No division is applied at runtime anywhere: the model's math is unchanged in exact
arithmetic (in fp32 the logits agree to rounding; tests/test_smoothing.py).

Calibration: ``activation_stats`` (engine/model/activations.py) over presets/calibration.json on the
fp32 model, before quantization; the gate_up smoothing leaves gate and up outputs unchanged,
so the down statistics of the same pass stay valid after it. Deterministic (one fp32 pass).

Measured on SmolLM2-135M (tests/bench/bench_smoothing.py: perplexity of the first 1,024 tokens of
presets/texts/sqlite3_h_comments.txt, window 512 / stride 256; fp32 14.94): w8a8 15.17, w8a8 +
alpha 0.5 15.18, + alpha 0.8 15.70; with LLM.int8()'s float columns off (threshold 1e30, every
column int8) 15.10, + alpha 0.5 15.25, + alpha 0.8 15.65. So on this model smoothing does not
lower perplexity: per-token activation scales already absorb most of the range, and the range
moved into the weights (qkv weight max/median 4.7x at 0.5, 12x at 0.8, in layers 12-24) costs
the per-output-channel int8 weights more than it saves. What it does buy: activation channels
above the 6.0 threshold (the columns w8a8 keeps in floating point) drop from 2,356 to 102 at
alpha 0.5 and to 2 at 0.8, and the qkv input's max/median channel absmax from 17.8x to 4.7x
(0.5) and 1.8x (0.8) in layers 12-24.

Each smoothed linear keeps what a view needs (``SmoothedLinear``: plain floats): the scales, the
activation absmax per channel before and after (after = before / s, the exact consequence of
the fold), and the weight absmax per input channel before and after.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch

from engine.core.config import check_smoothing

__all__ = ["SMOOTHED_LINEARS", "SmoothedLinear", "Smoothing", "apply_smoothing", "check_smoothing_strength",
           "smooth_weights", "smoothing_scales"]

SMOOTHED_LINEARS = ("qkv", "gate_up", "down")
_FLOOR = 1e-5  # SmoothQuant's clamp of act / weight maxima and of s (no division by zero)


class CalibrationStats(Protocol):
    """What the fold needs from calibration: each linear's per-channel input absmax, every layer,
    and how many tokens they came from (engine/model/activations.py ActivationStats is one)."""

    @property
    def num_tokens(self) -> int: ...

    def absmax_of(self, linear: str) -> tuple[tuple[float, ...], ...]: ...


def check_smoothing_strength(strength: object) -> float:
    """A finite number in [0, 1] (not a bool, not None); ValueError naming the knob."""
    if strength is None:
        raise ValueError("quantization_smoothing_strength: must be a number in [0, 1], got None")
    check_smoothing("w8a8", strength)
    assert isinstance(strength, (int, float))
    return float(strength)


@dataclass(frozen=True)
class SmoothedLinear:
    """One smoothed linear of one layer: s [K] and the ranges it moves (all [K], plain floats)."""

    layer: int
    linear: str  # "qkv" | "gate_up" | "down"
    folded_into: str  # the tensor that takes the 1/s: "input_layernorm", "post_attention_layernorm", "up_proj"
    scales: tuple[float, ...]  # s
    act_absmax_before: tuple[float, ...]  # max_t |X[t, j]| (calibration)
    act_absmax_after: tuple[float, ...]  # max_t |X'[t, j]| = before / s
    weight_absmax_before: tuple[float, ...]  # max_n |W[n, j]|
    weight_absmax_after: tuple[float, ...]  # max_n |W'[n, j]| = before * s

    @staticmethod
    def _spread(values: tuple[float, ...]) -> float:
        t = torch.tensor(values)
        med = float(t.median())
        return float(t.max()) / med if med > 0 else math.inf

    def act_spread(self) -> tuple[float, float]:
        """(before, after) of max / median of the per-channel activation absmax."""
        return self._spread(self.act_absmax_before), self._spread(self.act_absmax_after)

    def weight_spread(self) -> tuple[float, float]:
        """(before, after) of max / median of the per-input-channel weight absmax."""
        return self._spread(self.weight_absmax_before), self._spread(self.weight_absmax_after)


@dataclass(frozen=True)
class Smoothing:
    """Every smoothed linear of a model (layer-major, SMOOTHED_LINEARS order within a layer)."""

    strength: float
    num_tokens: int  # calibration tokens behind the absmax
    linears: tuple[SmoothedLinear, ...]

    def of(self, layer: int, linear: str) -> SmoothedLinear:
        for entry in self.linears:
            if entry.layer == layer and entry.linear == linear:
                return entry
        raise ValueError(f"linear: no smoothed ({layer}, {linear!r}); smoothed linears are {SMOOTHED_LINEARS}")


def smoothing_scales(act_absmax: torch.Tensor, weight: torch.Tensor, strength: float) -> torch.Tensor:
    """s [K] = max|X_j|^a / max_n|W_nj|^(1-a) for act_absmax [K] and weight [N, K] (module doc).
    a = 0 gives s = 1 / max|W_j| (all range to activations), a = 1 gives s = max|X_j|."""
    a = act_absmax.float().clamp(min=_FLOOR)  # [K]
    w = weight.float().abs().amax(dim=0).clamp(min=_FLOOR)  # [K]
    return (a.pow(strength) / w.pow(1 - strength)).clamp(min=_FLOOR)


def _targets(i: int, linear: str) -> tuple[str, list[str]]:
    """(the tensor divided by s, the weights whose input columns are multiplied by s)."""
    p = f"model.layers.{i}."
    if linear == "qkv":
        return p + "input_layernorm.weight", [p + f"self_attn.{n}_proj.weight" for n in "qkv"]
    if linear == "gate_up":
        return p + "post_attention_layernorm.weight", [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"]
    if linear == "down":
        return p + "mlp.up_proj.weight", [p + "mlp.down_proj.weight"]
    raise ValueError(f"linear: must be one of {SMOOTHED_LINEARS}, got {linear!r}")


def _fold(w: dict[str, torch.Tensor], i: int, linear: str, s: torch.Tensor) -> None:
    """In place on the dict (new tensors, the originals untouched): source / s, columns * s."""
    source, balance = _targets(i, linear)
    if linear == "down":  # up_proj [I, h]: its output row j is down's input channel j
        w[source] = w[source].float() / s[:, None]
    else:  # an RMSNorm weight [h]
        w[source] = w[source].float() / s
    for name in balance:
        w[name] = w[name].float() * s[None, :]  # [N, K] * [1, K]


def smooth_weights(weights: dict[str, torch.Tensor], stats: CalibrationStats,
                   strength: float) -> tuple[dict[str, torch.Tensor], Smoothing]:
    """Hugging Face-named fp32 weights with every qkv / gate_up / down smoothed (module doc),
    and the record of what moved. ``stats`` must come from the same (unsmoothed) weights.
    Order per layer: gate_up before down (down's fold rescales up_proj's rows, which gate_up's
    fold rescaled by column: the two commute, both are exact)."""
    strength = check_smoothing_strength(strength)
    out = dict(weights)
    records: list[SmoothedLinear] = []
    num_layers = len(stats.absmax_of("qkv"))
    for i in range(num_layers):
        for linear in SMOOTHED_LINEARS:
            _, balance = _targets(i, linear)
            act = torch.tensor(stats.absmax_of(linear)[i])  # [K]
            w_cat = torch.cat([out[n].float() for n in balance])  # [N, K]
            s = smoothing_scales(act, w_cat, strength)
            w_before = w_cat.abs().amax(dim=0)  # [K]
            _fold(out, i, linear, s)
            w_after = torch.cat([out[n] for n in balance]).abs().amax(dim=0)
            records.append(SmoothedLinear(i, linear, _targets(i, linear)[0].split(".")[-2],
                                          tuple(s.tolist()), tuple(act.tolist()), tuple((act / s).tolist()),
                                          tuple(w_before.tolist()), tuple(w_after.tolist())))
    return out, Smoothing(strength, stats.num_tokens, tuple(records))


def apply_smoothing(weights: dict[str, torch.Tensor], smoothing: Smoothing) -> dict[str, torch.Tensor]:
    """The same fold with recorded scales: what a model smoothed with ``smoothing`` computes
    with (the Hugging Face reference of a smoothed engine)."""
    out = dict(weights)
    for entry in smoothing.linears:
        _fold(out, entry.layer, entry.linear, torch.tensor(entry.scales))
    return out
