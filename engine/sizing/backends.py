"""Decode speed per serving backend, fitted to published measurements.

The roofline (bytes read per step / bandwidth) is an upper bound. What a backend reaches falls
further below it the faster the device (llama.cpp Q4_0 reaches 0.8 of an M1's bandwidth but 0.4
of an M1 Ultra's): a fixed cost per step (kernel launches, scheduling, sampling) that does not
shrink with bandwidth. So each backend gets one rule of two numbers:

    step = sum over stages max(bytes / (BW x eta x format factor), FLOPs / (peak x eta_compute))
           + TP/PP communication + t0

``format_factors``: whether the formats' dequantising-kernel factors (``WeightFormat.eta_factor``)
apply. For llama.cpp they do not: on the same chips F16, Q8_0 and Q4_0 fall on one line once t0
is counted (the #4167 table), so a factor would count the overhead twice. For vLLM the data
wants them (BF16 vs GPTQ-Int8 / Int4 on one A100).

Every row was fitted (least squares on the relative error, fewest points beyond 20 % first) to
the points of ``tests/data/decode_speeds.json`` named in ``fitted_on``, with the calculator's own
bytes per step; ``failing`` lists those points that stay beyond 20 %, kept in the data with their
figures. ``tests/fit_decode_speeds.py`` re-runs the fit. A backend without a row (vllm-ascend,
llama.cpp on Ascend) uses the hardware preset's ``efficiency.memory`` and no t0, as before; so
does any plan given an explicit memory efficiency (``Settings.eta_memory``, ``--efficiency-memory``).
"""
from __future__ import annotations

from dataclasses import dataclass

DATA_FILE = "tests/data/decode_speeds.json"


@dataclass(frozen=True)
class BackendRule:
    """One backend's decode rule and where it comes from."""

    key: str
    label: str
    eta: float  # share of the bandwidth the weight/KV reads reach
    t0_s: float  # fixed time per decode step, seconds
    format_factors: bool  # apply WeightFormat.eta_factor (dequantising kernels)
    fitted_on: tuple[str, ...]  # point ids in DATA_FILE
    failing: tuple[str, ...]  # of those, the ones beyond 20 % (kept, reported)
    worst_error: float  # the largest |expect / measured - 1| among the passing points
    sources: tuple[str, ...]
    note: str = ""

    @property
    def words(self) -> str:
        """'llama.cpp Metal: 0.92 of the bandwidth + 6.1 ms per step'"""
        return f"{self.label}: {self.eta:.2f} of the bandwidth + {self.t0_s * 1e3:.1f} ms per step"


def _ids(backend: str, *indices: int) -> tuple[str, ...]:
    return tuple(f"{backend}:{i}" for i in indices)


_METAL_IDS = _ids("llama.cpp-metal", *range(0, 84), 90)
_CUDA_IDS = _ids("llama.cpp-cuda", 93, 94, 95, 96, 97, 98, 99, 100, 101, 103, 104, 105, 107, 108, 110, 111, 112, 118,
                 123, 124, 125, 126, 127, 128)

BACKENDS: dict[str, BackendRule] = {r.key: r for r in (
    BackendRule(
        "llama.cpp-metal", "llama.cpp Metal", 0.915, 6.10e-3, False, _METAL_IDS,
        _ids("llama.cpp-metal", 79, 80, 90), 0.198,
        ("https://github.com/ggml-org/llama.cpp/discussions/4167", "https://github.com/ggml-org/llama.cpp/pull/2917",
         "https://github.com/ggml-org/llama.cpp/blob/master/benches/mac-m2-ultra/mac-m2-ultra.md"),
        "85 llama-bench tg rows, M1 to M5, F16 / Q8_0 / Q4_0 / Q4_1; failing: the M5 Max rows (faster than"
        " 546 GB/s allows with this t0) and a Qwen2.5-7B tg32 row with flash attention"),
    BackendRule(
        "llama.cpp-cuda", "llama.cpp CUDA", 0.815, 1.90e-3, False, _CUDA_IDS,
        _ids("llama.cpp-cuda", 93, 97, 99, 103, 128), 0.198,
        ("https://github.com/ggml-org/llama.cpp/discussions/15013", "https://github.com/ggml-org/llama.cpp/pull/4766",
         "https://github.com/ggml-org/llama.cpp/blob/master/benches/dgx-spark.md"),
        "24 rows from 448 GB/s to 3,350 GB/s and a batch 1-32 series; failing: RTX 5090 (both transcriptions)"
        " and 5070 Ti (faster than the fit), A100 80GB (slower; SXM preset assumed), batch 32 (compute starts)"),
    BackendRule(
        "llama.cpp-cpu", "llama.cpp CPU", 1.0, 21.40e-3, False,
        _ids("llama.cpp-cpu", 129, 131, 134, 135), _ids("llama.cpp-cpu", 131), 0.193,
        ("https://github.com/ggml-org/llama.cpp/issues/34", "https://github.com/ggml-org/llama.cpp/pull/8908",
         "https://llm-tracker.info/AMD-Strix-Halo-(Ryzen-AI-Max+-395)-GPU-Performance", "https://justine.lol/matmul/"),
        "4 points, two bandwidths derived from the memory type (not stated in the sources); the fit puts eta at its"
        " bound 1 and the rest in t0 (CPU decode is partly compute-bound): a rough rule"),
    BackendRule(
        "vllm-cuda", "vLLM (CUDA)", 0.80, 2.95e-3, True,
        _ids("vllm-cuda", *range(136, 172), 172), _ids("vllm-cuda", 159, 165, 166), 0.199,
        ("https://github.com/QwenLM/Qwen2.5/blob/main/docs/source/benchmark/speed_benchmark.rst",
         "https://github.com/gpustack/gpustack/blob/main/docs/performance-lab/qwen3-8b/h100-latency.md",
         "https://johnmusgrave.com/p/vllm-throughput-latency-sweep-on",
         "https://gist.github.com/jiangLLM/e95756b974f385846e4277b7ee68d6c8"),
        "37 points: Qwen2.5 0.5B-72B x BF16 / GPTQ-Int8 / Int4 / AWQ on A100 (vLLM 0.6.3, TP 1-4), a context"
        " sweep to 129k, Qwen3-8B on H100 at batch 1-8 (0.11), Llama-3.1-8B on A100 40GB; failing: 72B Int4"
        " on one GPU (16.5 tok/s, half the rule) and the 64k / 129k contexts (attention slower than its bytes)"),
    BackendRule(
        "sglang-cuda", "SGLang (CUDA)", 0.80, 1.35e-3, True,
        _ids("sglang-cuda", 174, 175, 176, 177, 178), (), 0.143,
        ("https://docs.sglang.io/advanced_features/speculative_decoding.html",
         "https://github.com/gpustack/gpustack/blob/main/docs/performance-lab/qwen3-8b/h100-latency.md"),
        "5 points, all on one H100 (batch 1 and 4, BF16 and FP8): one bandwidth cannot separate eta from t0, so"
        " eta is vLLM's and only t0 is fitted"),
    BackendRule(
        "mindie", "MindIE", 0.41, 4.20e-3, True,
        (*_ids("mindie", 183, 185, 186), "mindie:wjj-r1-qwen7b-b1", "mindie:llm-action-qwen72b-b1",
         "mindie:llm-action-qwen72b-b4"), _ids("mindie", 186), 0.130,
        ("https://github.com/vllm-project/vllm-ascend/issues/4395",
         "https://github.com/wang-junjian/wang-junjian.github.io/blob/1dd1ed73f5ea4ef7e0754e4e6879b25a9023d273/"
         "_posts/2025-07-19-Ascend-Atlas-800I-A2-Installation-Guide_MindIE-Install-and-Config.md",
         "https://github.com/liguodongiot/llm-action/blob/768ca6c70feeea24e64dd1edffce6918b6d2c98f/"
         "llm-localization/ascend/mindie/mindie-20240411.md"),
        "6 points on 910B / 910B4 with the 910B preset's bandwidth (unofficial, low confidence): two at batch 1"
        " (DeepSeek-R1-Distill-Qwen-7B TP 4, Qwen-72B-Chat TP 8), Qwen-72B at batch 4, and Qwen3-32B INT8 per user"
        " at 16 and 2 concurrent; eta is low against the 1,600 GB/s the preset assumes; failing: 64k context at"
        " 2 concurrent"),
)}


def serving_tool(framework: str, fmt_family: str, device_class: str) -> str:
    """The tool that serves a plan: llama.cpp for GGUF formats and, without a framework, on Apple / CPU /
    Jetson; otherwise the framework (the vLLM line when none was chosen). ``advice.serve_target`` says why."""
    if fmt_family == "gguf" or (framework == "none" and device_class in ("apple", "cpu", "nvidia-edge")):
        return "llama.cpp"
    return "vllm" if framework == "none" else framework


def backend_key(tool: str, device_class: str) -> str:
    """The backend of ``BACKENDS`` for a tool on a device class (llama.cpp on Apple = Metal, on CPU = CPU,
    on NVIDIA = CUDA); '' where no rule was fitted (vllm-ascend, llama.cpp on Ascend, custom devices)."""
    nvidia = device_class.startswith("nvidia")
    if tool == "llama.cpp":
        return {"apple": "llama.cpp-metal", "cpu": "llama.cpp-cpu"}.get(device_class, "llama.cpp-cuda" if nvidia else "")
    if tool in ("vllm", "sglang") and nvidia:
        return f"{tool}-cuda"
    return "mindie" if tool == "mindie" else ""


def backend_rule(tool: str, device_class: str) -> BackendRule | None:
    """The fitted rule for a tool on a device class, or None (the preset's efficiency applies)."""
    return BACKENDS.get(backend_key(tool, device_class))
