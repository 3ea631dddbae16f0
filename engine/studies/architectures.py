"""Attention architectures side by side on one device: the calculator's answers for real configs.

MHA (Llama-2-7B), MQA (Falcon-7B), GQA (Llama-3-8B), MLA (DeepSeek-V2-Lite), sliding + global
layers (Gemma-2-9B), a state-space model (Mamba-2.8B) and a hybrid (Jamba-v0.1), each sized by
``engine.sizing.estimate`` on one device (tp = pp = 1) at one context length: KV (or recurrent
state) bytes per token and per sequence, how many sequences the device holds beside the
weights, and the decode roofline with the KV reads counted, for one sequence and for the
device full. Every number is copied from the calculator's Estimate, with the calculator's own
formula lines; nothing is derived again here. Torch-free, like the calculator.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.sizing import Settings, SizingError, Workload, estimate
from engine.sizing.estimate import Estimate

__all__ = ["ARCHITECTURES", "ArchitectureCase", "ArchitectureRow", "compare_architectures"]


@dataclass(frozen=True)
class ArchitectureCase:
    kind: str  # the short name the page shows ("GQA")
    model: str  # a preset in presets/models/
    idea: str  # what the architecture keeps per token, in a line


ARCHITECTURES: tuple[ArchitectureCase, ...] = (
    ArchitectureCase("MHA", "llama-2-7b", "multi-head: one K and one V head per query head (32 of 128 per layer)"),
    ArchitectureCase("MQA", "falcon-7b", "multi-query: every query head shares one K and one V head"),
    ArchitectureCase("GQA", "llama-3-8b", "grouped-query: 32 query heads share 8 K/V heads (4 per group)"),
    ArchitectureCase("MLA", "deepseek-v2-lite", "multi-head latent: one compressed latent (512) + a shared RoPE key"
                                                " (64) per token and layer, expanded to heads at attention time"),
    ArchitectureCase("sliding + global", "gemma-2-9b", "half the layers attend to the last 4,096 tokens only, the"
                                                       " other half to all; a sliding layer's KV stops growing"),
    ArchitectureCase("SSM", "mamba-2.8b", "state-space: a constant conv + SSM state per sequence, no per-token KV"),
    ArchitectureCase("hybrid", "jamba-v0.1", "attention on 1 layer in 8 (KV), Mamba on the other 7 (state), MoE"
                                             " MLPs"),
)
#: the formula lines of the calculator each row shows (key in Estimate.formulas, heading)
FORMULA_LINES: tuple[tuple[str, str], ...] = (
    ("kv_per_token", "KV (or state) per token"), ("kv_total", "KV per sequence at this context"),
    ("weights", "weights"), ("fits", "memory at one sequence"), ("kv_room", "room for KV beside the weights"),
    ("decode", "decode, one sequence"),
)


@dataclass(frozen=True)
class ArchitectureRow:
    """One architecture on the device at the context: the calculator's numbers and formulas."""

    kind: str
    model: str
    model_name: str
    idea: str
    hardware_name: str
    framework: str
    weights_format: str
    kv_dtype: str
    context: int
    weight_bytes: int
    kv_bytes_per_token: int  # 0 for a pure SSM (its state does not grow with tokens)
    kv_bytes_per_sequence: int  # at the context: KV of every token + any recurrent state (block-rounded)
    fits: bool  # one sequence at the context fits beside the weights
    max_sequences: int  # most sequences at the context the device holds (0: not even one)
    decode_bytes_per_step: float  # one sequence: weights read + its KV read
    decode_tokens_per_s: float  # roofline (eta = 1), one sequence
    decode_bound: str
    full_decode_bytes_per_step: float  # at max_sequences (0.0 when none fit)
    full_decode_tokens_per_s: float  # roofline, all max_sequences together
    full_decode_bound: str
    formulas: tuple[tuple[str, str], ...]  # (heading, the calculator's line with its numbers)
    warnings: tuple[str, ...]


def _roofline_total(est: Estimate) -> float:
    return est.decode_tokens_per_s_roofline * est.batch


def architecture_row(case: ArchitectureCase, hardware: str, context: int, weights: str = "bf16",
                     kv_dtype: str = "auto") -> ArchitectureRow:
    """``case`` on one ``hardware`` device at ``context``; SizingError as the calculator says it."""
    settings = Settings(weights=weights, kv_dtype=kv_dtype, tp=1, pp=1)
    one = estimate(case.model, hardware, Workload(batch=1, context=context), settings, detail=False)
    full = None
    if one.max_batch >= 1:
        full = estimate(case.model, hardware, Workload(batch=one.max_batch, context=context), settings, detail=False)
    formulas = [(heading, one.formulas[key]) for key, heading in FORMULA_LINES if key in one.formulas]
    if full is not None:
        formulas.append((f"decode, {full.batch:,} sequences (the device full)", full.formulas["decode"]))
    return ArchitectureRow(
        kind=case.kind, model=case.model, model_name=one.model_name, idea=case.idea, hardware_name=one.hardware_name,
        framework=one.framework, weights_format=one.weights_format, kv_dtype=one.kv_dtype, context=one.context,
        weight_bytes=one.weight_bytes, kv_bytes_per_token=one.kv_bytes_per_token, kv_bytes_per_sequence=one.kv_bytes,
        fits=one.fits, max_sequences=one.max_batch, decode_bytes_per_step=one.decode_bytes_per_step,
        decode_tokens_per_s=one.decode_tokens_per_s_roofline, decode_bound=one.bound,
        full_decode_bytes_per_step=full.decode_bytes_per_step if full else 0.0,
        full_decode_tokens_per_s=_roofline_total(full) if full else 0.0, full_decode_bound=full.bound if full else "",
        formulas=tuple(formulas), warnings=tuple(one.warnings))


def compare_architectures(hardware: str, context: int, weights: str = "bf16",
                          kv_dtype: str = "auto") -> tuple[ArchitectureRow, ...]:
    """Every case in ARCHITECTURES on one device at ``context`` (SizingError names a bad input)."""
    if not isinstance(context, int) or isinstance(context, bool) or context < 1:
        raise SizingError(f"context: must be a whole number of tokens >= 1, got {context!r}")
    return tuple(architecture_row(case, hardware, context, weights, kv_dtype) for case in ARCHITECTURES)
