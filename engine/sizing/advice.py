"""Advice attached to an answer: which other formats to try and how they do, what would make it
fit (computed by re-running the plan, not guessed), the command line that serves it, and every
formula with its numbers filled in.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from .budget import DEFAULT_UTIL, FRAMEWORK_LABELS
from .formats import WEIGHT_FORMATS, SizingError, torch_dtype_name
from .plan import ACT_COEFF, Plan, Speed, nccl_bytes
from .precision import sixteen_bit
from .units import ceil_exact, fmt_bytes, gib, rate, round_up

if TYPE_CHECKING:
    from .estimate import Estimate


@dataclass(frozen=True)
class FormatOption:
    """One weight format tried on the same hardware and workload (a row of "Other formats")."""

    format: str
    label: str
    weight_bytes: int
    total_bytes_per_device: int
    fits: bool
    kv_room_tokens: int
    decode_tokens_per_s: float
    decode_tokens_per_s_roofline: float
    prefill_seconds: float
    support: str  # "supported", or what limits it here
    current: bool


@dataclass(frozen=True)
class ServeTarget:
    """Which tool the serve line is for, and why when it is not the framework that was sized."""

    tool: str  # "vllm" | "vllm-ascend" | "sglang" | "llama.cpp"
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
    fw, fmt, hw = plan.framework, plan.fmt, plan.hw
    if fmt.family == "gguf":
        if fw == "none":
            return ServeTarget("llama.cpp", "llama.cpp", "")
        asked = FRAMEWORK_LABELS[fw]
        return ServeTarget("llama.cpp", "llama.cpp",
                           f"not {asked}: {fmt.label} is llama.cpp's format ({asked}'s GGUF loader is experimental)")
    if fw == "none" and hw.device_class in ("apple", "cpu", "nvidia-edge"):
        return ServeTarget("llama.cpp", "llama.cpp", "")
    if fw == "none":
        return ServeTarget("vllm", "vLLM", "sized without a framework; the vLLM line for the same workload")
    return ServeTarget(fw, FRAMEWORK_LABELS[fw], "")


def _llama_server(plan: Plan) -> str:
    m, fmt, kv = plan.model, plan.fmt, plan.kv
    name = (m.hf_id or m.display_name).split("/")[-1]
    quant = fmt.key.upper() if fmt.family == "gguf" else "Q8_0"
    parts = [f"llama-server -m {name}-{quant}.gguf", f"-c {plan.batch * plan.context}", f"-np {plan.batch}", "-ngl 999"]
    if kv.key in ("q8_0", "q4_0"):
        parts.append(f"--cache-type-k {kv.key} --cache-type-v {kv.key}")
    if m.vision:
        parts.append(f"--mmproj mmproj-{name}-f16.gguf")
    return " ".join(parts)


def _sglang(plan: Plan) -> str:
    m, fmt, b = plan.model, plan.fmt, plan.budget
    parts = ["python -m sglang.launch_server", f"--model-path {m.hf_id or m.display_name}"]
    if m.trust_remote_code:
        parts.append("--trust-remote-code")
    parts += [f"--dtype {torch_dtype_name(plan.precision.act_dtype)}", f"--context-length {plan.context}",
              f"--max-running-requests {plan.batch}", f"--mem-fraction-static {b.static_fraction(plan.tp):.2f}",
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
    parts += [f"--max-model-len {plan.context}", f"--max-num-seqs {plan.batch}",
              f"--max-num-batched-tokens {max(plan.batched_tokens, 1)}", f"--gpu-memory-utilization {util:.2f}"]
    if plan.tp > 1:
        parts.append(f"--tensor-parallel-size {plan.tp}")
    if plan.pp > 1:
        parts.append(f"--pipeline-parallel-size {plan.pp}")
    if ascend:
        parts.append(f"--block-size {b.block}")
        if plan.hw.is_310p:
            parts.append("--enforce-eager")
    elif b.block_given:
        parts.append(f"--block-size {b.block}")
    if m.vision:
        parts.append(f"--limit-mm-per-prompt '{{\"image\": {max(1, plan.work.images)}}}'")
    return " ".join(parts)


def serve_command(plan: Plan) -> str:
    """The command line that serves this plan, for the tool ``serve_target`` names."""
    tool = serve_target(plan).tool
    if tool == "llama.cpp":
        return _llama_server(plan)
    if tool == "sglang":
        return _sglang(plan)
    return _vllm(plan, ascend=tool == "vllm-ascend")


def _alternatives(plan: Plan) -> list[FormatOption]:
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
            format=key, label=WEIGHT_FORMATS[key].label, weight_bytes=ceil_exact(alt.weights.total),
            total_bytes_per_device=worst.total, fits=all(s.fits for s in mem),
            kv_room_tokens=min(s.kv_room_tokens for s in mem), decode_tokens_per_s=sp.decode_tokens_per_s,
            decode_tokens_per_s_roofline=roof.decode_tokens_per_s, prefill_seconds=sp.prefill_s,
            support=_support_note(plan, key), current=key == plan.fmt.key))
    return rows


def _suggestions(plan: Plan, est: Estimate) -> list[str]:
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


def _formulas(plan: Plan, est: Estimate, sp: Speed, roof: Speed) -> dict[str, str]:
    """Every formula of the answer with its numbers filled in (name -> text)."""
    m, hw, prec, b = plan.model, plan.hw, plan.precision, plan.budget
    f: dict[str, str] = {}
    f["parameters"] = "\n".join(list(m.param_formula) + [
        f"embeddings V*h = {m.vocab:,}*{m.hidden:,} = {m.embed_params:,}"
        + (" (tied: the LM head shares it)" if m.tied else f"; LM head V*h = {m.lm_head_params:,}"),
        f"total = {est.params_total:,}; active per token = {est.params_active:,}"])
    fmt = plan.fmt
    wline = (f"weights = layers' matmul params x {float(fmt.bytes_per_param):.4g} B ({fmt.label})"
             f" + embeddings/LM head x {float(fmt.bytes_per_param if fmt.quantizes_embeddings else prec.small_bytes):.4g} B"
             f" + norms/biases x {float(prec.small_for_layers):.4g} B")
    if m.vision:
        wline += f" + vision/projector {m.vision.total_params:,} x {float(prec.vision_fmt.bytes_per_param):.4g} B ({prec.vision_fmt.label})"
    wline += f" = {est.weight_bytes:,} B = {gib(est.weight_bytes)}"
    if prec.exact_scale is not None:
        wline += " (scaled to the exact safetensors bytes)"
    if est.devices > 1:
        wline += f"; per device (tp {plan.tp}, pp {plan.pp}, worst stage) = {gib(est.weight_bytes_per_device)}"
    f["weights"] = wline
    kv = plan.kv
    if m.has_kv:
        f["kv_per_token"] = (m.kv_formula + f"; x {float(kv.bytes_per_elem):.4g} B ({kv.label})"
                             + (f" + scales 4 B per head per layer" if kv.per_head_scale_bytes else "")
                             + f" = {est.kv_bytes_per_token:,} B/token = {fmt_bytes(est.kv_bytes_per_token)}")
        windows = sorted({lay.window for lay in m.layers if lay.window})
        wtxt = f"; sliding layers hold min(S, {', '.join(f'{w:,}' for w in windows)}) tokens" if windows else ""
        f["kv_total"] = (f"KV = B x ceil(S/block)*block x KV/token = {est.batch} x {round_up(est.context, b.block):,}"
                         f" x {est.kv_bytes_per_token:,}{wtxt} = {est.kv_bytes:,} B = {gib(est.kv_bytes)}"
                         + (f"; per device {gib(est.kv_bytes_per_device)}" if est.devices > 1 else ""))
    else:
        f["kv_per_token"] = m.kv_formula + f"; x {float(kv.bytes_per_elem):.4g} B"
        f["kv_total"] = f"state = B x state/sequence = {est.kv_bytes:,} B = {gib(est.kv_bytes)} (independent of context)"
    ap = plan.activation_parts(est.batch)
    act = (f"activations = {prec.act_bytes} B x {ap.tokens:,} tokens x max(h, nh*d) {max(m.hidden, m.num_heads * m.head_dim):,}"
           f" x {ACT_COEFF} = {fmt_bytes(ap.llm)} + logits B x V x 4 = {est.batch} x {m.vocab:,} x 4 = {fmt_bytes(ap.logits)}")
    if ap.vision and m.vision:
        act += (f" + vision {plan.work.images} x {plan.work.tiles} tiles x {m.vision.patch_tokens} tokens x {m.vision.hidden}"
                f" x {prec.act_bytes} B x {ACT_COEFF} = {fmt_bytes(ap.vision)}")
    act += f" = {fmt_bytes(est.activation_bytes)}"
    act += ("  (vLLM profiles at max_num_batched_tokens)" if plan.framework in ("vllm", "vllm-ascend")
            else "  (SGLang: chunked prefill size)" if plan.framework == "sglang"
            else "  (prefill in chunks of at most this many tokens)")
    f["activations"] = act
    f["overhead"] = (f"overhead = runtime context {hw.runtime_overhead_bytes / 1e6:,.0f} MB"
                     + (f" + NCCL/HCCL buffers {fmt_bytes(nccl_bytes(est.devices))}" if est.devices > 1 else "")
                     + f" = {fmt_bytes(est.overhead_bytes)}")
    cap = hw.memory_bytes
    if plan.framework in ("vllm", "vllm-ascend"):
        budget = f"usable = gpu_memory_utilization x total = {b.util or DEFAULT_UTIL:.2f} x {gib(cap)} = {gib(est.usable_bytes_per_device)}"
        if hw.usable_fraction < 1:
            budget += f" (capped at the unified-memory share {hw.usable_fraction:.2f})"
    elif plan.framework == "sglang":
        frac = b.static_fraction(plan.tp)
        budget = (f"SGLang: weights + KV pool <= mem_fraction_static x total = {frac:.2f} x {gib(cap)} = {gib(frac * cap)};"
                  f" reserve = (1 - {frac:.2f}) x total - activations - overhead = {gib(est.reserve_bytes)}")
    else:
        budget = (f"usable = device memory {gib(cap)}" + (f" x unified-memory share {hw.usable_fraction:.2f}"
                                                          if hw.usable_fraction < 1 else "")
                  + f" = {gib(est.usable_bytes_per_device)}")
    if b.ascend_310p_rules:
        budget += (f"; 310P mask = max_model_len^2 x 2 = {est.context:,}^2 x 2 = {fmt_bytes(est.mask_bytes)};"
                   f" KV pool = (usable - weights - activations - mask - overhead) / 2 = {gib(est.kv_pool_bytes)}"
                   f" (reserve = the other half, sized to this workload's KV: {gib(est.reserve_bytes)})")
    f["budget"] = budget
    f["fits"] = (f"per device: weights {gib(est.weight_bytes_per_device)} + KV {gib(est.kv_bytes_per_device)}"
                 f" + activations {gib(est.activation_bytes)}" + (f" + mask {gib(est.mask_bytes)}" if est.mask_bytes else "")
                 + f" + overhead {gib(est.overhead_bytes)}" + (f" + reserve {gib(est.reserve_bytes)}" if est.reserve_bytes else "")
                 + f" = {gib(est.total_bytes_per_device)} {'<=' if est.fits else '>'} usable {gib(est.usable_bytes_per_device)}"
                 f" -> {est.verdict}")
    if m.has_kv:
        f["kv_room"] = (f"KV room = pool / KV-per-token-per-device = {gib(est.kv_pool_bytes)} / {est.kv_bytes_per_token_per_device:,} B"
                        + (" (sliding layers stop growing at their window)" if any(l.window for l in m.layers) else "")
                        + f" = {est.kv_room_tokens:,} tokens; largest context at {est.batch} sequence(s) = {est.max_context:,}"
                        + (f" (capped at max_position_embeddings {m.max_position:,})" if m.max_position and est.max_context == m.max_position else "")
                        + f"; most sequences at {est.context:,} tokens = {est.max_batch:,}")
    bw = hw.bandwidth
    f["decode"] = (f"decode step = max(bytes / (BW x eta_mem), FLOPs / (peak x eta_compute)) [+ TP/PP communication]:"
                   f" bytes/step = LLM weights read + KV read = {roof.decode_bytes / 1e9:,.3f} GB,"
                   f" BW = {bw / 1e9:,.1f} GB/s, FLOPs/step = {roof.decode_flops / 1e9:,.1f} GFLOP,"
                   f" peak = {rate(sp.peak)} {sp.peak_label}; roofline (eta = 1):"
                   f" {est.decode_tokens_per_s_roofline:,.1f} tok/s per sequence;"
                   f" with eta_mem {b.eta_memory:.2f}" + (f" x {plan.fmt.label} kernel factor {plan.fmt.eta_factor:.2f}" if plan.fmt.eta_factor != 1 else "")
                   + f" / eta_compute {b.eta_compute:.2f}: {est.decode_tokens_per_s:,.1f} tok/s"
                   f" ({est.bound}-bound; {est.decode_tokens_per_s_total:,.1f} tok/s over {est.batch} sequence(s))")
    f["prefill"] = (f"prefill = max(FLOPs / (peak x eta), bytes / (BW x eta)): FLOPs = 2 x active params x"
                    f" {est.batch * est.prompt_tokens:,} tokens + causal attention"
                    + (f" + vision {roof.vision_flops / 1e12:,.2f} TFLOP" if roof.vision_flops else "")
                    + f" = {roof.prefill_flops / 1e12:,.2f} TFLOP; roofline {est.prefill_seconds_roofline:,.3f} s;"
                    f" with eta: {est.prefill_seconds:,.3f} s ({est.prefill_bound}-bound)")
    f["ridge"] = (f"ridge point = peak / BW = {rate(sp.peak)} / {bw / 1e9:,.1f} GB/s ="
                  f" {est.ridge_flops_per_byte:,.0f} FLOP/byte; decode intensity"
                  f" {roof.decode_flops / max(roof.decode_bytes, 1):,.1f}, prefill intensity"
                  f" {roof.prefill_flops / max(roof.prefill_bytes, 1):,.0f} FLOP/byte")
    return f
