"""FlashAttention on a live run's own tensors: one request, one layer, one KV head, one step.

The FlashAttention page (app/app_pages/flash_attention.py) shows what the Triton kernel
(engine/kernels/paged_attention.py) really computes for a request the step scheduled:

    1. tokens     the request's token ids at positions 0 .. seq_len - 1, from the step's Snapshot
                  (the blocks of its block table hold them); seq_len = the chunk's start + its tokens
    2. tensors    one private prefill of those tokens through layers 0 .. layer of the run's own
                  model (its weights, its KV dtype; the engine's pool untouched), capturing the
                  layer's q (after RoPE) and reading back K/V as the layer's cache holds them
    3. paged      a cache of the run's pool size with ONE KV head, K/V placed at the request's real
                  block table (position p at block table[p // block_size], slot p % block_size),
                  so the kernel walks the blocks the engine used
    4. kernel     ``paged_attention(..., trace=True)`` for the chunk's new tokens and that KV
                  head's GQA group of query heads: per KV tile, each row's running max m, running
                  sum l, rescale exp(m_old - m_new) and partial output; per split-KV segment its
                  (m, l, partial output)
    5. oracle     ``paged_attention_reference`` (float64) on the same tensors, and m = max_j s_j,
                  l = sum_j exp(s_j - m) from the float64 scores

Invariant the page shows (and the tests check): after the last tile, the kernel's m and l equal
the float64 ones and acc / l equals softmax(q·kᵀ·scale)·V to ~1e-6 in fp32; with split-KV the
log-sum-exp merge of the segments equals the unsplit output.

Recomputing instead of reading the live cache: the view may show an earlier step whose blocks
have since been overwritten, and q is kept nowhere. A full prefill and the engine's chunked one
agree up to fp32 rounding; where the live cache still holds the request's blocks,
``live_cache_difference`` measures the gap.

Bounded: the trace records at most ``TRACE_CONTEXT`` (512) context positions per request; a
longer context is refused (no silent cut). ``engine.kernels`` is imported only when a kernel
runs: on CPU, TRITON_INTERPRET=1 must be in the environment before that first import (the app's
study module sets it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from types import ModuleType

import torch

from engine.core.trace import ChunkKind, Snapshot, StepTrace
from engine.model.attention import TORCH_ATTENTION, as_rows, gather_kv
from engine.model.forward_batch import ForwardBatch
from engine.model.kv_quant import KVCache
from engine.model.llama import LlamaModel
from engine.model.private_prefill import PrivatePrefill
from engine.sizing.models import get_model

__all__ = ["Candidate", "FlashStudy", "LayerTensors", "SegmentPart", "TileStep", "Traffic", "MAX_TRACE_TILES",
           "TRACE_CONTEXT", "TILE_WIDTHS", "TRAFFIC_MODELS", "block_m_of", "candidates", "estimated_tiles",
           "flash_study", "kernels", "layer_tensors", "live_cache_difference", "preset_traffic", "step_traffic",
           "traceable_width"]

#: Context positions per request the kernel's trace records (engine.kernels.TRACE_MAX_CONTEXT,
#: checked against it when the kernels load).
TRACE_CONTEXT = 512
#: KV tile widths (Bc) the page offers: narrow tiles show the online softmax on short contexts.
TILE_WIDTHS = (4, 8, 16, 32, 64)
#: Most split-KV segments the page offers (the engine itself uses at most 8).
MAX_PAGE_SEGMENTS = 8
#: Most tiles one trace visits: the interpreter takes a few ms per tile (a 500-token prefill in
#: tiles of 4 would be ~4,000 tiles, half a minute); a narrower Bc past this is traced wider.
MAX_TRACE_TILES = 1024
#: Calculator presets the traffic table offers (dense GQA / MHA attention).
TRAFFIC_MODELS = ("llama-3-8b", "llama-3.1-70b", "mistral-7b", "qwen2.5-7b", "qwen3-8b", "smollm2-135m")
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


def kernels() -> ModuleType:
    """``engine.kernels``, refusing where it cannot run: on CPU it needs Triton's interpreter,
    which reads TRITON_INTERPRET when the package is first imported (ValueError naming it)."""
    import engine.kernels as k  # defines the kernels: Triton reads TRITON_INTERPRET here

    if k.TRACE_MAX_CONTEXT != TRACE_CONTEXT:
        raise RuntimeError(f"TRACE_CONTEXT ({TRACE_CONTEXT}) differs from the kernels' {k.TRACE_MAX_CONTEXT}")
    if not k.INTERPRETED and not torch.cuda.is_available():
        raise ValueError("TRITON_INTERPRET: there is no GPU here and engine.kernels was imported without Triton's "
                         "interpreter; set TRITON_INTERPRET=1 before anything imports the engine's kernels")
    return k


# -- which requests of a step can be traced ---------------------------------------------------

@dataclass(frozen=True)
class Candidate:
    """A request the step scheduled, with what the kernel needs to redo its attention.

    start: its first new position; num_tokens: new tokens this step (1 for a plain decode);
    seq_len = start + num_tokens; token_ids: positions 0 .. seq_len - 1; block_table: as the
    snapshot after the step holds it (covers at least seq_len positions)."""

    request_id: str
    kind: ChunkKind  # "prefill" (a chunk of new tokens) or "decode" (one)
    start: int
    num_tokens: int
    block_table: tuple[int, ...]
    token_ids: tuple[int, ...]

    @property
    def seq_len(self) -> int:
        return self.start + self.num_tokens


def candidates(snapshot: Snapshot, trace: StepTrace | None) -> tuple[list[Candidate], list[str]]:
    """The step's scheduled requests whose tensors can be rebuilt from ``snapshot`` (the state
    right after ``trace``'s step) -> (candidates in schedule order, a note per request left out)."""
    if trace is None:
        return [], []
    bs = snapshot.block_size
    states = {r.request_id: r for r in snapshot.requests}
    blocks = {b.block_id: b for b in snapshot.blocks}
    out: list[Candidate] = []
    notes: list[str] = []
    for chunk in trace.scheduled:
        rid = chunk.request_id
        seq_len = chunk.start + chunk.num_tokens
        state = states.get(rid)
        if state is None or not state.block_table:
            notes.append(f"{rid}: finished or preempted in this step, its blocks are freed")
            continue
        if state.num_computed_tokens < seq_len:  # speculative drafts rejected: their K/V are gone
            notes.append(f"{rid}: only {state.num_computed_tokens} of the {seq_len} positions this step computed "
                         "were kept (rejected drafts)")
            continue
        if seq_len > TRACE_CONTEXT:
            notes.append(f"{rid}: context {seq_len} tokens, over the {TRACE_CONTEXT} the kernel's trace records")
            continue
        need = -(-seq_len // bs)
        ids: list[int] = []
        for block_id in state.block_table[:need]:
            ids.extend(blocks[block_id].token_ids)
        if len(state.block_table) < need or len(ids) < seq_len:
            notes.append(f"{rid}: its blocks do not hold all {seq_len} tokens")
            continue
        out.append(Candidate(rid, chunk.kind, chunk.start, chunk.num_tokens, tuple(state.block_table),
                             tuple(ids[:seq_len])))
    return out, notes


# -- the layer's real tensors ----------------------------------------------------------------

@dataclass(frozen=True)
class LayerTensors:
    """One layer's attention inputs for positions 0 .. L - 1 of one token sequence, fp32.

    q [L, heads, head_dim] after RoPE; k, v [L, kv_heads, head_dim] as the layer's cache holds
    them (a quantized cache's values dequantized: what attention reads); scale = head_dim^-0.5."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    scale: float


class _Capture:
    """An attention backend that is the torch one, keeping layer ``layer``'s q and scale."""

    name = "capture"

    def __init__(self, layer: int) -> None:
        self.layer = layer
        self.calls = 0
        self.q: torch.Tensor | None = None
        self.scale = 0.0

    def write_kv(self, k_cache: KVCache, v_cache: KVCache, k: torch.Tensor, v: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        TORCH_ATTENTION.write_kv(k_cache, v_cache, k, v, slot_mapping)

    def attention(self, q: torch.Tensor, k_cache: KVCache, v_cache: KVCache, batch: ForwardBatch,
                  scale: float) -> torch.Tensor:
        if self.calls == self.layer:
            self.q, self.scale = q.detach().float().clone(), scale
        self.calls += 1
        return TORCH_ATTENTION.attention(q, k_cache, v_cache, batch, scale)


def _read(cache: KVCache, slots: torch.Tensor) -> torch.Tensor:
    """[L, kv_heads, head_dim] fp32 at ``slots`` of a layer cache, as attention reads it (the torch
    backend's gather: dequantized when quantized)."""
    return gather_kv(as_rows(cache), slots, cache.shape[2], torch.float32)


def layer_tensors(model: LlamaModel, token_ids: tuple[int, ...], layer: int, block_size: int,
                  kv_cache_dtype: str) -> LayerTensors:
    """One private prefill of ``token_ids`` through layers 0 .. ``layer`` (module doc, step 2)."""
    n_layers = model.config.num_hidden_layers
    if not 0 <= layer < n_layers:
        raise ValueError(f"layer: must be in 0 .. {n_layers - 1}, got {layer}")
    if not token_ids:
        raise ValueError("token_ids: empty")
    prefill = PrivatePrefill(model, len(token_ids), block_size, kv_cache_dtype)
    batch = prefill.batch([list(token_ids)])
    capture = _Capture(layer)
    with torch.inference_mode():
        model.run_layers(model.embed(batch), batch, prefill.kv_caches, end=layer + 1, attention=capture)
    if capture.q is None:
        raise RuntimeError(f"layer {layer}: attention was never called")
    slots = torch.arange(len(token_ids))  # a fresh chunk's K/V sit at slots 0 .. L - 1 (private_prefill.py)
    k_cache, v_cache = prefill.kv_caches[layer]
    return LayerTensors(capture.q, _read(k_cache, slots), _read(v_cache, slots), capture.scale)


def _slots(block_table: tuple[int, ...], block_size: int, length: int) -> torch.Tensor:
    pos = torch.arange(length)
    return torch.tensor(block_table, dtype=torch.int64)[pos // block_size] * block_size + pos % block_size


def live_cache_difference(cache: tuple[KVCache, KVCache], block_table: tuple[int, ...], block_size: int,
                          tensors: LayerTensors) -> float:
    """max |K, V recomputed - K, V in a live layer cache| over the request's positions (read only)."""
    length = tensors.k.shape[0]
    slots = _slots(block_table, block_size, length)
    k, v = _read(cache[0], slots), _read(cache[1], slots)
    return max(float((k - tensors.k).abs().max()), float((v - tensors.v).abs().max()))


# -- the kernel's trace ----------------------------------------------------------------------

@dataclass(frozen=True)
class TileStep:
    """The chosen query head's rows of one program right after one KV tile.

    order: the tile's number in visiting order (query block by query block, segment by segment,
    each program's tiles in the order it walks them); rows: new-token indices (0 .. n - 1) of the
    program's query block; positions: the tile's context positions [lo, hi); m, l, alpha: per row
    the running max, running sum and rescale exp(m_old - m_new) applied at this tile; out: per
    row the partial output acc / l [head_dim] (a row that has seen only masked scores: m = -inf,
    l = 0, out = 0)."""

    order: int
    query_block: int
    segment: int
    index: int
    rows: tuple[int, ...]
    positions: tuple[int, int]
    m: tuple[float, ...]
    l: tuple[float, ...]
    alpha: tuple[float, ...]
    out: tuple[tuple[float, ...], ...]


@dataclass(frozen=True)
class SegmentPart:
    """One split-KV segment of a decode row: its context positions [lo, hi) (lo == hi: empty),
    its max m, sum l and partial output acc / l, as the kernel stored them."""

    segment: int
    positions: tuple[int, int]
    m: float
    l: float
    out: tuple[float, ...]

    @property
    def lse(self) -> float:
        """log-sum-exp of the segment's scores: m + log l (-inf when empty)."""
        return self.m + math.log(self.l) if self.l > 0 else float("-inf")


@dataclass(frozen=True)
class FlashStudy:
    """One request's attention at one layer, one query head, as the Triton kernel computed it.

    scores [n][seq_len]: q·kᵀ·scale in float64, NaN where the causal mask hides a position
    (n = num_tokens, the step's new tokens). block_m: query tokens per program (the tile's Br in
    tokens; its rows are block_m x the padded GQA group); block_n: KV tile width Bc. out,
    reference [n][head_dim]: the kernel's output and the float64 oracle's; ref_m, ref_l [n]: the
    float64 row max and sum of exp(s - max). segments (decode, num_segments > 1): each segment's
    part; unsplit: the same row with one segment; merged_vs_unsplit: max |merged - unsplit|.
    live_cache_difference: max |K, V recomputed - the live cache| (None: not comparable)."""

    request_id: str
    kind: ChunkKind  # "prefill" (a chunk of new tokens) or "decode" (one)
    step: int
    layer: int
    query_head: int
    kv_head: int
    group: int
    start: int
    num_tokens: int
    block_size: int
    block_table: tuple[int, ...]
    block_m: int
    block_n: int
    num_segments: int
    head_dim: int
    scale: float
    scores: tuple[tuple[float, ...], ...]
    tiles: tuple[TileStep, ...]
    out: tuple[tuple[float, ...], ...]
    reference: tuple[tuple[float, ...], ...]
    ref_m: tuple[float, ...]
    ref_l: tuple[float, ...]
    max_abs_diff: float
    group_max_abs_diff: float
    segments: tuple[SegmentPart, ...] = ()
    unsplit: tuple[float, ...] | None = None
    merged_vs_unsplit: float | None = None
    live_cache_difference: float | None = None
    interpreted: bool = True

    @property
    def seq_len(self) -> int:
        return self.start + self.num_tokens

    def first_tile_shown(self) -> int:
        """The tile a view opens at: the last of the last full query block (its rows have been
        rescaled, where a first tile shows nothing summed yet)."""
        full = max(len(t.rows) for t in self.tiles)
        return max(t.order for t in self.tiles if len(t.rows) == full)

    def final_tiles(self) -> dict[int, TileStep]:
        """Query block -> its last tile (segment 0 only: with split-KV the merge finishes the row)."""
        last: dict[int, TileStep] = {}
        for t in self.tiles:
            if t.segment == 0:
                last[t.query_block] = t
        return last


def block_m_of(group: int) -> int:
    """Query tokens per program for a GQA group (the kernel's rule: rows = block_m x the group
    padded to a power of two = 16)."""
    return max(1, 16 // (1 << max(0, (group - 1).bit_length())))


def estimated_tiles(start: int, num_tokens: int, group: int, block_n: int) -> int:
    """Tiles one KV head's programs visit (the kernel's causal rule: a query block walks the tiles
    up to its last query's position; split-KV visits the same tiles, cut into segments)."""
    block_m = block_m_of(group)
    seq_len = start + num_tokens
    total = 0
    for q0 in range(0, num_tokens, block_m):
        kv_end = min(seq_len, start + q0 + block_m)
        total += -(-kv_end // block_n)
    return total


def traceable_width(start: int, num_tokens: int, group: int, block_n: int) -> int:
    """``block_n``, or the narrowest wider tile width (TILE_WIDTHS) whose trace stays within
    MAX_TRACE_TILES tiles (the widest when none does)."""
    wider = [w for w in TILE_WIDTHS if w >= block_n]
    for w in wider:
        if estimated_tiles(start, num_tokens, group, w) <= MAX_TRACE_TILES:
            return w
    return TILE_WIDTHS[-1]


def _rows(x: torch.Tensor) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(float(v) for v in row) for row in x.tolist())


def flash_study(cand: Candidate, tensors: LayerTensors, num_blocks: int, block_size: int, layer: int,
                query_head: int, step: int, num_segments: int = 1, block_n: int = 16,
                live_difference: float | None = None) -> FlashStudy:
    """Run the kernel with ``trace=True`` on the candidate's real tensors (module doc, steps 3-5)."""
    k_mod = kernels()
    heads, kv_heads, d = tensors.q.shape[1], tensors.k.shape[1], tensors.q.shape[2]
    if not 0 <= query_head < heads:
        raise ValueError(f"query_head: must be in 0 .. {heads - 1}, got {query_head}")
    if block_n not in TILE_WIDTHS:
        raise ValueError(f"block_n: must be one of {TILE_WIDTHS}, got {block_n}")
    if not 1 <= num_segments <= MAX_PAGE_SEGMENTS:
        raise ValueError(f"num_segments: must be in 1 .. {MAX_PAGE_SEGMENTS}, got {num_segments}")
    seq_len, n = cand.seq_len, cand.num_tokens
    if num_segments > 1 and n > 1:
        raise ValueError(f"num_segments: split-KV is shown for a decode (one new token); this chunk has {n}")
    if tensors.k.shape[0] != seq_len:
        raise ValueError(f"tensors: hold {tensors.k.shape[0]} positions, the request has {seq_len}")
    group = heads // kv_heads
    kv_head, g = divmod(query_head, group)
    device = "cpu" if k_mod.INTERPRETED else "cuda"
    q = tensors.q[cand.start:seq_len, kv_head * group:(kv_head + 1) * group].contiguous()  # [n, group, d]
    k_cache = torch.zeros(num_blocks, block_size, 1, d)
    v_cache = torch.zeros(num_blocks, block_size, 1, d)
    slots = _slots(cand.block_table, block_size, seq_len)
    k_cache.view(-1, 1, d)[slots] = tensors.k[:, kv_head:kv_head + 1]
    v_cache.view(-1, 1, d)[slots] = tensors.v[:, kv_head:kv_head + 1]
    tables = torch.tensor([cand.block_table], dtype=torch.int64)
    lens = torch.tensor([seq_len], dtype=torch.int64)
    qsl = torch.tensor([0, n], dtype=torch.int64)
    args = [x.to(device) for x in (q, k_cache, v_cache, tables, lens, qsl)]
    out, tr = k_mod.paged_attention(*args, tensors.scale, num_segments, trace=True, block_n=block_n)
    out = out.cpu()
    ref = k_mod.paged_attention_reference(q, k_cache, v_cache, tables, lens, qsl, tensors.scale)  # [n, group, d]

    # float64 scores of the chosen head, and the row max / sum the kernel's m, l must reach
    s = torch.einsum("nd,ld->nl", q[:, g].double(), tensors.k[:, kv_head].double()) * tensors.scale
    allowed = torch.arange(seq_len)[None, :] <= torch.arange(cand.start, seq_len)[:, None]
    s = s.masked_fill(~allowed, float("nan"))
    ref_m = torch.nan_to_num(s, nan=float("-inf")).amax(dim=1)
    ref_l = torch.exp(torch.nan_to_num(s - ref_m[:, None], nan=float("-inf"))).sum(dim=1)

    tiles: list[TileStep] = []
    counts = tr.tile_count.cpu()
    tm, tl_, ta, to = (x.cpu() for x in (tr.tile_m, tr.tile_l, tr.tile_alpha, tr.tile_out))
    for p in range(len(tr.work_start)):
        start = int(tr.work_start[p])
        rows = tuple(range(start, min(start + tr.block_m, n)))
        at = [r * tr.group_pad + g for r in range(len(rows))]
        for seg in range(num_segments):
            for i, span in enumerate(tr.tile_positions(p, seg)[:int(counts[p, 0, seg])]):
                tiles.append(TileStep(
                    order=len(tiles), query_block=p, segment=seg, index=i, rows=rows,
                    positions=(span.start, span.stop),
                    m=tuple(float(tm[p, 0, seg, i, r]) for r in at), l=tuple(float(tl_[p, 0, seg, i, r]) for r in at),
                    alpha=tuple(float(ta[p, 0, seg, i, r]) for r in at),
                    out=tuple(tuple(float(x) for x in to[p, 0, seg, i, r, :d].tolist()) for r in at)))

    segments: tuple[SegmentPart, ...] = ()
    unsplit: tuple[float, ...] | None = None
    merged_diff: float | None = None
    if num_segments > 1 and n == 1 and tr.segment_m is not None and tr.segment_l is not None \
            and tr.segment_out is not None:
        sm, sl, so = tr.segment_m.cpu(), tr.segment_l.cpu(), tr.segment_out.cpu()
        spans = [tr.tile_positions(0, seg) for seg in range(num_segments)]
        segments = tuple(
            SegmentPart(seg, (sp[0].start, sp[-1].stop) if sp else (seq_len, seq_len), float(sm[seg, 0, g]),
                        float(sl[seg, 0, g]), tuple(float(x) for x in so[seg, 0, g].tolist()))
            for seg, sp in enumerate(spans))
        one = k_mod.paged_attention(*args, tensors.scale, 1, block_n=block_n).cpu()
        unsplit = tuple(float(x) for x in one[0, g].tolist())
        merged_diff = float((out[0, g] - one[0, g]).abs().max())

    return FlashStudy(
        request_id=cand.request_id, kind=cand.kind, step=step, layer=layer, query_head=query_head,
        kv_head=kv_head, group=group, start=cand.start, num_tokens=n, block_size=block_size,
        block_table=cand.block_table, block_m=tr.block_m, block_n=tr.block_n, num_segments=num_segments,
        head_dim=d, scale=tensors.scale, scores=_rows(s), tiles=tuple(tiles), out=_rows(out[:, g]),
        reference=_rows(ref[:, g]), ref_m=tuple(float(x) for x in ref_m), ref_l=tuple(float(x) for x in ref_l),
        max_abs_diff=float((out[:, g].double() - ref[:, g]).abs().max()),
        group_max_abs_diff=float((out.double() - ref).abs().max()),
        segments=segments, unsplit=unsplit, merged_vs_unsplit=merged_diff,
        live_cache_difference=live_difference, interpreted=bool(k_mod.INTERPRETED))


# -- memory traffic ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Traffic:
    """HBM bytes of one layer's attention, every head, naive against tiled.

    H query heads, KVH KV heads, d head_dim, b bytes per element, N context positions, M query
    tokens, Br query tokens per tile pass:

        Q = O = b·M·H·d        K + V = 2·b·N·KVH·d        S (or P) = b·H·M·N
        naive = Q + K + V + O + 4·S        (write S, read S for the softmax, write P, read P for P·V)
        tiled = Q + O + (K + V)·⌈M / Br⌉   (S and P live in on-chip tiles; each query block's
                                             program walks K/V once)

    Non-causal: causal masking lets both skip about half of S and of the K/V tiles of a prefill."""

    label: str
    heads: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    context: int
    query_tokens: int
    block_m: int
    layers: int

    @property
    def q_bytes(self) -> int:
        return self.dtype_bytes * self.query_tokens * self.heads * self.head_dim

    @property
    def kv_bytes(self) -> int:
        return 2 * self.dtype_bytes * self.context * self.kv_heads * self.head_dim

    @property
    def s_bytes(self) -> int:
        """One pass over the score (or probability) matrix."""
        return self.dtype_bytes * self.heads * self.query_tokens * self.context

    @property
    def passes(self) -> int:
        return -(-self.query_tokens // self.block_m)

    @property
    def naive(self) -> int:
        return 2 * self.q_bytes + self.kv_bytes + 4 * self.s_bytes

    @property
    def tiled(self) -> int:
        return 2 * self.q_bytes + self.kv_bytes * self.passes

    @property
    def ratio(self) -> float:
        return self.naive / self.tiled


def step_traffic(study: FlashStudy, heads: int, kv_heads: int, dtype_bytes: int, layers: int,
                 label: str = "this step") -> Traffic:
    """This step's request with the run's model (every head of one layer; the kernel's Br)."""
    return Traffic(label, heads, kv_heads, study.head_dim, dtype_bytes, study.seq_len,
                   study.num_tokens, study.block_m, layers)


def preset_traffic(key: str, context: int, query_tokens: int, block_m: int = 128) -> Traffic:
    """A calculator preset (engine/sizing) at ``context`` with ``query_tokens`` new tokens."""
    if context < 1 or not 1 <= query_tokens <= context or block_m < 1:
        raise ValueError(f"context, query_tokens, block_m: need 1 <= query_tokens <= context and block_m >= 1, got "
                         f"{context}, {query_tokens}, {block_m}")
    spec = get_model(key)
    return Traffic(spec.display_name, spec.num_heads, spec.num_kv_heads, spec.head_dim,
                   DTYPE_BYTES.get(spec.checkpoint_dtype, 2), context, query_tokens, block_m, spec.num_layers)
