"""Frozen configuration records: engine knobs and per-request sampling parameters.

Validation happens here, once, and raises ``ValueError`` naming the field and the allowed
range, so a bad knob never reaches the engine's state.
"""
from __future__ import annotations

import math

from dataclasses import dataclass, field
from typing import Literal

Policy = Literal["continuous", "static"]
DTYPES = ("float32", "bfloat16", "float16")


def _is_number(value: object) -> bool:
    """An int or a float, not a bool (True would pass as 1)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _require_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name}: must be >= {minimum}, got {value}")


@dataclass(frozen=True)
class EngineConfig:
    """Engine knobs (vLLM names where vLLM has one).

    block_size              tokens per KV block (1 .. 256)
    num_blocks              physical KV blocks in the pool (per layer)
    max_num_batched_tokens  the token budget of one step (all requests together)
    max_num_seqs            most requests running at once
    enable_chunked_prefill  a prompt may be split across steps to fit the budget
    policy                  "continuous" (refill every step) or "static" (a fixed batch that
                            waits for its longest member)
    max_model_len           context limit; None = the model's own limit
    dtype / kv_cache_dtype  weights and KV tensors; kv defaults to the weights' dtype
    seed                    seeds requests that carry no seed of their own
    """

    block_size: int = 16
    num_blocks: int = 512
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 16
    enable_chunked_prefill: bool = True
    policy: Policy = "continuous"
    max_model_len: int | None = None
    dtype: str = "float32"
    kv_cache_dtype: str | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        _require_int("block_size", self.block_size, 1)
        if self.block_size > 256:
            raise ValueError(f"block_size: must be <= 256, got {self.block_size}")
        _require_int("num_blocks", self.num_blocks, 1)
        _require_int("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        _require_int("max_num_seqs", self.max_num_seqs, 1)
        if self.max_model_len is not None:
            _require_int("max_model_len", self.max_model_len, 2)
        if self.policy not in ("continuous", "static"):
            raise ValueError(f"policy: must be 'continuous' or 'static', got {self.policy!r}")
        if not isinstance(self.enable_chunked_prefill, bool):
            raise ValueError("enable_chunked_prefill: must be True or False")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: must be one of {DTYPES}, got {self.dtype!r}")
        if self.kv_cache_dtype is not None and self.kv_cache_dtype not in DTYPES:
            raise ValueError(f"kv_cache_dtype: must be one of {DTYPES}, got {self.kv_cache_dtype!r}")
        _require_int("seed", self.seed, 0)

    @property
    def pool_tokens(self) -> int:
        return self.num_blocks * self.block_size


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples and when it stops.

    temperature 0 is greedy (argmax, exact against Hugging Face ``generate``). With a seed,
    a request's random draws come from its own generator, so a run replays identically.
    """

    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    max_tokens: int = 16
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        if not _is_number(self.temperature) or not 0 <= self.temperature < math.inf:
            raise ValueError(f"temperature: must be a number >= 0, got {self.temperature!r}")
        _require_int("max_tokens", self.max_tokens, 1)
        _require_int("top_k", self.top_k, 0)
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p: must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None:
            _require_int("seed", self.seed, 0)
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError("stop: every stop string must be a non-empty string")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
