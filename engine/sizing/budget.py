"""The framework budget rule: which serving framework, how much of a device it lets you use, its
KV block size and step token budget, and how a device's memory splits into weights, KV pool and
the framework's reserve (sizing.md §3.5, §1).

  none         usable = device memory (x usable share for unified memory); needs = weights + KV
               + activations + overhead.
  vllm         usable = gpu_memory_utilization x total; activations profiled at
               max_num_batched_tokens; the KV pool is whatever is left (reserved up front).
  sglang       weights + KV pool <= mem_fraction_static x total; the rest is held back for
               activations (shown as "reserve" when the activations need less).
  vllm-ascend  as vLLM with block size 128; on 310P also a dense FP16 mask of
               max_model_len^2 x 2 B and the KV budget halved ("reserve" = the other half).

Block sizes each framework accepts (anything else is refused, never copied into a command):
  vllm (CUDA), none   1, 8, 16, 32, 64, 128   (vLLM CacheConfig; "none" prints a vLLM line on GPUs)
  vllm-ascend         16, 32, 64, 128          (vllm_ascend.utils; 128 is its default and forced
                                                with prefix caching / chunked prefill)
  sglang              --page-size 1..1024      (any positive page size; 1 is its default)
max_num_batched_tokens: 1..2**24.
"""
from __future__ import annotations

from dataclasses import dataclass

from .checks import Remarks, fraction_in, whole_number
from .formats import SizingError
from .hardware import FRAMEWORKS, GiB, MiB, Hardware

VLLM_BLOCK_SIZES = (1, 8, 16, 32, 64, 128)
ASCEND_BLOCK_SIZES = (16, 32, 64, 128)
SGLANG_MAX_PAGE = 1024
DEFAULT_BLOCK = {"none": 1, "vllm": 16, "sglang": 1, "vllm-ascend": 128}
MAX_BATCHED_TOKENS = 1 << 24
DEFAULT_UTIL = 0.9  # vLLM's gpu_memory_utilization default
FRAMEWORK_LABELS = {"none": "no serving framework (plain)", "vllm": "vLLM", "sglang": "SGLang",
                    "vllm-ascend": "vllm-ascend"}


def nccl_bytes(devices: int) -> int:
    """aiconfigurator: NCCL buffers 342 MiB at TP2, 392 MiB at TP4/8 (sizing.md §3.5)."""
    if devices <= 1:
        return 0
    return (342 if devices == 2 else 392) * MiB


def sglang_fraction(tp: int) -> float:
    """SGLang's default mem_fraction_static by TP (server_args; newer versions size it from capacity)."""
    for at_least, fraction in ((16, 0.79), (8, 0.81), (4, 0.85), (2, 0.87)):
        if tp >= at_least:
            return fraction
    return 0.88


def ascend_mask_bytes(max_model_len: int) -> int:
    """vllm-ascend 310P dense FP16 causal mask: max_model_len^2 x 2 bytes."""
    return max_model_len * max_model_len * 2


@dataclass(frozen=True)
class Budget:
    """One framework's rule applied to one device type."""

    framework: str
    util: float | None  # vLLM gpu_memory_utilization / SGLang mem_fraction_static (None: default)
    block: int  # KV block (page) size in tokens
    block_given: bool  # the caller chose the block size (so the command line carries it)
    batched_tokens: int  # max_num_batched_tokens / chunked prefill size
    eta_memory: float
    eta_compute: float
    ascend_310p_rules: bool
    capacity: int  # device memory, bytes
    usable_fraction: float  # unified-memory share (1 on discrete devices)

    @property
    def usable(self) -> int:
        """vLLM: total x min(util, usable share); otherwise total x usable share."""
        if self.framework in ("vllm", "vllm-ascend"):
            util = DEFAULT_UTIL if self.util is None else self.util
            return int(self.capacity * min(util, self.usable_fraction))
        return int(self.capacity * self.usable_fraction)

    def static_fraction(self, tp: int) -> float:
        """SGLang's mem_fraction_static: the caller's, else its default for this TP."""
        return self.util if self.util is not None else sglang_fraction(tp)

    def mask_bytes(self, context: int) -> int:
        """The 310P dense attention mask (0 elsewhere)."""
        return ascend_mask_bytes(context) if self.ascend_310p_rules else 0

    def reserve_and_pool(self, weights: int, kv: int, activations: int, overhead: int, mask: int,
                         tp: int) -> tuple[int, int]:
        """(reserve, KV pool) on one device.
        sglang:      reserve = max(0, (1 - f) x total - activations - overhead);
                     pool = min(f x total - weights, usable - non-KV)
        310P ascend: reserve = this workload's KV (the held-back half); pool = (usable - non-KV) / 2
        otherwise:   reserve = 0; pool = usable - non-KV"""
        non_kv = weights + activations + mask + overhead
        if self.framework == "sglang":
            frac = self.static_fraction(tp)
            reserve = max(0, int((1 - frac) * self.capacity) - activations - overhead)
            return reserve, min(int(frac * self.capacity) - weights, self.usable - non_kv)
        if self.ascend_310p_rules:
            return kv, (self.usable - non_kv) // 2
        return 0, self.usable - non_kv


def _framework(hw: Hardware, requested: str | None, remarks: Remarks) -> str:
    """The framework key: 'auto' is the hardware's usual one; vLLM on Ascend is vllm-ascend."""
    fw = "auto" if requested is None else str(requested).strip().lower()
    if fw == "auto":
        fw = hw.default_framework
    if fw not in FRAMEWORKS:
        raise SizingError(f"unknown framework {requested!r}; choose one of: auto, {', '.join(FRAMEWORKS)}")
    if fw == "vllm-ascend" and not hw.is_ascend:
        raise SizingError(f"vllm-ascend runs on Ascend NPUs only; for {hw.name} use vllm, sglang or none")
    if fw == "vllm" and hw.is_ascend:
        remarks.note("vLLM on Ascend is the vllm-ascend plugin: its rules are applied")
        fw = "vllm-ascend"
    if fw == "sglang" and hw.is_310p:
        remarks.warn("SGLang has no Ascend 310P support; the budget is SGLang's rule only on paper")
    if fw in ("vllm", "sglang") and hw.device_class in ("apple", "cpu"):
        remarks.warn(f"{fw} has no Metal backend and a slow CPU path; llama.cpp or MLX is the usual choice here")
    return fw


def accepted_block_sizes(framework: str) -> str:
    """The block sizes ``framework`` accepts, in words (for messages and the README)."""
    if framework == "sglang":
        return f"SGLang's --page-size takes 1 to {SGLANG_MAX_PAGE:,}"
    if framework == "vllm-ascend":
        return f"vllm-ascend accepts {', '.join(map(str, ASCEND_BLOCK_SIZES))} (128 is its default)"
    who = "vLLM" if framework == "vllm" else "the vLLM command printed without a framework"
    return f"{who} accepts {', '.join(map(str, VLLM_BLOCK_SIZES))} on CUDA"


def check_block_size(framework: str, value: object) -> int:
    """A block size the framework accepts (module doc), else a SizingError naming the accepted ones."""
    block = whole_number("block_size", value, 1, None)
    allowed: tuple[int, ...] | range
    if framework == "sglang":
        allowed = range(1, SGLANG_MAX_PAGE + 1)
    elif framework == "vllm-ascend":
        allowed = ASCEND_BLOCK_SIZES
    else:
        allowed = VLLM_BLOCK_SIZES
    if block not in allowed:
        raise SizingError(f"block size {block:,} is not accepted: {accepted_block_sizes(framework)}")
    return block


def resolve_budget(hw: Hardware, framework: str | None, util: float | None, block_size: int | None,
                   max_num_batched_tokens: int | None, eta_memory: float | None, eta_compute: float | None,
                   remarks: Remarks) -> Budget:
    """The rule for ``framework`` on ``hw``, every number checked against its range.
    Step token budget default: 8192 on >= 70 GiB devices under a framework, else 2048."""
    fw = _framework(hw, framework, remarks)
    if fw in ("vllm", "vllm-ascend"):
        util_ok: float | None = fraction_in("gpu_memory_utilization", DEFAULT_UTIL if util is None else util)
    elif fw == "sglang" and util is not None:
        util_ok = fraction_in("mem_fraction_static", util)
    else:
        util_ok = None
    block = DEFAULT_BLOCK[fw] if block_size is None else check_block_size(fw, block_size)
    if max_num_batched_tokens is not None:
        batched = whole_number("max_num_batched_tokens", max_num_batched_tokens, 1, MAX_BATCHED_TOKENS)
    else:
        batched = 8192 if (hw.memory_bytes >= 70 * GiB and fw != "none") else 2048
    return Budget(
        framework=fw, util=util_ok, block=block, block_given=block_size is not None, batched_tokens=batched,
        eta_memory=fraction_in("memory efficiency", hw.eta_memory if eta_memory is None else eta_memory),
        eta_compute=fraction_in("compute efficiency", hw.eta_compute if eta_compute is None else eta_compute),
        ascend_310p_rules=fw == "vllm-ascend" and hw.is_310p, capacity=hw.memory_bytes,
        usable_fraction=hw.usable_fraction)
