"""Weight quantization (issue #9): int8 per channel, int4 group-wise, fp8 e4m3, and w8a8 with
LLM.int8()'s outlier decomposition, computed with torch's own CPU kernels.

Schemes (``QuantConfig.scheme``; vLLM's knob name is ``quantization``):

    int8   weight-only, per output channel, symmetric: s[n] = absmax(W[n,:]) / 127 (rounded UP
           to bf16, so no code clips), q = round(W / s) in [-127, 127]; y = (x @ q^T) * s via
           ``aten._weight_int8pack_mm(x_bf16 [M,K], q int8 [N,K], s bf16 [N])``, or for a decode
           step's 1-16 rows ``cpu_gemv.gemv_int8`` (C; also every scheme's int8 LM head).
    int4   weight-only, group-wise along K (group g in 32/64/128/256, torchao's ``group_size``),
           asymmetric with torch's int4pack zero-point convention:
               W ~= (q - 8) * scale + zero,   q in 0..15
           (zero is the value at the mid code 8: zero = lo + 8 * scale, rounded to bf16);
           ``aten._convert_weight_to_int4pack_for_cpu(q int32 [N,K], 1)`` packs, and
           ``aten._weight_int4pack_mm_for_cpu(x_bf16, packed, g, scales_and_zeros bf16 [K/g,N,2])``
           multiplies; a decode step's 1-16 rows take ``cpu_gemv.gemv_int4`` instead (C, reading the
           same packed layout; aten's read it at ~1-2 GB/s on the 2-core CPU).
    fp8    weight-only e4m3 (``torch.float8_e4m3fn``), per output channel: s[n] = absmax / 448
           (rounded up to bf16); dequantized on the fly: y = F.linear(x, bf16(q)) * s (every
           e4m3 value is exact in bf16, so only the GEMM and the final scaling round). bf16(q)
           is a 256-entry table lookup on the codes' bit patterns (``fp8_to_bf16``), decoded in
           pieces of 2^20 codes (``fp8_linear``), not ``q.to(bf16)`` of the whole weight: torch's
           CPU fp8 conversion and the big temporaries were the cost; the table holds exactly the
           values that conversion gives, so the output is bit-identical.
    w8a8   int8 weights as int8, plus dynamic per-token int8 activations (LLM.int8()): the input
           columns where any token has |x| > outlier_threshold (default 6.0, bitsandbytes'
           ``llm_int8_threshold``) stay in floating point,
               y = x_out @ deq(W)_out^T  +  (int8(x_in) @ q_in^T) * s_x[:,None] * s_w[None,:]
           the integer GEMM by ``torch._int_mm`` (int32 accumulation, exact).

The kernels have SIMD paths only for bfloat16 activations (reference/cpu.md), so every
quantized mode computes in bfloat16 (``EngineConfig.dtype`` "auto" resolves to it; float32 or
float16 with a quantization is a ValueError).

What is quantized: the four linear layers of every decoder layer (qkv, o, gate_up, down) with the
scheme; the embedding table and the LM head (tied in SmolLM2: 49152 x 576, 21% of its bytes)
in int8 per vocabulary row (fp8 in the fp8 mode): the LM head goes through the int8pack kernel
and the embedding lookup gathers int8 rows and scales them. int4 and w8a8 keep that table in
int8 too (the int4pack layout is opaque, so a row gather cannot read it; bitsandbytes also
leaves lm_head out of LLM.int8()). What stays 16 bit (bfloat16): the RMSNorm weights and any
bias (qkv / o bias of Qwen2-style models).

Disk cache: the quantized tensors are stored (safetensors, keyed by the source weights' content,
the scheme and the parameters that matter) by engine/model/quant_cache.py the first time a
quantized model is built, and loaded from there afterwards; in-process, ``get_shared_model``
shares them. Measured quantize times on the shared 2-core machine for SmolLM2 (quantize +
error statistics): int8 3.4 s, w8a8 4.1 s, fp8 5.6-11 s, int4 8-11 s.

Each quantized weight keeps what a future view needs: its scales and its error against the
original (relative Frobenius error, max |error|), not the original itself (recoverable from the
fp32 load).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F

from engine.core.config import (DEFAULT_GROUP_SIZE, DEFAULT_OUTLIER_THRESHOLD, INT4_GROUP_SIZES, SCHEMES, QuantConfig,
                                check_quant_knobs, check_smoothing)
from engine.model import cpu_gemv

FP8_MAX = 448.0  # largest finite float8_e4m3fn
_TINY = 1e-30  # floor of a scale: an all-zero row quantizes to zeros, not NaN


def check_group_size(config: QuantConfig, in_features: dict[str, int]) -> None:
    """Every input dimension K must be a multiple of 32 (torch's packed kernels; smaller odd
    shapes crashed them), and for int4, whose groups run along K, of the group size
    (SmolLM2's hidden 576 allows 32 and 64, not 128 or 256)."""
    for name, k in in_features.items():
        if k % 32:  # in a probe, _weight_int8pack_mm segfaulted on [5, 8] and [3, 33] weights
            raise ValueError(f"quantization: the quantized kernels need input dimensions that are multiples "
                             f"of 32; the {name} input dimension is {k}")
    if config.scheme != "int4":
        return
    for name, k in in_features.items():
        if k % config.group_size:
            raise ValueError(f"quantization_group_size: {config.group_size} does not divide the {name} "
                             f"input dimension {k}; choose one of "
                             f"{[g for g in INT4_GROUP_SIZES if all(v % g == 0 for v in in_features.values())]}")


# -- records --------------------------------------------------------------------------------


@dataclass(frozen=True)
class QuantError:
    """How far a quantized weight is from its original (fp32)."""

    relative_frobenius: float  # ||W - deq(W)||_F / ||W||_F
    max_abs: float  # max |W - deq(W)|


@dataclass(frozen=True, eq=False)
class QuantizedTensor:
    """A quantized weight in its canonical (inspectable) form.

    int8: data int8 [N,K], scales bf16 [N]; int4: data uint8 [N,K/2] (two codes per byte, even
    k in the high nibble), scales bf16 [K/g,N,2] (scale, zero) per group; fp8: data
    float8_e4m3fn [N,K], scales bf16 [N].
    """

    scheme: str  # "int8" | "int4" | "fp8"
    shape: tuple[int, int]  # [N, K] of the original weight
    data: torch.Tensor
    scales: torch.Tensor
    group_size: int | None
    error: QuantError


def _bf16_ceil(t: torch.Tensor) -> torch.Tensor:
    """The smallest bf16 value >= t (fp32, t > 0): a scale rounded up never clips a code."""
    b = t.to(torch.bfloat16)
    low = b.float() < t
    up = torch.nextafter(b, torch.full_like(b, math.inf))
    return torch.where(low, up, b)


def _error(w: torch.Tensor, deq: torch.Tensor) -> QuantError:
    diff = (w - deq).float()
    norm = float(w.float().norm())
    return QuantError(float(diff.norm()) / norm if norm else 0.0, float(diff.abs().max()) if diff.numel() else 0.0)


def quantize_int8(w: torch.Tensor) -> QuantizedTensor:
    """Symmetric per output channel. Invariant: |W - deq| <= s/2 elementwise (s rounded up to
    bf16, so |W/s| <= 127 and no code clips)."""
    w = w.float()  # [N, K]
    scales = _bf16_ceil((w.abs().amax(dim=1) / 127).clamp(min=_TINY))  # [N] bf16
    q = torch.round(w / scales.float()[:, None]).clamp(-127, 127).to(torch.int8)
    out = QuantizedTensor("int8", (w.shape[0], w.shape[1]), q, scales, None, QuantError(0.0, 0.0))
    return _with_error(out, w)


def quantize_int4(w: torch.Tensor, group_size: int = DEFAULT_GROUP_SIZE) -> QuantizedTensor:
    """Asymmetric group-wise along K, torch's int4pack convention W ~= (q - 8) * scale + zero.
    Invariant: |W - deq| <= scale/2 + |zero - (lo + 8 scale)| (the second term is the bf16
    rounding of the stored zero point, at most 2^-9 |zero|)."""
    w = w.float()
    n, k = w.shape
    if k % group_size:
        raise ValueError(f"quantization_group_size: {group_size} does not divide the input dimension {k}")
    wg = w.view(n, k // group_size, group_size)  # [N, G, g]
    lo, hi = wg.amin(-1), wg.amax(-1)  # [N, G]
    scale = _bf16_ceil(((hi - lo) / 15).clamp(min=_TINY))  # [N, G] bf16
    zero = (lo + 8 * scale.float()).to(torch.bfloat16)  # [N, G] bf16, the value at code 8
    base = zero.float() - 8 * scale.float()  # value of code 0
    q = torch.round((wg - base[..., None]) / scale.float()[..., None]).clamp(0, 15).to(torch.uint8)
    q = q.view(n, k)
    packed = (q[:, 0::2] << 4) | q[:, 1::2]  # [N, K/2] uint8
    sz = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous()  # [G, N, 2] bf16
    out = QuantizedTensor("int4", (n, k), packed, sz, group_size, QuantError(0.0, 0.0))
    return _with_error(out, w)


def quantize_fp8(w: torch.Tensor) -> QuantizedTensor:
    """e4m3 per output channel. Invariant: |W - deq| <= 2^-4 |W| for |W/s| in e4m3's normal
    range [2^-6, 448] (3 mantissa bits: half an ulp is 2^-4 of the value at most), and
    <= 2^-10 s below it (subnormal spacing 2^-9)."""
    w = w.float()
    scales = _bf16_ceil((w.abs().amax(dim=1) / FP8_MAX).clamp(min=_TINY))  # [N] bf16
    q = (w / scales.float()[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    out = QuantizedTensor("fp8", (w.shape[0], w.shape[1]), q, scales, None, QuantError(0.0, 0.0))
    return _with_error(out, w)


#: bf16 value of every float8_e4m3fn bit pattern 0..255 (torch's own conversion, NaN codes included).
FP8_TO_BF16_TABLE = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.bfloat16)  # [256]
#: Codes decoded per piece by ``fp8_linear``: 2^20 codes make a 4 MiB index and a 2 MiB bf16 piece,
#: small enough to be reused from the allocator's heap instead of fresh (page-faulting) mmaps.
FP8_CHUNK_CODES = 1 << 20


def fp8_to_bf16(q: torch.Tensor) -> torch.Tensor:
    """float8_e4m3fn [N, K] -> bf16 [N, K], bit-identical to ``q.to(torch.bfloat16)``: the codes'
    bit patterns (a free uint8 view) index a 256-entry table. ``index_select`` with int32 indices
    measured fastest of the gathers tried (advanced indexing, ``torch.take``, int64 indices, a
    65,536-entry two-codes-at-once table, bit manipulation)."""
    codes = q.view(torch.uint8).reshape(-1).to(torch.int32)  # [N*K]
    return FP8_TO_BF16_TABLE.index_select(0, codes).view(q.shape)


def fp8_linear(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """y = (x @ bf16(q)^T) * s for x bf16 [M, K], q float8_e4m3fn [N, K], s bf16 [N] -> bf16 [M, N].

    Rule: the result is bit-identical to ``F.linear(x, q.to(torch.bfloat16)) * s`` (the decoded
    weight holds the same values; each output element is one K-reduction, and splitting the N
    rows into pieces does not change it: checked by tests/test_quantization.py). The weight is
    decoded FP8_CHUNK_CODES codes at a time, never whole (the LM head alone would be a 57 MB
    temporary per step)."""
    n, k = q.shape
    rows = max(1, FP8_CHUNK_CODES // max(k, 1))
    if n <= rows:
        return F.linear(x, fp8_to_bf16(q)) * scales
    parts = [F.linear(x, fp8_to_bf16(q[a:a + rows])) for a in range(0, n, rows)]  # [M, rows] each
    return torch.cat(parts, dim=1) * scales


def _with_error(q: QuantizedTensor, w: torch.Tensor) -> QuantizedTensor:
    return QuantizedTensor(q.scheme, q.shape, q.data, q.scales, q.group_size, _error(w, dequantize(q)))


def int4_codes(q: QuantizedTensor) -> torch.Tensor:
    """The int4 codes 0..15 as int32 [N, K] (unpacked from two per byte)."""
    n, k = q.shape
    codes = torch.empty(n, k, dtype=torch.int32)
    codes[:, 0::2] = (q.data >> 4).to(torch.int32)
    codes[:, 1::2] = (q.data & 15).to(torch.int32)
    return codes


def dequantize(q: QuantizedTensor) -> torch.Tensor:
    """The weight the codes stand for, exactly, in fp32 [N, K]."""
    n, k = q.shape
    if q.scheme in ("int8", "fp8"):  # per output channel: code x scale
        return q.data.float() * q.scales.float()[:, None]
    if q.scheme == "int4":
        assert q.group_size is not None
        g = q.group_size
        scale = q.scales[..., 0].float().t()  # [N, G]
        zero = q.scales[..., 1].float().t()
        codes = int4_codes(q).float().view(n, k // g, g)
        return ((codes - 8) * scale[..., None] + zero[..., None]).view(n, k)
    raise ValueError(f"quantization: cannot dequantize scheme {q.scheme!r}")


# -- the runtime weight ----------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class QuantizedLinear:
    """One quantized weight, ready for its kernel: ``y = self(x)`` is ``x @ W^T`` for x bf16 [M, K].

    weight: int8 [N,K] (int8, w8a8), the int4pack layout (int4; opaque), float8_e4m3fn [N,K] (fp8).
    scales: bf16 [N] (int8, fp8, w8a8) or bf16 [K/g, N, 2] (int4). ``error`` and the scales are what
    a view needs; the original weight is not kept.
    """

    scheme: str  # "int8" | "int4" | "fp8" | "w8a8"
    out_features: int
    in_features: int
    weight: torch.Tensor
    scales: torch.Tensor
    error: QuantError
    group_size: int | None = None
    outlier_threshold: float = DEFAULT_OUTLIER_THRESHOLD

    @staticmethod
    def from_quantized(q: QuantizedTensor, scheme: str | None = None,
                       outlier_threshold: float = DEFAULT_OUTLIER_THRESHOLD) -> QuantizedLinear:
        """Pack ``q`` for its kernel (``scheme="w8a8"`` reuses an int8 tensor's codes)."""
        n, k = q.shape
        weight = q.data
        if q.scheme == "int4":
            weight = torch.ops.aten._convert_weight_to_int4pack_for_cpu(int4_codes(q), 1)
        return QuantizedLinear(scheme or q.scheme, n, k, weight, q.scales, q.error, q.group_size,
                               outlier_threshold)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x bf16 [M, K] -> y bf16 [M, N]."""
        x = x.to(torch.bfloat16).contiguous()
        y: torch.Tensor  # (torch.ops are untyped)
        if self.scheme == "int8":
            if cpu_gemv.applies_int8(x, self.weight, self.scales):  # a decode step: the C kernel
                return cpu_gemv.gemv_int8(x, self.weight, self.scales)
            y = torch.ops.aten._weight_int8pack_mm(x, self.weight, self.scales)
            return y
        if self.scheme == "int4":
            assert self.group_size is not None
            if cpu_gemv.applies_int4(x, self.weight, self.out_features):  # a decode step: the C kernel
                return cpu_gemv.gemv_int4(x, self.weight, self.block_scales, self.group_size)
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.weight, self.group_size, self.scales)
            return y
        if self.scheme == "fp8":
            return fp8_linear(x, self.weight, self.scales)
        if self.scheme == "w8a8":
            return self._int8_int8(x)
        raise ValueError(f"quantization: unknown scheme {self.scheme!r}")

    def _int8_int8(self, x: torch.Tensor) -> torch.Tensor:
        """LLM.int8(): outlier input columns (any |x| > threshold) in floating point, the rest
        as per-token int8 (s_x = absmax/127 over the inlier columns) times int8 weights."""
        xf = x.float()  # [M, K]
        outliers = (xf.abs() > self.outlier_threshold).any(dim=0)  # [K]
        y = torch.zeros(x.shape[0], self.out_features, dtype=torch.float32)
        if bool(outliers.any()):
            cols = outliers.nonzero().squeeze(1)
            w_out = self.weight[:, cols].float() * self.scales.float()[:, None]  # [N, k_out]
            y = y + xf[:, cols] @ w_out.t()
            xf = xf.index_fill(1, cols, 0.0)
        sx = (xf.abs().amax(dim=1) / 127).clamp(min=_TINY)  # [M]
        xq = torch.round(xf / sx[:, None]).clamp(-127, 127).to(torch.int8)
        acc = torch._int_mm(xq, self.weight.t()).float()  # [M, N] int32 accumulation, exact
        y = y + acc * sx[:, None] * self.scales.float()[None, :]
        return y.to(torch.bfloat16)

    @cached_property
    def block_scales(self) -> torch.Tensor:
        """int4: ``scales`` laid out for the C decode kernel (``cpu_gemv.int4_block_scales``), made on
        first use and kept (the same bytes again: 1/8 of the packed weight at group size 32)."""
        return cpu_gemv.int4_block_scales(self.scales)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` of the table (an embedding lookup), dequantized: bf16 [T, K]."""
        if self.scheme not in ("int8", "fp8", "w8a8"):
            raise ValueError(f"quantization: an embedding cannot be read from a {self.scheme} table")
        return (self.weight[ids].float() * self.scales[ids].float()[:, None]).to(torch.bfloat16)

    @property
    def nbytes(self) -> int:
        return self.weight.numel() * self.weight.element_size() + self.scales.numel() * self.scales.element_size()


Weight = torch.Tensor | QuantizedLinear


def linear(x: torch.Tensor, weight: Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W^T + b`` for a plain tensor (``F.linear``; 1..16 fp32 rows, a decode step: the C
    kernels of engine/model/cpu_gemv.py, equal up to rounding) or a quantized weight."""
    if isinstance(weight, torch.Tensor):
        if cpu_gemv.applies(x, weight):
            y = cpu_gemv.gemv(x, weight)
            return y if bias is None else y + bias
        return F.linear(x, weight, bias)
    y = weight(x)
    return y if bias is None else y + bias


def quantize_tensor(w: torch.Tensor, scheme: str, group_size: int = DEFAULT_GROUP_SIZE) -> QuantizedTensor:
    """The canonical quantized form of a linear weight [N, K] under ``scheme``: the one dispatch
    from a scheme name to its quantizer. "w8a8" quantizes its weights as int8 (its activations
    are quantized per token at run time); ``group_size`` is read by int4 only."""
    if scheme in ("int8", "w8a8"):
        return quantize_int8(w)
    if scheme == "int4":
        return quantize_int4(w, group_size)
    if scheme == "fp8":
        return quantize_fp8(w)
    raise ValueError(f"quantization: must be one of {SCHEMES}, got {scheme!r}")


def quantize_weight(w: torch.Tensor, config: QuantConfig) -> QuantizedLinear:
    """One linear layer's weight [N, K] under ``config``."""
    q = quantize_tensor(w, config.scheme, config.group_size)
    if config.scheme == "w8a8":
        return QuantizedLinear.from_quantized(q, "w8a8", config.outlier_threshold)
    return QuantizedLinear.from_quantized(q)


def quantize_table(w: torch.Tensor, config: QuantConfig) -> QuantizedLinear:
    """The embedding / LM head table [V, h]: fp8 in the fp8 mode, int8 per row otherwise."""
    q = quantize_fp8(w) if config.scheme == "fp8" else quantize_int8(w)
    return QuantizedLinear.from_quantized(q)


def dequantize_linear(q: QuantizedLinear, original: QuantizedTensor | None = None) -> torch.Tensor:
    """The fp32 weight a runtime ``QuantizedLinear`` computes with (not for int4, whose packed
    layout is opaque: dequantize its ``QuantizedTensor`` instead)."""
    if q.scheme in ("int8", "w8a8", "fp8"):
        return q.weight.float() * q.scales.float()[:, None]
    if original is not None:
        return dequantize(original)
    raise ValueError("quantization: an int4 QuantizedLinear keeps only the packed layout; "
                     "dequantize its QuantizedTensor")


def is_linear_weight(name: str) -> bool:
    """The decoder-layer projections a scheme quantizes (Hugging Face names)."""
    return name.startswith("model.layers.") and name.endswith("_proj.weight")


def is_table(name: str) -> bool:
    """The embedding table and an untied LM head (int8 per row, fp8 in the fp8 mode)."""
    return name in ("model.embed_tokens.weight", "lm_head.weight")


def dequantized_weights(weights: dict[str, torch.Tensor], config: QuantConfig) -> dict[str, torch.Tensor]:
    """fp32 weights with every quantized tensor replaced by what its codes stand for: the
    Hugging Face reference of a quantized engine. Rows quantize independently (per channel,
    or groups along K within a row), so quantizing q|k|v fused, as the engine does, gives
    the same values as quantizing each projection alone."""
    out = {}
    for name, w in weights.items():
        if is_linear_weight(name):
            out[name] = dequantize(quantize_tensor(w, config.scheme, config.group_size))
        elif is_table(name):
            out[name] = dequantize(quantize_fp8(w) if config.scheme == "fp8" else quantize_int8(w))
        else:
            out[name] = w.float()
    return out


__all__ = ["dequantized_weights", "is_linear_weight", "is_table", "DEFAULT_GROUP_SIZE", "DEFAULT_OUTLIER_THRESHOLD", "INT4_GROUP_SIZES", "SCHEMES", "QuantConfig",
           "QuantError", "QuantizedLinear", "QuantizedTensor", "Weight", "check_group_size", "check_quant_knobs",
           "dequantize", "dequantize_linear", "fp8_linear", "fp8_to_bf16", "FP8_CHUNK_CODES", "FP8_TO_BF16_TABLE", "int4_codes", "linear", "quantize_fp8", "quantize_int4",
           "quantize_int8", "quantize_table", "quantize_tensor", "quantize_weight"]
