"""The sizing answer (``Estimate``): memory per device under the framework's budget rule, the
verdict and why, the searches (longest context, most sequences, fewest devices), roofline speeds,
plus the advice from ``advice``. ``compare_hardware`` and ``concurrency_curve`` feed the page.

``Estimate``'s fields are the CLI's JSON contract (``to_dict`` / ``--json``): flat, stable names.
Fields marked ``contract=False`` are for the text answer and the page only.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction as F

from .advice import format_alternatives, format_suggestions, serve_command, serve_len_note, serve_target
from .arch import ModelSpec
from .result import Estimate, FittedLayout, FormatOption, VariantAnswer
from .formats import SizingError, kv_dtype, weight_format
from .formulas import formulas
from .hardware import Hardware, get_hardware
from .models import get_model
from .parallel import MAX_DEVICES, DeviceLayout, fewest_devices
from .plan import Plan, Settings, Speed, StageMemory, Workload
from .precision import group_bytes
from .units import GiB, ceil_exact, gib, margin, search_max
from .workload import MAX_BATCH, MAX_CONTEXT

def _verdict_words(fits: bool, devices_needed: int | None, current: int, unit: str) -> tuple[str, str]:
    """(verdict_key, verdict): "fits" on the devices asked for; otherwise it does not fit, and the
    words say so first ("does not fit on 2 devices — needs 4"), never as a kind of fit."""
    here = f"{current} {unit}{'s' if current > 1 else ''}"
    if fits:
        return "fits", f"fits on {here}"
    if devices_needed:
        return "needs_more_devices", f"does not fit on {here} — needs {devices_needed}"
    return "does_not_fit", f"does not fit on {here}, nor on up to {MAX_DEVICES} {unit}s"


def _max_context(plan: Plan, batch: int) -> int:
    """Longest context that fits at ``batch`` (bisection up to the model's limit or 2**24)."""
    if not plan.fits(batch, 1):
        return 0
    cap = plan.model.max_model_len or MAX_CONTEXT
    return search_max(lambda s: plan.fits(batch, s), 1, cap)


def _max_batch(plan: Plan, context: int) -> int:
    """Most sequences that fit at ``context`` (doubling, then bisection; at most 2**20)."""
    if not plan.fits(1, context):
        return 0
    hi = 1
    while hi < MAX_BATCH and plan.fits(hi * 2, context):
        hi *= 2
    if hi >= MAX_BATCH:
        return MAX_BATCH
    return search_max(lambda b: plan.fits(b, context), hi, hi * 2)


def _devices_needed(plan: Plan) -> DeviceLayout | None:
    """Fewest devices as an engine lays them out (``parallel.fewest_devices``)."""
    weights = float(plan.static(1, 1)[0].weights)
    return fewest_devices(plan.model, plan.hw, lambda tp, pp: plan.fits(plan.batch, plan.context, tp, pp),
                          weights, plan.usable())


def _layout_memory_note(plan: Plan, layout: DeviceLayout, unit: str) -> str:
    """The memory the fewest-devices answer assumes there (worst stage)."""
    worst = max(plan.memory(plan.batch, plan.context, layout.tp, layout.pp), key=lambda s: s.over)
    kind = "pipeline-only, " if layout.rule == "pipeline-only" else ""
    return (f"fewest {unit}s ({layout.devices}: {kind}tp {layout.tp} x pp {layout.pp}) assume {gib(worst.usable)} usable"
            f" of {gib(worst.capacity)} per {unit}; {gib(worst.total)} needed per {unit} there (weights"
            f" {gib(worst.weights)}, KV {gib(worst.kv)}, activations {gib(worst.activations)}, overhead"
            f" {gib(worst.overhead)})")


def _reason(worst: StageMemory, fits: bool, found: bool, unit: str) -> str:
    """Why, in one sentence: needed vs usable, and the largest part when it does not fit."""
    if fits:
        return f"{gib(worst.total)} needed per {unit} of {gib(worst.usable)} usable ({margin(worst.over)})"
    parts = {"weights": worst.weights, "KV cache": worst.kv, "activations": worst.activations,
             "mask": worst.mask, "overhead": worst.overhead, "reserve": worst.reserve}
    biggest = max(parts, key=lambda k: parts[k])
    reason = (f"{gib(worst.total)} needed per {unit} but only {gib(worst.usable)} usable"
              f" ({margin(worst.over)}; largest part: {biggest} {gib(parts[biggest])})")
    if worst.weights > worst.usable:
        reason += "; the weights alone do not fit"
    if not found:
        reason += f"; not even on {MAX_DEVICES} {unit}s"
    return reason


def _fitted(model: ModelSpec, hw: Hardware, workload: Workload, settings: Settings,
            layout: DeviceLayout) -> FittedLayout:
    there = Plan(model, hw, workload, replace(settings, tp=layout.tp, pp=layout.pp))
    b, s = there.batch, there.context
    sp, roof = there.speed(b, s), there.speed(b, s, efficiency=False)
    return FittedLayout(devices=layout.devices, tp=layout.tp, pp=layout.pp, decode_tokens_per_s=sp.decode_tokens_per_s,
                        decode_tokens_per_s_roofline=roof.decode_tokens_per_s, prefill_seconds=sp.prefill_s,
                        prefill_seconds_roofline=roof.prefill_s, serve_command=serve_command(there))


def _resolve_inputs(model: ModelSpec | str, hardware: Hardware | str) -> tuple[ModelSpec, Hardware]:
    return (model if isinstance(model, ModelSpec) else get_model(model),
            hardware if isinstance(hardware, Hardware) else get_hardware(hardware))


def estimate(model: ModelSpec | str, hardware: Hardware | str, workload: Workload | None = None,
             settings: Settings | None = None, *, detail: bool = True) -> Estimate:
    """The full answer. ``model``/``hardware`` are names, paths or spec objects.

    ``detail=False`` skips the alternatives, suggestions and the hardware's other variants (used by
    the comparison table and by each variant's own answer).
    """
    spec, hw = _resolve_inputs(model, hardware)
    workload = workload or Workload()
    settings = settings or Settings()
    plan = Plan(spec, hw, workload, settings)
    B, S = plan.batch, plan.context
    stages = plan.memory(B, S)
    worst = max(stages, key=lambda s: s.over)
    fits = all(s.fits for s in stages)
    sp, roof = plan.speed(B, S), plan.speed(B, S, efficiency=False)
    layout = _devices_needed(plan)
    unit = "chip" if hw.devices_per_card > 1 else "device"
    verdict_key, verdict = _verdict_words(fits, layout.devices if layout else None, plan.tp * plan.pp, unit)
    one = plan.static(1, 1)
    params_total = spec.params_total
    if spec.checkpoint is not None and spec.checkpoint.all_float:
        params_total = spec.checkpoint.numel
    target = serve_target(plan)
    est = Estimate(
        model=spec.key, model_name=spec.display_name, hardware=hw.key, hardware_name=hw.name,
        framework=plan.framework, framework_version=plan.budget.version, budget_rule=plan.budget.rule,
        weights_format=plan.fmt.key, kv_dtype=plan.kv.key,
        vision_dtype=plan.precision.vision_fmt.key if spec.vision else None,
        batch=B, context=S, prompt_tokens=plan.work.prompt_total, output_tokens=plan.work.output,
        images=plan.work.images, tiles=plan.work.tiles, image_tokens=plan.work.image_tokens, tp=plan.tp, pp=plan.pp,
        devices=plan.tp * plan.pp, device_unit=unit,
        params_total=params_total, params_active=spec.params_active,
        params_vision=spec.vision.total_params if spec.vision else 0,
        weight_bytes=ceil_exact(plan.weights.total), weight_bytes_per_device=max(s.weights for s in stages),
        vision_weight_bytes_per_device=worst.weights_vision,
        kv_bytes_per_token=ceil_exact(sum((st.kv_per_token_full for st in one), F(0))),
        kv_bytes_per_token_per_device=ceil_exact(max(st.kv_per_token_full for st in plan.static(plan.tp, plan.pp))),
        kv_bytes=ceil_exact(sum((plan.kv_bytes_stage(st, B, S) for st in one), F(0))), kv_bytes_per_device=worst.kv,
        activation_bytes=worst.activations, mask_bytes=worst.mask, overhead_bytes=worst.overhead,
        reserve_bytes=worst.reserve, total_bytes_per_device=worst.total, usable_bytes_per_device=worst.usable,
        over_bytes_per_device=worst.over,
        device_memory_bytes=hw.memory_bytes, kv_pool_bytes=min(s.kv_pool for s in stages),
        kv_room_tokens=min(s.kv_room_tokens for s in stages),
        fits=fits, verdict=verdict, verdict_key=verdict_key, reason=_reason(worst, fits, layout is not None, unit),
        devices_needed=layout.devices if layout else None, devices_needed_tp=layout.tp if layout else None,
        devices_needed_pp=layout.pp if layout else None, max_context=_max_context(plan, B),
        max_batch=_max_batch(plan, S),
        prefill_seconds=sp.prefill_s, prefill_seconds_roofline=roof.prefill_s, prefill_bound=sp.prefill_bound,
        decode_tokens_per_s=sp.decode_tokens_per_s, decode_tokens_per_s_roofline=roof.decode_tokens_per_s,
        decode_tokens_per_s_total=sp.decode_tokens_per_s_total, bound=sp.decode_bound,
        efficiency_memory=sp.eta_memory, efficiency_compute=plan.budget.eta_compute, peak_flops=sp.peak,
        peak_label=sp.peak_label, bandwidth_bytes_per_s=hw.bandwidth, ridge_flops_per_byte=sp.peak / hw.bandwidth,
        decode_bytes_per_step=roof.decode_bytes, decode_flops_per_step=roof.decode_flops,
        prefill_flops=roof.prefill_flops, prefill_bytes=roof.prefill_bytes, serve_command=serve_command(plan),
        at_devices_needed=None, warnings=list(dict.fromkeys(plan.warnings)), notes=list(dict.fromkeys(plan.notes)),
        stages=stages, serve_heading=target.heading, serve_note=serve_len_note(plan),
        devices_note=layout.explanation if layout and layout.devices > 1 else "",
        decode_backend=sp.backend, decode_overhead_s=sp.overhead_s,
    )
    if spec.has_kv and spec.kv_window_bound:
        est.kv_window = spec.kv_window_bound
        est.kv_window_sequences = plan.window_sequences(est.kv_pool_bytes)
        est.notes.append(f"KV room counts token slots in the KV pool ({est.kv_room_tokens:,}), not the longest context:"
                         f" {est.kv_room_meaning}")
    if layout and not fits:
        est.notes.append(_layout_memory_note(plan, layout, unit))
    if not fits and layout:
        est.at_devices_needed = _fitted(spec, hw, workload, settings, layout)
    if detail:
        est.alternatives = format_alternatives(plan)
        est.suggestions = format_suggestions(plan, est)
        est.variants, same = _variant_answers(spec, hw, workload, settings, est)
        if same:
            est.notes.append(f"{' and '.join(same)}: the same verdict")
    est.server = _server_words(hw, est)
    est.formulas = formulas(plan, est, sp, roof)
    return est


def _variant_answers(spec: ModelSpec, hw: Hardware, workload: Workload, settings: Settings,
                     main: Estimate) -> tuple[list[VariantAnswer], list[str]]:
    """(the variants whose verdict differs from ``main``, the names of those that agree). A variant
    that cannot be sized at all (its memory too small for a setting) counts as differing."""
    differ, same = [], []
    for variant in hw.variants:
        try:
            v = estimate(spec, variant, workload, settings, detail=False)
        except SizingError as exc:
            differ.append(VariantAnswer(variant.name, variant.memory_bytes, False, str(exc), None, 0))
            continue
        if (v.fits, v.devices_needed) == (main.fits, main.devices_needed):
            same.append(variant.name)
        else:
            differ.append(VariantAnswer(variant.name, variant.memory_bytes, v.fits, v.verdict, v.devices_needed,
                                        v.kv_room_tokens))
    return differ, same


def _server_words(hw: Hardware, est: Estimate) -> str:
    """For a server preset: which of its devices the answer uses, or how many servers it needs."""
    if not hw.server or not hw.devices_per_node:
        return ""
    n, unit = hw.devices_per_node, est.device_unit
    whole = hw.server
    needed = est.devices_needed
    if needed is None:
        return f"{whole}: no layout within {MAX_DEVICES} {unit}s fits"
    if needed <= n:
        return f"{whole}: {needed} of its {n} {unit}s hold this workload"
    servers = -(-needed // n)
    return f"{whole}: it needs {servers} servers ({needed} {unit}s)"


def kv_bytes_per_token(model: ModelSpec | str, kv: str = "fp16") -> int:
    """KV-cache bytes per token over all layers (one sequence, no TP): the engine contract."""
    spec = model if isinstance(model, ModelSpec) else get_model(model)
    k = kv_dtype(kv)
    total = sum((lay.kv_elems * k.bytes_per_elem + lay.kv_scale_slots * k.per_head_scale_bytes
                 for lay in spec.layers if lay.kv_elems), F(0))
    return ceil_exact(total)


def weight_bytes(model: ModelSpec | str, weights: str = "fp16") -> int:
    """Weight bytes of a model in a format (no hardware rules applied; vision tower in 16 bit,
    32 bit with FP32)."""
    spec = model if isinstance(model, ModelSpec) else get_model(model)
    fmt = weight_format(weights)
    return ceil_exact(group_bytes(spec, fmt, weight_format("fp32" if fmt.key == "fp32" else "fp16")).total)


def _compare_settings(hw: Hardware, settings: Settings | None) -> Settings:
    """The caller's settings on another device: its own TP default, and its own framework unless
    one was picked (vllm-ascend only on Ascend)."""
    s = replace(settings or Settings(), framework="auto", tp=None, framework_version=None)
    if settings is not None and settings.framework in ("auto", None) and hw.default_framework in ("vllm", "sglang") \
            and not hw.is_ascend:  # "auto" with a version: the version of whatever vLLM / SGLang that device runs
        s = replace(s, framework_version=settings.framework_version)
    if settings is not None and settings.framework not in ("auto", None):
        fw = settings.framework
        if fw == "vllm-ascend" and not hw.is_ascend:
            fw = "auto"
        # the version travels with an explicit vllm / sglang (not to vllm-ascend on an Ascend preset)
        same = fw == settings.framework and not (fw == "vllm" and hw.is_ascend)
        s = replace(s, framework=fw, framework_version=settings.framework_version if same else None)
    return s


@dataclass(frozen=True)
class HardwareRow:
    """One hardware preset in the comparison: the verdict as configured, and speed and memory
    where it fits (on the fewest devices when it needs more). ``error``: why it could not be sized."""

    hardware: str
    name: str
    memory_gib: float | None = None
    framework: str = ""
    fits: bool = False
    verdict: str = "n/a"
    devices_needed: int | None = None
    tp: int | None = None
    pp: int | None = None
    total_gib: float | None = None
    usable_gib: float | None = None
    decode_tokens_per_s: float | None = None
    decode_tokens_per_s_roofline: float | None = None
    prefill_seconds: float | None = None
    max_context: int | None = None
    error: str = ""


@dataclass(frozen=True)
class CurvePoint:
    """Most concurrent sequences that fit at one context length."""

    context: int
    max_batch: int


def _hardware_row(model: ModelSpec | str, key: str, workload: Workload | None,
                  settings: Settings | None) -> HardwareRow:
    hw = get_hardware(key)
    s = _compare_settings(hw, settings)
    est = estimate(model, hw, workload, s, detail=False)
    fits, verdict, needed = est.fits, est.verdict, est.devices_needed
    if not est.fits and est.devices_needed:  # report speed and memory where it does fit
        est = estimate(model, hw, workload, replace(s, tp=est.devices_needed_tp, pp=est.devices_needed_pp or 1),
                       detail=False)
    return HardwareRow(hardware=key, name=hw.name, memory_gib=hw.memory_bytes / GiB, framework=est.framework,
                       fits=fits, verdict=verdict, devices_needed=needed, tp=est.tp, pp=est.pp,
                       total_gib=est.total_bytes_per_device / GiB, usable_gib=est.usable_bytes_per_device / GiB,
                       decode_tokens_per_s=est.decode_tokens_per_s,
                       decode_tokens_per_s_roofline=est.decode_tokens_per_s_roofline,
                       prefill_seconds=est.prefill_seconds, max_context=est.max_context)


def compare_hardware(model: ModelSpec | str, keys: list[str], workload: Workload | None = None,
                     settings: Settings | None = None) -> list[HardwareRow]:
    """One row per hardware preset: fits? devices needed? tokens/s. Errors become a row note."""
    rows = []
    for key in keys:
        try:
            rows.append(_hardware_row(model, key, workload, settings))
        except SizingError as exc:
            rows.append(HardwareRow(hardware=key, name=key, error=str(exc)))
    return rows


def concurrency_curve(model: ModelSpec | str, hardware: Hardware | str, workload: Workload | None = None,
                      settings: Settings | None = None, contexts: list[int] | None = None) -> list[CurvePoint]:
    """Most concurrent sequences that fit at each context length (for the page's curve)."""
    spec, hw = _resolve_inputs(model, hardware)
    plan = Plan(spec, hw, workload or Workload(), settings or Settings())
    if contexts is None:
        top = spec.max_model_len or 131072
        contexts = sorted({c for c in (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, top)
                           if 2 <= c <= top})
    return [CurvePoint(c, _max_batch(plan, c)) for c in contexts]


__all__ = ["CurvePoint", "Estimate", "FittedLayout", "FormatOption", "HardwareRow", "Speed", "compare_hardware",
           "concurrency_curve", "estimate", "kv_bytes_per_token", "weight_bytes"]
