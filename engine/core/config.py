"""Frozen configuration records: engine knobs and per-request sampling parameters.

Validation happens here, once, and raises ``ValueError`` naming the field and the allowed
range, so a bad knob never reaches the engine's state.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

from engine.core.hf_config import ENGINE_DTYPES

Policy = Literal["continuous", "static"]
# Which waiting request is admitted first and which running one is preempted (engine/core/policies/,
# one module each; vLLM's knob name). "fcfs" is the default and the engine's behaviour before the knob.
SchedulingPolicyName = Literal["fcfs", "priority", "sjf", "lpm", "mlfq"]
SCHEDULING_POLICIES: tuple[str, ...] = get_args(SchedulingPolicyName)
# How a step splits its budget between prefills and decodes (engine/core/scheduler.py).
PrefillSchedule = Literal["mixed", "prefill_first"]
PREFILL_SCHEDULES: tuple[str, ...] = get_args(PrefillSchedule)
# add_request(priority=...): an int32, as vLLM's API carries it; lower is served earlier.
MIN_PRIORITY, MAX_PRIORITY = -(2 ** 31), 2 ** 31 - 1
DTYPES = ENGINE_DTYPES  # the one dtype vocabulary (engine/core/hf_config.py): float32, bfloat16, float16
# KV-cache dtypes: the float ones, or quantized with per-token-head fp32 scales (engine/model/kv_quant.py)
KV_CACHE_DTYPES: tuple[str, ...] = (*DTYPES, "int8", "fp8")

# Hard caps that need no model (the model-dependent memory check is in LLMEngine.__init__).
# They keep one engine small enough to build in about a second on a laptop CPU: the block pool
# is pure Python (~230 B and ~10 us per block measured), and a demo never needs more.
MAX_BLOCK_SIZE = 256
MAX_NUM_BLOCKS = 1 << 21  # 2,097,152 blocks (x block_size tokens each): a simulated SGLang pool has 1-token pages
MAX_NUM_BATCHED_TOKENS = 1 << 20  # 1,048,576 tokens in one step
MAX_NUM_SEQS = 1 << 14  # 16,384 running requests
MAX_MODEL_LEN = 1 << 24  # 16,777,216 positions; the model's own limit usually binds first
MAX_TOKENS = 1 << 24  # SamplingParams.max_tokens; the context limit usually binds first
MAX_N = 64  # SamplingParams.n: parallel sequences of one request (each also counts in max_num_seqs)
MAX_SEED = 2 ** 63 - 1  # seeds are 0 .. 2**63 - 1 (a torch.Generator seed, as vLLM)
# vLLM's _SAMPLING_EPS: a temperature below it samples greedily (logits / t would overflow).
SAMPLING_EPS = 1e-5


# Quantization knobs (the schemes themselves are in engine/model/quantization.py; kept here so this
# module stays torch-free).
QuantScheme = Literal["int8", "int4", "fp8", "w8a8"]
SCHEMES: tuple[str, ...] = ("int8", "int4", "fp8", "w8a8")
INT4_GROUP_SIZES: tuple[int, ...] = (32, 64, 128, 256)  # what _weight_int4pack_mm_for_cpu accepts
DEFAULT_GROUP_SIZE = 32
DEFAULT_OUTLIER_THRESHOLD = 6.0


def check_quant_knobs(quantization: object, group_size: object, outlier_threshold: object) -> None:
    """The three knobs, each a ValueError naming the field (``quantization=None`` is off)."""
    if quantization is not None and (not isinstance(quantization, str) or quantization not in SCHEMES):
        raise ValueError(f"quantization: must be one of {SCHEMES} or None, got {str(quantization)[:40]!r}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size not in INT4_GROUP_SIZES:
        raise ValueError(f"quantization_group_size: must be one of {INT4_GROUP_SIZES} (the int4 kernel's "
                         f"group sizes), got {str(group_size)[:40]!r}")
    if (isinstance(outlier_threshold, bool) or not isinstance(outlier_threshold, (int, float))
            or not 0 < outlier_threshold < math.inf):
        raise ValueError(f"quantization_outlier_threshold: must be a finite number > 0, got "
                         f"{str(outlier_threshold)[:40]!r}")


# Parallelism (engine/parallel/executor.py): worker processes, the two pipeline schedules.
PipelineSchedule = Literal["gpipe", "batch_queue"]
PIPELINE_SCHEDULES: tuple[str, ...] = get_args(PipelineSchedule)
MAX_WORKERS = 8
MAX_MICROBATCHES = 64
MAX_WORKER_TIMEOUT_S = 3600.0


# Weight sparsity patterns (engine/model/sparsity.py): 2 nonzeros in every 4 consecutive input weights.
SPARSITY_PATTERNS: tuple[str, ...] = ("2:4",)


def check_sparsity(sparsity: object) -> None:
    """``sparsity`` is None (dense) or one of SPARSITY_PATTERNS; anything else a ValueError."""
    if sparsity is not None and (not isinstance(sparsity, str) or sparsity not in SPARSITY_PATTERNS):
        raise ValueError(f"sparsity: must be None or one of {SPARSITY_PATTERNS}, got {str(sparsity)[:40]!r}")
# SmoothQuant (engine/model/smoothing.py) applies to the scheme that quantizes activations.
SMOOTHING_SCHEMES: tuple[str, ...] = ("w8a8",)


def check_smoothing(quantization: object, strength: object) -> None:
    """``quantization_smoothing_strength``: None (off) or a finite number in [0, 1] (SmoothQuant's
    alpha), and only with a scheme in SMOOTHING_SCHEMES; ValueError naming the knob."""
    if strength is None:
        return
    if isinstance(strength, bool) or not isinstance(strength, (int, float)) or not (
            math.isfinite(strength) and 0 <= strength <= 1):
        raise ValueError(f"quantization_smoothing_strength: must be a number in [0, 1] or None, got "
                         f"{str(strength)[:40]!r}")
    if quantization not in SMOOTHING_SCHEMES:
        raise ValueError(f"quantization_smoothing_strength: applies to quantization in {SMOOTHING_SCHEMES} "
                         f"(the schemes that quantize activations), got quantization={str(quantization)[:40]!r}")


def _is_number(value: object) -> bool:
    """An int or a float, not a bool (True would pass as 1)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _require_int(name: str, value: object, minimum: int, maximum: int | None = None) -> None:
    """An int (not a bool) in [minimum, maximum]; ValueError naming ``name`` and the range."""
    allowed = f">= {minimum}" if maximum is None else f"in {minimum} .. {maximum:,}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: must be an integer {allowed}, got {_short(value)}")
    if value < minimum or (maximum is not None and value > maximum):
        raise ValueError(f"{name}: must be an integer {allowed}, got {value:,}")


def _short(value: object, limit: int = 80) -> str:
    """repr() cut to ``limit`` characters, so a huge bad value cannot flood a message."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _stop_strings(stop: object) -> tuple[str, ...]:
    """None (no stop strings, as vLLM), one string, or a list/tuple of non-empty strings."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, (list, tuple)):
        raise ValueError(f"stop: must be None, a string or a list of non-empty strings, got "
                         f"{type(stop).__name__}")
    if any(not isinstance(s, str) or not s for s in stop):
        raise ValueError("stop: every stop string must be a non-empty string")
    return tuple(stop)


MAX_NAME_CHARS = 40  # runner / attention_backend names
#: Where the engine's tensors live (EngineConfig.device).
DEVICES: tuple[str, ...] = ("cpu", "cuda")


@dataclass(frozen=True)
class CacheConfig:
    """The paged KV cache (vLLM's ``CacheConfig``).

    block_size              tokens per KV block (1 .. 256)
    num_blocks              physical KV blocks in the pool (per layer)
    cache_dtype             the KV tensors' dtype: "auto" (vLLM's word: the weights' dtype), a float
                            dtype, or "int8" / "fp8" (e4m3): quantized on write with one fp32 absmax
                            scale per token and KV head, dequantized on read (engine/model/kv_quant.py).
                            The flat knob is ``kv_cache_dtype`` (None there = "auto")
    enable_prefix_caching   share the KV of common prompt prefixes through a radix tree (on by
                            default, as in vLLM)
    """

    block_size: int = 16
    num_blocks: int = 512
    cache_dtype: str = "auto"
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        _require_int("block_size", self.block_size, 1, MAX_BLOCK_SIZE)
        _require_int("num_blocks", self.num_blocks, 1, MAX_NUM_BLOCKS)
        if not isinstance(self.cache_dtype, str) or self.cache_dtype not in ("auto", *KV_CACHE_DTYPES):
            raise ValueError(f"kv_cache_dtype: must be one of {KV_CACHE_DTYPES} (or None / 'auto': the weights' "
                             f"dtype), got {_short(self.cache_dtype)}")
        if not isinstance(self.enable_prefix_caching, bool):
            raise ValueError("enable_prefix_caching: must be True or False")

    @property
    def pool_tokens(self) -> int:
        """Tokens the pool holds: num_blocks x block_size."""
        return self.num_blocks * self.block_size


@dataclass(frozen=True)
class SchedulerConfig:
    """What one step may schedule (vLLM's ``SchedulerConfig``).

    max_num_batched_tokens  the token budget of one step (all requests together)
    max_num_seqs            most requests running at once
    enable_chunked_prefill  a prompt may be split across steps to fit the budget
    policy                  "continuous" (refill every step) or "static" (a fixed batch that
                            waits for its longest member)
    max_model_len           context limit; None = the model's own limit
    scheduling_policy       who is admitted first and who is preempted (vLLM's knob name;
                            engine/core/policies/, sources in each module):
                            "fcfs"     arrival order, no overtaking (the default)
                            "priority" add_request(priority=): lower first, ties by arrival; a
                                       better waiting request preempts worse running ones (vLLM)
                            "sjf"      fewest prompt tokens left to prefill first
                            "lpm"      longest prefix-cache hit first (SGLang); fcfs without caching
                            "mlfq"     FastServe's skip-join multi-level feedback queue
                            A non-zero priority under a policy other than "priority" is accepted
                            and ignored (vLLM refuses it; here one workload runs under every policy)
    prefill_schedule        how a step splits its budget between prefills and decodes:
                            "mixed"         running requests first, prefill chunks fill the rest
                                            (stall-free batching, Sarathi-Serve; the default)
                            "prefill_first" when a new prompt can be admitted (or one is still
                                            prefilling) the step runs prompts only and running
                                            decodes stall for it (vLLM V0); a preempted request's
                                            recompute runs the mixed way
    """

    max_num_batched_tokens: int = 512
    max_num_seqs: int = 16
    enable_chunked_prefill: bool = True
    policy: Policy = "continuous"
    max_model_len: int | None = None
    scheduling_policy: SchedulingPolicyName = "fcfs"
    prefill_schedule: PrefillSchedule = "mixed"

    def __post_init__(self) -> None:
        _require_int("max_num_batched_tokens", self.max_num_batched_tokens, 1, MAX_NUM_BATCHED_TOKENS)
        _require_int("max_num_seqs", self.max_num_seqs, 1, MAX_NUM_SEQS)
        if self.max_model_len is not None:
            _require_int("max_model_len", self.max_model_len, 2, MAX_MODEL_LEN)
        if not isinstance(self.policy, str) or self.policy not in ("continuous", "static"):
            raise ValueError(f"policy: must be 'continuous' or 'static', got {_short(self.policy)}")
        if not isinstance(self.enable_chunked_prefill, bool):
            raise ValueError("enable_chunked_prefill: must be True or False")
        if not isinstance(self.scheduling_policy, str) or self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling_policy: must be one of {SCHEDULING_POLICIES}, got "
                             f"{_short(self.scheduling_policy)}")
        if not isinstance(self.prefill_schedule, str) or self.prefill_schedule not in PREFILL_SCHEDULES:
            raise ValueError(f"prefill_schedule: must be one of {PREFILL_SCHEDULES}, got "
                             f"{_short(self.prefill_schedule)}")


def check_priority(priority: object) -> int:
    """A request's priority (``add_request(priority=)``, vLLM's meaning: lower is served earlier):
    an int in MIN_PRIORITY .. MAX_PRIORITY (an int32), not a bool; ValueError naming ``priority``."""
    if isinstance(priority, bool) or not isinstance(priority, int) or not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise ValueError(f"priority: must be an integer in {MIN_PRIORITY:,} .. {MAX_PRIORITY:,} (lower is "
                         f"served earlier), got {_short(priority)}")
    return priority


@dataclass(frozen=True)
class ParallelConfig:
    """Worker processes and how the layers are split over them (vLLM's ``ParallelConfig``).

    pipeline_parallel_size  p: the layers split into p contiguous stages, each a worker process
                            (engine/parallel/executor.py); 1 = no pipeline (vLLM's name)
    tensor_parallel_size    t: every stage's attention heads and MLP columns split across t
                            worker processes joined by all-reduces (vLLM's name); p * t <= 8
                            workers (p * t = 1 runs in this process)
    pipeline_schedule       "gpipe": each step's batch split into num_microbatches micro-batches
                            that fill and drain the pipeline within the step; "batch_queue"
                            (vLLM's way): up to p independent batches, each scheduled over
                            requests no other in-flight batch holds, in flight at once
    num_microbatches        m for "gpipe" (1 .. 64; fewer when the batch has fewer requests);
                            must be 1 for "batch_queue"
    pipeline_layer_split    layers per stage, e.g. (20, 10); None = as even as possible; its
                            length must be p and it must sum to the model's layer count (checked
                            at engine start)
    worker_timeout_s        a worker that does not answer within this many seconds is declared
                            hung: the step raises and the workers are stopped
    """

    pipeline_parallel_size: int = 1
    tensor_parallel_size: int = 1
    pipeline_schedule: PipelineSchedule = "gpipe"
    num_microbatches: int = 1
    pipeline_layer_split: tuple[int, ...] | None = None
    worker_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        _require_int("pipeline_parallel_size", self.pipeline_parallel_size, 1, MAX_WORKERS)
        _require_int("tensor_parallel_size", self.tensor_parallel_size, 1, MAX_WORKERS)
        if self.world_size > MAX_WORKERS:
            raise ValueError(f"tensor_parallel_size: pipeline_parallel_size x tensor_parallel_size must be <= "
                             f"{MAX_WORKERS} worker processes, got {self.pipeline_parallel_size} x "
                             f"{self.tensor_parallel_size}")
        if not isinstance(self.pipeline_schedule, str) or self.pipeline_schedule not in PIPELINE_SCHEDULES:
            raise ValueError(f"pipeline_schedule: must be one of {PIPELINE_SCHEDULES}, got "
                             f"{_short(self.pipeline_schedule)}")
        _require_int("num_microbatches", self.num_microbatches, 1, MAX_MICROBATCHES)
        if self.pipeline_schedule == "batch_queue" and self.num_microbatches != 1:
            raise ValueError(f"num_microbatches: the 'batch_queue' schedule keeps up to pipeline_parallel_size "
                             f"whole batches in flight and does not split them; must be 1, got "
                             f"{self.num_microbatches}")
        split = self.pipeline_layer_split
        if split is not None:
            if not isinstance(split, (list, tuple)) or any(isinstance(n, bool) or not isinstance(n, int) or n < 1
                                                           for n in split):
                raise ValueError(f"pipeline_layer_split: must be None or a list of layer counts >= 1, one per "
                                 f"stage, got {_short(split)}")
            if len(split) != self.pipeline_parallel_size:
                raise ValueError(f"pipeline_layer_split: needs one layer count per stage "
                                 f"({self.pipeline_parallel_size}), got {len(split)}")
            object.__setattr__(self, "pipeline_layer_split", tuple(split))
        if (not _is_number(self.worker_timeout_s) or not 0 < self.worker_timeout_s <= MAX_WORKER_TIMEOUT_S
                or math.isnan(self.worker_timeout_s)):
            raise ValueError(f"worker_timeout_s: must be a number of seconds in (0, {MAX_WORKER_TIMEOUT_S}], "
                             f"got {_short(self.worker_timeout_s)}")

    @property
    def world_size(self) -> int:
        """Worker processes the engine starts: p x t (1 = none, the model runs in this process)."""
        return self.pipeline_parallel_size * self.tensor_parallel_size


@dataclass(frozen=True)
class QuantConfig:
    """Weight quantization: which scheme, and its parameters (ignored by the schemes that do not
    use them). ``smoothing_strength``: SmoothQuant's alpha, w8a8 only (engine/model/smoothing.py).
    Also the shared-model cache key (engine/model/shared.py). Flat knobs: ``quantization``,
    ``quantization_group_size``, ``quantization_outlier_threshold``, ``quantization_smoothing_strength``."""

    scheme: str
    group_size: int = DEFAULT_GROUP_SIZE
    outlier_threshold: float = DEFAULT_OUTLIER_THRESHOLD
    smoothing_strength: float | None = None

    def __post_init__(self) -> None:
        if self.scheme is None:
            raise ValueError(f"quantization: must be one of {SCHEMES} (no QuantConfig at all means none)")
        check_quant_knobs(self.scheme, self.group_size, self.outlier_threshold)
        check_smoothing(self.scheme, self.smoothing_strength)


# Every flat knob (vLLM's EngineArgs names: what LLM(model, **knobs), scenarios and replay files
# hold) -> (the EngineConfig field holding it, its name there; "" = a field of EngineConfig itself).
# The order is the flat knobs' order in a replay file.
KNOB_PLACES: dict[str, tuple[str, str]] = {
    "block_size": ("cache_config", "block_size"),
    "num_blocks": ("cache_config", "num_blocks"),
    "max_num_batched_tokens": ("scheduler_config", "max_num_batched_tokens"),
    "max_num_seqs": ("scheduler_config", "max_num_seqs"),
    "enable_chunked_prefill": ("scheduler_config", "enable_chunked_prefill"),
    "policy": ("scheduler_config", "policy"),
    "max_model_len": ("scheduler_config", "max_model_len"),
    "dtype": ("", "dtype"),
    "kv_cache_dtype": ("cache_config", "cache_dtype"),
    "seed": ("", "seed"),
    "enable_prefix_caching": ("cache_config", "enable_prefix_caching"),
    "quantization": ("quant_config", "scheme"),
    "quantization_group_size": ("quant_config", "group_size"),
    "quantization_outlier_threshold": ("quant_config", "outlier_threshold"),
    "sparsity": ("", "sparsity"),
    "quantization_smoothing_strength": ("quant_config", "smoothing_strength"),
    "speculative_config": ("", "speculative_config"),
    "pipeline_parallel_size": ("parallel_config", "pipeline_parallel_size"),
    "tensor_parallel_size": ("parallel_config", "tensor_parallel_size"),
    "pipeline_schedule": ("parallel_config", "pipeline_schedule"),
    "num_microbatches": ("parallel_config", "num_microbatches"),
    "pipeline_layer_split": ("parallel_config", "pipeline_layer_split"),
    "worker_timeout_s": ("parallel_config", "worker_timeout_s"),
    "runner": ("", "runner"),
    "attention_backend": ("", "attention_backend"),
    "device": ("", "device"),
    "decode_grouping": ("", "decode_grouping"),
    "scheduling_policy": ("scheduler_config", "scheduling_policy"),
    "prefill_schedule": ("scheduler_config", "prefill_schedule"),
}
KNOB_NAMES: tuple[str, ...] = tuple(KNOB_PLACES)
_SECTIONS: dict[str, type] = {"cache_config": CacheConfig, "scheduler_config": SchedulerConfig,
                              "parallel_config": ParallelConfig, "quant_config": QuantConfig}


def unknown_knob(keys: Iterable[str]) -> tuple[str, str | None] | None:
    """The first of ``keys`` that is no engine knob, with the closest knob name (None: none close);
    None when every key is a knob. The engine's and the replay loader's messages both use it."""
    name = next((k for k in keys if k not in KNOB_PLACES), None)
    if name is None:
        return None
    close = difflib.get_close_matches(name, KNOB_NAMES, 1)
    return name, close[0] if close else None


def check_knob_names(knobs: Mapping[str, object]) -> None:
    """A ValueError naming the first knob (in sorted order) that is not an engine knob (a typo
    gets a suggestion)."""
    found = unknown_knob(sorted(str(k) for k in knobs))
    if found is not None:
        name, close = found
        raise ValueError(f"{name[:60]}: unknown engine option" + (f" (did you mean {close!r}?)" if close else ""))


def _check_cuda_rules(c: EngineConfig) -> None:
    """What device="cuda" runs: the whole model in this process, unquantized (the quantized kernels
    are CPU ones: torch's int4 / int8 CPU ops), and no draft model (drafters load on CPU)."""
    if c.parallel_config.world_size > 1:
        raise ValueError("device: 'cuda' runs the model in one process on one GPU; set pipeline_parallel_size = "
                         "tensor_parallel_size = 1 (the worker processes run on CPU)")
    if c.quant_config is not None:
        raise ValueError(f"device: 'cuda' runs unquantized weights (quantization={c.quant_config.scheme!r} uses "
                         f"torch's CPU kernels); use quantization=None with dtype 'bfloat16' or 'float16'")
    if c.speculative_config is not None:
        raise ValueError("device: 'cuda' does not run speculative decoding (its drafters run on CPU); "
                         "set speculative_config=None")


@dataclass(frozen=True)
class EngineConfig:
    """Every engine knob, grouped as vLLM groups them (its ``VllmConfig``)::

        EngineConfig
        ├── cache_config       CacheConfig       block_size, num_blocks, cache_dtype, enable_prefix_caching
        ├── scheduler_config   SchedulerConfig   max_num_batched_tokens, max_num_seqs, chunked prefill, policy, max_model_len,
        │                                        scheduling_policy, prefill_schedule
        ├── parallel_config    ParallelConfig    p, t, pipeline schedule, micro-batches, layer split, worker timeout
        ├── quant_config       QuantConfig|None  weight quantization scheme, int4 group size, w8a8 outliers, SmoothQuant
        ├── speculative_config SpeculativeConfig|None  drafter and k (engine/speculative/)
        └── dtype, sparsity, seed, runner, attention_backend, device   how the model itself runs

    Users pass flat knobs (vLLM's EngineArgs names): ``LLM(model, block_size=16, quantization="int4")``,
    scenario and replay files too; ``EngineConfig.from_knobs(**knobs)`` groups them (``KNOB_PLACES``) and
    ``to_knobs()`` flattens back. A sub-config may also be given as a dict of its own fields.

    dtype                   the weights' compute dtype; "auto" (the default, vLLM's word) resolves at
                            construction to "float32", or "bfloat16" with a quant_config (the quantized
                            kernels have SIMD paths only for bf16 activations); an explicit "float32" /
                            "float16" with a quantization is a ValueError
    sparsity                None, or "2:4": the decoder layers' projections magnitude-pruned to 2
                            nonzeros in every 4 input weights (engine/model/sparsity.py), before any
                            quantization; dense storage, so no speedup on CPU
    speculative_config      None (off), a SpeculativeConfig, or vLLM's dict ({"method": "ngram",
                            "num_speculative_tokens": 4, ...}; a bad key or value is a ValueError naming
                            speculative_config.<key>). Requests with SamplingParams(n > 1) are refused
                            while it is set (ValueError naming n). Single process only
    seed                    seeds requests that carry no seed of their own
    runner                  what runs the model (engine/serving/runners.py RUNNERS): "auto" (this
                            process, or worker processes when p * t > 1), "in_process", "workers",
                            or another registered name; an unknown one is a ValueError at start
    attention_backend       the attention kernels of the forward (engine/model/attention.py
                            ATTENTION_BACKENDS): "torch" (the reference) or "triton" (engine/kernels:
                            on CPU only under TRITON_INTERPRET=1, slow: tiny models and teaching);
                            "auto" (the default) resolves at construction to "torch" on CPU and
                            "triton" on CUDA; a name is checked at start
    device                  where the weights, the KV cache and the forward live: "cpu" (default) or
                            "cuda" (a GPU: one process, unquantized weights, no speculation; whether a
                            GPU is visible is checked at start, a ValueError naming device)
    decode_grouping         True (default): the torch backend attends decodes in groups of similar
                            context, each padded to its own longest (engine/model/forward_batch.py);
                            False: one group padded to the longest decode, as a padded batch does
                            (the audit measures what grouping buys)

    Rules across sub-configs (checked here): a quantization computes in bfloat16; speculation runs
    in one process; t > 1 refuses a weight quantization (its packed codes are not sliced).
    """

    cache_config: CacheConfig = CacheConfig()
    scheduler_config: SchedulerConfig = SchedulerConfig()
    parallel_config: ParallelConfig = ParallelConfig()
    quant_config: QuantConfig | None = None
    speculative_config: SpeculativeConfig | None = None
    dtype: str = "auto"
    sparsity: str | None = None
    seed: int = 0
    runner: str = "auto"
    attention_backend: str = "auto"
    decode_grouping: bool = True
    device: str = "cpu"

    def __post_init__(self) -> None:
        """Each sub-config is its own record (a dict of its fields is parsed); then the top-level
        knobs and the rules across sub-configs. Memory is checked by the engine, against the model."""
        for name, cls in _SECTIONS.items():
            value = getattr(self, name)
            if isinstance(value, Mapping):
                object.__setattr__(self, name, _section(cls, name, value))
            elif not isinstance(value, cls) and not (name == "quant_config" and value is None):
                raise ValueError(f"{name}: must be a {cls.__name__} or a dict of its fields, got "
                                 f"{type(value).__name__}")
        for name in ("runner", "attention_backend"):  # which ones exist is the registries' to say
            value = getattr(self, name)
            if not isinstance(value, str) or not 1 <= len(value) <= MAX_NAME_CHARS:
                raise ValueError(f"{name}: must be a name (1 to {MAX_NAME_CHARS} characters), got {_short(value)}")
        if self.device not in DEVICES:
            raise ValueError(f"device: must be one of {DEVICES}, got {_short(self.device)}")
        if self.attention_backend == "auto":
            object.__setattr__(self, "attention_backend", "triton" if self.device == "cuda" else "torch")
        if not isinstance(self.decode_grouping, bool):
            raise ValueError(f"decode_grouping: must be True or False, got {_short(self.decode_grouping)}")
        object.__setattr__(self, "speculative_config", parse_speculative_config(self.speculative_config))
        check_sparsity(self.sparsity)
        scheme = self.quantization
        if self.dtype == "auto":
            object.__setattr__(self, "dtype", "float32" if scheme is None else "bfloat16")
        if not isinstance(self.dtype, str) or self.dtype not in DTYPES:
            raise ValueError(f"dtype: must be 'auto' or one of {DTYPES}, got {_short(self.dtype)}")
        if scheme is not None and self.dtype != "bfloat16":
            raise ValueError(f"dtype: quantization={scheme!r} computes in 'bfloat16' (torch's "
                             f"quantized CPU kernels have SIMD paths only for bf16 activations); pass "
                             f"dtype='bfloat16' or 'auto', got {_short(self.dtype)}")
        _require_int("seed", self.seed, 0, MAX_SEED)
        if self.device == "cuda":
            _check_cuda_rules(self)
        if self.parallel_config.world_size == 1:
            return
        if self.speculative_config is not None:
            raise ValueError("speculative_config: speculative decoding runs in a single process; set "
                             "pipeline_parallel_size = tensor_parallel_size = 1 to use it")
        if self.parallel_config.tensor_parallel_size > 1 and scheme is not None:
            raise ValueError(f"quantization: tensor_parallel_size > 1 slices the weights by heads and columns, "
                             f"which the packed {scheme!r} codes do not support; use "
                             f"tensor_parallel_size = 1 (pipeline stages may be quantized)")

    @classmethod
    def from_knobs(cls, **knobs: Any) -> EngineConfig:
        """Flat knobs (``KNOB_NAMES``; any left out takes its default) -> the grouped config.
        An unknown knob or a bad value is a ValueError naming the flat knob. The quantization
        knobs are checked even when ``quantization`` is None (then they are not kept)."""
        check_knob_names(knobs)
        sections: dict[str, dict[str, Any]] = {name: {} for name in _SECTIONS}
        top: dict[str, Any] = {}
        for knob, value in knobs.items():
            section, name = KNOB_PLACES[knob]
            (sections[section] if section else top)[name] = value
        if sections["cache_config"].get("cache_dtype", "auto") is None:
            sections["cache_config"]["cache_dtype"] = "auto"
        quant = sections.pop("quant_config")
        scheme = quant.pop("scheme", None)
        check_quant_knobs(scheme, quant.get("group_size", DEFAULT_GROUP_SIZE),
                          quant.get("outlier_threshold", DEFAULT_OUTLIER_THRESHOLD))
        check_smoothing(scheme, quant.get("smoothing_strength"))
        return cls(cache_config=CacheConfig(**sections["cache_config"]),
                   scheduler_config=SchedulerConfig(**sections["scheduler_config"]),
                   parallel_config=ParallelConfig(**sections["parallel_config"]),
                   quant_config=None if scheme is None else QuantConfig(scheme, **quant), **top)

    def to_knobs(self) -> dict[str, Any]:
        """The flat knobs, every one (``from_knobs``'s inverse): kv_cache_dtype None for "auto",
        speculative_config as a dict of all its fields (as every recording has held it; the other
        methods' keys None), the quantization knobs' defaults when there is none."""
        quant = self.quant_config or QuantConfig(SCHEMES[0])  # its other fields: the knobs' defaults
        out: dict[str, Any] = {}
        for knob, (section, name) in KNOB_PLACES.items():
            owner = quant if section == "quant_config" else getattr(self, section) if section else self
            out[knob] = getattr(owner, name)
        out["quantization"] = self.quantization
        out["kv_cache_dtype"] = None if self.cache_config.cache_dtype == "auto" else self.cache_config.cache_dtype
        out["speculative_config"] = None if self.speculative_config is None else asdict(self.speculative_config)
        return out

    def replace(self, **knobs: Any) -> EngineConfig:
        """This config with some flat knobs changed (validated as ``from_knobs``)."""
        return EngineConfig.from_knobs(**{**self.to_knobs(), **knobs})

    @property
    def quantization(self) -> str | None:
        """The weight quantization scheme, None when the weights are not quantized."""
        return None if self.quant_config is None else self.quant_config.scheme

    @property
    def kv_cache_dtype(self) -> str:
        """The KV cache's dtype name: ``cache_config.cache_dtype``, or the weights' dtype for "auto"."""
        dtype = self.cache_config.cache_dtype
        return self.dtype if dtype == "auto" else dtype


def _section(cls: type, name: str, values: Mapping[str, Any]) -> Any:
    """A sub-config from a dict of its own fields; an unknown key is a ValueError naming it."""
    own = [f.name for f in dataclasses.fields(cls)]
    for key in values:
        if key not in own:
            raise ValueError(f"{name}.{str(key)[:40]}: unknown field (its fields: {', '.join(own)})")
    return cls(**values)


# vLLM SamplingParams keywords InferScope does not implement -> why, and what to use instead.
# An explicit table: a keyword in neither it nor the fields is reported as unknown (a typo).
UNSUPPORTED_SAMPLING_KEYWORDS: dict[str, str] = {
    "best_of": "returning the best n of best_of sampled sequences is not supported; use n for n parallel "
               "sequences (all returned)",
    "use_beam_search": "beam search is not supported; use temperature=0 (greedy) or n > 1 (parallel sampling)",
    "length_penalty": "beam search (and its length_penalty) is not supported",
    "early_stopping": "beam search (and its early_stopping) is not supported",
    "presence_penalty": "penalties are not supported",
    "frequency_penalty": "penalties are not supported",
    "repetition_penalty": "penalties are not supported",
    "min_p": "min_p filtering is not supported; use top_p or top_k",
    "min_tokens": "min_tokens is not supported; ignore_eos=True generates exactly max_tokens",
    "stop_token_ids": "stop token ids are not supported; use stop (strings)",
    "logprobs": "log probabilities are not returned",
    "prompt_logprobs": "log probabilities are not returned",
    "logit_bias": "logit bias is not supported",
}


def check_sampling_keywords(keywords: Mapping[str, object]) -> None:
    """Keywords SamplingParams does not take: a ValueError naming the first, saying that
    InferScope does not support it (a vLLM keyword in UNSUPPORTED_SAMPLING_KEYWORDS) or that it
    is unknown, with the closest field when it looks like a typo."""
    fields = SamplingParams.__dataclass_fields__
    for key in keywords:
        if key in fields:
            continue
        if key in UNSUPPORTED_SAMPLING_KEYWORDS:
            raise ValueError(f"{key}: InferScope does not support vLLM's SamplingParams({key}=...): "
                             f"{UNSUPPORTED_SAMPLING_KEYWORDS[key]}")
        close = difflib.get_close_matches(key, list(fields), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise ValueError(f"{key[:40]}: unknown SamplingParams field (fields: {', '.join(fields)}){hint}")


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples and when it stops.

    temperature  a finite number >= 0; 0 is greedy (argmax, exact against Hugging Face
                 ``generate``), and so is any 0 < t < SAMPLING_EPS (1e-5, as vLLM)
    top_k        an int >= 0; 0 = off (vLLM's -1 is not accepted), k >= vocab keeps all
    top_p        in (0, 1]; the top token is always kept, so a tiny top_p is greedy
    max_tokens   an int in 1 .. MAX_TOKENS (the context limit may end a request sooner)
    seed         None (derived from the engine's seed) or an int in 0 .. 2**63 - 1
    stop         None or () = no stop strings, a string, or a list/tuple of non-empty strings
    ignore_eos   a bool
    n            parallel sequences sampled from one prompt, 1 .. MAX_N (vLLM's meaning): the
                 prompt is prefilled once and its blocks shared; sequence i draws from a
                 generator seeded with seed + i. n > 1 on an engine with speculative_config
                 set is a ValueError naming n (add_request / generate)

    With a seed, a request's random draws come from its own generator, so a run replays
    identically. A keyword that is not a field is a ValueError naming it
    (``check_sampling_keywords``: vLLM's best_of, use_beam_search, penalties ... are not
    supported; anything else is unknown).
    """

    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    max_tokens: int = 16
    seed: int | None = None
    stop: Sequence[str] | None = field(default_factory=tuple)  # stored as tuple[str, ...]
    ignore_eos: bool = False
    n: int = 1

    def __new__(cls, *args: object, **kwargs: object) -> SamplingParams:
        """Checks the keywords before the dataclass __init__ would refuse one with a TypeError."""
        check_sampling_keywords(kwargs)
        return super().__new__(cls)

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", _stop_strings(self.stop))
        if not _is_number(self.temperature) or not 0 <= self.temperature < math.inf:
            raise ValueError(f"temperature: must be a finite number >= 0, got {_short(self.temperature)}")
        _require_int("max_tokens", self.max_tokens, 1, MAX_TOKENS)
        _require_int("top_k", self.top_k, 0)
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p: must be a number in (0, 1], got {_short(self.top_p)}")
        if self.seed is not None:
            _require_int("seed", self.seed, 0, MAX_SEED)
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos: must be True or False, got {_short(self.ignore_eos)}")
        _require_int("n", self.n, 1, MAX_N)

    @property
    def greedy(self) -> bool:
        """Rule: temperature below SAMPLING_EPS (vLLM's _SAMPLING_EPS) samples greedily."""
        return self.temperature < SAMPLING_EPS


# Speculative decoding (issue #10; the algorithm is in engine/speculative/spec_decode.py). The config is in
# vLLM's dict shape and kept here so this module stays torch-free.
SpecMethod = Literal["ngram", "draft_model", "early_exit"]
SPEC_METHODS: tuple[str, ...] = ("ngram", "draft_model", "early_exit")
# k is capped at 16: the target verifies k + 1 query tokens per request per step (on this CPU
# about 2x a decode step at small k, growing with k), lookahead KV slots are reserved for all k,
# and the tokens one step can buy saturate at 1 / (1 - alpha) (10 at alpha = 0.9), so k > 16
# only adds verification cost; best_k() searches the same range.
MAX_SPECULATIVE_TOKENS = 16
# prompt lookup n-gram length cap: ngram_propose costs O(len + c * n_max) per call.
MAX_PROMPT_LOOKUP = 32
DEFAULT_PROMPT_LOOKUP_MIN = 2
DEFAULT_PROMPT_LOOKUP_MAX = 4
_SPEC_KEYS: dict[str, tuple[str, ...]] = {
    "ngram": ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"),
    "draft_model": ("method", "num_speculative_tokens", "model", "quantization"),
    "early_exit": ("method", "num_speculative_tokens", "num_layers"),
}


@dataclass(frozen=True)
class SpeculativeConfig:
    """One speculative-decoding setup, parsed from vLLM's ``speculative_config`` dict.

    method                  "ngram" (prompt lookup, no model), "draft_model" (a second, cheaper
                            model with the target's vocabulary) or "early_exit" (the target's
                            first num_layers layers + final norm + LM head)
    num_speculative_tokens  k, draft tokens proposed per step, 1 .. MAX_SPECULATIVE_TOKENS (16)
    prompt_lookup_min/max   ngram only: n-gram lengths tried, 1 <= min <= max <= 32; both
                            absent -> 2 and 4; one absent -> it takes the other's value (vLLM)
    model / quantization    draft_model only: the draft model's name (required) and its weight
                            quantization (None or one of SCHEMES)
    num_layers              early_exit only: >= 1; the upper bound (< the target's layer count)
                            needs the model: ``check_against_model``

    Fields of the other methods are None. ``to_dict()`` gives back the vLLM-shaped dict.
    """

    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    model: str | None = None
    quantization: str | None = None
    num_layers: int | None = None

    def __post_init__(self) -> None:
        """Validates each field, naming it as ``speculative_config.<key>``."""
        name = "speculative_config."
        if not isinstance(self.method, str) or self.method not in SPEC_METHODS:
            raise ValueError(f"{name}method: must be one of {SPEC_METHODS}, got {_short(self.method)}")
        _require_int(name + "num_speculative_tokens", self.num_speculative_tokens, 1, MAX_SPECULATIVE_TOKENS)
        own = _SPEC_KEYS[self.method]
        for key in ("prompt_lookup_min", "prompt_lookup_max", "model", "quantization", "num_layers"):
            if key not in own and getattr(self, key) is not None:
                raise ValueError(f"{name}{key}: not a key of method {self.method!r} (its keys: "
                                 f"{', '.join(own)}), got {_short(getattr(self, key))}")
        if self.method == "ngram":
            lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
            if lo is not None:
                _require_int(name + "prompt_lookup_min", lo, 1, MAX_PROMPT_LOOKUP)
            if hi is not None:
                _require_int(name + "prompt_lookup_max", hi, 1, MAX_PROMPT_LOOKUP)
            if lo is None and hi is None:
                lo, hi = DEFAULT_PROMPT_LOOKUP_MIN, DEFAULT_PROMPT_LOOKUP_MAX
            lo = hi if lo is None else lo
            hi = lo if hi is None else hi
            assert isinstance(lo, int) and isinstance(hi, int)
            if lo > hi:
                raise ValueError(f"{name}prompt_lookup_min: must be <= prompt_lookup_max ({hi}), got {lo}")
            object.__setattr__(self, "prompt_lookup_min", lo)
            object.__setattr__(self, "prompt_lookup_max", hi)
        elif self.method == "draft_model":
            if not isinstance(self.model, str) or not self.model.strip():
                raise ValueError(f"{name}model: method 'draft_model' needs the draft model's name "
                                 f"(e.g. 'smollm2-135m'), got {_short(self.model)}")
            if self.quantization is not None and (not isinstance(self.quantization, str)
                                                  or self.quantization not in SCHEMES):
                raise ValueError(f"{name}quantization: must be None or one of {SCHEMES}, got "
                                 f"{_short(self.quantization)}")
        else:
            if self.num_layers is None:
                raise ValueError(f"{name}num_layers: method 'early_exit' needs num_layers (an integer >= 1)")
            _require_int(name + "num_layers", self.num_layers, 1)

    def check_against_model(self, num_hidden_layers: int) -> None:
        """early_exit: num_layers must be below the target's layer count (all layers would be the
        target itself, at the target's cost); ValueError naming the key. Other methods: no-op."""
        if self.method == "early_exit" and self.num_layers is not None and self.num_layers >= num_hidden_layers:
            raise ValueError(f"speculative_config.num_layers: must be in 1 .. {num_hidden_layers - 1} "
                             f"(the target has {num_hidden_layers} layers), got {self.num_layers}")

    def to_dict(self) -> dict[str, object]:
        """The vLLM-shaped dict: the method's own keys only (parse_speculative_config inverts it)."""
        return {key: getattr(self, key) for key in _SPEC_KEYS[self.method]}


def parse_speculative_config(d: object) -> SpeculativeConfig | None:
    """``speculative_config`` dict (or None: off) -> SpeculativeConfig.

    Keys: "method" and "num_speculative_tokens" always; the method's own keys (see
    SpeculativeConfig). An unknown key, a key of another method or a bad value is a ValueError
    naming ``speculative_config.<key>``. A SpeculativeConfig passes through unchanged.
    """
    if d is None or isinstance(d, SpeculativeConfig):
        return d
    if not isinstance(d, Mapping):
        raise ValueError(f"speculative_config: must be a dict or None, got {type(d).__name__}")
    for key in d:
        if not isinstance(key, str) or key not in SpeculativeConfig.__dataclass_fields__:
            known = sorted({k for keys in _SPEC_KEYS.values() for k in keys})
            raise ValueError(f"speculative_config.{str(key)[:40]}: unknown key (known: {', '.join(known)})")
    for key in ("method", "num_speculative_tokens"):
        if key not in d:
            raise ValueError(f"speculative_config.{key}: required")
    return SpeculativeConfig(**{str(k): v for k, v in d.items()})


def engine_config(config: EngineConfig | None, knobs: Mapping[str, Any]) -> EngineConfig:
    """An engine's config from either an EngineConfig or flat keyword knobs (not both); an unknown
    knob is a ValueError naming it."""
    if config is not None and not isinstance(config, EngineConfig):
        raise ValueError(f"config: must be an EngineConfig (or pass knobs as keywords), got "
                         f"{type(config).__name__}")
    if config is not None and knobs:
        raise ValueError("pass either config or keyword knobs, not both")
    return config or EngineConfig.from_knobs(**knobs)
