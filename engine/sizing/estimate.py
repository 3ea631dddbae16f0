"""The sizing answer (``Estimate``): memory per device under the framework's budget rule, the
verdict and why, the searches (longest context, most sequences, fewest devices), roofline speeds,
plus the advice from ``advice``. ``compare_hardware`` and ``concurrency_curve`` feed the page.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from fractions import Fraction as F

from .advice import _alternatives, _formulas, _suggestions, serve_command
from .arch import ModelSpec
from .formats import SizingError, kv_dtype, weight_format
from .hardware import GiB, Hardware, get_hardware
from .models import get_model
from .plan import MAX_BATCH_SEARCH, MAX_CONTEXT_SEARCH, MAX_DEVICES, Plan, Settings, Workload, _ceil, _search_max, gib


# --------------------------------------------------------------------------------------
# the answer


@dataclass
class Estimate:
    # identity
    model: str
    model_name: str
    hardware: str
    hardware_name: str
    framework: str
    weights_format: str
    kv_dtype: str
    vision_dtype: str | None
    # workload
    batch: int
    context: int
    prompt_tokens: int
    output_tokens: int
    images: int
    tiles: int
    image_tokens: int
    tp: int
    pp: int
    devices: int
    device_unit: str  # "chip" for multi-chip cards, else "device"
    # parameters and memory (bytes)
    params_total: int
    params_active: int
    params_vision: int
    weight_bytes: int
    weight_bytes_per_device: int
    vision_weight_bytes_per_device: int
    kv_bytes_per_token: int
    kv_bytes_per_token_per_device: int
    kv_bytes: int
    kv_bytes_per_device: int
    activation_bytes: int
    mask_bytes: int
    overhead_bytes: int
    reserve_bytes: int
    total_bytes_per_device: int
    usable_bytes_per_device: int
    device_memory_bytes: int
    kv_pool_bytes: int
    kv_room_tokens: int
    # verdict and searches
    fits: bool
    verdict: str
    verdict_key: str
    reason: str
    devices_needed: int | None
    devices_needed_tp: int | None
    devices_needed_pp: int | None
    max_context: int
    max_batch: int
    # speed
    prefill_seconds: float
    prefill_seconds_roofline: float
    prefill_bound: str
    decode_tokens_per_s: float
    decode_tokens_per_s_roofline: float
    decode_tokens_per_s_total: float
    bound: str
    efficiency_memory: float
    efficiency_compute: float
    peak_flops: float
    peak_label: str
    bandwidth_bytes_per_s: float
    ridge_flops_per_byte: float
    decode_bytes_per_step: float
    decode_flops_per_step: float
    prefill_flops: float
    prefill_bytes: float
    # advice
    serve_command: str
    #: when it only fits on more devices: speed there ({tp, pp, decode_tokens_per_s, ...}); else None
    at_devices_needed: dict | None
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    suggestions: list[str] = field(default_factory=list)
    alternatives: list[dict] = field(default_factory=list)
    formulas: dict[str, str] = field(default_factory=dict)
    stages: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _verdict_words(fits: bool, devices_needed: int | None, current: int, hw: Hardware) -> tuple[str, str]:
    unit = "chip" if hw.devices_per_card > 1 else "device"
    if fits:
        return "fits", f"fits on {current} {unit}{'s' if current > 1 else ''}"
    if devices_needed:
        return "fits_with_more", f"fits with {devices_needed} {unit}s"
    return "does_not_fit", "does not fit"


def _max_context(plan: Plan, batch: int) -> int:
    if not plan.fits(batch, 1):
        return 0
    cap = plan.model.max_position or MAX_CONTEXT_SEARCH
    return _search_max(lambda s: plan.fits(batch, s), 1, cap)


def _max_batch(plan: Plan, context: int) -> int:
    if not plan.fits(1, context):
        return 0
    hi = 1
    while hi < MAX_BATCH_SEARCH and plan.fits(hi * 2, context):
        hi *= 2
    if hi >= MAX_BATCH_SEARCH:
        return MAX_BATCH_SEARCH
    return _search_max(lambda b: plan.fits(b, context), hi, hi * 2)


def _devices_needed(plan: Plan) -> tuple[int, int, int] | None:
    n_layers = plan.model.num_layers
    tps = [t for t in (8, 4, 2, 1) if plan._tp_valid(t)]
    weights = float(sum(plan.static(1, 1)[0]["weights"] for _ in (0,)))
    lower = max(1, int(weights // max(plan.usable(), 1)))  # the weights alone need at least this many
    for n in range(lower, MAX_DEVICES + 1):
        for tp in tps:
            if n % tp:
                continue
            pp = n // tp
            if pp > n_layers:
                continue
            if plan.fits(plan.batch, plan.context, tp, pp):
                return n, tp, pp
    return None


def estimate(model, hardware, workload: Workload | None = None, settings: Settings | None = None,
             *, detail: bool = True) -> Estimate:
    """The full answer. ``model``/``hardware`` are names, paths or spec objects.

    ``detail=False`` skips the alternatives and suggestions (used by the comparison table).
    """
    model = get_model(model) if not isinstance(model, ModelSpec) else model
    hw = get_hardware(hardware) if not isinstance(hardware, Hardware) else hardware
    workload = workload or Workload()
    settings = settings or Settings()
    plan = Plan(model, hw, workload, settings)
    B, S = plan.batch, plan.context
    stages = plan.memory(B, S)
    worst = max(stages, key=lambda s: s["total"] - s["usable"])
    fits = all(s["fits"] for s in stages)
    sp = plan.speed(B, S)
    roof = plan.speed(B, S, efficiency=False)
    dn = _devices_needed(plan)
    max_ctx = _max_context(plan, B)
    max_b = _max_batch(plan, S)
    verdict_key, verdict = _verdict_words(fits, dn[0] if dn else None, plan.tp * plan.pp, hw)

    weight_total = _ceil(sum(plan.layer_bytes, F(0)) + plan.embed_bytes + plan.lm_head_bytes
                         + plan.final_norm_bytes + plan.vision_bytes)
    kv_total_tp1 = _ceil(sum(plan.kv_bytes_stage(st, B, S) for st in plan.static(1, 1)))
    kv_per_token = _ceil(sum((st["kv_per_token_full"] for st in plan.static(1, 1)), F(0)))
    kv_per_token_dev = _ceil(max(st["kv_per_token_full"] for st in plan.static(plan.tp, plan.pp)))
    params_total = model.params_total
    if model.checkpoint is not None and model.checkpoint.all_float:
        params_total = model.checkpoint.numel

    # why
    over = worst["total"] - worst["usable"]
    parts = {"weights": worst["weights"], "KV cache": worst["kv"], "activations": worst["activations"],
             "mask": worst["mask"], "overhead": worst["overhead"], "reserve": worst["reserve"]}
    biggest = max(parts, key=parts.get)
    unit = "chip" if hw.devices_per_card > 1 else "device"
    if fits:
        reason = (f"{gib(worst['total'])} needed per {unit} of {gib(worst['usable'])} usable"
                  f" ({gib(worst['usable'] - worst['total'])} to spare)")
    else:
        reason = (f"{gib(worst['total'])} needed per {unit} but only {gib(worst['usable'])} usable"
                  f" (over by {gib(over)}; largest part: {biggest} {gib(parts[biggest])})")
        if worst["weights"] > worst["usable"]:
            reason += "; the weights alone do not fit"
    if not fits and not dn:
        reason += f"; not even on {MAX_DEVICES} {unit}s"

    est = Estimate(
        model=model.key, model_name=model.display_name, hardware=hw.key, hardware_name=hw.name,
        framework=plan.framework, weights_format=plan.fmt.key, kv_dtype=plan.kv.key,
        vision_dtype=plan.vision_fmt.key if model.vision else None,
        batch=B, context=S, prompt_tokens=plan.prompt_total, output_tokens=plan.output, images=plan.images,
        tiles=plan.tiles, image_tokens=plan.image_tokens, tp=plan.tp, pp=plan.pp, devices=plan.tp * plan.pp,
        device_unit=unit,
        params_total=params_total, params_active=model.params_active,
        params_vision=model.vision.total_params if model.vision else 0,
        weight_bytes=weight_total, weight_bytes_per_device=max(s["weights"] for s in stages),
        vision_weight_bytes_per_device=worst["weights_vision"],
        kv_bytes_per_token=kv_per_token, kv_bytes_per_token_per_device=kv_per_token_dev,
        kv_bytes=kv_total_tp1, kv_bytes_per_device=worst["kv"], activation_bytes=worst["activations"],
        mask_bytes=worst["mask"], overhead_bytes=worst["overhead"], reserve_bytes=worst["reserve"],
        total_bytes_per_device=worst["total"], usable_bytes_per_device=worst["usable"],
        device_memory_bytes=hw.memory_bytes, kv_pool_bytes=min(s["kv_pool"] for s in stages),
        kv_room_tokens=min(s["kv_room_tokens"] for s in stages),
        fits=fits, verdict=verdict, verdict_key=verdict_key, reason=reason,
        devices_needed=dn[0] if dn else None, devices_needed_tp=dn[1] if dn else None,
        devices_needed_pp=dn[2] if dn else None, max_context=max_ctx, max_batch=max_b,
        prefill_seconds=sp["prefill_s"], prefill_seconds_roofline=roof["prefill_s"], prefill_bound=sp["prefill_bound"],
        decode_tokens_per_s=sp["decode_tokens_per_s"], decode_tokens_per_s_roofline=roof["decode_tokens_per_s"],
        decode_tokens_per_s_total=sp["decode_tokens_per_s_total"], bound=sp["decode_bound"],
        efficiency_memory=sp["eta_memory"], efficiency_compute=plan.eta_c, peak_flops=sp["peak"],
        peak_label=sp["peak_label"], bandwidth_bytes_per_s=hw.bandwidth,
        ridge_flops_per_byte=sp["peak"] / hw.bandwidth, decode_bytes_per_step=roof["decode_bytes"],
        decode_flops_per_step=roof["decode_flops"], prefill_flops=roof["prefill_flops"],
        prefill_bytes=roof["prefill_bytes"], serve_command=serve_command(plan), at_devices_needed=None,
        warnings=list(dict.fromkeys(plan.warnings)), notes=list(dict.fromkeys(plan.notes)), stages=stages,
    )
    if not fits and dn:
        there = Plan(model, hw, workload, replace(settings, tp=dn[1], pp=dn[2]))
        sp2, roof2 = there.speed(B, S), there.speed(B, S, efficiency=False)
        est.at_devices_needed = dict(
            devices=dn[0], tp=dn[1], pp=dn[2], decode_tokens_per_s=sp2["decode_tokens_per_s"],
            decode_tokens_per_s_roofline=roof2["decode_tokens_per_s"], prefill_seconds=sp2["prefill_s"],
            prefill_seconds_roofline=roof2["prefill_s"], serve_command=serve_command(there))
    if detail:
        est.alternatives = _alternatives(plan)
        est.suggestions = _suggestions(plan, est)
    est.formulas = _formulas(plan, est, sp, roof)
    return est


def kv_bytes_per_token(model, kv: str = "fp16") -> int:
    """KV-cache bytes per token over all layers (one sequence, no TP): the engine contract."""
    model = get_model(model) if not isinstance(model, ModelSpec) else model
    k = kv_dtype(kv)
    total = F(0)
    for lay in model.layers:
        if lay.kv_elems:
            total += lay.kv_elems * k.bytes_per_elem + lay.kv_scale_slots * k.per_head_scale_bytes
    return _ceil(total)


def weight_bytes(model, weights: str = "fp16") -> int:
    """Weight bytes of a model in a format (no hardware rules applied)."""
    model = get_model(model) if not isinstance(model, ModelSpec) else model
    fmt = weight_format(weights)
    small = F(4) if fmt.key == "fp32" else F(2)
    small_layers = F(4) if fmt.family == "gguf" else small
    emb = fmt.bytes_per_param if fmt.quantizes_embeddings else small
    total = sum((lay.linear_params * fmt.bytes_per_param + (lay.params - lay.linear_params) * small_layers
                 for lay in model.layers), F(0))
    total += (model.embed_params + model.lm_head_params) * emb + model.final_norm_params * small_layers
    if model.vision:
        total += model.vision.total_params * small
    return _ceil(total)


def compare_hardware(model, keys: list[str], workload: Workload | None = None, settings: Settings | None = None) -> list[dict]:
    """One row per hardware preset: fits? devices needed? tokens/s. Errors become a row note."""
    rows = []
    for key in keys:
        try:
            hw = get_hardware(key)
            s = replace(settings or Settings(), framework="auto", tp=None)
            if settings is not None and settings.framework not in ("auto", None):
                fw = settings.framework
                if fw == "vllm-ascend" and not hw.is_ascend:
                    fw = "auto"
                s = replace(s, framework=fw)
            est = estimate(model, hw, workload, s, detail=False)
            fits, verdict, needed = est.fits, est.verdict, est.devices_needed
            if not est.fits and est.devices_needed:  # report speed and memory where it does fit
                est = estimate(model, hw, workload, replace(s, tp=est.devices_needed_tp, pp=est.devices_needed_pp),
                               detail=False)
            rows.append(dict(hardware=key, name=hw.name, memory_gib=hw.memory_bytes / GiB, framework=est.framework,
                             fits=fits, verdict=verdict, devices_needed=needed, tp=est.tp, pp=est.pp,
                             total_gib=est.total_bytes_per_device / GiB, usable_gib=est.usable_bytes_per_device / GiB,
                             decode_tokens_per_s=est.decode_tokens_per_s,
                             decode_tokens_per_s_roofline=est.decode_tokens_per_s_roofline,
                             prefill_seconds=est.prefill_seconds, max_context=est.max_context, error=""))
        except SizingError as exc:
            rows.append(dict(hardware=key, name=key, memory_gib=None, framework="", fits=False, verdict="n/a",
                             devices_needed=None, tp=None, pp=None, total_gib=None, usable_gib=None, decode_tokens_per_s=None,
                             decode_tokens_per_s_roofline=None, prefill_seconds=None, max_context=None,
                             error=str(exc)))
    return rows


def concurrency_curve(model, hardware, workload: Workload | None = None, settings: Settings | None = None,
                      contexts: list[int] | None = None) -> list[dict]:
    """Most concurrent sequences that fit at each context length (for the page's curve)."""
    model = get_model(model) if not isinstance(model, ModelSpec) else model
    hw = get_hardware(hardware) if not isinstance(hardware, Hardware) else hardware
    plan = Plan(model, hw, workload or Workload(), settings or Settings())
    if contexts is None:
        top = model.max_position or 131072
        contexts = sorted({c for c in (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, top)
                           if c <= top and c >= 2})
    return [{"context": c, "max_batch": _max_batch(plan, c)} for c in contexts]
