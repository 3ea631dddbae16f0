"""Owns the KV tensors of one engine and runs one flattened forward per step.

The weights (``LlamaModel``) are shared read-only between engines; each engine has its own
pool: per layer, K and V of shape ``[num_blocks, block_size, kv_heads, head_dim]``; with a
quantized ``kv_cache_dtype`` ("int8", "fp8") each also carries fp32 scales
``[num_blocks, block_size, kv_heads]`` (engine/model/kv_quant.py).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from engine.core.batch import BatchStage, SingleBatch
from engine.model import cpu_gemv, kv_quant
from engine.model.attention import TORCH_ATTENTION, AttentionBackend
from engine.model.forward_batch import GROUP_OVERHEAD_SLOTS, ForwardBatch, build_forward_batch
from engine.core.hf_config import ENGINE_DTYPES
from engine.core.kv_cache import KVCacheManager
from engine.model.kv_quant import KVCache, QuantizedKV
from engine.model.llama import LlamaModel, ModelConfig, Observer
from engine.core.request import Request
from engine.core.trace import ParallelLayout, PipelineTimeline
from engine.core.scheduler import ScheduledRequest, SchedulerOutput

#: The engine's dtype names (engine/core/hf_config.py, the one vocabulary) -> torch dtypes.
DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in ENGINE_DTYPES}


def kv_dtype_name(kv_cache_dtype: str | torch.dtype) -> str:
    """A KV dtype as the engine's name: "float32" / "bfloat16" / "float16" / "int8" / "fp8"."""
    if isinstance(kv_cache_dtype, torch.dtype):
        for name, dtype in DTYPES.items():
            if dtype == kv_cache_dtype:
                return name
        raise ValueError(f"kv_cache_dtype: must be one of {(*DTYPES, *kv_quant.KV_QUANT_DTYPES)}, "
                         f"got {kv_cache_dtype}")
    if kv_cache_dtype not in DTYPES and kv_cache_dtype not in kv_quant.KV_QUANT_DTYPES:
        raise ValueError(f"kv_cache_dtype: must be one of {(*DTYPES, *kv_quant.KV_QUANT_DTYPES)}, "
                         f"got {kv_cache_dtype!r}")
    return kv_cache_dtype


def kv_cache_bytes_per_token(config: ModelConfig, kv_cache_dtype: str | torch.dtype) -> int:
    """K and V, every layer, one token: 2 * layers * kv_heads * (head_dim * bytes + scale bytes),
    scale bytes = 4 (one fp32 scale per token-head) for "int8"/"fp8", else 0. The one function
    the engine sizes its pool by; equals engine.memory.kv_bytes_per_token for the same dtype."""
    name = kv_dtype_name(kv_cache_dtype)
    if name in kv_quant.KV_QUANT_DTYPES:
        elem = torch.empty((), dtype=kv_quant.KV_QUANT_DTYPES[name][0]).element_size()
        extra = kv_quant.SCALE_BYTES
    else:
        elem, extra = torch.empty((), dtype=DTYPES[name]).element_size(), 0
    return 2 * config.num_hidden_layers * config.num_key_value_heads * (config.head_dim * elem + extra)


class BatchInputs(NamedTuple):
    """What build_forward_batch needs for a run of scheduled requests (plain lists, so a worker
    process can be sent them): per request its new tokens, first position, slots of positions
    0 .. start + len - 1, and how many logits rows it samples."""

    chunks: list[list[int]]
    starts: list[int]
    slots: list[list[int]]
    sample_flags: list[int]
    group_overhead: int = GROUP_OVERHEAD_SLOTS  # decode grouping (forward_batch.decode_group_overhead)


def batch_inputs(scheduled: Sequence[ScheduledRequest], requests: dict[str, Request],
                 kv: KVCacheManager, group_overhead: int = GROUP_OVERHEAD_SLOTS) -> BatchInputs:
    out = BatchInputs([], [], [], [], group_overhead)
    for s in scheduled:
        r = requests[s.request_id]
        end = s.start + s.num_new_tokens
        out.chunks.append(r.all_token_ids[s.start:end])
        out.starts.append(s.start)
        out.slots.append(kv.slot_mapping(s.request_id, 0, end))
        out.sample_flags.append(0 if s.is_prefill else 1 + s.num_spec_tokens)
    return out


class ModelRunner:
    """The in-process Runner (engine/serving/runners.py): the whole model and its KV cache in
    this process, one forward per step."""

    def __init__(self, model: LlamaModel, num_blocks: int, block_size: int,
                 kv_cache_dtype: str | torch.dtype, attention: AttentionBackend = TORCH_ATTENTION,
                 group_overhead: int = GROUP_OVERHEAD_SLOTS) -> None:
        self.model = model
        self.attention = attention
        if model.device.type == "cpu":
            cpu_gemv.build_in_background()  # the C kernels: torch's run until they are built
        self.group_overhead = group_overhead
        c = model.config
        name = kv_dtype_name(kv_cache_dtype)
        shape = (num_blocks, block_size, c.num_key_value_heads, c.head_dim)
        float_dtype = DTYPES.get(name)
        self.device = model.device  # EngineConfig.device: the cache and each step's batch live with the weights
        self.kv_caches: list[tuple[KVCache, KVCache]] = [
            (kv_quant.allocate(shape, name, float_dtype, self.device),
             kv_quant.allocate(shape, name, float_dtype, self.device))
            for _ in model.layers  # a pipeline stage's shard holds its own layers only
        ]
        self.kv_cache_dtype = name
        # Sees every linear input of every step (engine/model/activations.py ActivationRecorder); None = off.
        self.observer: Observer | None = None
        self.layout: ParallelLayout | None = None  # one process: no split
        self.timeline: PipelineTimeline | None = None  # one process: no workers to time

    def batch_stage(self) -> BatchStage:
        """One batch per step, done within the step."""
        return SingleBatch(self.forward)

    def set_observer(self, observer: Observer | None) -> None:
        """Let ``observer`` see every linear input of every later step (None: stop)."""
        self.observer = observer

    def shutdown(self) -> None:
        """Nothing to stop: the model runs in this process."""

    def check_integrity(self) -> None:
        """Nothing to check beyond the tensors' shapes, which never change."""

    @property
    def kv_cache_bytes_per_token(self) -> int:
        """K and V, every layer, one token: 2 * layers * kv_heads * head_dim * bytes."""
        return kv_cache_bytes_per_token(self.model.config, self.kv_cache_dtype)

    @property
    def kv_cache_total_bytes(self) -> int:
        return sum(_nbytes(k) + _nbytes(v) for k, v in self.kv_caches)

    def prepare(self, output: SchedulerOutput, requests: dict[str, Request],
                kv: KVCacheManager) -> ForwardBatch:
        """Copy-on-write copies first (the chunks below write into the copies), then the batch."""
        self.copy_blocks([(c.src_block, c.dst_block) for c in output.copies])
        return build_forward_batch(*batch_inputs(output.scheduled, requests, kv, self.group_overhead))

    def forward(self, output: SchedulerOutput, requests: dict[str, Request], kv: KVCacheManager) -> torch.Tensor:
        """The step's batch -> logits [S, V] (ParallelRunner.forward's signature)."""
        return self.execute(self.prepare(output, requests, kv))

    @torch.inference_mode()
    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """KV of block src -> block dst, K and V of every layer (a real copy of the tensors; a
        quantized cache copies its scales too)."""
        if not copies:
            return
        src = torch.tensor([s for s, _ in copies], dtype=torch.long, device=self.device)
        dst = torch.tensor([d for _, d in copies], dtype=torch.long, device=self.device)
        for layer in self.kv_caches:  # [num_blocks, block_size, kv_heads, head_dim]
            for cache in layer:
                if isinstance(cache, QuantizedKV):
                    kv_quant.copy_blocks(cache, src, dst)
                else:
                    cache.index_copy_(0, dst, cache.index_select(0, src))

    @torch.inference_mode()
    def execute(self, batch: ForwardBatch) -> torch.Tensor:
        """-> logits [S, V] fp32 on CPU (sampling runs there) for the rows in batch.logits_indices
        (k + 1 consecutive rows for a request verifying k drafts)."""
        return self.model.forward(batch.to(self.device), self.kv_caches, self.observer, self.attention).cpu()


def _nbytes(cache: KVCache) -> int:
    if isinstance(cache, QuantizedKV):
        return cache.nbytes
    return cache.numel() * cache.element_size()
