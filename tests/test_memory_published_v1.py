"""vLLM V1 and SGLang KV budgets against published startup logs (docs/calculator.md, "Accuracy against
vLLM V1 and SGLang logs").

One rule per framework version, nothing fitted per log: each case gives the published settings (model
config, GPU, TP, memory fraction, max_num_batched_tokens, max_num_seqs, version) and the logged KV-cache
token count; the calculator's ``kv_room_tokens`` must land within 5 %. Models without a preset carry their
config.json fields here (published fields only). A GPU whose total the log prints, or that ran under a
desktop (WSL / Docker Desktop) holding memory before the server started, is described from the log's own
figures (say so in ``why``); every other case uses the preset.

A case that misses is kept with ``fails`` = the reason and its figure, and the test asserts that it still
misses (so a change that fixes it is noticed): it is not dropped.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import pytest

from engine.memory import GiB, Settings, Workload, estimate, get_model, hardware_from_dict
from engine.sizing.models import model_preset_config, parse_config_text

# --- model configs (Hugging Face config.json fields, as published) -----------------------------------------
LLAMA_31_8B = model_preset_config("llama-3.1-8b")  # meta-llama/Llama-3.1-8B-Instruct, as its preset holds it
QWEN2_7B = {  # Qwen/Qwen2-7B-Instruct
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
    "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
    "max_position_embeddings": 32768, "rope_theta": 1000000.0, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "rms_norm_eps": 1e-6, "use_sliding_window": False,
}
R1_DISTILL_QWEN_7B = {**QWEN2_7B, "max_position_embeddings": 131072, "rope_theta": 10000}  # deepseek-ai/...-Qwen-7B
QWEN25_05B = {  # Qwen/Qwen2.5-0.5B-Instruct
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
    "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
    "max_position_embeddings": 32768, "rope_theta": 1000000.0, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "rms_norm_eps": 1e-6, "use_sliding_window": False,
}
QWQ_32B = {  # Qwen/QwQ-32B
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 5120, "intermediate_size": 27648,
    "num_hidden_layers": 64, "num_attention_heads": 40, "num_key_value_heads": 8, "vocab_size": 152064,
    "max_position_embeddings": 131072, "rope_theta": 1000000.0, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5, "use_sliding_window": False,
}
QWEN3_30B_A3B = {  # Qwen/Qwen3-30B-A3B-Instruct-2507-FP8 (the FP8 format is passed as weights="fp8")
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
    "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
    "decoder_sparse_step": 1, "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
    "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 262144, "rope_theta": 10000000,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "rms_norm_eps": 1e-6,
}
GEMMA3_4B_IT = {  # google/gemma-3-4b-it (Gemma3ForConditionalGeneration: SigLIP tower + Gemma-3 text model)
    "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "mm_tokens_per_image": 256,
    "torch_dtype": "bfloat16",
    "text_config": {"model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240,
                    "num_hidden_layers": 34, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                    "vocab_size": 262208, "max_position_embeddings": 131072, "sliding_window": 1024,
                    "sliding_window_pattern": 6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
                    "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "query_pre_attn_scalar": 256},
    "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152, "intermediate_size": 4304,
                      "num_hidden_layers": 27, "num_attention_heads": 16, "image_size": 896, "patch_size": 14},
}
CONFIGS = {"llama-3.1-8b": LLAMA_31_8B, "qwen2-7b": QWEN2_7B, "r1-distill-qwen-7b": R1_DISTILL_QWEN_7B,
           "qwen2.5-0.5b": QWEN25_05B, "qwq-32b": QWQ_32B, "qwen3-30b-a3b": QWEN3_30B_A3B,
           "gemma-3-4b-it": GEMMA3_4B_IT}


def _device(name: str, visible_gib: float, board_gib: int, held_gib: float, cls: str = "nvidia-consumer") -> dict:
    """A GPU as its log shows it: CUDA's total and what was held before the server started (CUDA context,
    plus a desktop's share under WSL / Docker Desktop) as the runtime overhead."""
    return {"name": name, "device_class": cls, "memory_gib": board_gib, "memory_visible_mib": visible_gib * 1024,
            "bandwidth_gb_s": 1000, "fp16_tflops": 100, "runtime_overhead_mb": held_gib * GiB / 1e6}


@dataclass(frozen=True)
class Log:
    id: str
    framework: str
    version: str
    model: str
    hardware: str | dict[str, Any]
    tokens: int  # logged KV-cache tokens
    source: str
    lines: tuple[str, ...]
    tp: int = 1
    util: float | None = None  # gpu_memory_utilization / mem_fraction_static as run (None: the default)
    context: int = 4096  # max_model_len
    batched: int | None = None  # max_num_batched_tokens / chunked prefill size
    seqs: int = 256  # max_num_seqs
    weights: str = "auto"
    why: str = ""  # how the device was described, where it is not the plain preset
    fails: str = ""  # the reason and figure, for a case the rule does not meet within 5 %


VLLM_LOGS = [
    Log("VL1", "vllm", "0.10.2", "qwen3-30b-a3b", "l40s", 566_016, tp=2, util=0.95, context=32768, batched=2048,
        weights="fp8",
        source="https://github.com/tim-roethig/ai-platform/blob/main/platform/docs/ollama_vs_vllm.md",
        lines=("vllm serve Qwen/Qwen3-30B-A3B-Instruct-2507-FP8 --tensor-parallel-size 2 --enable-expert-parallel"
               " --gpu-memory-utilization 0.95 --swap-space 0 --max-model-len 32K",
               "[gpu_worker.py:298] Available KV cache memory: 25.91 GiB",
               "[kv_cache_utils.py:864] GPU KV cache size: 566,016 tokens")),
    Log("VL2", "vllm", "0.10.1.1", "qwen2-7b", "a100-80gb", 93_872, util=0.25, context=16384, batched=2048,
        source="https://github.com/dennislee22/vLLM-benchmarking/blob/391660db66f5a6e44ea8ed82decf48a88e55e992"
               "/log/vllm-7B-1gpuA10080GB-0.25GRAM.log",
        lines=("[gpu_model_runner.py:2007] Model loading took 14.2488 GiB and 4.422213 seconds",
               "[gpu_worker.py:276] Available KV cache memory: 5.01 GiB",
               "[kv_cache_utils.py:849] GPU KV cache size: 93,872 tokens")),
    Log("VL3", "vllm", "0.10.1.1", "qwen2-7b", "a100-80gb", 464_848, util=0.50, context=16384, batched=2048,
        source="https://github.com/dennislee22/vLLM-benchmarking/blob/608c86e90fc1ab6071c6bb8a673046ab9cd65062"
               "/log/vllm-7B-1gpuA10080GB-0.5GRAM.log",
        lines=("[gpu_model_runner.py:2007] Model loading took 14.2488 GiB and 2.993822 seconds",
               "[gpu_worker.py:276] Available KV cache memory: 24.83 GiB",
               "[kv_cache_utils.py:849] GPU KV cache size: 464,848 tokens")),
    Log("VL4", "vllm", "0.10.1.1", "qwen2-7b", "a100-80gb", 1_192_160, tp=2, util=0.50, context=16384,
        batched=2048,
        source="https://github.com/dennislee22/vLLM-benchmarking/blob/e514a58512f7c1ced8a2bffb191be171e7ad99b2"
               "/log/vllm-7B-2gpuA10080GB-0.5GRAM-same-node.log",
        lines=("(VllmWorker TP0) [gpu_model_runner.py:2007] Model loading took 7.1217 GiB and 2.887189 seconds",
               "(VllmWorker TP0) [gpu_worker.py:276] Available KV cache memory: 31.83 GiB",
               "(EngineCore_0) [kv_cache_utils.py:849] GPU KV cache size: 1,192,160 tokens")),
    Log("VL5", "vllm", "0.10.1.1", "qwen2-7b", "a100-40gb", 412_944, tp=2, util=0.50, context=16384, batched=2048,
        source="https://github.com/dennislee22/vLLM-benchmarking/blob/89771826649777b1127b11adaf18514eb24ff099"
               "/log/vllm-7B-2gpuA10040GB-0.5GRAM-diff-nodes.log",
        lines=("(RayWorkerWrapper) [gpu_model_runner.py:2007] Model loading took 7.1217 GiB and 198.942282 seconds",
               "(RayWorkerWrapper) [gpu_worker.py:276] Available KV cache memory: 11.03 GiB",
               "(EngineCore_0) [kv_cache_utils.py:849] GPU KV cache size: 412,944 tokens"),
        why="TP 2 across two nodes (Ray, one A100 40GB each)",
        fails="+7.5 % (444,000 predicted): TP across two nodes over Ray; the log leaves 1.54 GiB of activations +"
              " non-torch memory (19.69 - 7.12 - 11.03) where the rule counts 0.74 GiB (forward 0.16 + non-torch"
              " 0.25 + NCCL 0.33); cross-node NCCL buffers are not modelled"),
    Log("VL7", "vllm", "0.19.0", "llama-3.1-8b", "h100-sxm", 476_016, util=0.95, context=16384, batched=8192,
        seqs=1024,
        source="https://github.com/llm-d-incubation/llm-d-planner/blob/d3121e059da88662db39a926a3ead964be97359b"
               "/accuracy/results/v0.19.0/logs/meta-llama-llama-3-1-8b--h100-80gb--tp1pp1dp1--16384.log",
        lines=("worker init memory snapshot: torch_peak=0.0GiB, free_memory=78.68GiB, total_memory=79.19GiB, ...",
               "Memory profiling takes 18.17 seconds. Total non KV cache memory: 17.12GiB; torch peak memory"
               " increase: 1.89GiB; non-torch forward increase memory: 0.25GiB; weights memory: 14.99GiB.",
               "[v1/worker/gpu_worker.py:436] Available KV cache memory: 58.11 GiB",
               "[v1/core/kv_cache_utils.py:1319] GPU KV cache size: 476,016 tokens")),
    Log("VL8", "vllm", "0.27.1", "qwen2.5-0.5b",
        _device("RTX 4090 (WSL2, as logged)", 23.99, 24, 1.54), 1_793_232, util=0.92, context=32768, batched=8192,
        source="find_string id 61815222665 (lab notes running orca3/llm-model-inference ch02 on an RTX 4090 under"
               " WSL2; repository path not resolved)",
        lines=("[model_runner.py:329] Model loading took 0.93 GiB and 6.206722 seconds",
               "[gpu_worker.py:563] Available KV cache memory: 20.52 GiB",
               "[kv_cache_utils.py:2235] GPU KV cache size: 1,793,232 tokens",
               "Free memory on device (22.45/23.99 GiB) on startup. Desired GPU memory utilization is (0.92, 22.07"
               " GiB). Actual usage is 1.23 GiB for consumed memory (weights + non-torch), 0.31 GiB for peak"
               " activation, and 0.0 GiB for CUDAGraph memory."),
        why="total 23.99 GiB as logged (WSL2)"),
]

SGLANG_LOGS = [
    Log("SG1", "sglang", "0.4.3.post4", "qwq-32b", "l4", 46_611, tp=4,
        source="https://github.com/didier-durand/llms-in-clouds/blob/b001c8690e894d234cf3a2e2345d259173acf293"
               "/docs/sglang.md",
        lines=("[TP0] Load weight begin. avail mem=21.63 GB",
               "[TP0] Load weight end. type=Qwen2ForCausalLM, dtype=torch.bfloat16, avail mem=6.09 GB,"
               " mem usage=15.54 GB.",
               "[TP0] KV Cache is allocated. #tokens: 46611, K size: 1.42 GB, V size: 1.42 GB")),
    Log("SG2", "sglang", "0.4.2", "r1-distill-qwen-7b", _device("RTX 3090 (Docker on Windows)", 23.58, 24, 0.82),
        105_531,
        source="https://github.com/jerryzsj/my-deepseek-r1 (README)",
        lines=("[TP0] Load weight begin. avail mem=22.76 GB",
               "[TP0] Load weight end. type=Qwen2ForCausalLM, dtype=torch.bfloat16, avail mem=8.37 GB",
               "[TP0] max_total_num_tokens=105531, chunked_prefill_size=2048, max_prefill_tokens=16384, ..."),
        why="RTX 3090 total 23.58 GiB (preset); 0.82 GiB held before load (Windows desktop + context), from"
            " 'Load weight begin. avail mem=22.76 GB'"),
    Log("SG3", "sglang", "0.4.1", "llama-3.1-8b", "h100-sxm", 444_500,
        source="https://docs.sglang.ai/start/send_request.html (as built 2025-01-23)",
        lines=("[TP0] Load weight begin. avail mem=78.81 GB",
               "[TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=63.72 GB",
               "[TP0] max_total_num_tokens=444500, max_prefill_tokens=16384, max_running_requests=2049, ...")),
    Log("SG4", "sglang", "0.4.9", "llama-3.1-8b", _device("24 GB GPU (Docker Desktop, Windows)", 23.64, 24, 1.25),
        38_141,
        source="https://github.com/MaxUhl98/Thesis/blob/main/inference_server/readme.md",
        lines=("Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=7.37 GB, mem usage=15.02 GB.",
               "KV Cache is allocated. #tokens: 38141, K size: 2.33 GB, V size: 2.33 GB"),
        why="a 24 GB card (RTX 4090 total 23.64 GiB assumed); 1.25 GiB held before load (7.37 + 15.02 = 22.39 GB"
            " free at 'Load weight begin')"),
    Log("SG5", "sglang", "0.5.8", "qwen2.5-0.5b", _device("RTX 4070 Ti SUPER 16GB (WSL2)", 15.99, 16, 1.29),
        107_319, util=0.15, context=2048,
        source="find_string id 52853901169 ('SGLang Model Gateway', 2026-04-14; reliability C)",
        lines=("Load weight begin. avail mem=14.70 GB",
               "Load weight end. type=Qwen2ForCausalLM, dtype=torch.bfloat16, avail mem=13.72 GB, mem usage=0.98 GB",
               "KV Cache is allocated. #tokens: 107319, K size: 0.61 GB, V size: 0.61 GB"),
        why="16 GB board (15.99 GiB total); 1.29 GiB held before load under WSL2 (avail mem=14.70 GB)"),
    Log("SG6", "sglang", "0.4.4", "llama-3.1-8b", "h100-sxm", 442_750,
        source="https://github.com/sgl-project/sglang/pull/4760",
        lines=("[TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=63.48 GB,"
               " mem usage=15.11 GB.",
               "[TP0] KV Cache is allocated. #tokens: 442750, K size: 27.02 GB, V size: 27.02 GB")),
    Log("SG7", "sglang", "0.4.4", "gemma-3-4b-it", "h200", 834_615,
        source="https://github.com/sgl-project/sglang/pull/4826 (comment, 2025-03-27)",
        lines=("[TP0] Load weight end. type=Gemma3ForConditionalGeneration, dtype=torch.bfloat16, avail mem=131.08 GB,"
               " mem usage=8.13 GB.",
               "[TP0] KV Cache is allocated. #tokens: 834615, K size: 54.12 GB, V size: 54.12 GB")),
]


def _model(key: str):
    return parse_config_text(json.dumps(CONFIGS[key]), key) if key in CONFIGS else get_model(key)


def predict(log: Log) -> dict[str, Any]:
    hw = hardware_from_dict(log.hardware, "logged-gpu") if isinstance(log.hardware, dict) else log.hardware
    est = estimate(_model(log.model), hw, Workload(context=log.context, batch=log.seqs),
                   Settings(framework=log.framework, framework_version=log.version, tp=log.tp, weights=log.weights,
                            gpu_memory_utilization=log.util, max_num_batched_tokens=log.batched), detail=False)
    return est.to_dict()


def _error(log: Log) -> float:
    return predict(log)["kv_room_tokens"] / log.tokens - 1


@pytest.mark.parametrize("log", VLLM_LOGS + SGLANG_LOGS, ids=lambda log: log.id)
def test_kv_tokens_within_5_percent_of_the_log(log):
    err = _error(log)
    if log.fails:
        assert abs(err) > 0.05, f"{log.id} now meets 5 % ({err:+.1%}): move it out of the failing cases"
    else:
        assert abs(err) <= 0.05, f"{log.id}: {err:+.1%}"


def test_enough_logs_per_framework():
    assert sum(1 for log in VLLM_LOGS if not log.fails) >= 5
    assert sum(1 for log in SGLANG_LOGS if not log.fails) >= 5
    for log in VLLM_LOGS + SGLANG_LOGS:
        assert log.source and log.lines and any(f"{log.tokens:,}" in line or str(log.tokens) in line
                                                for line in log.lines), log.id


# --- the version field -------------------------------------------------------------------------------------
@pytest.mark.parametrize("framework, version, rule", [
    ("vllm", None, "v1-graphs"), ("vllm", "", "v1-graphs"), ("vllm", "latest", "v1-graphs"),
    ("vllm", "0.6.4", "v0"), ("vllm", "0.7.3", "v0"), ("vllm", "v0.8.5.post1", "v1-early"), ("vllm", "0.9.1", "v1-early"),
    ("vllm", "0.9.2", "v1"), ("vllm", "0.10.1.1", "v1"), ("vllm", "0.20.2rc1", "v1"), ("vllm", "0.21", "v1-graphs"),
    ("vllm", "0.27.1", "v1-graphs"), ("sglang", None, "0.4"), ("sglang", "0.4.3.post4", "0.4"), ("sglang", "0.5.8", "0.5"),
])
def test_versions_pick_the_rule(framework, version, rule):
    est = estimate("llama-3-8b", "a100-80gb", Workload(), Settings(framework=framework, framework_version=version),
                   detail=False)
    assert est.budget_rule == rule
    assert any(n.startswith("budget rule: ") for n in est.notes)


@pytest.mark.parametrize("framework, version, message", [
    ("vllm", "seven", "framework_version 'seven' is not a version number"),
    ("vllm", "0", "framework_version '0' is not a version number"),
    ("vllm", "0.7.x", "framework_version '0.7.x' is not a version number"),
    ("vllm", "2.0", "framework_version '2.0': vllm versions start with 0. or 1."),
    ("sglang", "0." + "1" * 60, "framework_version is too long"),
    ("none", "0.7", "framework_version '0.7' applies to vllm, sglang and vllm-ascend only, not none"),
])
def test_a_bad_version_names_the_field(framework, version, message):
    from engine.memory import SizingError
    with pytest.raises(SizingError, match=re.escape(message)):
        estimate("llama-3-8b", "a100-80gb", Workload(), Settings(framework=framework, framework_version=version),
                 detail=False)


def test_v0_and_v1_differ_where_the_rules_say():
    """Same deployment, three rules: V0 reserves the sampler (256 seqs x 152,064 logits x 38.8 B) and the
    CUDA context; V1 the forward and the non-torch increase; >= 0.21 also the CUDA-graph estimate."""
    runs = {v: predict(Log("x", "vllm", v, "qwen2-7b", "a100-80gb", 1, util=0.5, context=16384, batched=2048,
                           source="-", lines=("-",))) for v in ("0.7", "0.10.1", "0.21")}
    assert runs["0.7"]["activation_bytes"] > runs["0.10.1"]["activation_bytes"]
    assert runs["0.10.1"]["overhead_bytes"] == 256 * 2**20
    assert runs["0.21"]["overhead_bytes"] == 256 * 2**20 + 28 * int(0.84 * GiB / 32)
    assert runs["0.7"]["kv_room_tokens"] < runs["0.21"]["kv_room_tokens"] < runs["0.10.1"]["kv_room_tokens"]


def test_sglang_05_default_fraction_from_reserved_memory():
    # H100 (80 GiB board = 81,920 MiB): reserved = 512 + 8,192 x 1.5 + 256 x 2 + 1 / 8 x 1,024 = 13,440 MiB
    est = estimate("llama-3-8b", "h100-sxm", Workload(), Settings(framework="sglang", framework_version="0.5"),
                   detail=False)
    assert "--mem-fraction-static 0.836 " in est.serve_command + " "
    old = estimate("llama-3-8b", "h100-sxm", Workload(), Settings(framework="sglang"), detail=False)
    assert "--mem-fraction-static 0.88 " in old.serve_command + " "


def test_vl7_torch_peak_is_not_the_forward():
    """A known gap (docs/calculator.md): vLLM 0.19 logged a 1.89 GiB torch peak for VL7; the V1 rule counts the
    forward, 0.84 GiB. The KV tokens still land within 5 % (above)."""
    from engine.sizing.activations import forward_peak
    assert forward_peak(_model("llama-3.1-8b"), 8192, 2) / GiB == pytest.approx(0.84, abs=0.01)


def test_the_comparison_keeps_the_version_where_the_device_runs_that_framework():
    from engine.memory import compare_hardware
    rows = {r.hardware: r for r in compare_hardware("llama-3-8b", ["h100-sxm", "atlas-300v-pro", "apple-m2-ultra"],
                                                   Workload(), Settings(framework_version="0.7"))}
    assert not any(r.error for r in rows.values()), rows
    one = estimate("llama-3-8b", "h100-sxm", Workload(), Settings(framework_version="0.7"), detail=False)
    assert rows["h100-sxm"].total_gib == pytest.approx(one.total_bytes_per_device / GiB)
