"""The audit: for a model on hardware under a framework version, with settings and evidence,
which known optimisations apply, are supported, are on (and from what evidence), what each would
gain here, how far the measured figures are from the roofline, and what to change first.

    settings     evidence (a log: source "log") < what the user typed ("setting"); a canonical setting
                 nobody stated that an optimisation reads takes the version's default ("default")
    checklist    one item per optimisation in the knowledge table (knowledge.py), in its order:
                   applies     the model has what it needs (GQA, MoE, MLA) and the hardware too (FP8, BF16,
                               an sm version, an Ascend generation, a CPU feature)
                   supported   the table's row for this framework and version
                   enabled     the evidence's setting, else the version's default
                   gain        predicted here: the calculator (weight / KV formats, TP) and the serving
                               simulator (prefix caching, chunked prefill); else the table's sourced words
    roofline     measured decode tokens/s (a benchmark block or typed in) against the bandwidth bound,
                 measured TTFT against the compute bound, next to the efficiency the hardware preset
                 expects (its source), and where the simulator puts a decode step's time
    recommend    items that apply, are supported and are off, ranked by predicted gain (numbers
                 first, then the sourced words); items the hardware or version cannot run are listed
                 apart with why, never recommended

All of it is prediction from the calculator, the simulator and the table, except the figures a
benchmark block or the user gives; the report says which is which.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from engine.audit.evidence import CANONICAL, Evidence, Setting, Value
from engine.audit.knowledge import FrameworkVersion, Knowledge, Optimisation, Support, knowledge
from engine.costmodel.model import simulated_model
from engine.costmodel.shape import ChunkShape, StepShape
from engine.simulate.metrics import summarize
from engine.simulate.simulator import ServingKnobs, simulate
from engine.simulate.workload import Lengths, generate
from engine.sizing.arch.records import ModelSpec
from engine.sizing.estimate import Estimate, estimate
from engine.sizing.formats import SizingError
from engine.sizing.hardware import Hardware, get_hardware
from engine.sizing.models import get_model
from engine.sizing.plan import Settings, Workload

Status = Literal["on", "off", "unsupported", "not applicable", "unknown"]

#: the calculator's framework for each audited one (others are sized as plain weights + KV)
SIZING_FRAMEWORK = {"vllm": "vllm", "sglang": "sglang", "vllm-ascend": "vllm-ascend", "mindie": "mindie",
                    "inferscope": "inferscope"}
#: KV dtypes that are not a quantization
FULL_KV = {"auto", "bf16", "bfloat16", "fp16", "float16", "f16", "torch.bfloat16", "torch.float16", "fp32", "f32"}
#: weight quantization names (vLLM / SGLang's --quantization, llama.cpp's file types) per optimisation
QUANT_NAMES = {
    "weight_quant_fp8": ("fp8", "fbgemm_fp8", "modelopt", "ptpc_fp8"),
    "weight_quant_w8a8": ("w8a8", "w8a8_int8", "smoothquant", "compressed-tensors", "compressed_tensors",
                          "sq"),
    "weight_quant_awq_gptq": ("awq", "gptq", "awq_marlin", "gptq_marlin", "marlin", "auto_round", "gguf",
                              "bitsandbytes", "q4"),
    "marlin_kernels": ("marlin", "awq_marlin", "gptq_marlin", "gptq_marlin_24"),
}
#: the calculator's weight format that each weight-quantization optimisation would give
QUANT_TARGET = {"weight_quant_fp8": "fp8", "weight_quant_w8a8": "w8a8", "weight_quant_awq_gptq": "int4"}
#: optimisation -> the canonical setting that says whether it is on
SETTING_OF = {"prefix_caching": "enable_prefix_caching", "chunked_prefill": "enable_chunked_prefill",
              "cuda_graphs": "cuda_graphs"}
#: words in a speculative setting that name its method (anything else is a draft model)
SPECULATIVE_WORDS = {"speculative_ngram": ("ngram",), "speculative_eagle_mtp": ("eagle", "mtp", "medusa"),
                     "speculative_draft": ()}
#: the shared-prefix workload the simulator prices prefix caching and chunked prefill on
GAIN_REQUESTS = 48


@dataclass(frozen=True)
class CheckItem:
    name: str
    title: str
    applies: bool
    applies_why: str
    supported: bool | None  # None: the table has no row for this framework version
    supported_why: str
    enabled: bool | None  # None: unknown
    evidence: str  # where "enabled" comes from, in words (a log line, a setting, the default)
    expected_gain: str  # here, predicted ("" when nothing is known)
    gain_ratio: float | None  # the predicted factor behind expected_gain (ranking), None: words only
    how: str  # the flag or config that turns it on ("" when there is none)
    source: str  # the table entry's source url

    @property
    def status(self) -> Status:
        if not self.applies:
            return "not applicable"
        if self.supported is False:
            return "unsupported"
        if self.enabled is None:
            return "unknown"
        return "on" if self.enabled else "off"


@dataclass(frozen=True)
class Roofline:
    """Measured against the bounds (all per sequence at the audited batch)."""

    batch: int
    context: int
    decode_bound_tokens_per_s: float  # bandwidth bound (roofline)
    decode_predicted_tokens_per_s: float  # the calculator's, with the preset's efficiency
    decode_measured_tokens_per_s: float | None
    bandwidth_utilisation: float | None  # measured / bound
    typical_utilisation: float  # the hardware preset's memory efficiency
    typical_source: str
    prefill_bound_s: float
    ttft_measured_s: float | None
    compute_utilisation: float | None  # bound / measured TTFT (prefill of the context's prompt)
    step_shares: dict[str, float]  # the simulator's decode step by part (gemm, attention, ..., overhead)
    attribution: tuple[str, ...]  # where the gap goes, in words


@dataclass(frozen=True)
class Recommendation:
    name: str
    title: str
    how: str
    gain: str
    gain_ratio: float | None


@dataclass(frozen=True)
class AuditReport:
    model: str
    hardware: str
    framework: str
    version: str  # the version answered for (the table's nearest known)
    engine: str | None
    detected: dict[str, Setting]
    checklist: tuple[CheckItem, ...]
    roofline: Roofline | None
    recommendations: tuple[Recommendation, ...]
    cannot: tuple[tuple[str, str], ...]  # (title, why) of items this hardware or version cannot run
    warnings: tuple[str, ...] = field(default_factory=tuple)


# -- what applies -----------------------------------------------------------------------------------

def model_has(spec: ModelSpec, prop: str) -> tuple[bool, str]:
    kinds = {layer.kind for layer in spec.layers}
    if prop == "gqa":
        ok = 0 < spec.num_kv_heads < spec.num_heads or "mla" in kinds
        return ok, f"{spec.display_name}: {spec.num_heads} query heads, {spec.num_kv_heads} KV heads"
    if prop == "moe":
        return spec.is_moe, f"{spec.display_name} is {'' if spec.is_moe else 'not '}a mixture of experts"
    if prop == "mla":
        return "mla" in kinds, f"{spec.display_name} {'has' if 'mla' in kinds else 'has no'} MLA layers"
    if prop == "multi_device":
        return True, ""
    return True, f"(model condition {prop!r} is not one this audit reads)"


def hardware_meets(need: str, hw: Hardware, kn: Knowledge, cpu_features: str = "") -> tuple[bool | None, str]:
    """Does ``hw`` have what ``need`` names? (None: unknown), and why in words."""
    feats = kn.hardware.get(hw.key)
    if need == "fp8":
        ok = hw.fp8_flops is not None or bool(feats and feats.fp8)
        return ok, f"{hw.name} {'has' if ok else 'has no'} FP8"
    if need == "bf16":
        ok = hw.bf16_flops is not None or bool(feats and feats.bf16)
        return ok, f"{hw.name} {'has' if ok else 'has no'} BF16"
    if need.startswith("cuda_sm>="):
        want = int(need.split(">=")[1])
        sm = feats.cuda_sm if feats else None
        if not hw.device_class.startswith("nvidia"):
            return None, ""  # a CUDA condition says nothing of other hardware: the framework's row decides
        if sm is None:
            return None, f"{hw.name}: sm version unknown"
        return sm >= want, f"{hw.name} is sm{sm} (needs sm{want}+)"
    if need.startswith("ascend"):
        arch = feats.arch if feats else hw.device_class
        ok = arch.startswith(need) or hw.device_class.startswith(need.replace("-910b", "-910"))
        return ok, f"{hw.name} is {arch}"
    if need.startswith(("avx", "amx")):
        have = {f.lower() for f in cpu_features.split(",") if f}
        if not have:
            return None, f"{hw.name}: CPU features unknown (paste a llama.cpp log to read them)"
        return need.lower() in have, f"CPU features: {cpu_features}"
    if need == "cuda":
        ok = hw.device_class.startswith("nvidia")
        return ok, f"{hw.name} is {'' if ok else 'not '}an NVIDIA GPU"
    if need == "multi_device":
        return True, ""
    return None, f"(hardware condition {need!r} is not one this audit reads)"


# -- what is on ----------------------------------------------------------------------------------

def _quant_on(name: str, settings: dict[str, Setting], spec: ModelSpec) -> tuple[bool | None, str]:
    q = settings.get("quantization")
    if q is None:  # every framework's default is none: the checkpoint's own format decides
        if spec.quantization is None:
            return False, f"no quantization stated; {spec.display_name}'s checkpoint is {spec.checkpoint_dtype}"
        return None, f"no quantization stated; the checkpoint is quantized ({spec.quantization})"
    v = str(q.value).lower() if q.value is not None else "none"
    return any(n in v for n in QUANT_NAMES[name]), _said(q)


def _said(s: Setting) -> str:
    if s.source == "log":
        return f"log line {s.line_no}: {s.name} = {s.value!r}"
    if s.source == "setting":
        return f"your setting: {s.name} = {s.value!r}"
    return f"default: {s.name} = {s.value!r}"


def enabled(opt: Optimisation, settings: dict[str, Setting], row: Support | None, spec: ModelSpec,
            applies: bool) -> tuple[bool | None, str]:
    """Is ``opt`` on in this deployment, and the evidence in words."""
    n = opt.name
    if n in SETTING_OF and SETTING_OF[n] in settings:
        s = settings[SETTING_OF[n]]
        return (bool(s.value) if isinstance(s.value, bool) else None), _said(s)
    if n in QUANT_NAMES:
        return _quant_on(n, settings, spec)
    if n == "kv_cache_quant" and "kv_cache_dtype" in settings:
        s = settings["kv_cache_dtype"]
        return str(s.value).lower() not in FULL_KV, _said(s)
    if n in ("flash_attention", "flashinfer") and ("attention_backend" in settings or "flash_attn" in settings):
        s = settings.get("attention_backend") or settings["flash_attn"]
        v = str(s.value).lower()
        if s.name == "flash_attn":
            return bool(s.value) if isinstance(s.value, bool) else None, _said(s)
        on = ("flashinfer" in v) if n == "flashinfer" else any(k in v for k in ("flash_attn", "fa3", "fa2", "flashattn"))
        return on, _said(s)
    if n in SPECULATIVE_WORDS and "speculative" in settings:
        s = settings["speculative"]
        v = str(s.value).lower()
        method = next((m for m, words in SPECULATIVE_WORDS.items() if any(w in v for w in words)),
                      "speculative_draft")  # any other speculative config names a draft model
        return (v not in ("none", "") and method == n), _said(s)
    if n in ("tensor_parallel", "pipeline_parallel") and f"{n}_size" in settings:
        s = settings[f"{n}_size"]
        return (isinstance(s.value, int) and s.value > 1), _said(s)
    if n in ("gqa_mqa", "mla"):
        return applies, "a property of the model"
    if row is not None and row.supported:
        return row.default_on, f"default of this version ({'on' if row.default_on else 'off'})"
    return None, "nothing states it"


def with_defaults(settings: dict[str, Setting], kn: Knowledge, framework: str, version: str,
                  hw: Hardware) -> dict[str, Setting]:
    """``settings`` plus, for each setting nobody stated, the version's documented default: the
    optimisations' switches (off where the version cannot run one on ``hw``) and the settings the
    table records (FrameworkVersion.defaults)."""
    out = dict(settings)
    fv = kn.frameworks.get(framework, {}).get(version)
    if fv is not None and fv.defaults_source is not None:
        for name, value in fv.defaults.items():
            if name not in out and name in CANONICAL:
                out[name] = Setting(name, value, "default", f"{framework} {version}: {name} defaults to {value!r} "
                                    f"({fv.defaults_source.url})")
    for opt_name, name in SETTING_OF.items():
        if name in out:
            continue
        try:
            row = kn.support(kn.optimisation(opt_name), framework, version)
        except KeyError:
            continue
        if row is not None and row.supported:
            ok, why = _row_hardware(row, hw, kn)
            on = row.default_on and ok
            out[name] = Setting(name, on, "default", f"{framework} {version}: {'on' if on else 'off'} by default"
                                + (f" ({why})" if not ok else f" ({row.source.url})"))
    return out


# -- what it would gain --------------------------------------------------------------------------

def _sizing_settings(settings: dict[str, Setting], framework: str, version: str, **over: object) -> Settings:
    tp = settings.get("tensor_parallel_size")
    pp = settings.get("pipeline_parallel_size")
    kw: dict[str, object] = {"framework": SIZING_FRAMEWORK.get(framework, "none"),
                             "tp": tp.value if tp and isinstance(tp.value, int) and tp.value >= 1 else None,
                             "pp": pp.value if pp and isinstance(pp.value, int) and pp.value >= 1 else 1}
    if framework in ("vllm", "sglang"):
        kw["framework_version"] = version
    kv = settings.get("kv_cache_dtype")
    if kv and str(kv.value).lower() in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        kw["kv_dtype"] = "fp8"
    kw.update(over)
    return Settings(**kw)  # type: ignore[arg-type]


def _estimate(spec: ModelSpec, hw: Hardware, work: Workload, s: Settings) -> Estimate | None:
    try:
        return estimate(spec, hw, work, s, detail=False)
    except (SizingError, ValueError):
        return None


def _prefix_and_chunk_gains(spec: ModelSpec, hw: Hardware, s: Settings, context: int) -> dict[str, tuple[str, float]]:
    """The simulator's p50 TTFT with and without prefix caching (half of each prompt shared, 4 system
    prompts), and its p90 TPOT with and without chunked prefill, on this deployment."""
    out: dict[str, tuple[str, float]] = {}
    prompt = max(64, min(context, 2048) // 2)
    try:
        sim = simulated_model(spec, hw, s, max_model_len=min(spec.max_model_len or context, 4 * prompt))
    except (SizingError, ValueError):
        return out
    work = generate(GAIN_REQUESTS, 4.0, Lengths("fixed", prompt), Lengths("fixed", 128), seed=1, prefix_groups=4,
                    prefix_tokens=prompt // 2)
    on = summarize(simulate(sim, work, ServingKnobs(enable_prefix_caching=True)))
    off = summarize(simulate(sim, work, ServingKnobs(enable_prefix_caching=False)))
    if on.ttft_p50_s and off.ttft_p50_s:
        out["prefix_caching"] = (f"p50 TTFT {off.ttft_p50_s:.3g} s -> {on.ttft_p50_s:.3g} s "
                                 f"({(on.ttft_p50_s / off.ttft_p50_s - 1):+.0%}) with half of each {prompt}-token "
                                 f"prompt shared (simulated, {GAIN_REQUESTS} requests at 4/s)",
                                 off.ttft_p50_s / on.ttft_p50_s)
    ch = summarize(simulate(sim, work, ServingKnobs(enable_prefix_caching=False, enable_chunked_prefill=True)))
    un = summarize(simulate(sim, work, ServingKnobs(enable_prefix_caching=False, enable_chunked_prefill=False)))
    if ch.tpot_p90_s and un.tpot_p90_s:
        out["chunked_prefill"] = (f"p90 TPOT {un.tpot_p90_s * 1e3:.3g} ms -> {ch.tpot_p90_s * 1e3:.3g} ms "
                                  f"({(ch.tpot_p90_s / un.tpot_p90_s - 1):+.0%}) (simulated, the same workload)",
                                  un.tpot_p90_s / ch.tpot_p90_s)
    return out


def gains(spec: ModelSpec, hw: Hardware, settings: dict[str, Setting], framework: str, version: str,
          work: Workload, simulate_gains: bool) -> dict[str, tuple[str, float]]:
    """Predicted gains here, by optimisation: (words, factor)."""
    base_s = _sizing_settings(settings, framework, version)
    base = _estimate(spec, hw, work, base_s)
    out: dict[str, tuple[str, float]] = {}
    if base is None:
        return out
    for name, fmt in QUANT_TARGET.items():
        if base.weights_format == fmt:
            continue
        e = _estimate(spec, hw, work, _sizing_settings(settings, framework, version, weights=fmt))
        if e is not None and e.decode_tokens_per_s and base.decode_tokens_per_s:
            out[name] = (f"decode {base.decode_tokens_per_s:.3g} -> {e.decode_tokens_per_s:.3g} tokens/s per sequence "
                         f"({base.weights_format} -> {e.weights_format} weights, calculator)",
                         e.decode_tokens_per_s / base.decode_tokens_per_s)
    if base.kv_dtype not in ("fp8", "int8"):
        kinds = ("fp8", "int8") if hw.fp8_flops is not None or hw.device_class.startswith("nvidia") else ("int8",)
        for kv in kinds:  # (no FP8 KV where the hardware has no FP8: Ascend 310P, CPUs)
            e = _estimate(spec, hw, work, _sizing_settings(settings, framework, version, kv_dtype=kv))
            if e is not None and e.kv_room_tokens and base.kv_room_tokens:
                out["kv_cache_quant"] = (f"KV room {base.kv_room_tokens:,} -> {e.kv_room_tokens:,} tokens "
                                         f"({base.kv_dtype} -> {kv} KV cache, calculator)",
                                         e.kv_room_tokens / base.kv_room_tokens)
                break
    e = _estimate(spec, hw, work, _sizing_settings(settings, framework, version, tp=2 * base.tp))
    if e is not None and e.fits and e.decode_tokens_per_s and base.decode_tokens_per_s:
        out["tensor_parallel"] = (f"decode {base.decode_tokens_per_s:.3g} -> {e.decode_tokens_per_s:.3g} tokens/s "
                                  f"per sequence at TP {2 * base.tp} (twice the devices, calculator)",
                                  e.decode_tokens_per_s / base.decode_tokens_per_s)
    if simulate_gains and base.fits:
        out.update(_prefix_and_chunk_gains(spec, hw, base_s, work.context or 4096))
    return out


# -- the roofline gap ----------------------------------------------------------------------------

def roofline(spec: ModelSpec, hw: Hardware, settings: dict[str, Setting], framework: str, version: str,
             work: Workload, evidence: Evidence | None, decode_tok_s: float | None,
             ttft_s: float | None) -> Roofline | None:
    s = _sizing_settings(settings, framework, version)
    est = _estimate(spec, hw, work, s)
    if est is None:
        return None
    bench = evidence.benchmark if evidence else None
    measured = decode_tok_s if decode_tok_s is not None else (bench.decode_tokens_per_s if bench else None)
    ttft = ttft_s if ttft_s is not None else (bench.ttft_s if bench else None)
    bw = measured / est.decode_tokens_per_s_roofline if measured and est.decode_tokens_per_s_roofline else None
    cu = est.prefill_seconds_roofline / ttft if ttft and est.prefill_seconds_roofline else None
    shares: dict[str, float] = {}
    why: list[str] = []
    ctx = work.context or 1
    try:
        sim = simulated_model(spec, hw, s, max_model_len=min(spec.max_model_len or ctx, max(ctx, 2)))
        cost = sim.cost.step_cost(StepShape(tuple(ChunkShape(1, max(1, ctx - 1), 1)
                                                  for _ in range(work.batch))))
        total = cost.total_s or 1.0
        shares = {k: v / total for k, v in cost.as_dict().items() if k != "total_s"}
        if shares.get("overhead_s", 0) > 0.2:
            why.append(f"step overhead is {shares['overhead_s']:.0%} of a decode step at batch {work.batch}: "
                       f"a larger batch (and graph capture, where supported) amortises it")
        if shares.get("comm_s", 0) > 0.15:
            why.append(f"communication is {shares['comm_s']:.0%} of a decode step (TP {est.tp} over "
                       f"{hw.name}'s link)")
        seqs = est.kv_room_tokens // ctx
        if seqs < 64:
            why.append(f"KV-limited: the KV room ({est.kv_room_tokens:,} tokens) holds {seqs} sequence(s) of "
                       f"{ctx:,} tokens: concurrency, not bandwidth, caps throughput")
    except (SizingError, ValueError):
        pass
    if work.batch <= 4:
        why.append(f"batch {work.batch}: each step reads all the weights for {work.batch} token(s); a larger "
                   f"batch raises tokens/s almost in proportion until compute binds")
    if bw is not None and bw < 0.6 * est.efficiency_memory:
        why.append(f"measured {bw:.0%} of the bandwidth bound, under the {est.efficiency_memory:.0%} this "
                   f"hardware's preset expects: look at the items marked off below")
    return Roofline(work.batch, ctx, est.decode_tokens_per_s_roofline, est.decode_tokens_per_s, measured,
                    bw, est.efficiency_memory, hw.name + " preset (presets/hardware/" + hw.key + ".json)",
                    est.prefill_seconds_roofline, ttft, cu, shares, tuple(why))


# -- the audit -------------------------------------------------------------------------------------

def merged_settings(evidence: Evidence | None, typed: dict[str, Value]) -> dict[str, Setting]:
    """Evidence's settings, then what the user typed on top (module doc)."""
    out = dict(evidence.settings) if evidence else {}
    for name, value in typed.items():
        if name not in CANONICAL:
            raise ValueError(f"setting: unknown name {name!r} (one of {', '.join(CANONICAL)})")
        if value is not None:
            out[name] = Setting(name, value, "setting")
    return out


def _alnum(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch.isalnum())


def _device_contradiction(device: str, line_no: int, hw: Hardware) -> str | None:
    """The log's device against the chosen hardware: a CUDA GPU for an NPU (or the other way round),
    or another GPU model (the hardware key's first part with a digit, e.g. "4090", "h100", must appear)."""
    cuda = "cuda" in device.lower() or "compute capability" in device
    npu = "npu" in device.lower()
    if (cuda and not hw.device_class.startswith("nvidia")) or (npu and not hw.device_class.startswith("ascend")):
        return f"the log runs on {device} (line {line_no}), but the audit is for {hw.name}"
    model = next((part for part in hw.key.split("-") if any(ch.isdigit() for ch in part)), "")
    if cuda and "compute capability" in device and model and model not in _alnum(device):
        return f"the log runs on {device} (line {line_no}), but the audit is for {hw.name}"
    return None


def _contradictions(settings: dict[str, Setting], framework: str, spec: ModelSpec, hw: Hardware,
                    devices: tuple[tuple[str, int], ...]) -> list[str]:
    out = [w for d, n in devices if (w := _device_contradiction(d, n, hw)) is not None]
    fw = settings.get("framework")
    if fw is not None and fw.source == "log" and str(fw.value) != framework and not (
            {str(fw.value), framework} == {"vllm", "vllm-ascend"}):
        out.append(f"the log is a {fw.value} log (line {fw.line_no}), but the audit is for {framework}")
    m = settings.get("model")
    if m is not None and m.source == "log" and isinstance(m.value, str):
        said = _alnum(m.value)
        names = {_alnum(n.split("/")[-1]) for n in (spec.key, spec.hf_id or "", spec.display_name) if n}
        if not any(n and n in said for n in names):
            out.append(f"the log serves {m.value!r} (line {m.line_no}), not {spec.display_name}")
    return out


def _row_hardware(row: Support, hw: Hardware, kn: Knowledge) -> tuple[bool, str]:
    """Can this version run the row's way of turning it on, on ``hw``? (an FP8 value needs FP8)."""
    feats = kn.hardware.get(hw.key)
    arch = feats.arch if feats else hw.device_class
    if arch in row.unsupported_on:
        return False, f"{row.unsupported_why} ({hw.name} is {arch})"
    if row.value and "fp8" in row.value.lower() and not hw.device_class.startswith("nvidia"):
        # (CUDA GPUs without FP8 compute still store an FP8 KV cache: the sm conditions say the rest)
        has, why = hardware_meets("fp8", hw, kn)
        if has is False:
            return False, why
    return True, ""


def _how(row: Support | None, on: bool | None) -> str:
    """What to change to turn it on: the flag (and value), or removing the flag that turned it off."""
    if row is None or not row.supported:
        return ""
    if row.how_on:
        return row.how_on
    if row.default_on and row.how_off:
        return f"remove {row.how_off}"
    return ""


def _check(opt: Optimisation, spec: ModelSpec, hw: Hardware, kn: Knowledge, fv: FrameworkVersion,
           settings: dict[str, Setting], gain: dict[str, tuple[str, float]]) -> CheckItem:
    applies, why = True, ""
    if opt.applies_model:
        applies, why = model_has(spec, opt.applies_model)
    hw_ok, hw_why = (True, "")
    if opt.needs_hardware:
        hw_ok_, hw_why = hardware_meets(opt.needs_hardware, hw, kn, str(settings["cpu_features"].value)
                                        if "cpu_features" in settings else "")
        hw_ok = hw_ok_ if hw_ok_ is not None else True
        if not hw_ok and opt.needs_why:
            hw_why += f" ({opt.needs_why})"
    if "fp8" in opt.name and not hw.device_class.startswith("nvidia"):  # (on CUDA the sm condition decides)
        fp8, fp8_why = hardware_meets("fp8", hw, kn)
        if fp8 is False:
            hw_ok, hw_why = False, fp8_why
    row = kn.support(opt, fv.framework, fv.version)
    if row is None:
        supported: bool | None = None if hw_ok else False
        sup_why = f"the table does not say for {fv.framework} {fv.version}" + ("" if hw_ok else f"; {hw_why}")
    else:
        row_ok, row_why = _row_hardware(row, hw, kn)
        supported = row.supported and hw_ok and row_ok
        sup_why = "; ".join(w for w in (row.note or ("supported" if row.supported else "not supported"),
                                         "" if hw_ok else hw_why, row_why) if w)
    if opt.name == "kv_cache_quant" and supported is not False:
        fp8, fp8_why = hardware_meets("fp8", hw, kn)
        if fp8 is False and not hw.device_class.startswith("nvidia") and (
                row is None or (row.value is not None and "fp8" in row.value.lower())):
            supported = False
            sup_why += f"; FP8 KV cache: {fp8_why}" + ("" if row is not None else
                                                       f", and the table knows no INT8 KV path in {fv.framework}")
    on, evidence = enabled(opt, settings, row, spec, applies)
    g = gain.get(opt.name)
    return CheckItem(opt.name, opt.title, applies, why or hw_why, supported, sup_why, on, evidence,
                     g[0] if g else opt.gain, g[1] if g else None, _how(row, on), opt.source.url)


#: optimisations that stand in for one another: one on, the others are not recommended
ALTERNATIVES: tuple[frozenset[str], ...] = (
    frozenset({"flash_attention", "flashinfer"}),
    frozenset({"weight_quant_w8a8", "weight_quant_fp8", "weight_quant_awq_gptq"}),
    frozenset({"speculative_ngram", "speculative_draft", "speculative_eagle_mtp"}),
)
#: recommended only with a predicted number (they change what runs where, not how fast it runs)
NUMBERS_ONLY = frozenset({"tensor_parallel", "pipeline_parallel", "expert_parallel", "disaggregated_prefill"})


def recommendable(item: CheckItem, items: dict[str, CheckItem]) -> bool:
    """Off, supported here, and not standing in for one that is on (ALTERNATIVES); Marlin only for a
    4-bit checkpoint; the parallelisms only with a predicted gain."""
    if item.status != "off" or not item.supported:
        return False
    if item.gain_ratio is not None:
        return item.gain_ratio > 1.0
    if item.name in NUMBERS_ONLY:
        return False
    if item.name == "marlin_kernels":
        q = items.get("weight_quant_awq_gptq")
        return bool(q and q.enabled)
    return not any(item.name in group and any(items[n].enabled for n in group if n != item.name and n in items)
                   for group in ALTERNATIVES)


def run_audit(model: str, hardware: str, framework: str, version: str | None = None, *,
              settings: dict[str, Value] | None = None, evidence: Evidence | None = None,
              measured_decode_tok_s: float | None = None, measured_ttft_s: float | None = None,
              batch: int = 1, context: int = 4096, simulate_gains: bool = True,
              kn: Knowledge | None = None) -> AuditReport:
    """The audit (module doc). ValueError naming the field for a bad input."""
    kn = kn or knowledge()
    if framework not in kn.frameworks:
        raise ValueError(f"framework: must be one of {', '.join(sorted(kn.frameworks))}, got {framework!r}")
    for name, v in (("batch", batch), ("context", context)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: must be a whole number >= 1, got {v!r}")
    for name, x in (("measured_decode_tok_s", measured_decode_tok_s), ("measured_ttft_s", measured_ttft_s)):
        if x is not None and not (isinstance(x, (int, float)) and math.isfinite(x) and x > 0):
            raise ValueError(f"{name}: must be a number > 0, got {x!r}")
    try:
        spec, hw = get_model(model), get_hardware(hardware)
    except SizingError as e:
        raise ValueError(str(e)) from None
    detected = merged_settings(evidence, settings or {})
    warnings = list(evidence.warnings) if evidence else []
    if version is None and "version" in detected:
        version = str(detected["version"].value)
    fv, warn = kn.resolve(framework, version)
    if warn:
        warnings.append(warn)
    assert fv is not None  # the framework is in the table (checked above)
    detected = with_defaults(detected, kn, fv.framework, fv.version, hw)
    warnings += _contradictions(detected, framework, spec, hw, evidence.devices if evidence else ())
    work = Workload(batch=batch, context=context)
    gain = gains(spec, hw, detected, fv.framework, fv.version, work, simulate_gains)
    items = tuple(_check(o, spec, hw, kn, fv, detected, gain) for o in kn.optimisations)
    by_name = {i.name: i for i in items}
    recs = sorted((i for i in items if recommendable(i, by_name)),
                  key=lambda i: (i.gain_ratio is None, -(i.gain_ratio or 0.0)))
    cannot = tuple((i.title, i.supported_why) for i in items if i.status == "unsupported")
    return AuditReport(spec.key, hw.key, fv.framework, fv.version, (evidence.engine if evidence else None) or fv.engine,
                       detected, items,
                       roofline(spec, hw, detected, fv.framework, fv.version, work, evidence, measured_decode_tok_s,
                                measured_ttft_s),
                       tuple(Recommendation(i.name, i.title, i.how, i.expected_gain, i.gain_ratio) for i in recs),
                       cannot, tuple(dict.fromkeys(warnings)))
