"""Advice attached to an answer: which other formats to try and how they do, what would make it
fit (computed by re-running the plan, not guessed), and the command line that serves it (and
which tool that line is for). The formulas with their numbers are in ``formulas``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .budget import DEFAULT_UTIL, FRAMEWORK_LABELS, MINDIE_NPU_FRACTION
from .formats import WEIGHT_FORMATS, SizingError, torch_dtype_name
from .plan import Plan
from .result import Estimate, FormatOption
from .precision import INFERSCOPE_KV, sixteen_bit
from .units import ceil_exact, gib



@dataclass(frozen=True)
class ServeTarget:
    """Which tool the serve line is for, and why when it is not the framework that was sized."""

    tool: str  # "vllm" | "vllm-ascend" | "sglang" | "mindie" | "llama.cpp"
    label: str  # for people: "vLLM", "llama.cpp", ...
    why: str  # "" when it is the sized framework

    @property
    def heading(self) -> str:
        """ "vLLM", or "llama.cpp, not vLLM: <why>" """
        return f"{self.label}, {self.why}" if self.why else self.label


def _alt_formats(plan: Plan) -> list[str]:
    """The current format, the 16-bit baseline, and the usual smaller ones this hardware can run."""
    hw, fw = plan.hw, plan.framework
    keys = [plan.fmt.key, sixteen_bit(hw, plan.model.checkpoint_dtype)]
    # FP8 natively, or weight-only (Marlin) on NVIDIA Ampere and newer (BF16 support marks them)
    if hw.supports_fp8 or (hw.device_class in ("nvidia-datacenter", "nvidia-consumer") and hw.supports_bf16):
        keys.append("fp8")
    keys += ["w8a8", "int4"]
    if fw == "none":
        keys += ["q8_0", "q4_k_m"]
    return list(dict.fromkeys(keys))


def _support_note(plan: Plan, key: str) -> str:
    hw, fw = plan.hw, plan.framework
    if key not in WEIGHT_FORMATS:  # the checkpoint's own quantized format: its kernel was checked
        return f"the checkpoint's format ({plan.fmt.vllm_quantization} kernels)"
    if hw.is_310p:
        return {"fp16": "supported", "w8a8": "supported (msmodelslim W8A8 / W8A8SC)"}.get(
            key, "not documented for 310P")
    if key == "fp8" and not hw.supports_fp8:
        return "weight-only (no FP8 units)"
    if key == "w8a8" and not hw.int8_ops:
        return "no INT8 units"
    if WEIGHT_FORMATS[key].family == "gguf":
        return "llama.cpp" if fw == "none" else "llama.cpp (vLLM gguf is experimental)"
    return "supported"


def _with(plan: Plan, **changes: Any) -> Plan:
    """The same plan with some settings changed (re-resolved from scratch)."""
    return Plan(plan.model, plan.hw, plan.workload_in, replace(plan.settings, **changes))


def serve_target(plan: Plan) -> ServeTarget:
    """The tool the command line is for. llama.cpp for GGUF formats (vLLM's GGUF loader is
    experimental and single-file) and, without a framework, on Apple / CPU / Jetson; without a
    framework on GPUs and NPUs, the vLLM (or vllm-ascend) line for the same workload."""
    fw, fmt = plan.framework, plan.fmt
    tool = plan.serving_tool  # backends.serving_tool: the same choice the decode speed follows
    if tool == "llama.cpp":
        if fmt.family != "gguf" or fw == "none":
            return ServeTarget("llama.cpp", "llama.cpp", "")
        asked = FRAMEWORK_LABELS[fw]
        return ServeTarget("llama.cpp", "llama.cpp",
                           f"not {asked}: {fmt.label} is llama.cpp's format ({asked}'s GGUF loader is experimental)")
    if fw == "none":
        return ServeTarget("vllm", "vLLM", "sized without a framework; the vLLM line for the same workload")
    return ServeTarget(fw, FRAMEWORK_LABELS[fw], "")


def serve_len(plan: Plan) -> int:
    """The context the serve command asks for: the sized context, capped at the model's own limit
    (``ModelSpec.max_model_len``: max_position_embeddings, rope-scaled where rope_scaling extends
    it). A server refuses a longer one, so the command never asks for it; the sizing keeps the
    context asked for and warns (``workload``)."""
    limit = plan.model.max_model_len
    return plan.context if not limit else min(plan.context, limit)


def serve_len_note(plan: Plan) -> str:
    """Words for a capped serve length ("" when the command asks for the sized context)."""
    n = serve_len(plan)
    if n == plan.context:
        return ""
    return (f"the command asks for {n:,} tokens per sequence, not {plan.context:,}: the model has"
            f" {plan.model.positions_text}")


def _llama_server(plan: Plan) -> str:
    m, fmt, kv = plan.model, plan.fmt, plan.kv
    name = (m.hf_id or m.display_name).split("/")[-1]
    quant = fmt.key.upper() if fmt.family == "gguf" else "Q8_0"
    parts = [f"llama-server -m {name}-{quant}.gguf", f"-c {plan.batch * serve_len(plan)}", f"-np {plan.batch}", "-ngl 999"]
    if kv.key in ("q8_0", "q4_0"):
        parts.append(f"--cache-type-k {kv.key} --cache-type-v {kv.key}")
    if m.vision:
        parts.append(f"--mmproj mmproj-{name}-f16.gguf")
    return " ".join(parts)


def _fraction(x: float) -> str:
    """0.88 -> '0.88', 0.835 -> '0.835' (SGLang 0.5's defaults have three decimals)."""
    return f"{x:.2f}" if round(x, 2) == round(x, 3) else f"{x:.3f}"


def _sglang(plan: Plan) -> str:
    m, fmt, b = plan.model, plan.fmt, plan.budget
    parts = ["python -m sglang.launch_server", f"--model-path {m.hf_id or m.display_name}"]
    if m.trust_remote_code:
        parts.append("--trust-remote-code")
    parts += [f"--dtype {torch_dtype_name(plan.precision.act_dtype)}", f"--context-length {serve_len(plan)}",
              f"--max-running-requests {plan.batch}", f"--mem-fraction-static {_fraction(b.static_fraction(plan.tp, plan.pp))}",
              f"--chunked-prefill-size {plan.batched_tokens}"]
    if plan.tp > 1:
        parts.append(f"--tp-size {plan.tp}")
    if plan.pp > 1:
        parts.append(f"--pp-size {plan.pp}")
    if fmt.sglang_quantization and fmt.family != "float":
        parts.append(f"--quantization {fmt.sglang_quantization}")
    if plan.kv.sglang_name and plan.kv.sglang_name != "auto":
        parts.append(f"--kv-cache-dtype {plan.kv.sglang_name}")
    if b.block_given:
        parts.append(f"--page-size {b.block}")
    return " ".join(parts)


def _vllm(plan: Plan, ascend: bool) -> str:
    m, fmt, b = plan.model, plan.fmt, plan.budget
    parts = ["PYTORCH_NPU_ALLOC_CONF=max_split_size_mb:256"] if ascend else []
    parts += ["vllm serve", m.hf_id or m.display_name]
    if m.trust_remote_code:
        parts.append("--trust-remote-code")
    parts.append(f"--dtype {torch_dtype_name(plan.precision.act_dtype)}")
    if fmt.family != "float":
        q = "ascend" if ascend else fmt.vllm_quantization
        if q:
            parts.append(f"--quantization {q}")
    if plan.kv.vllm_name and plan.kv.vllm_name != "auto":
        parts.append(f"--kv-cache-dtype {plan.kv.vllm_name}")
    util = b.util if b.util is not None else DEFAULT_UTIL
    parts += [f"--max-model-len {serve_len(plan)}", f"--max-num-seqs {plan.batch}",
              f"--max-num-batched-tokens {max(plan.batched_tokens, 1)}", f"--gpu-memory-utilization {util:.2f}"]
    if plan.tp > 1:
        parts.append(f"--tensor-parallel-size {plan.tp}")
    if plan.pp > 1:
        parts.append(f"--pipeline-parallel-size {plan.pp}")
    if ascend:
        parts.append(f"--block-size {b.block}")
        if plan.hw.is_310p and b.version_nums is not None and b.version_nums < ASCEND_310P_GRAPH_VERSION:
            parts.append("--enforce-eager")
    elif b.block_given:
        parts.append(f"--block-size {b.block}")
    if m.vision:
        parts.append(f"--limit-mm-per-prompt '{{\"image\": {max(1, plan.work.images)}}}'")
    return " ".join(parts)


# vllm-ascend on 310P: the v0.10.x images' tutorial runs every example with --enforce-eager; the
# v0.18.0rc1-310p image supports FULL_DECODE_ONLY graph mode and its examples drop the flag
# (vllm-ascend docs/source/tutorials/310p.md vs tutorials/hardwares/310p.md). Releases in between were not
# checked, so "older than 0.18" is eager; the default (latest) prints no flag.
ASCEND_310P_GRAPH_VERSION = (0, 18)
MINDIE_CONFIG = "$MIES_INSTALL_PATH/conf/config.json"  # .run install: {MindIE}/latest/mindie-service/conf


def _mindie(plan: Plan) -> str:
    """MindIE: the config.json fields that matter, as jq edits, then ``mindieservice_daemon`` (MindIE-LLM
    docs: npuMemSize -1 = KV from NPU_MEMORY_FRACTION; maxInputTokenLen <= maxSeqLen - 1; maxPrefillTokens
    >= maxInputTokenLen; cacheBlockSize in ScheduleConfig)."""
    m, b = plan.model, plan.budget
    seq = serve_len(plan)
    inp = max(1, min(plan.prompt_total, seq - 1))
    devices = plan.tp * plan.pp
    ids = ",".join(str(i) for i in range(devices))
    edits = [f".BackendConfig.npuDeviceIds = [[{ids}]]",
             f".BackendConfig.ModelDeployConfig.maxSeqLen = {seq}",
             f".BackendConfig.ModelDeployConfig.maxInputTokenLen = {inp}",
             f".BackendConfig.ModelDeployConfig.ModelConfig[0].modelWeightPath = \"/models/{(m.hf_id or m.display_name).split('/')[-1]}\"",
             f".BackendConfig.ModelDeployConfig.ModelConfig[0].worldSize = {devices}",
             ".BackendConfig.ModelDeployConfig.ModelConfig[0].npuMemSize = -1",
             f".BackendConfig.ScheduleConfig.cacheBlockSize = {b.block}",
             f".BackendConfig.ScheduleConfig.maxPrefillTokens = {max(plan.batched_tokens, inp)}",
             f".BackendConfig.ScheduleConfig.maxBatchSize = {plan.batch}"]
    env = "" if b.util is None or b.util == MINDIE_NPU_FRACTION else f"NPU_MEMORY_FRACTION={b.util:.2f} "
    return (f"jq '{' | '.join(edits)}' {MINDIE_CONFIG} > config.tmp && mv config.tmp {MINDIE_CONFIG}"
            f" && cd $MIES_INSTALL_PATH && {env}./bin/mindieservice_daemon")


#: the models InferScope's engine bundles by name (engine/model/loader.py); any other is a local folder
ENGINE_MODELS = ("smollm2-135m",)


def _inferscope(plan: Plan) -> str:
    """This project's engine with the plan's pool: ``LLM`` with the engine's own knob names."""
    m, b = plan.model, plan.budget
    kv = next(name for name, key in INFERSCOPE_KV.items() if key == plan.kv.key)  # the engine's kv_cache_dtype
    blocks = max(1, plan.batch * -(-serve_len(plan) // b.block))
    name = m.key if m.key in ENGINE_MODELS else m.checkpoint.path if m.checkpoint else f"<local folder of {m.hf_id or m.display_name}>"
    return (f"python -c \"from engine import LLM; llm = LLM('{name}', kv_cache_dtype='{kv}',"
            f" block_size={b.block}, num_blocks={blocks}, max_num_seqs={plan.batch},"
            f" max_num_batched_tokens={max(plan.batched_tokens, 1)})\"")


def serve_command(plan: Plan) -> str:
    """The command line that serves this plan, for the tool ``serve_target`` names."""
    tool = serve_target(plan).tool
    if tool == "inferscope":
        return _inferscope(plan)
    if tool == "llama.cpp":
        return _llama_server(plan)
    if tool == "sglang":
        return _sglang(plan)
    if tool == "mindie":
        return _mindie(plan)
    return _vllm(plan, ascend=tool == "vllm-ascend")


def format_alternatives(plan: Plan) -> list[FormatOption]:
    """Each of ``_alt_formats`` sized on the same hardware and workload (re-running the plan)."""
    rows = []
    for key in _alt_formats(plan):
        try:
            alt = plan if key == plan.fmt.key else _with(plan, weights=key)
        except SizingError:
            continue
        mem = alt.memory(alt.batch, alt.context)
        worst = max(mem, key=lambda s: s.over)
        sp = alt.speed(alt.batch, alt.context)
        roof = alt.speed(alt.batch, alt.context, efficiency=False)
        rows.append(FormatOption(
            format=key, label=alt.fmt.label, weight_bytes=ceil_exact(alt.weights.total),
            total_bytes_per_device=worst.total, fits=all(s.fits for s in mem),
            kv_room_tokens=min(s.kv_room_tokens for s in mem), decode_tokens_per_s=sp.decode_tokens_per_s,
            decode_tokens_per_s_roofline=roof.decode_tokens_per_s, prefill_seconds=sp.prefill_s,
            support=_support_note(plan, key), current=key == plan.fmt.key))
    return rows


def format_suggestions(plan: Plan, est: Estimate) -> list[str]:
    """What would make it fit, each checked by re-running the plan: the largest smaller format
    that fits, more devices, a shorter context, fewer sequences, an FP8 KV cache."""
    if est.fits:
        return []
    out = []
    unit = "chip" if plan.hw.devices_per_card > 1 else "device"
    # a smaller format: the largest one that fits
    candidates = sorted((r for r in est.alternatives if r.fits and not r.current), key=lambda r: -r.weight_bytes)
    if candidates:
        r = candidates[0]
        out.append(f"use {r.label}: {gib(r.total_bytes_per_device)} per {unit}, fits"
                   f" (decode ≈ {r.decode_tokens_per_s:.1f} tok/s; {r.support})")
    if est.devices_needed:
        out.append(f"use {est.devices_needed} {unit}s (tp {est.devices_needed_tp}, pp {est.devices_needed_pp})")
    if 0 < est.max_context < est.context:
        out.append(f"shorten the context to {est.max_context:,} tokens at {est.batch} sequence(s)")
    if 0 < est.max_batch < est.batch:
        out.append(f"serve at most {est.max_batch:,} sequences at {est.context:,} tokens")
    if plan.model.has_kv and plan.kv.bytes_per_elem >= 2 and not (plan.hw.is_ascend or plan.hw.device_class == "apple"):
        try:
            alt = _with(plan, kv_dtype="fp8")
            if alt.fits(alt.batch, alt.context):
                out.append("use an FP8 KV cache (--kv-cache-dtype fp8): halves the KV bytes")
        except SizingError:
            pass
    if not out:
        out.append("nothing within reach fits: a smaller model, or more memory per device")
    return out
