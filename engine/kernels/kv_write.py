"""Writing this step's K/V into the paged cache through the slot mapping (a Triton kernel).

Rule: token t's K (and V) [kv_heads, head_dim] go to slot s = slot_mapping[t], i.e. block
s // block_size, offset s % block_size of the cache [num_blocks, block_size, kv_heads, head_dim],
in the cache's dtype. One program writes BLOCK_T tokens, all their heads:

    k [T, kv_heads, head_dim]        slot_mapping [T]         k_cache [num_blocks, block_size, ...]
    t=0  [h0 | h1]  ------------->   s=37  ---------------->  block 37 // bs, offset 37 % bs
    t=1  [h0 | h1]  ------------->   s=5   ---------------->  block  5 // bs, offset  5 % bs

Invariant: only the T addressed slots change; slots are distinct within a step (the engine's
block tables are disjoint), so the programs never race. The kernel only moves values: dtype
casts happen in torch before the launch (Triton's interpreter truncates fp32 -> bf16 where a GPU
and torch round to nearest even).

Quantized caches (int8 / fp8 e4m3 data with one fp32 scale per token and KV head):
``write_kv_quantized`` takes values already quantized by the caller (the engine quantizes with
its one rule, engine/model/kv_quant.py) and scatters data and scales with the same kernel: the
data as raw bytes, the scales as a cache of head_dim 1.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.paged_attention import INTERPRETED
from engine.kernels.validation import check_kv_write, check_quantized_kv_write, check_runnable


@triton.jit
def _write_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, slots_ptr, num_tokens,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_cs, stride_ch, stride_vcb, stride_vcs, stride_vch,
    KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, COLS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_T: tl.constexpr,
):
    """BLOCK_T tokens per program; columns are (head, dim) flattened: c = head * D_PAD + dim."""
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T).to(tl.int64)  # int64 (see paged_attention.py)
    t_ok = t < num_tokens
    slot = tl.load(slots_ptr + t, mask=t_ok, other=0).to(tl.int64)
    blk = slot // BLOCK_SIZE
    off = slot % BLOCK_SIZE
    c = tl.arange(0, COLS).to(tl.int64)
    h = c // D_PAD
    d = c % D_PAD
    ok = t_ok[:, None] & ((h < KV_HEADS) & (d < HEAD_DIM))[None, :]
    k = tl.load(k_ptr + t[:, None] * stride_kt + (h * stride_kh + d)[None, :], mask=ok)
    v = tl.load(v_ptr + t[:, None] * stride_vt + (h * stride_vh + d)[None, :], mask=ok)
    tl.store(kc_ptr + (blk * stride_cb + off * stride_cs)[:, None] + (h * stride_ch + d)[None, :], k, mask=ok)
    tl.store(vc_ptr + (blk * stride_vcb + off * stride_vcs)[:, None] + (h * stride_vch + d)[None, :], v, mask=ok)


#: Tokens per program (the interpreter's cost is per program and per op, not per element).
BLOCK_T = 32


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _scatter(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """The launch: k, v [T, kv_heads, d] already in the caches' dtype; caches contiguous."""
    check_runnable("k_cache", k_cache, INTERPRETED)
    num_tokens = k.shape[0]
    if num_tokens == 0:
        return
    k, v = k.contiguous(), v.contiguous()
    kvh, d = k.shape[1], k.shape[2]
    _write_kernel[(-(-num_tokens // BLOCK_T),)](
        k, v, k_cache, v_cache, slot_mapping.contiguous(), num_tokens,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        KV_HEADS=kvh, HEAD_DIM=d, D_PAD=_pow2(d), COLS=_pow2(kvh) * _pow2(d), BLOCK_SIZE=k_cache.shape[1],
        BLOCK_T=BLOCK_T,
    )


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Scatter k, v [T, kv_heads, head_dim] into the float caches' slots [T], in place (module
    rule). Bad inputs (shapes, dtypes, a slot outside the cache, a non-float cache) are a
    ValueError naming the argument, before the launch."""
    check_kv_write(k_cache, v_cache, k, v, slot_mapping)
    _scatter(k_cache, v_cache, k.to(k_cache.dtype), v.to(v_cache.dtype), slot_mapping)


def write_kv_quantized(k_cache: torch.Tensor, v_cache: torch.Tensor, k_scale: torch.Tensor, v_scale: torch.Tensor,
                       k: torch.Tensor, v: torch.Tensor, k_scales: torch.Tensor, v_scales: torch.Tensor,
                       slot_mapping: torch.Tensor) -> None:
    """Quantized caches: data [num_blocks, block_size, kv_heads, head_dim] int8 / float8_e4m3fn and
    scales [num_blocks, block_size, kv_heads] fp32; k, v [T, kv_heads, head_dim] already quantized
    (the caches' dtype) with their scales k_scales, v_scales [T, kv_heads]. Scatters both (module
    doc); a ValueError naming the argument before the launch on bad inputs."""
    check_quantized_kv_write(k_cache, v_cache, k_scale, v_scale, k, v, k_scales, v_scales, slot_mapping)
    # Bytes: the kernel moves bits, whatever the storage dtype (fp8 has few CPU kernels in torch).
    _scatter(k_cache.view(torch.uint8), v_cache.view(torch.uint8), k.view(torch.uint8), v.view(torch.uint8),
             slot_mapping)
    _scatter(k_scale.unsqueeze(-1), v_scale.unsqueeze(-1), k_scales.unsqueeze(-1), v_scales.unsqueeze(-1),
             slot_mapping)
