"""Checks before a launch: a kernel reads raw pointers, so a bad index reads (or writes) someone
else's memory instead of failing. Every check raises a ValueError naming the argument.

Rules (the kernels' contract):
  q [T, heads, head_dim] float32/float16/bfloat16; caches [num_blocks, block_size, kv_heads,
  head_dim], both the same shape, a float dtype, on q's device, head_dim contiguous; heads a
  multiple of kv_heads. A quantized cache instead: int8 / float8_e4m3fn data with fp32 scales
  [num_blocks, block_size, kv_heads] (k_scale, v_scale), one per token and KV head.
  query_start_loc [num_seqs + 1] integer, starts at 0, strictly increasing, ends at T.
  seq_lens [num_seqs] integer, each >= its request's new tokens (q_len) and within its table
  row: ceil(seq_len / block_size) <= max_blocks. block_tables [num_seqs, max_blocks]
  int32/int64; the entries a request uses (its first ceil(seq_len / block_size)) lie in
  [0, num_blocks); entries past them are never read and may hold anything (e.g. -1 padding).
"""
from __future__ import annotations

import math

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
QUANT_DTYPES = (torch.int8, torch.float8_e4m3fn)
INDEX_DTYPES = (torch.int32, torch.int64)


def _shape(name: str, t: object, ndim: int, layout: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dim() != ndim:
        got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{name}: must be a {ndim}-D tensor {layout}, got {got}")
    return t


def check_cache(name: str, cache: object, quantized: bool = False) -> torch.Tensor:
    """A paged cache tensor [num_blocks, block_size, kv_heads, head_dim]: a float dtype, or with
    ``quantized`` int8 / float8_e4m3fn (its scales are checked by ``check_scale``)."""
    if not isinstance(cache, torch.Tensor):
        raise ValueError(f"{name}: must be a cache tensor (a quantized cache passes its data here and its "
                         f"scales as k_scale / v_scale), got {type(cache).__name__}")
    c = _shape(name, cache, 4, "[num_blocks, block_size, kv_heads, head_dim]")
    allowed = QUANT_DTYPES if quantized else FLOAT_DTYPES
    if c.dtype not in allowed:
        hint = "" if quantized else " (an int8 / fp8 cache needs its scales: k_scale, v_scale)"
        raise ValueError(f"{name}: dtype must be one of {allowed}{hint}, got {c.dtype}")
    if min(c.shape) < 1:
        raise ValueError(f"{name}: every dimension must be >= 1, got {tuple(c.shape)}")
    if c.stride(3) != 1:
        raise ValueError(f"{name}: head_dim must be contiguous (stride 1), got strides {c.stride()}")
    return c


def check_scale(name: str, scale: object, cache: torch.Tensor) -> torch.Tensor:
    """A quantized cache's scales: fp32 [num_blocks, block_size, kv_heads] on the cache's device."""
    sc = _shape(name, scale, 3, "[num_blocks, block_size, kv_heads] float32")
    if sc.dtype != torch.float32 or tuple(sc.shape) != tuple(cache.shape[:3]) or sc.device != cache.device:
        raise ValueError(f"{name}: must be float32 {tuple(cache.shape[:3])} on {cache.device}, got {sc.dtype} "
                         f"{tuple(sc.shape)} on {sc.device}")
    return sc


def _index_list(name: str, t: object, length: int) -> list[int]:
    v = _shape(name, t, 1, "of integers")
    if v.dtype not in INDEX_DTYPES:
        raise ValueError(f"{name}: dtype must be int32 or int64, got {v.dtype}")
    if v.shape[0] != length:
        raise ValueError(f"{name}: must have {length} entries, got {v.shape[0]}")
    return [int(x) for x in v.tolist()]


def check_paged_inputs(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                       seq_lens: torch.Tensor, query_start_loc: torch.Tensor, scale: float, num_segments: int,
                       max_segments: int, k_scale: torch.Tensor | None = None,
                       v_scale: torch.Tensor | None = None) -> tuple[list[int], list[int]]:
    """The module's rules for ``paged_attention`` -> (seq_lens, query_start_loc) as lists."""
    _shape("q", q, 3, "[tokens, heads, head_dim]")
    if q.dtype not in FLOAT_DTYPES:
        raise ValueError(f"q: dtype must be one of {FLOAT_DTYPES}, got {q.dtype}")
    if min(q.shape) < 1:
        raise ValueError(f"q: every dimension must be >= 1, got {tuple(q.shape)}")
    if (k_scale is None) != (v_scale is None):
        raise ValueError("k_scale: a quantized cache needs both k_scale and v_scale (or neither, for a float cache)")
    quantized = k_scale is not None
    k = check_cache("k_cache", k_cache, quantized)
    v = check_cache("v_cache", v_cache, quantized)
    if quantized:
        check_scale("k_scale", k_scale, k)
        check_scale("v_scale", v_scale, v)
    if v.shape != k.shape or v.dtype != k.dtype:
        raise ValueError(f"v_cache: must match k_cache {tuple(k.shape)} {k.dtype}, got {tuple(v.shape)} {v.dtype}")
    for name, t in (("k_cache", k), ("v_cache", v), ("block_tables", block_tables)):
        if isinstance(t, torch.Tensor) and t.device != q.device:
            raise ValueError(f"{name}: must be on q's device {q.device}, got {t.device}")
    num_blocks, block_size, kv_heads, head_dim = k.shape
    if head_dim != q.shape[2]:
        raise ValueError(f"k_cache: head_dim {head_dim} must equal q's head_dim {q.shape[2]}")
    if q.shape[1] % kv_heads:
        raise ValueError(f"q: heads ({q.shape[1]}) must be a multiple of the cache's kv_heads ({kv_heads})")
    tables = _shape("block_tables", block_tables, 2, "[num_seqs, max_blocks]")
    if tables.dtype not in INDEX_DTYPES:
        raise ValueError(f"block_tables: dtype must be int32 or int64, got {tables.dtype}")
    num_seqs, max_blocks = tables.shape
    if num_seqs < 1:
        raise ValueError("block_tables: needs at least one request (row)")
    qsl = _index_list("query_start_loc", query_start_loc, num_seqs + 1)
    if qsl[0] != 0 or qsl[-1] != q.shape[0] or any(b <= a for a, b in zip(qsl, qsl[1:])):
        raise ValueError(f"query_start_loc: must start at 0, increase strictly and end at the {q.shape[0]} "
                         f"tokens of q, got {qsl[:8]}{'...' if len(qsl) > 8 else ''}")
    lens = _index_list("seq_lens", seq_lens, num_seqs)
    for i, n in enumerate(lens):
        q_len = qsl[i + 1] - qsl[i]
        if n < q_len:
            raise ValueError(f"seq_lens: request {i} has {n} positions but {q_len} new tokens")
        if -(-n // block_size) > max_blocks:
            raise ValueError(f"seq_lens: request {i} has {n} positions, beyond its block table of "
                             f"{max_blocks} blocks x {block_size}")
    # The entries each request uses, all requests at once (one device sync, not two per request).
    need = torch.tensor([-(-n // block_size) for n in lens], device=tables.device)  # [num_seqs]
    used = torch.arange(max_blocks, device=tables.device)[None, :] < need[:, None]  # [num_seqs, max_blocks]
    outside = used & ((tables < 0) | (tables >= num_blocks))
    if bool(outside.any()):
        i = int(outside.any(dim=1).nonzero()[0])
        raise ValueError(f"block_tables: request {i} points outside the cache's {num_blocks} blocks "
                         f"(entries {tables[i, : int(need[i])].tolist()[:8]})")
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale: must be a finite number > 0, got {scale!r}")
    if not isinstance(num_segments, int) or isinstance(num_segments, bool) or not 1 <= num_segments <= max_segments:
        raise ValueError(f"num_segments: must be an integer in 1..{max_segments}, got {num_segments!r}")
    return lens, qsl


def check_kv_write(k_cache: object, v_cache: object, k: object, v: object, slot_mapping: object) -> None:
    """write_kv's rules: k, v [T, kv_heads, head_dim] match the caches' heads and dim; slot_mapping
    [T] int32/int64, every slot in [0, num_blocks * block_size)."""
    kc = check_cache("k_cache", k_cache)
    vc = check_cache("v_cache", v_cache)
    if vc.shape != kc.shape:
        raise ValueError(f"v_cache: must match k_cache's shape {tuple(kc.shape)}, got {tuple(vc.shape)}")
    kt = _shape("k", k, 3, "[tokens, kv_heads, head_dim]")
    vt = _shape("v", v, 3, "[tokens, kv_heads, head_dim]")
    if tuple(kt.shape[1:]) != tuple(kc.shape[2:]):
        raise ValueError(f"k: (kv_heads, head_dim) must be the cache's {tuple(kc.shape[2:])}, got {tuple(kt.shape[1:])}")
    if vt.shape != kt.shape:
        raise ValueError(f"v: must match k's shape {tuple(kt.shape)}, got {tuple(vt.shape)}")
    for name, t in (("k", kt), ("v", vt)):
        if t.dtype not in FLOAT_DTYPES:
            raise ValueError(f"{name}: dtype must be one of {FLOAT_DTYPES}, got {t.dtype}")
    for name, x in (("v_cache", vc), ("k", kt), ("v", vt), ("slot_mapping", slot_mapping)):
        if isinstance(x, torch.Tensor) and x.device != kc.device:
            raise ValueError(f"{name}: must be on k_cache's device {kc.device}, got {x.device}")
    _check_slots(slot_mapping, kt.shape[0], kc)


def _check_slots(slot_mapping: object, tokens: int, kc: torch.Tensor) -> None:
    """slot_mapping [tokens] int32/int64 on the cache's device, every slot inside the cache."""
    slots = _shape("slot_mapping", slot_mapping, 1, "[tokens]")
    if slots.dtype not in INDEX_DTYPES:
        raise ValueError(f"slot_mapping: dtype must be int32 or int64, got {slots.dtype}")
    if slots.device != kc.device:
        raise ValueError(f"slot_mapping: must be on k_cache's device {kc.device}, got {slots.device}")
    if slots.shape[0] != tokens:
        raise ValueError(f"slot_mapping: must have one slot per token ({tokens}), got {slots.shape[0]}")
    num_slots = kc.shape[0] * kc.shape[1]
    if slots.numel() and (int(slots.min()) < 0 or int(slots.max()) >= num_slots):
        raise ValueError(f"slot_mapping: every slot must lie in [0, {num_slots}), got "
                         f"min {int(slots.min())}, max {int(slots.max())}")


def check_quantized_kv_write(k_cache: object, v_cache: object, k_scale: object, v_scale: object, k: object,
                             v: object, k_scales: object, v_scales: object, slot_mapping: object) -> None:
    """write_kv_quantized's rules: caches int8 / float8_e4m3fn with fp32 scales (check_scale); k, v
    [T, kv_heads, head_dim] in the caches' dtype; k_scales, v_scales [T, kv_heads] fp32; slots as
    in check_kv_write."""
    kc = check_cache("k_cache", k_cache, quantized=True)
    vc = check_cache("v_cache", v_cache, quantized=True)
    if vc.shape != kc.shape or vc.dtype != kc.dtype:
        raise ValueError(f"v_cache: must match k_cache {tuple(kc.shape)} {kc.dtype}, got {tuple(vc.shape)} {vc.dtype}")
    check_scale("k_scale", k_scale, kc)
    check_scale("v_scale", v_scale, vc)
    kt = _shape("k", k, 3, "[tokens, kv_heads, head_dim]")
    for name, x in (("k", k), ("v", v)):
        t = _shape(name, x, 3, "[tokens, kv_heads, head_dim]")
        if t.dtype != kc.dtype or tuple(t.shape) != (kt.shape[0], *kc.shape[2:]):
            raise ValueError(f"{name}: must be quantized values {kc.dtype} [tokens, {kc.shape[2]}, {kc.shape[3]}], "
                             f"got {t.dtype} {tuple(t.shape)}")
    for name, x in (("k_scales", k_scales), ("v_scales", v_scales)):
        t = _shape(name, x, 2, "[tokens, kv_heads] float32")
        if t.dtype != torch.float32 or tuple(t.shape) != (kt.shape[0], kc.shape[2]):
            raise ValueError(f"{name}: must be float32 [{kt.shape[0]}, {kc.shape[2]}], got {t.dtype} {tuple(t.shape)}")
    _check_slots(slot_mapping, kt.shape[0], kc)


def check_runnable(name: str, t: torch.Tensor, interpreted: bool) -> None:
    """CPU tensors run only in Triton's interpreter (there is no CPU backend to compile for); a
    GPU tensor needs the compiled kernels (the interpreter would copy it to the host and back)."""
    if t.device.type == "cpu" and not interpreted:
        raise ValueError(f"{name}: on CPU tensors the Triton kernels run only in Triton's interpreter: set "
                         f"TRITON_INTERPRET=1 before engine.kernels is imported (slow: tiny models and teaching)")
