"""KV-cache quantization: int8 / fp8 (E4M3) storage with per-token-per-head scales.

A quantized layer cache is a pair of tensors kept side by side (``QuantizedKV``):

    data   [num_blocks, block_size, kv_heads, head_dim]   int8 or float8_e4m3fn
    scale  [num_blocks, block_size, kv_heads]             float32 (always fp32, whatever the
                                                          compute dtype: 4 B per token-head,
                                                          the calculator's count, sizing.md §3.3)

Rule (symmetric absmax, one scale per token and KV head, over head_dim):

    scale = max(|x[h, :]|) / QMAX          QMAX = 127 (int8), 448 (fp8 e4m3, its largest finite)
    q     = int8: clamp(round(x / scale), -127, 127)    fp8: clamp(x / scale, -448, 448) -> e4m3
    x~    = q * scale                      (dequantized in fp32, then cast to the compute dtype)

Invariant: a slot's stored value is exactly ``data[slot] * scale[slot]``; writes quantize,
reads dequantize, so attention over a quantized cache equals attention over those values.
Error bounds (tests/test_kv_quantization.py): int8 ``|x - x~| <= scale / 2``; fp8 e4m3 (3
mantissa bits, round to nearest) ``|x - x~| <= |x| / 16 + scale * 2**-10`` (the second term
covers e4m3 subnormals, spacing 2**-9 in units of scale).

An all-zero token-head gets scale 0 and dequantizes to exact zeros.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

#: Quantized KV dtype name (``EngineConfig.kv_cache_dtype``) -> (storage dtype, QMAX).
KV_QUANT_DTYPES: dict[str, tuple[torch.dtype, float]] = {
    "int8": (torch.int8, 127.0),
    "fp8": (torch.float8_e4m3fn, 448.0),
}
#: Bytes of one scale (fp32) per token, per KV head, for K and for V.
SCALE_BYTES = 4
SCALE_DTYPE = torch.float32

#: The engine's KV dtype names -> the calculator's KV dtype keys (engine/sizing/formats.py).
#: The calculator's "fp8" is vLLM's (per-tensor scale, ~0 B); ours stores per-token-head scales.
SIZING_KV_DTYPES: dict[str, str] = {
    "float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "int8": "int8", "fp8": "fp8_token",
}


@dataclass(frozen=True)
class QuantizedKV:
    """One layer's K (or V) cache in a quantized dtype and its scales (see the module rule).

    data  [num_blocks, block_size, kv_heads, head_dim] int8 / float8_e4m3fn
    scale [num_blocks, block_size, kv_heads] float32
    """

    data: torch.Tensor
    scale: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    @property
    def name(self) -> str:
        """"int8" or "fp8" (the key of KV_QUANT_DTYPES)."""
        return "int8" if self.data.dtype == torch.int8 else "fp8"

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size() + self.scale.numel() * self.scale.element_size()

    def byte_rows(self) -> torch.Tensor:
        """data as raw bytes, one row per slot: [num_slots, kv_heads * head_dim] uint8 (fp8 has no
        CPU index_copy_/index_select kernels; bytes copy the same bits)."""
        kvh, d = self.data.shape[2], self.data.shape[3]
        return self.data.view(torch.uint8).view(-1, kvh * d)

    def scale_rows(self) -> torch.Tensor:
        """[num_slots, kv_heads] float32."""
        return self.scale.view(-1, self.scale.shape[2])


#: One layer's K or V cache: a plain float tensor or a quantized one.
KVCache = torch.Tensor | QuantizedKV


def is_quantized(name: str) -> bool:
    return name in KV_QUANT_DTYPES


def allocate(shape: tuple[int, int, int, int], name: str, float_dtype: torch.dtype | None = None,
             device: torch.device | str = "cpu") -> KVCache:
    """Zeroed cache of ``shape`` [num_blocks, block_size, kv_heads, head_dim] on ``device``:
    quantized for "int8"/"fp8" (with an fp32 scale tensor [num_blocks, block_size, kv_heads]),
    else a tensor of ``float_dtype``."""
    if name in KV_QUANT_DTYPES:
        storage, _ = KV_QUANT_DTYPES[name]
        return QuantizedKV(torch.zeros(shape, dtype=storage, device=device),
                           torch.zeros(shape[:3], dtype=SCALE_DTYPE, device=device))
    if float_dtype is None:
        raise ValueError(f"kv_cache_dtype: {name!r} is not a quantized KV dtype and no float dtype was given")
    return torch.zeros(shape, dtype=float_dtype, device=device)


def quantize(x: torch.Tensor, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., head_dim] (any float dtype) -> (q [..., head_dim] storage dtype, scale [...] fp32).

    Rule: symmetric absmax per row (token, head): scale = absmax / QMAX; int8 rounds to nearest
    and clamps to +-127; fp8 clamps to +-448 and casts (round to nearest even)."""
    storage, qmax = KV_QUANT_DTYPES[name]
    xf = x.float()
    scale = xf.abs().amax(dim=-1) / qmax  # [...]
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    y = xf / safe.unsqueeze(-1)  # [..., d], |y| <= QMAX up to rounding
    if storage == torch.int8:
        q = y.round().clamp_(-qmax, qmax).to(torch.int8)
    else:
        q = y.clamp_(-qmax, qmax).to(storage)
    return q, scale


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """q [..., head_dim], scale [...] fp32 -> q * scale [..., head_dim] in ``dtype`` (computed in fp32)."""
    return (q.float() * scale.unsqueeze(-1)).to(dtype)


def write(cache: QuantizedKV, x: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Quantize x [T, kv_heads, head_dim] and scatter data and scales into their slots [T]."""
    kvh, d = x.shape[1], x.shape[2]
    q, scale = quantize(x, cache.name)  # [T, kvh, d], [T, kvh]
    cache.byte_rows().index_copy_(0, slot_mapping, q.view(torch.uint8).reshape(-1, kvh * d))
    cache.scale_rows().index_copy_(0, slot_mapping, scale)


def gather(cache: QuantizedKV, slots: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """slots [L] -> the dequantized K or V [L, kv_heads, head_dim] in ``dtype``."""
    kvh, d = cache.data.shape[2], cache.data.shape[3]
    q = cache.byte_rows().index_select(0, slots).view(cache.data.dtype).view(-1, kvh, d)  # [L, kvh, d]
    return dequantize(q, cache.scale_rows().index_select(0, slots), dtype)


def copy_blocks(cache: QuantizedKV, src: torch.Tensor, dst: torch.Tensor) -> None:
    """Blocks src -> dst ([n] each): data and scales (copy-on-write must carry both)."""
    raw = cache.data.view(torch.uint8)  # [num_blocks, block_size, kvh, d]
    raw.index_copy_(0, dst, raw.index_select(0, src))
    cache.scale.index_copy_(0, dst, cache.scale.index_select(0, src))
