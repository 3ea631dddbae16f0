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
  mindie       (Ascend only) npuMemSize -1: KV cache = total x NPU_MEMORY_FRACTION (0.8) - weights
               - runtime variables (activations) - system memory (overhead); cacheBlockSize 128;
               maxPrefillTokens 8192 (MindIE-LLM docs, config.json "npuMemSize").
  inferscope   this project's engine (engine/): as none (it allocates the pool it is given);
               block 16; its own KV formats (fp8 and int8 with an fp32 scale per token and KV
               head, ``precision``), so the calculator and ``LLMEngine`` agree byte for byte.

Block sizes each framework accepts (anything else is refused, never copied into a command):
  vllm (CUDA), none   1, 8, 16, 32, 64, 128   (vLLM CacheConfig; "none" prints a vLLM line on GPUs)
  vllm-ascend         16, 32, 64, 128          (vllm_ascend.utils; 128 is its default and forced
                                                with prefix caching / chunked prefill)
  sglang              --page-size 1..1024      (any positive page size; 1 is its default)
  mindie              cacheBlockSize 16..128 in multiples of 16 (128 the default and recommended)
  inferscope          block_size 1..1024
max_num_batched_tokens: 1..2**24.

Framework versions (``Settings.framework_version``, CLI ``--framework-version``, the page's
"Framework version" box; docs/calculator.md "Framework versions"). A version picks the rule:
  vllm    < 0.8         V0: activation peak = max(forward, sampler) at max_num_batched_tokens;
                        overhead = the preset's CUDA context + NCCL (what V0 logs as non-torch)
          0.8 - 0.9.1   V1 before PR #19312: forward peak only (V1 samples after the pool is
                        allocated); overhead = the CUDA context + NCCL, as V0
          0.9.2 - 0.20  V1: the memory snapshot is taken after the CUDA context and NCCL exist, so
                        only the *increase* during profiling counts: V1_NON_TORCH at TP 1, more
                        with TP (``v1_non_torch``); CUDA graphs come out of the (1 - util) headroom
          >= 0.21       (the default) as 0.9.2 - 0.20, plus the CUDA-graph estimate
                        (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS, on by default since 0.21)
  sglang  < 0.5         (the default) mem_fraction_static by TP (0.88 / 0.87 / 0.85 / 0.81 / 0.79)
          >= 0.5        mem_fraction_static = (GPU MiB - reserved) / GPU MiB, reserved from the
                        chunked prefill size, CUDA-graph batch and TP x PP (``sglang_fraction_v05``)
  Both SGLang rules: pool = mem_fraction_static x (device total - CUDA context) - weights, x 0.95
  for vision-language models (SGLang lowers the fraction for them).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .checks import Remarks, fraction_in, whole_number
from .formats import SizingError
from .hardware import FRAMEWORKS, GiB, MiB, Hardware

VLLM_BLOCK_SIZES = (1, 8, 16, 32, 64, 128)
ASCEND_BLOCK_SIZES = (16, 32, 64, 128)
SGLANG_MAX_PAGE = 1024
MINDIE_BLOCK_SIZES = (16, 32, 48, 64, 80, 96, 112, 128)
DEFAULT_BLOCK = {"none": 1, "vllm": 16, "sglang": 1, "vllm-ascend": 128, "mindie": 128, "inferscope": 16}
MINDIE_NPU_FRACTION = 0.8  # NPU_MEMORY_FRACTION default (MindIE-LLM docs, npuMemSize -1)
MINDIE_PREFILL_TOKENS = 8192  # maxPrefillTokens default
MAX_BATCHED_TOKENS = 1 << 24
DEFAULT_UTIL = 0.9  # vLLM's gpu_memory_utilization default
FRAMEWORK_LABELS = {"none": "no serving framework (plain)", "vllm": "vLLM", "sglang": "SGLang",
                    "vllm-ascend": "vllm-ascend", "mindie": "MindIE", "inferscope": "InferScope's engine"}
INFERSCOPE_MAX_BLOCK = 1024


VLLM_RULES = ("v0", "v1-early", "v1", "v1-graphs")  # oldest to newest (module doc)
SGLANG_RULES = ("0.4", "0.5")
DEFAULT_RULE = {"vllm": "v1-graphs", "sglang": "0.4"}
RULE_LABELS = {"v0": "vLLM < 0.8 (V0 engine)", "v1-early": "vLLM 0.8 - 0.9.1 (V1, early profiler)",
               "v1": "vLLM 0.9.2 - 0.20 (V1)", "v1-graphs": "vLLM >= 0.21 (V1, CUDA-graph estimate)",
               "0.4": "SGLang <= 0.4.x (fraction by TP)", "0.5": "SGLang 0.5.x (fraction from reserved memory)"}
# vLLM V1's "non-torch forward increase" at TP 1: 0.25 GiB on an H100 (vLLM 0.19.0 DEBUG log, llm-d-planner
# accuracy/results/v0.19.0; 0.24 GiB for Qwen2.5-7B), 0.30 GiB on an RTX 4090 (0.27.1): cuBLAS workspace etc.
V1_NON_TORCH = 256 * MiB
# With TP > 1 on NVSwitch H100/H200 (>= 450 GB/s links) vLLM 0.19 logs 2.07 GiB (TP 2) and 2.13 GiB (TP 4) of
# non-torch increase: NCCL's NVLink-SHARP buffers come on top. Elsewhere: aiconfigurator's NCCL buffers.
V1_NVLS_EXTRA = 1856 * MiB
NVLS_MIN_LINK = 450e9  # bytes/s per direction: H100/H200 SXM
# CUDA-graph estimate (>= 0.21): 0.84 GiB logged for Llama-3.1-8B (32 layers, 51 capture sizes, FULL_AND_PIECEWISE;
# llm-d-planner v0.19.0 log), scaled by layers (one piecewise graph per layer and size).
CUDAGRAPH_BYTES_PER_LAYER = int(0.84 * GiB / 32)
SGLANG_VLM_FACTOR = 0.95


_VERSION = re.compile(r"v?(\d{1,4})\.(\d{1,4})(?:\.(\d{1,4}))?(?:\.(\d{1,4}))?(?:[.+-]?(?:post|rc|dev|a|b)[0-9a-z.+]*)?")


def parse_version(framework: str, text: str | None) -> tuple[int, ...] | None:
    """'0.7', '0.10.1.1', 'v0.19.0', '0.4.3.post4' -> (0, 7), (0, 10, 1, 1), ...; None / '' / 'latest' -> None.
    Anything else is a SizingError naming the field."""
    if text is None:
        return None
    raw = str(text).strip().lower()
    if len(raw) > 40:
        raise SizingError(f"framework_version is too long ({len(raw):,} characters): write e.g. 0.7 or 0.10.1")
    if raw in ("", "auto", "latest", "default"):
        return None
    if framework not in DEFAULT_RULE and framework != "vllm-ascend":
        raise SizingError(f"framework_version {text!r} applies to vllm, sglang and vllm-ascend only, not {framework}")
    match = _VERSION.fullmatch(raw)
    if match is None:
        raise SizingError(f"framework_version {text!r} is not a version number (write e.g. 0.7, 0.10.1 or"
                          " 0.4.3.post4)")
    nums = [int(g) for g in match.groups() if g is not None]
    if nums[0] > 1:
        raise SizingError(f"framework_version {text!r}: {framework} versions start with 0. or 1.")
    return tuple(nums)


def version_rule(framework: str, version: tuple[int, ...] | None) -> str:
    """The budget rule for ``framework`` at ``version`` (module doc); '' for none / vllm-ascend."""
    if framework not in DEFAULT_RULE:
        return ""
    if version is None:
        return DEFAULT_RULE[framework]
    if framework == "sglang":
        return "0.4" if version < (0, 5) else "0.5"
    if version < (0, 8):
        return "v0"
    if version < (0, 9, 2):
        return "v1-early"
    return "v1" if version < (0, 21) else "v1-graphs"


def sglang_fraction_v05(gpu_mib: float, chunked_prefill: int, tp: int, pp: int) -> float:
    """SGLang 0.5.x default mem_fraction_static (server_args._handle_gpu_memory_settings):
    reserved MiB = 512 + max(chunked prefill, 2048) x 1.5 + cuda_graph_max_bs x 2 + tp x pp / 8 x 1024,
    at least 10,240 on > 60 GiB GPUs; cuda_graph_max_bs by GPU size (8 / 24-80 / 32-160 / 256-512)."""
    if gpu_mib < 20 * 1024:
        graph_bs = 8
    elif gpu_mib < 35 * 1024:
        graph_bs = 24 if tp < 4 else 80
    elif gpu_mib < 60 * 1024:
        graph_bs = 32 if tp < 4 else 160
    else:
        graph_bs = 256 if tp < 4 else 512
    reserved = 512 + max(chunked_prefill, 2048) * 1.5 + graph_bs * 2 + tp * pp / 8 * 1024
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return max(0.05, round((gpu_mib - reserved) / gpu_mib, 3))


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
    rule: str = ""  # VLLM_RULES / SGLANG_RULES entry ('' for none / vllm-ascend)
    version: str = ""  # the framework version asked for ('' = the default rule)
    context_bytes: int = 0  # CUDA context + libraries before the framework measures (preset runtime overhead)
    nvls: bool = False  # NVSwitch-class links (NCCL NVLink-SHARP buffers with TP > 1)
    multimodal: bool = False  # a vision-language model (SGLang lowers its fraction x 0.95)
    nominal_bytes: int = 0  # the board's memory (SGLang 0.5 sizes its fraction from it)
    version_nums: tuple[int, ...] | None = None  # the parsed version (None = the default / latest)

    @property
    def usable(self) -> int:
        """vLLM: total x min(util, usable share); otherwise total x usable share."""
        if self.framework in ("vllm", "vllm-ascend"):
            util = DEFAULT_UTIL if self.util is None else self.util
            return int(self.capacity * min(util, self.usable_fraction))
        if self.framework == "mindie":  # npuMemSize -1: total x NPU_MEMORY_FRACTION
            frac = MINDIE_NPU_FRACTION if self.util is None else self.util
            return int(self.capacity * min(frac, self.usable_fraction))
        return int(self.capacity * self.usable_fraction)

    @property
    def rule_label(self) -> str:
        """The rule in words ('' for none / vllm-ascend)."""
        return RULE_LABELS.get(self.rule, "")

    def static_fraction(self, tp: int, pp: int = 1) -> float:
        """SGLang's --mem-fraction-static: the caller's, else its default for this TP (and version)."""
        if self.util is not None:
            return self.util
        if self.rule == "0.5":
            gpu = self.nominal_bytes or self.capacity
            return sglang_fraction_v05(gpu / MiB, self.batched_tokens, tp, pp)
        return sglang_fraction(tp)

    def pool_fraction(self, tp: int, pp: int = 1) -> float:
        """The fraction SGLang applies: the flag's, x 0.95 for a vision-language model."""
        frac = self.static_fraction(tp, pp)
        return frac * SGLANG_VLM_FACTOR if self.multimodal else frac

    def overhead(self, devices: int, stage_layers: int) -> int:
        """Non-KV memory besides weights and activations, per device.
        vLLM >= 0.9.2: the non-torch increase while profiling (V1_NON_TORCH, + NCCL with TP), + the
        CUDA-graph estimate from 0.21; otherwise the CUDA context (preset) + NCCL buffers."""
        if self.rule in ("v1", "v1-graphs"):
            comm = 0 if devices <= 1 else (V1_NVLS_EXTRA if self.nvls else nccl_bytes(devices))
            graphs = CUDAGRAPH_BYTES_PER_LAYER * stage_layers if self.rule == "v1-graphs" else 0
            return V1_NON_TORCH + comm + graphs
        return self.context_bytes + nccl_bytes(devices)

    def mask_bytes(self, context: int) -> int:
        """The 310P dense attention mask (0 elsewhere)."""
        return ascend_mask_bytes(context) if self.ascend_310p_rules else 0

    def reserve_and_pool(self, weights: int, kv: int, activations: int, overhead: int, mask: int,
                         tp: int, pp: int = 1) -> tuple[int, int]:
        """(reserve, KV pool) on one device.
        sglang:      T = total - CUDA context (free memory when weights start loading);
                     pool = min(f x T - weights, usable - non-KV), f = pool_fraction;
                     reserve = max(0, total - f x T - activations - overhead)
        310P ascend: reserve = this workload's KV (the held-back half); pool = (usable - non-KV) / 2
        otherwise:   reserve = 0; pool = usable - non-KV"""
        non_kv = weights + activations + mask + overhead
        if self.framework == "sglang":
            static = int(self.pool_fraction(tp, pp) * (self.capacity - self.context_bytes))
            reserve = max(0, self.capacity - static - activations - overhead)
            return reserve, min(static - weights, self.usable - non_kv)
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
    if fw in ("vllm-ascend", "mindie") and not hw.is_ascend:
        raise SizingError(f"framework {fw!r} ({FRAMEWORK_LABELS[fw]}) runs on Ascend NPUs only; for {hw.name}"
                          " use vllm, sglang or none")
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
    if framework == "inferscope":
        return f"InferScope's engine takes a block_size of 1 to {INFERSCOPE_MAX_BLOCK:,}"
    if framework == "mindie":
        return f"MindIE's cacheBlockSize takes {', '.join(map(str, MINDIE_BLOCK_SIZES))} (128 is its default)"
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
    elif framework == "inferscope":
        allowed = range(1, INFERSCOPE_MAX_BLOCK + 1)
    elif framework == "vllm-ascend":
        allowed = ASCEND_BLOCK_SIZES
    elif framework == "mindie":
        allowed = MINDIE_BLOCK_SIZES
    else:
        allowed = VLLM_BLOCK_SIZES
    if block not in allowed:
        raise SizingError(f"block size {block:,} is not accepted: {accepted_block_sizes(framework)}")
    return block


def resolve_budget(hw: Hardware, framework: str | None, util: float | None, block_size: int | None,
                   max_num_batched_tokens: int | None, eta_memory: float | None, eta_compute: float | None,
                   remarks: Remarks, framework_version: str | None = None, multimodal: bool = False) -> Budget:
    """The rule for ``framework`` (at ``framework_version``) on ``hw``, every number checked against its range.
    Step token budget default: 8192 on >= 70 GiB devices under a framework, else 2048."""
    fw = _framework(hw, framework, remarks)
    version = parse_version(fw, framework_version)
    rule = version_rule(fw, version)
    if fw in ("vllm", "vllm-ascend"):
        util_ok: float | None = fraction_in("gpu_memory_utilization", DEFAULT_UTIL if util is None else util)
    elif fw == "sglang" and util is not None:
        util_ok = fraction_in("mem_fraction_static", util)
    elif fw == "mindie":
        util_ok = fraction_in("NPU_MEMORY_FRACTION", MINDIE_NPU_FRACTION if util is None else util)
    else:
        util_ok = None
    block = DEFAULT_BLOCK[fw] if block_size is None else check_block_size(fw, block_size)
    if max_num_batched_tokens is not None:
        batched = whole_number("max_num_batched_tokens", max_num_batched_tokens, 1, MAX_BATCHED_TOKENS)
    elif fw == "mindie":
        batched = MINDIE_PREFILL_TOKENS
    else:
        batched = 8192 if (hw.memory_bytes >= 70 * GiB and fw != "none") else 2048
    return Budget(
        framework=fw, util=util_ok, block=block, block_given=block_size is not None, batched_tokens=batched,
        eta_memory=fraction_in("memory efficiency", hw.eta_memory if eta_memory is None else eta_memory),
        eta_compute=fraction_in("compute efficiency", hw.eta_compute if eta_compute is None else eta_compute),
        ascend_310p_rules=fw == "vllm-ascend" and hw.is_310p, capacity=hw.memory_bytes,
        usable_fraction=hw.usable_fraction, rule=rule, version=str(framework_version or "").strip() if version else "",
        context_bytes=hw.runtime_overhead_bytes,
        nvls=hw.device_class == "nvidia-datacenter" and (hw.interconnect or 0) >= NVLS_MIN_LINK,
        multimodal=multimodal, nominal_bytes=hw.nominal_memory_bytes or hw.memory_bytes, version_nums=version)
