"""Checks before a launch: a kernel reads raw pointers, so a bad index reads (or writes) someone
else's memory instead of failing. Every check raises a ValueError naming the argument.

Rules (the kernels' contract):
  q [T, heads, head_dim] float32/float16/bfloat16; caches [num_blocks, block_size, kv_heads,
  head_dim], both the same shape, a float dtype, on q's device; heads a multiple of kv_heads.
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
INDEX_DTYPES = (torch.int32, torch.int64)


def _shape(name: str, t: object, ndim: int, layout: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dim() != ndim:
        got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{name}: must be a {ndim}-D tensor {layout}, got {got}")
    return t


def check_cache(name: str, cache: object) -> torch.Tensor:
    """A float paged cache [num_blocks, block_size, kv_heads, head_dim] (a quantized cache is refused)."""
    if not isinstance(cache, torch.Tensor):
        raise ValueError(f"{name}: the Triton kernels take a float cache tensor; a quantized KV cache "
                         f"(kv_cache_dtype 'int8' / 'fp8') is not supported yet, got {type(cache).__name__}")
    c = _shape(name, cache, 4, "[num_blocks, block_size, kv_heads, head_dim]")
    if c.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name}: dtype must be one of {FLOAT_DTYPES}, got {c.dtype}")
    if min(c.shape) < 1:
        raise ValueError(f"{name}: every dimension must be >= 1, got {tuple(c.shape)}")
    return c


def _index_list(name: str, t: object, length: int) -> list[int]:
    v = _shape(name, t, 1, "of integers")
    if v.dtype not in INDEX_DTYPES:
        raise ValueError(f"{name}: dtype must be int32 or int64, got {v.dtype}")
    if v.shape[0] != length:
        raise ValueError(f"{name}: must have {length} entries, got {v.shape[0]}")
    return [int(x) for x in v.tolist()]


def check_paged_inputs(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                       seq_lens: torch.Tensor, query_start_loc: torch.Tensor, scale: float, num_segments: int,
                       max_segments: int) -> tuple[list[int], list[int]]:
    """The module's rules for ``paged_attention`` -> (seq_lens, query_start_loc) as lists."""
    _shape("q", q, 3, "[tokens, heads, head_dim]")
    if q.dtype not in FLOAT_DTYPES:
        raise ValueError(f"q: dtype must be one of {FLOAT_DTYPES}, got {q.dtype}")
    if min(q.shape) < 1:
        raise ValueError(f"q: every dimension must be >= 1, got {tuple(q.shape)}")
    k = check_cache("k_cache", k_cache)
    v = check_cache("v_cache", v_cache)
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
    for i, n in enumerate(lens):
        used = tables[i, : -(-n // block_size)]
        if used.numel() and (int(used.min()) < 0 or int(used.max()) >= num_blocks):
            raise ValueError(f"block_tables: request {i} points outside the cache's {num_blocks} blocks "
                             f"(entries {used.tolist()[:8]})")
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
    slots = _shape("slot_mapping", slot_mapping, 1, "[tokens]")
    if slots.dtype not in INDEX_DTYPES:
        raise ValueError(f"slot_mapping: dtype must be int32 or int64, got {slots.dtype}")
    if slots.shape[0] != kt.shape[0]:
        raise ValueError(f"slot_mapping: must have one slot per token ({kt.shape[0]}), got {slots.shape[0]}")
    num_slots = kc.shape[0] * kc.shape[1]
    if slots.numel() and (int(slots.min()) < 0 or int(slots.max()) >= num_slots):
        raise ValueError(f"slot_mapping: every slot must lie in [0, {num_slots}), got "
                         f"min {int(slots.min())}, max {int(slots.max())}")
