"""Every formula of an answer with its numbers filled in (``--formula``, the page's expander).

One function per formula; ``formulas`` puts them together in the order they are shown.
"""
from __future__ import annotations


from .budget import CUDAGRAPH_BYTES_PER_LAYER, DEFAULT_UTIL, V1_NON_TORCH, nccl_bytes
from . import activations
from .plan import Plan, Speed
from .result import Estimate
from .units import fmt_bytes, gib, rate, round_up



def _parameters(plan: Plan, est: Estimate) -> str:
    m = plan.model
    return "\n".join(list(m.param_formula) + [
        f"embeddings V*h = {m.vocab:,}*{m.hidden:,} = {m.embed_params:,}"
        + (" (tied: the LM head shares it)" if m.tied else f"; LM head V*h = {m.lm_head_params:,}"),
        f"total = {est.params_total:,}; active per token = {est.params_active:,}"])


def _weights(plan: Plan, est: Estimate) -> str:
    m, fmt, prec = plan.model, plan.fmt, plan.precision
    emb = fmt.bytes_per_param if fmt.quantizes_embeddings else prec.small_bytes
    line = (f"weights = layers' matmul params x {float(fmt.bytes_per_param):.4g} B ({fmt.label})"
            f" + embeddings/LM head x {float(emb):.4g} B + norms/biases x {float(prec.small_for_layers):.4g} B")
    if m.vision:
        line += (f" + vision/projector {m.vision.total_params:,} x {float(prec.vision_fmt.bytes_per_param):.4g} B"
                 f" ({prec.vision_fmt.label})")
    line += f" = {est.weight_bytes:,} B = {gib(est.weight_bytes)}"
    if prec.exact_scale is not None:
        line += " (scaled to the exact safetensors bytes)"
    if est.devices > 1:
        line += f"; per device (tp {plan.tp}, pp {plan.pp}, worst stage) = {gib(est.weight_bytes_per_device)}"
    return line


def _kv_per_token(plan: Plan, est: Estimate) -> str:
    m, kv = plan.model, plan.kv
    if not m.has_kv:
        return m.kv_formula + f"; x {float(kv.bytes_per_elem):.4g} B"
    return (m.kv_formula + f"; x {float(kv.bytes_per_elem):.4g} B ({kv.label})"
            + (" + scales 4 B per head per layer" if kv.per_head_scale_bytes else "")
            + f" = {est.kv_bytes_per_token:,} B/token = {fmt_bytes(est.kv_bytes_per_token)}")


def _kv_total(plan: Plan, est: Estimate) -> str:
    m = plan.model
    if not m.has_kv:
        return f"state = B x state/sequence = {est.kv_bytes:,} B = {gib(est.kv_bytes)} (independent of context)"
    windows = sorted({lay.window for lay in m.layers if lay.window})
    wtxt = f"; sliding layers hold min(S, {', '.join(f'{w:,}' for w in windows)}) tokens" if windows else ""
    return (f"KV = B x ceil(S/block)*block x KV/token = {est.batch} x {round_up(est.context, plan.budget.block):,}"
            f" x {est.kv_bytes_per_token:,}{wtxt} = {est.kv_bytes:,} B = {gib(est.kv_bytes)}"
            + (f"; per device {gib(est.kv_bytes_per_device)}" if est.devices > 1 else ""))


def _activations(plan: Plan, est: Estimate) -> str:
    """activations.py's formula (vLLM's profiling peak) with this answer's numbers."""
    ap = plan.activation_parts(est.batch)
    text = activations.formula_text(plan.model, ap, act_bytes=plan.precision.act_bytes, batch=est.batch,
                                    framework=plan.framework, tp=plan.tp, images=plan.work.images,
                                    tiles=plan.work.tiles, rule=plan.budget.rule)
    text += f" ({fmt_bytes(ap.total)})"
    return text + ("  (vLLM profiles at max_num_batched_tokens)" if plan.framework in ("vllm", "vllm-ascend")
                   else "  (SGLang: chunked prefill size)" if plan.framework == "sglang"
                   else "  (prefill in chunks of at most this many tokens)")


def _overhead(plan: Plan, est: Estimate) -> str:
    b = plan.budget
    if b.rule in ("v1", "v1-graphs"):
        layers = max(st.num_layers for st in plan.static(plan.tp, plan.pp))
        comm = b.overhead(est.devices, 0) - V1_NON_TORCH
        graphs = est.overhead_bytes - V1_NON_TORCH - comm
        return (f"overhead = vLLM V1 non-torch increase while profiling {fmt_bytes(V1_NON_TORCH)}"
                + (f" + NCCL {'NVLink-SHARP ' if b.nvls else ''}buffers {fmt_bytes(comm)}" if comm else "")
                + (f" + CUDA-graph estimate {layers} layers x {fmt_bytes(CUDAGRAPH_BYTES_PER_LAYER)} = {fmt_bytes(graphs)}"
                   if graphs else "")
                + f" = {fmt_bytes(est.overhead_bytes)} (the CUDA context is outside vLLM V1's budget)")
    return (f"overhead = runtime context {plan.hw.runtime_overhead_bytes / 1e6:,.0f} MB"
            + (f" + NCCL/HCCL buffers {fmt_bytes(nccl_bytes(est.devices))}" if est.devices > 1 else "")
            + f" = {fmt_bytes(est.overhead_bytes)}")


def _budget(plan: Plan, est: Estimate) -> str:
    hw, b = plan.hw, plan.budget
    cap = hw.memory_bytes
    if plan.framework in ("vllm", "vllm-ascend"):
        text = (f"usable = gpu_memory_utilization x total = {b.util or DEFAULT_UTIL:.2f} x {gib(cap)}"
                f" = {gib(est.usable_bytes_per_device)}")
        if hw.usable_fraction < 1:
            text += f" (capped at the unified-memory share {hw.usable_fraction:.2f})"
    elif plan.framework == "sglang":
        frac = b.pool_fraction(plan.tp, plan.pp)
        free = cap - b.context_bytes
        vlm = f" ({b.static_fraction(plan.tp, plan.pp):.3f} x 0.95 for a vision-language model)" if b.multimodal else ""
        text = (f"SGLang: weights + KV pool <= mem_fraction_static x (total - CUDA context) = {frac:.3f}{vlm} x"
                f" ({gib(cap)} - {fmt_bytes(b.context_bytes)}) = {gib(frac * free)};"
                f" reserve = total - that - activations - overhead = {gib(est.reserve_bytes)}")
    else:
        text = (f"usable = device memory {gib(cap)}"
                + (f" x unified-memory share {hw.usable_fraction:.2f}" if hw.usable_fraction < 1 else "")
                + f" = {gib(est.usable_bytes_per_device)}")
    if b.ascend_310p_rules:
        text += (f"; 310P mask = max_model_len^2 x 2 = {est.context:,}^2 x 2 = {fmt_bytes(est.mask_bytes)};"
                 f" KV pool = (usable - weights - activations - mask - overhead) / 2 = {gib(est.kv_pool_bytes)}"
                 f" (reserve = the other half, sized to this workload's KV: {gib(est.reserve_bytes)})")
    return text


def _fits(est: Estimate) -> str:
    return (f"per device: weights {gib(est.weight_bytes_per_device)} + KV {gib(est.kv_bytes_per_device)}"
            f" + activations {gib(est.activation_bytes)}" + (f" + mask {gib(est.mask_bytes)}" if est.mask_bytes else "")
            + f" + overhead {gib(est.overhead_bytes)}" + (f" + reserve {gib(est.reserve_bytes)}" if est.reserve_bytes else "")
            + f" = {gib(est.total_bytes_per_device)} {'<=' if est.fits else '>'} usable {gib(est.usable_bytes_per_device)}"
            f" -> {est.verdict}")


def _kv_room(plan: Plan, est: Estimate) -> str:
    m = plan.model
    capped = m.max_model_len and est.max_context == m.max_model_len
    if est.kv_window:
        room = (f" = {est.kv_room_tokens:,} token slots; a window on every layer: a sequence keeps at most"
                f" round_up(window {est.kv_window:,}, block) tokens, so pool / (that x KV/token) ="
                f" {est.kv_window_sequences or 0:,} sequence(s) at a full window; the KV room does not limit the context")
    else:
        room = ((" (sliding layers stop growing at their window: the longest single context whose KV fits)"
                 if any(lay.window for lay in m.layers) else "") + f" = {est.kv_room_tokens:,} tokens")
    return (f"KV room = pool / KV-per-token-per-device = {gib(est.kv_pool_bytes)} / {est.kv_bytes_per_token_per_device:,} B"
            + room + f"; largest context at {est.batch} sequence(s) = {est.max_context:,}"
            + (f" (capped at the model's {m.positions_text})" if capped else "")
            + f"; most sequences at {est.context:,} tokens = {est.max_batch:,}")


def _decode_eta_words(plan: Plan, sp: Speed) -> str:
    """' with eta_mem 0.80 x INT4 kernel factor 0.72' (+ the backend's t0 where its fitted rule applies)."""
    fmt, rule = plan.fmt, plan.backend
    if rule is None:
        return (f" with eta_mem {plan.budget.eta_memory:.2f}"
                + (f" x {fmt.label} kernel factor {fmt.eta_factor:.2f}" if fmt.eta_factor != 1 else ""))
    factor = rule.format_factors and fmt.eta_factor != 1
    return (f" with {rule.label}'s fitted rule (backends.py): eta_mem {rule.eta:.3f}"
            + (f" x {fmt.label} kernel factor {fmt.eta_factor:.2f}" if factor else "")
            + f" + t0 {sp.overhead_s * 1e3:.2f} ms per step")


def _decode(plan: Plan, est: Estimate, sp: Speed, roof: Speed) -> str:
    b, fmt, bw = plan.budget, plan.fmt, plan.hw.bandwidth
    return (f"decode step = max(bytes / (BW x eta_mem), FLOPs / (peak x eta_compute)) [+ TP/PP communication] [+ t0]:"
            f" bytes/step = LLM weights read + KV read = {roof.decode_bytes / 1e9:,.3f} GB,"
            f" BW = {bw / 1e9:,.1f} GB/s, FLOPs/step = {roof.decode_flops / 1e9:,.1f} GFLOP,"
            f" peak = {rate(sp.peak)} {sp.peak_label}; roofline (eta = 1):"
            f" {est.decode_tokens_per_s_roofline:,.1f} tok/s per sequence;"
            + _decode_eta_words(plan, sp)
            + f" / eta_compute {b.eta_compute:.2f}: {est.decode_tokens_per_s:,.1f} tok/s"
            f" ({est.bound}-bound; {est.decode_tokens_per_s_total:,.1f} tok/s over {est.batch} sequence(s))")


def _prefill(est: Estimate, roof: Speed) -> str:
    return (f"prefill = max(FLOPs / (peak x eta), bytes / (BW x eta)): FLOPs = 2 x active params x"
            f" {est.batch * est.prompt_tokens:,} tokens + causal attention"
            + (f" + vision {roof.vision_flops / 1e12:,.2f} TFLOP" if roof.vision_flops else "")
            + f" = {roof.prefill_flops / 1e12:,.2f} TFLOP; roofline {est.prefill_seconds_roofline:,.3f} s;"
            f" with eta: {est.prefill_seconds:,.3f} s ({est.prefill_bound}-bound)")


def _ridge(plan: Plan, est: Estimate, sp: Speed, roof: Speed) -> str:
    return (f"ridge point = peak / BW = {rate(sp.peak)} / {plan.hw.bandwidth / 1e9:,.1f} GB/s ="
            f" {est.ridge_flops_per_byte:,.0f} FLOP/byte; decode intensity"
            f" {roof.decode_flops / max(roof.decode_bytes, 1):,.1f}, prefill intensity"
            f" {roof.prefill_flops / max(roof.prefill_bytes, 1):,.0f} FLOP/byte")


def formulas(plan: Plan, est: Estimate, sp: Speed, roof: Speed) -> dict[str, str]:
    """name -> formula text, in display order (``kv_room`` only for models with a per-token KV)."""
    f = {"parameters": _parameters(plan, est), "weights": _weights(plan, est),
         "kv_per_token": _kv_per_token(plan, est), "kv_total": _kv_total(plan, est),
         "activations": _activations(plan, est), "overhead": _overhead(plan, est), "budget": _budget(plan, est),
         "fits": _fits(est)}
    if plan.model.has_kv:
        f["kv_room"] = _kv_room(plan, est)
    f["decode"] = _decode(plan, est, sp, roof)
    f["prefill"] = _prefill(est, roof)
    f["ridge"] = _ridge(plan, est, sp, roof)
    return f
