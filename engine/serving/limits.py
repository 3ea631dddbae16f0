"""Limits that keep one engine within what the machine can hold and what a caller can wait for.

Config-only hard caps (no model needed) are in ``engine.core.config`` (MAX_NUM_BLOCKS, ...). Here
are the model-dependent memory check, run by ``LLMEngine.__init__`` before anything is
allocated, and the horizons of the request API:

    need  = KV cache (num_blocks x block_size x KV bytes per token)
          + block-pool objects (num_blocks x BLOCK_OBJECT_BYTES)
          + one step's activations (max_num_batched_tokens) + per-request buffers (max_num_seqs)
    refuse with a ValueError when need > MEMORY_FRACTION x MemAvailable (/proc/meminfo)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.core.config import EngineConfig

if TYPE_CHECKING:  # no torch import at module import time
    from engine.model.llama import ModelConfig

# A request may arrive at most this many steps after the engine's current step: a far arrival
# would make a caller that steps until everything is done spin for that many empty steps.
MAX_ARRIVAL_HORIZON = 100_000
# One LLM.generate call takes at most this many prompts (a generator is read up to this + 1).
MAX_GENERATE_PROMPTS = 100_000
# An engine may need at most this fraction of the memory the OS reports available
# (/proc/meminfo MemAvailable) when it is built; the rest is left to other sessions and the OS.
MEMORY_FRACTION = 0.5
# Python objects per KV block: a Block, its free-queue entry and a block-table slot (~233 B
# measured with tracemalloc on CPython 3.12; rounded up).
BLOCK_OBJECT_BYTES = 256
GiB, MiB = 2 ** 30, 2 ** 20


def available_memory_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (Linux); None where it cannot be read (no check then)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _bytes(n: float) -> str:
    return f"{n / GiB:,.2f} GiB" if n >= GiB else f"{n / MiB:,.1f} MiB"


@dataclass(frozen=True)
class MemoryNeed:
    """What one engine's knobs cost in host memory (an upper-bound estimate, in bytes).

    kv_cache     num_blocks x block_size x KV bytes per token (K and V, every layer; plus a
                 speculative model drafter's own pool of the same geometry)
    block_pool   num_blocks x BLOCK_OBJECT_BYTES of Python objects
    batch        one step's activations at max_num_batched_tokens tokens (fp32 upper bound:
                 residual, norms, qkv, attention output, MLP) + the attention scores of the
                 longest prefill chunk (chunk x heads x context)
    sequences    per running request (max_num_seqs): its decode K/V gather and scores over
                 the whole context, and its logits and probabilities over the vocabulary
    """

    kv_cache: int
    block_pool: int
    batch: int
    sequences: int

    @property
    def total(self) -> int:
        return self.kv_cache + self.block_pool + self.batch + self.sequences

    @property
    def knob(self) -> str:
        """The knob behind the largest share (named first in the refusal)."""
        shares = {"num_blocks": self.kv_cache + self.block_pool, "max_num_batched_tokens": self.batch,
                  "max_num_seqs": self.sequences}
        return max(shares, key=lambda k: shares[k])


def estimate_memory(config: EngineConfig, mc: ModelConfig, max_model_len: int, kv_bytes_per_token: int) -> MemoryNeed:
    """The memory ``config`` needs on model ``mc`` (see MemoryNeed); allocates nothing."""
    t, n_seqs, ctx = config.scheduler_config.max_num_batched_tokens, min(config.scheduler_config.max_num_seqs, config.scheduler_config.max_num_batched_tokens), max_model_len
    nq, nkv, d, h = mc.num_attention_heads, mc.num_key_value_heads, mc.head_dim, mc.hidden_size
    per_token = 4 * (4 * h + (2 * nq + 2 * nkv) * d + 3 * mc.intermediate_size)
    scores = 4 * min(t, ctx) * nq * ctx
    per_seq = 4 * ctx * (2 * nkv * d + nq) + 8 * mc.vocab_size
    return MemoryNeed(kv_cache=config.cache_config.num_blocks * config.cache_config.block_size * kv_bytes_per_token,
                      block_pool=config.cache_config.num_blocks * BLOCK_OBJECT_BYTES,
                      batch=t * per_token + scores, sequences=n_seqs * per_seq)


def block_pool_need(config: EngineConfig) -> MemoryNeed:
    """Only the block pool's objects (a simulated model: no KV tensors, no activations here)."""
    return MemoryNeed(kv_cache=0, block_pool=config.cache_config.num_blocks * BLOCK_OBJECT_BYTES, batch=0, sequences=0)


def check_memory(config: EngineConfig, need: MemoryNeed, available: int | None) -> None:
    """Rule: refuse (ValueError naming the dominant knob, the need and what is available) when
    the knobs need more than MEMORY_FRACTION of the available memory."""
    if available is None:
        return
    allowed = int(available * MEMORY_FRACTION)
    if need.total <= allowed:
        return
    raise ValueError(
        f"{need.knob}: these knobs need about {_bytes(need.total)} of memory but {_bytes(allowed)} is "
        f"available ({MEMORY_FRACTION:.0%} of the {_bytes(available)} the OS reports free): KV cache "
        f"{config.cache_config.num_blocks:,} blocks x {config.cache_config.block_size} tokens = {_bytes(need.kv_cache)}, block pool "
        f"objects {_bytes(need.block_pool)}, one step of max_num_batched_tokens={config.scheduler_config.max_num_batched_tokens:,} "
        f"{_bytes(need.batch)}, max_num_seqs={config.scheduler_config.max_num_seqs:,} running requests {_bytes(need.sequences)}. "
        f"Lower num_blocks, block_size, max_num_batched_tokens or max_num_seqs.")
