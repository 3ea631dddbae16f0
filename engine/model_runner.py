"""Owns the KV tensors of one engine and runs one flattened forward per step.

The weights (``LlamaModel``) are shared read-only between engines; each engine has its own
pool: per layer, K and V of shape ``[num_blocks, block_size, kv_heads, head_dim]``.
"""
from __future__ import annotations

import torch

from engine.forward_batch import ForwardBatch, build_forward_batch
from engine.hf_config import ENGINE_DTYPES
from engine.kv_cache import KVCacheManager
from engine.models.llama import LlamaModel, ModelConfig
from engine.request import Request
from engine.scheduler import SchedulerOutput

#: The engine's dtype names (engine/hf_config.py, the one vocabulary) -> torch dtypes.
DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in ENGINE_DTYPES}


def kv_cache_bytes_per_token(config: ModelConfig, kv_cache_dtype: torch.dtype) -> int:
    """K and V, every layer, one token: 2 * layers * kv_heads * head_dim * bytes."""
    elem = torch.empty((), dtype=kv_cache_dtype).element_size()
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * elem


class ModelRunner:
    def __init__(self, model: LlamaModel, num_blocks: int, block_size: int,
                 kv_cache_dtype: torch.dtype) -> None:
        self.model = model
        c = model.config
        shape = (num_blocks, block_size, c.num_key_value_heads, c.head_dim)
        self.kv_caches = [
            (torch.zeros(shape, dtype=kv_cache_dtype), torch.zeros(shape, dtype=kv_cache_dtype))
            for _ in range(c.num_hidden_layers)
        ]
        self.kv_cache_dtype = kv_cache_dtype

    @property
    def kv_cache_bytes_per_token(self) -> int:
        """K and V, every layer, one token: 2 * layers * kv_heads * head_dim * bytes."""
        return kv_cache_bytes_per_token(self.model.config, self.kv_cache_dtype)

    @property
    def kv_cache_total_bytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.kv_caches)

    def prepare(self, output: SchedulerOutput, requests: dict[str, Request],
                kv: KVCacheManager) -> ForwardBatch:
        """Copy-on-write copies first (the chunks below write into the copies), then the batch."""
        self.copy_blocks([(c.src_block, c.dst_block) for c in output.copies])
        chunks, starts, slots, sample_flags = [], [], [], []
        for s in output.scheduled:
            r = requests[s.request_id]
            end = s.start + s.num_new_tokens
            chunks.append(r.all_token_ids[s.start:end])
            starts.append(s.start)
            slots.append(kv.slot_mapping(s.request_id, 0, end))
            sample_flags.append(not s.is_prefill)
        return build_forward_batch(chunks, starts, slots, sample_flags)

    @torch.inference_mode()
    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """KV of block src -> block dst, K and V of every layer (a real copy of the tensors)."""
        if not copies:
            return
        src = torch.tensor([s for s, _ in copies], dtype=torch.long)
        dst = torch.tensor([d for _, d in copies], dtype=torch.long)
        for k, v in self.kv_caches:  # [num_blocks, block_size, kv_heads, head_dim]
            k.index_copy_(0, dst, k.index_select(0, src))
            v.index_copy_(0, dst, v.index_select(0, src))

    @torch.inference_mode()
    def execute(self, batch: ForwardBatch) -> torch.Tensor:
        """-> logits [S, V] fp32 for the rows in batch.logits_indices."""
        return self.model.forward(batch, self.kv_caches)
