"""FlashAttention over a paged KV cache for the engine's mixed batch, and FlashDecoding's split-KV.

One launch attends every row of a flattened batch (prefill chunks and decodes together). Grid:
``(query blocks, kv_heads, num_segments)``; a query block is up to BLOCK_M consecutive new tokens
of ONE request, and the GQA query heads that share the program's KV head are packed into its rows
(row r = token r // GROUP_PAD, head kv_head * GROUP + r % GROUP_PAD), so K/V are loaded once per
KV head, never once per query head:

    context positions of one request  0 ........................................ seq_len - 1
    KV tiles (BLOCK_N positions each)   | tile 0 | tile 1 | tile 2 | tile 3 | tile 4 |
    through the block table             blocks[p // block_size] * block_size + p % block_size
    segments (num_segments = 2)         |<----- segment 0 ----->|<--- segment 1 --->|

                        tile 0    tile 1    tile 2    tile 3    tile 4
    query rows (Br)   +---------+---------+---------+---------+------\\-+
    (BLOCK_M tokens   | S = QKᵀ | S = QKᵀ | S = QKᵀ | S = QKᵀ | causal \\|   each tile: scores,
     x GROUP heads)   +---------+---------+---------+---------+---------+   mask, online softmax
                        Bc = BLOCK_N                                          step, P·V

Algorithm (online softmax, per row, over the tiles of its segment in order):

    m_new = max(m, rowmax(S_tile))                 running max
    alpha = exp(m - m_new)                         rescale of everything summed so far
    P     = exp(S_tile - m_new)
    l     = l * alpha + rowsum(P)                  running sum
    acc   = acc * alpha + P · V_tile               unnormalised output
    out   = acc / l                                after the last tile

Invariants: after each tile, ``l = sum_j exp(s_j - m)`` and ``acc = sum_j exp(s_j - m) v_j`` over
exactly the positions visited so far (the rescale keeps both relative to the current max), so
``acc / l`` is the softmax-weighted mean of those positions' V; the full S matrix never exists.
Causal: a query at position p (p = seq_len - q_len + its index in the chunk) sees positions 0..p
only, so a cached prefix is seen whole and the new chunk triangularly; tiles past the query
block's last position are not visited at all. A row that has seen only masked scores keeps
m = -inf, l = 0 (the ``m_safe`` guard keeps exp(-inf - -inf) out of it).

Split-KV (FlashDecoding, ``num_segments`` S > 1): the tiles a query block visits are cut into S
contiguous runs; segment s stores its normalised partial output o_s = acc_s / l_s, its m_s and
l_s; ``_merge_kernel`` then combines, per row, with M = max_s m_s, w_s = l_s * exp(m_s - M):
``out = sum_s w_s o_s / sum_s w_s`` (the log-sum-exp merge: lse_s = m_s + log l_s). An empty
segment has m = -inf, l = 0 and weight 0. Splitting gives a long-context decode S programs per
KV head instead of one: the parallelism a GPU needs when there are few query rows.

Trace (``trace=True``, the compile-time ``TRACE`` flag): every program also stores, after each of
its tiles, the rows' m, l, alpha and acc / l (the partial output so far). Bounded: at most
``TRACE_MAX_CONTEXT`` = 512 context positions per request (a larger ``seq_lens`` is a ValueError
naming ``trace``), so at most 512 / block_n tiles per program, and the record holds
P x KVH x S x (512 / block_n) x R x (D + 3) fp32 values (P query blocks, R rows each, D head_dim
padded): e.g. tiny-random, a 512-token prefill, block_n 64: 64 x 2 x 1 x 8 x 16 x 19 x 4 B = 1.2 MB.
Without the flag the stores are not compiled in at all.

Quantized caches (``k_scale``/``v_scale`` given, the compile-time ``QUANT`` flag): int8 / fp8
data, dequantized in each tile as data x its fp32 scale per (token, KV head), the values the
torch backend gathers (engine/model/kv_quant.py).

Runs on a GPU (compiled) or on CPU tensors under ``TRITON_INTERPRET=1`` (Triton's interpreter:
the same kernel code, executed with numpy, slowly; for tiny models and teaching). fp32 dots use
``input_precision="ieee"`` (no TF32), so fp32 results match a float64 reference to ~1e-6. fp16 /
bf16 q and cache (the compile-time ``HALF`` flag): both products take operands in that dtype (P
cast to it after the exponent, as FlashAttention does) and accumulate in fp32, on tensor cores;
compiled only (the interpreter computes those in fp32: it holds bf16 as raw 16-bit integers).

Query block height on a GPU: BLOCK_M x GROUP_PAD rows per program, at least 16 (tl.dot's
smallest side). A decode-only launch keeps that minimum (one token per request: taller blocks
would be padding); a launch with prefill chunks takes blocks of PREFILL_ROWS rows, so each K/V
tile read serves that many query rows (a program per 4 tokens would re-read the context 16 times
as often). The interpreter keeps the minimum (the traced tiles the FlashAttention page shows).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, overload

import torch
import triton
import triton.language as tl

from engine.kernels.validation import check_paged_inputs, check_runnable

#: Most context positions per request that ``trace=True`` records (the tiles per program are
#: at most TRACE_MAX_CONTEXT / block_n).
TRACE_MAX_CONTEXT = 512
#: Most segments one split-KV launch takes (the merge holds them all in one tile).
MAX_SEGMENTS = 64
#: Default KV tile width (Bc) and the smallest tile side tl.dot takes when compiled for a GPU.
BLOCK_N = 64
MIN_DOT = 16
#: Query rows per program of a compiled launch with prefill chunks (module doc).
PREFILL_ROWS = 64
#: Whether the kernels below were defined under TRITON_INTERPRET=1 (Triton decides at definition).
INTERPRETED: bool = bool(triton.knobs.runtime.interpret)


@triton.jit
def _attention_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, seg_m_ptr, seg_l_ptr, ks_ptr, vs_ptr,
    tables_ptr, seq_lens_ptr, qsl_ptr, work_seq_ptr, work_start_ptr,
    tr_m_ptr, tr_l_ptr, tr_alpha_ptr, tr_o_ptr, tr_count_ptr,
    scale, num_segments, num_tokens, num_heads, num_kv_heads,
    stride_qt, stride_qh,
    stride_kb, stride_ks, stride_kh,  # K's and V's (both caches contiguous, the same shape)
    stride_ot, stride_oh,
    stride_bt, stride_sb, stride_ss,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    SPLIT: tl.constexpr, TRACE: tl.constexpr, TRACE_TILES: tl.constexpr, QUANT: tl.constexpr,
    HALF: tl.constexpr,
):
    # Index arithmetic in int64: no overflow on large caches, and the interpreter skips its
    # per-op int32 overflow check (a third of its time here).
    pid = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1).to(tl.int64)
    seg = tl.program_id(2).to(tl.int64)
    ROWS: tl.constexpr = BLOCK_M * GROUP_PAD

    seq = tl.load(work_seq_ptr + pid)
    q_block = tl.load(work_start_ptr + pid)  # first new token of this block, within its request
    row0 = tl.load(qsl_ptr + seq)
    q_len = tl.load(qsl_ptr + seq + 1) - row0
    seq_len = tl.load(seq_lens_ptr + seq)

    r = tl.arange(0, ROWS).to(tl.int64)
    tok = r // GROUP_PAD  # token of the row within the block
    g = r % GROUP_PAD  # query head of the row within the KV head's group
    row_ok = (q_block + tok < q_len) & (g < GROUP)
    token = row0 + q_block + tok  # row in the flat batch
    head = kvh * GROUP + g
    pos = seq_len - q_len + q_block + tok  # the row's position in its request
    d = tl.arange(0, D_PAD).to(tl.int64)
    d_ok = d < HEAD_DIM

    # HALF (fp16 / bf16 q and cache): q, K and V stay in their dtype and P is cast to it, so both
    # products run on tensor cores with fp32 accumulation (FlashAttention's rule); otherwise every
    # operand is fp32 and the products are IEEE fp32 (no TF32).
    q = tl.load(q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if not HALF:
        q = q.to(tl.float32)

    # Causal: no row of this block sees past its last token, so later tiles are never visited.
    kv_end = tl.minimum(seq_len, seq_len - q_len + q_block + BLOCK_M)
    num_tiles = (kv_end + BLOCK_N - 1) // BLOCK_N
    per_seg = (num_tiles + num_segments - 1) // num_segments
    t_lo = seg * per_seg
    t_hi = tl.minimum(t_lo + per_seg, num_tiles)

    # tl.full, not tl.zeros / tl.max / tl.sum: those are nested @jit functions, and the interpreter
    # re-patches triton.language on every such call (~5 ms each); tl.reduce with Triton's own
    # max / sum combine functions takes its numpy fast path. Compiled, both are the same code.
    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    l_i = tl.full([ROWS], 0.0, tl.float32)
    acc = tl.full([ROWS, D_PAD], 0.0, tl.float32)
    trace_base = ((pid * num_kv_heads + kvh) * num_segments + seg) * TRACE_TILES
    for t in range(t_lo, t_hi):
        n = t * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)  # context positions of this tile
        n_ok = n < kv_end
        # Paged: position n lives in slot n % BLOCK_SIZE of block table[n // BLOCK_SIZE].
        blk = tl.load(tables_ptr + seq * stride_bt + n // BLOCK_SIZE, mask=n_ok, other=0).to(tl.int64)
        off = n % BLOCK_SIZE
        kv_mask = n_ok[:, None] & d_ok[None, :]
        kv_at = (blk * stride_kb + off * stride_ks + kvh * stride_kh)[:, None] + d[None, :]  # [BLOCK_N, D_PAD]
        k = tl.load(k_ptr + kv_at, mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + kv_at, mask=kv_mask, other=0.0)
        if not HALF:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        if QUANT:  # int8 / fp8 data x its fp32 scale per (token, KV head): the values the cache holds
            at_scale = blk * stride_sb + off * stride_ss + kvh  # scales [num_blocks, block_size, kv_heads]
            k = k * tl.load(ks_ptr + at_scale, mask=n_ok, other=0.0)[:, None]
            v = v * tl.load(vs_ptr + at_scale, mask=n_ok, other=0.0)[:, None]
        if HALF:
            s = tl.dot(q, tl.trans(k)) * scale  # [ROWS, BLOCK_N] fp32
        else:
            s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        # Causal mask; it also hides n >= kv_end from every real row (pos < kv_end there).
        s = tl.where(n[None, :] <= pos[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.reduce(s, 1, tl.standard._elementwise_max))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing seen yet
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.reduce(p, 1, tl.standard._sum_combine)
        if HALF:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        else:
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        m_i = m_new
        if TRACE:
            i = t - t_lo
            if i < TRACE_TILES:
                at = (trace_base + i) * ROWS + r
                tl.store(tr_m_ptr + at, m_i)
                tl.store(tr_l_ptr + at, l_i)
                tl.store(tr_alpha_ptr + at, alpha)
                part = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
                tl.store(tr_o_ptr + at[:, None] * D_PAD + d[None, :], part)
    if TRACE:
        tl.store(tr_count_ptr + trace_base // TRACE_TILES, tl.maximum(t_hi - t_lo, 0))  # empty segment: 0

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    if SPLIT:
        # Partials [S, T, H, D] fp32 and their m, l [S, T, H], contiguous.
        at = (seg * num_tokens + token) * num_heads + head
        tl.store(seg_m_ptr + at, m_i, mask=row_ok)
        tl.store(seg_l_ptr + at, l_i, mask=row_ok)
        tl.store(o_ptr + at[:, None] * HEAD_DIM + d[None, :], out, mask=row_ok[:, None] & d_ok[None, :])
    else:
        tl.store(o_ptr + token[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
                 out, mask=row_ok[:, None] & d_ok[None, :])


@triton.jit
def _merge_kernel(
    part_ptr, seg_m_ptr, seg_l_ptr, o_ptr,
    num_segments, num_tokens, stride_ot, stride_oh,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, SEG_PAD: tl.constexpr,
):
    """One program per (token, head): rows are the segments, columns the head's dims."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    s = tl.arange(0, SEG_PAD).to(tl.int64)
    d = tl.arange(0, D_PAD).to(tl.int64)
    s_ok = s < num_segments
    d_ok = d < HEAD_DIM
    at = (s * num_tokens + t) * NUM_HEADS + h  # [SEG_PAD] into m, l
    m = tl.load(seg_m_ptr + at, mask=s_ok, other=float("-inf"))
    lsum = tl.load(seg_l_ptr + at, mask=s_ok, other=0.0)
    part = tl.load(part_ptr + at[:, None] * HEAD_DIM + d[None, :], mask=s_ok[:, None] & d_ok[None, :], other=0.0)
    m_max = tl.reduce(m, 0, tl.standard._elementwise_max)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)
    w = lsum * tl.exp(m - m_max)  # segment weight: its sum rescaled to the global max
    den = tl.reduce(w, 0, tl.standard._sum_combine)
    # An all-empty row divides 0 by 1, not 0 by 0.
    out = tl.reduce(w[:, None] * part, 0, tl.standard._sum_combine) / tl.where(den > 0, den, 1.0)
    tl.store(o_ptr + t * stride_ot + h * stride_oh + d, out, mask=d_ok)


@dataclass(frozen=True)
class AttentionTrace:
    """Per-tile statistics of one ``paged_attention(..., trace=True)`` launch.

    P = programs along the query axis, KVH = KV heads, S = segments, N = tiles per program
    (TRACE_MAX_CONTEXT / block_n at most), R = rows per program (block_m x group_pad: row r is
    token r // group_pad of the block, query head kv_head * group + r % group_pad; rows past the
    chunk or the group are padding), D = head_dim padded to a power of two.
    """

    block_m: int
    block_n: int
    group: int
    group_pad: int
    work_seq: torch.Tensor  # [P] int64 request of each query block
    work_start: torch.Tensor  # [P] int64 first new token of the block within its request
    tile_count: torch.Tensor  # [P, KVH, S] int32 tiles each program visited (entries past it are zeros)
    tile_m: torch.Tensor  # [P, KVH, S, N, R] fp32 running max after each tile
    tile_l: torch.Tensor  # [P, KVH, S, N, R] fp32 running sum after each tile
    tile_alpha: torch.Tensor  # [P, KVH, S, N, R] fp32 rescale exp(m_old - m_new) applied at that tile
    tile_out: torch.Tensor  # [P, KVH, S, N, R, D] fp32 partial output acc / l after each tile
    segment_m: torch.Tensor | None  # [S, T, H] fp32 each segment's final max (split-KV only)
    segment_l: torch.Tensor | None  # [S, T, H] fp32 each segment's final sum (split-KV only)
    segment_out: torch.Tensor | None  # [S, T, H, head_dim] fp32 each segment's partial output
    seq_lens: tuple[int, ...]  # [num_seqs] the launch's seq_lens
    query_start_loc: tuple[int, ...]  # [num_seqs + 1] the launch's query_start_loc
    num_segments: int

    def row_of(self, program: int, kv_head: int, r: int) -> tuple[int, int] | None:
        """Program row r -> (flat batch row, query head), or None for a padding row."""
        seq, start = int(self.work_seq[program]), int(self.work_start[program])
        tok, g = r // self.group_pad, r % self.group_pad
        q_len = self.query_start_loc[seq + 1] - self.query_start_loc[seq]
        if start + tok >= q_len or g >= self.group:
            return None
        return self.query_start_loc[seq] + start + tok, kv_head * self.group + g

    def tile_positions(self, program: int, segment: int) -> list[range]:
        """The context positions of each tile the program visited in ``segment``, in visiting
        order (the kernel's own rule: tiles up to the block's last query, cut into segments)."""
        seq, start = int(self.work_seq[program]), int(self.work_start[program])
        seq_len = self.seq_lens[seq]
        q_len = self.query_start_loc[seq + 1] - self.query_start_loc[seq]
        kv_end = min(seq_len, seq_len - q_len + start + self.block_m)
        num_tiles = -(-kv_end // self.block_n)
        per_seg = -(-num_tiles // self.num_segments)
        lo, hi = segment * per_seg, min(segment * per_seg + per_seg, num_tiles)
        return [range(t * self.block_n, min((t + 1) * self.block_n, kv_end)) for t in range(lo, hi)]


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _work(query_start_loc: list[int], block_m: int) -> tuple[list[int], list[int]]:
    """Query blocks: (request, first new token) of every BLOCK_M run of each request's new tokens."""
    seqs: list[int] = []
    starts: list[int] = []
    for i in range(len(query_start_loc) - 1):
        for start in range(0, query_start_loc[i + 1] - query_start_loc[i], block_m):
            seqs.append(i)
            starts.append(start)
    return seqs, starts


@overload
def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                    seq_lens: torch.Tensor, query_start_loc: torch.Tensor, scale: float, num_segments: int = 1,
                    trace: Literal[False] = False, *, block_n: int = BLOCK_N, k_scale: torch.Tensor | None = None,
                    v_scale: torch.Tensor | None = None) -> torch.Tensor: ...


@overload
def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                    seq_lens: torch.Tensor, query_start_loc: torch.Tensor, scale: float, num_segments: int = 1,
                    *, trace: Literal[True], block_n: int = BLOCK_N, k_scale: torch.Tensor | None = None,
                    v_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, AttentionTrace]: ...


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                    seq_lens: torch.Tensor, query_start_loc: torch.Tensor, scale: float, num_segments: int = 1,
                    trace: bool = False, *, block_n: int = BLOCK_N, k_scale: torch.Tensor | None = None,
                    v_scale: torch.Tensor | None = None,
                    ) -> torch.Tensor | tuple[torch.Tensor, AttentionTrace]:
    """Causal attention of every new token over its own request's paged context, one launch.

    q [T, heads, head_dim]; k_cache, v_cache [num_blocks, block_size, kv_heads, head_dim] (this
    step's K/V already written); block_tables [num_seqs, max_blocks] int32/int64; seq_lens
    [num_seqs] context per request including its new tokens; query_start_loc [num_seqs + 1]
    (request i's new tokens are rows qsl[i] .. qsl[i+1] - 1, at positions seq_len - q_len ..
    seq_len - 1). -> out [T, heads, head_dim] in q's dtype, or (out, AttentionTrace) with
    ``trace=True``. A quantized cache: int8 / float8_e4m3fn data as the caches and k_scale, v_scale
    [num_blocks, block_size, kv_heads] fp32 (position p's K is data * scale, dequantized in fp32
    in the tile). ``block_n`` is the KV tile width Bc (a power of two; >= 16 on a GPU). Bad inputs
    are a ValueError naming the argument, before any launch.
    """
    lens, qsl = check_paged_inputs(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale,
                                   num_segments, MAX_SEGMENTS, k_scale, v_scale)
    check_runnable("q", q, INTERPRETED)
    if not isinstance(block_n, int) or block_n < 1 or block_n & (block_n - 1):
        raise ValueError(f"block_n: must be a power of two >= 1, got {block_n!r}")
    if trace and max(lens) > TRACE_MAX_CONTEXT:
        raise ValueError(f"trace: traces at most {TRACE_MAX_CONTEXT} context positions per request "
                         f"(seq_lens has {max(lens)})")
    num_tokens, heads, d = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = heads // kv_heads
    group_pad = _pow2(group)
    block_m = max(1, MIN_DOT // group_pad)  # rows = block_m * group_pad >= 16, what a GPU's tl.dot takes
    if q.is_cuda and max(b - a for a, b in zip(qsl, qsl[1:])) > block_m:  # prefill chunks (module doc)
        block_m = max(block_m, PREFILL_ROWS // group_pad)
    rows = block_m * group_pad
    block_n = max(block_n, MIN_DOT) if q.is_cuda else block_n
    d_pad = max(_pow2(d), MIN_DOT)
    seqs, starts = _work(qsl, block_m)
    dev = q.device
    work_seq = torch.tensor(seqs, dtype=torch.int64, device=dev)
    work_start = torch.tensor(starts, dtype=torch.int64, device=dev)
    lens_t = seq_lens.to(device=dev, dtype=torch.int64).contiguous()
    qsl_t = query_start_loc.to(device=dev, dtype=torch.int64).contiguous()
    tables = block_tables.contiguous()
    q = q.contiguous()
    k_cache = k_cache.contiguous()
    v_cache = v_cache.contiguous()
    # fp32 out, cast by torch after: Triton's interpreter truncates fp32 -> bf16 casts (a GPU rounds
    # to nearest even); torch rounds the same way everywhere.
    out = torch.empty(q.shape, dtype=torch.float32, device=dev)
    split = num_segments > 1
    f32 = torch.float32
    if split:
        part = torch.empty(num_segments, num_tokens, heads, d, dtype=f32, device=dev)
        seg_m = torch.empty(num_segments, num_tokens, heads, dtype=f32, device=dev)
        seg_l = torch.empty(num_segments, num_tokens, heads, dtype=f32, device=dev)
    else:
        part, seg_m, seg_l = out, out, out  # unused pointers
    programs = (len(seqs), kv_heads, num_segments)
    tiles = -(-TRACE_MAX_CONTEXT // block_n) if trace else 1
    tr_shape = (*programs, tiles, rows)
    if trace:
        tr_m, tr_l, tr_alpha = (torch.zeros(tr_shape, dtype=f32, device=dev) for _ in range(3))
        tr_o = torch.zeros((*tr_shape, d_pad), dtype=f32, device=dev)
        tr_count = torch.zeros(programs, dtype=torch.int32, device=dev)
    else:  # unused pointers (the stores are not compiled in): no allocations on the launch path
        tr_m = tr_l = tr_alpha = tr_o = out
        tr_count = work_seq
    quant = k_scale is not None and v_scale is not None
    # Compiled only: the interpreter holds bf16 as raw 16-bit integers, which its dot would multiply.
    half = not INTERPRETED and not quant and q.dtype in (torch.float16, torch.bfloat16) and k_cache.dtype == q.dtype
    ks = k_scale.contiguous() if quant else out  # type: ignore[union-attr]
    vs = v_scale.contiguous() if quant else out  # type: ignore[union-attr]
    _attention_kernel[programs](
        q, k_cache, v_cache, part if split else out, seg_m, seg_l, ks, vs,
        tables, lens_t, qsl_t, work_seq, work_start,
        tr_m, tr_l, tr_alpha, tr_o, tr_count,
        float(scale), num_segments, num_tokens, heads, kv_heads,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        out.stride(0), out.stride(1),
        tables.stride(0), ks.stride(0) if quant else 0, ks.stride(1) if quant else 0,
        GROUP=group, GROUP_PAD=group_pad, BLOCK_M=block_m, BLOCK_N=block_n,
        HEAD_DIM=d, D_PAD=d_pad, BLOCK_SIZE=block_size,
        SPLIT=split, TRACE=trace, TRACE_TILES=tiles, QUANT=quant, HALF=half,
    )
    if split:
        _merge_kernel[(num_tokens, heads)](
            part, seg_m, seg_l, out, num_segments, num_tokens, out.stride(0), out.stride(1),
            NUM_HEADS=heads, HEAD_DIM=d, D_PAD=d_pad, SEG_PAD=_pow2(num_segments),
        )
    out = out.to(q.dtype)
    if not trace:
        return out
    record = AttentionTrace(
        block_m=block_m, block_n=block_n, group=group, group_pad=group_pad, work_seq=work_seq,
        work_start=work_start, tile_count=tr_count, tile_m=tr_m, tile_l=tr_l, tile_alpha=tr_alpha,
        tile_out=tr_o, segment_m=seg_m if split else None, segment_l=seg_l if split else None,
        segment_out=part if split else None, seq_lens=tuple(lens), query_start_loc=tuple(qsl),
        num_segments=num_segments)
    return out, record
