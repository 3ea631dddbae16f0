"""The "triton" attention backend: the engine's ForwardBatch adapted to ``engine.kernels``.

One launch per layer for the whole mixed batch (prefill chunks and decodes together), where the
torch backend makes one SDPA per prefill chunk and one per decode group. The kernels take block
tables; the ForwardBatch holds each request's slots, so the tables are derived once per step:

    request i's slots (positions 0 .. seq_len - 1)   [ 40 41 42 43 | 8 9 10 11 | 20 21 ]   block_size 4
    block table row i = slots[::block_size] // bs    [ 10 | 2 | 5 ]

Invariant (the engine's KV layout, checked when the tables are derived): position p of a request
is slot table[p // block_size] * block_size + p % block_size.

Where it runs: on a GPU (``EngineConfig.device="cuda"``, where it is the default backend), or
on CPU tensors under Triton's interpreter, which needs ``TRITON_INTERPRET=1`` in the environment
before ``engine.kernels`` is first imported (Triton reads it when a kernel is defined). The
interpreter executes the kernel with numpy, program by program: exact, and slow (about 0.1 s per
layer of a tiny-random step on a 2-core CPU): for tiny models and teaching. Without it, choosing this backend is a
ValueError naming attention_backend.

A quantized KV cache (int8 / fp8, kv_quant.py): write_kv quantizes with kv_quant's one rule (in
torch) and the kernel scatters data and scales; the attention kernel dequantizes each tile in
fp32 (data * scale), the very values the torch backend gathers.

Split-KV (FlashDecoding): a decode-only step whose longest context exceeds ``segment_tokens``
cuts each context into ceil(longest / segment_tokens) segments (at most 8), merged by
log-sum-exp; steps with a prefill chunk run unsplit.
"""
from __future__ import annotations

import os
from types import ModuleType

import torch

from engine.model import kv_quant
from engine.model.forward_batch import ForwardBatch
from engine.model.kv_quant import KVCache, QuantizedKV

#: Context tokens per split-KV segment of a decode-only step, and the most segments used.
SEGMENT_TOKENS = 256
MAX_STEP_SEGMENTS = 8


def _kernels(device: str) -> ModuleType:
    """engine.kernels, imported only once the interpreter (CPU) or a GPU (CUDA) is known to be there."""
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("attention_backend: 'triton' on CPU runs only in Triton's interpreter: set "
                         "TRITON_INTERPRET=1 in the environment before the engine starts (the interpreter "
                         "runs the kernels exactly but slowly: for tiny models and teaching)")
    if device != "cpu" and not torch.cuda.is_available():
        raise ValueError(f"attention_backend: 'triton' on device {device!r} needs a CUDA GPU, and none is visible")
    import engine.kernels as kernels  # defines the kernels: Triton reads TRITON_INTERPRET here

    if device == "cpu" and not kernels.INTERPRETED:
        raise ValueError("attention_backend: 'triton' on CPU needs Triton's interpreter, but engine.kernels was "
                         "imported before TRITON_INTERPRET=1 was set; set it before anything imports the "
                         "engine's kernels (the interpreter is for tiny models and teaching)")
    return kernels


def block_tables(batch: ForwardBatch, block_size: int) -> torch.Tensor:
    """[num_seqs, max_blocks] int64 block table of every request of the batch (module doc),
    from its prefill span's slots or its decode group's row."""
    qsl = batch.query_start_loc
    slots: dict[int, torch.Tensor] = {seq.q_start: seq.kv_slots for seq in batch.prefills}
    for group in batch.decode_groups:
        for j, row in enumerate(group.rows.tolist()):
            slots[row] = group.slots[j * group.width: (j + 1) * group.width]
    num_blocks = [-(-n // block_size) for n in batch.seq_lens]
    tables = torch.zeros(len(batch.seq_lens), max(num_blocks), dtype=torch.int64)
    for i, (seq_len, n) in enumerate(zip(batch.seq_lens, num_blocks)):
        s = slots[qsl[i]][:seq_len].cpu()  # [seq_len] (a decode row's padding cut off); built on the host
        blocks = s[::block_size] // block_size  # [n]
        pos = torch.arange(seq_len)
        if not torch.equal(blocks[pos // block_size] * block_size + pos % block_size, s):
            raise RuntimeError(f"request {i}: its slots are not whole blocks of {block_size} in position order")
        tables[i, :n] = blocks
    return tables


class TritonAttention:
    """``AttentionBackend`` over ``engine.kernels``: write_kv and paged_attention in Triton."""

    name = "triton"

    def __init__(self, segment_tokens: int = SEGMENT_TOKENS, block_n: int | None = None,
                 device: str = "cpu") -> None:
        # device: where the engine's tensors live (EngineConfig.device): compiled kernels on "cuda",
        # the interpreter on "cpu".
        self.kernels = _kernels(device)
        self.segment_tokens = segment_tokens
        self.block_n: int = self.kernels.BLOCK_N if block_n is None else block_n  # KV tile width (Bc)
        # The step's tables, derived once and reused by every layer of that step.
        self._batch: ForwardBatch | None = None
        self._args: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int] | None = None

    def write_kv(self, k_cache: KVCache, v_cache: KVCache, k: torch.Tensor, v: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        if isinstance(k_cache, QuantizedKV) and isinstance(v_cache, QuantizedKV):
            kq, ks = kv_quant.quantize(k, k_cache.name)  # [T, kvh, d] storage dtype, [T, kvh] fp32
            vq, vs = kv_quant.quantize(v, v_cache.name)
            self.kernels.write_kv_quantized(k_cache.data, v_cache.data, k_cache.scale, v_cache.scale,
                                            kq, vq, ks, vs, slot_mapping)
        else:
            self.kernels.write_kv(k_cache, v_cache, k, v, slot_mapping)

    def num_segments(self, batch: ForwardBatch) -> int:
        """Split-KV only for decode-only steps with a context longer than segment_tokens."""
        if batch.prefills:
            return 1
        return max(1, min(MAX_STEP_SEGMENTS, -(-max(batch.seq_lens) // self.segment_tokens)))

    def attention(self, q: torch.Tensor, k_cache: KVCache, v_cache: KVCache, batch: ForwardBatch,
                  scale: float) -> torch.Tensor:
        if self._batch is not batch or self._args is None:
            dev = q.device
            self._args = (block_tables(batch, k_cache.shape[1]).to(dev),
                          torch.tensor(batch.seq_lens, dtype=torch.int64, device=dev),
                          torch.tensor(batch.query_start_loc, dtype=torch.int64, device=dev),
                          self.num_segments(batch))
            self._batch = batch
        tables, seq_lens, qsl, segments = self._args
        out: torch.Tensor
        if isinstance(k_cache, QuantizedKV) and isinstance(v_cache, QuantizedKV):
            out = self.kernels.paged_attention(q, k_cache.data, v_cache.data, tables, seq_lens, qsl, scale,
                                               num_segments=segments, block_n=self.block_n,
                                               k_scale=k_cache.scale, v_scale=v_cache.scale)
        else:
            out = self.kernels.paged_attention(q, k_cache, v_cache, tables, seq_lens, qsl, scale,
                                               num_segments=segments, block_n=self.block_n)
        return out
