"""Inputs resolved to numbers: the serving framework's budget rule, formats, parallelism and
workload, then memory per device and roofline speed for any (batch, context, tp, pp).

Budget rules (sizing.md §3.5, §1):
  none         usable = device memory (x usable share for unified memory); needs = weights + KV
               + activations + overhead.
  vllm         usable = gpu_memory_utilization x total; activations profiled at
               max_num_batched_tokens; the KV pool is whatever is left (reserved up front).
  sglang       weights + KV pool <= mem_fraction_static x total; the rest is held back for
               activations (shown as "reserve" when the activations need less).
  vllm-ascend  as vLLM with block size 128; on 310P also a dense FP16 mask of
               max_model_len^2 x 2 B and the KV budget halved ("reserve" = the other half).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction as F

from . import activations
from .arch import ModelSpec
from .formats import KVDtype, SizingError, WeightFormat, kv_dtype, weight_format
from .hardware import FRAMEWORKS, GiB, MiB, Hardware

DEFAULT_CONTEXT = 4096
DEFAULT_OUTPUT = 512
ACT_COEFF = 11  # aiconfigurator's LLAMA activation coefficient at TP1 (sizing.md §3.4)
COMM_LATENCY_S = 8e-6  # per all-reduce / stage hop (assumed)
MAX_DEVICES = 64
MAX_CONTEXT_SEARCH = 1 << 24
MAX_BATCH_SEARCH = 1 << 20


def nccl_bytes(devices: int) -> int:
    """aiconfigurator: NCCL buffers 342 MiB at TP2, 392 MiB at TP4/8 (sizing.md §3.5)."""
    if devices <= 1:
        return 0
    return (342 if devices == 2 else 392) * MiB


def sglang_fraction(tp: int) -> float:
    """SGLang's default mem_fraction_static by TP (server_args; newer versions size it from capacity)."""
    if tp >= 16:
        return 0.79
    if tp >= 8:
        return 0.81
    if tp >= 4:
        return 0.85
    if tp >= 2:
        return 0.87
    return 0.88


def roofline_decode_tokens_per_s(bytes_per_token: float, bandwidth: float, efficiency: float = 1.0) -> float:
    """Memory-bound decode: tokens/s = bandwidth x efficiency / bytes read per token."""
    return bandwidth * efficiency / bytes_per_token


def ascend_mask_bytes(max_model_len: int) -> int:
    """vllm-ascend 310P dense FP16 causal mask: max_model_len^2 x 2 bytes."""
    return max_model_len * max_model_len * 2


# --------------------------------------------------------------------------------------
# inputs


@dataclass(frozen=True)
class Workload:
    batch: int = 1  # concurrent sequences
    context: int | None = None  # total tokens per sequence (text + image tokens + output)
    prompt: int | None = None  # text tokens of the prompt
    output: int | None = None  # generated tokens
    images: int | None = None  # images per sequence (vision-language models)
    tiles: int | None = None  # tiles per image (InternVL: up to 12 + thumbnail)


@dataclass(frozen=True)
class Settings:
    weights: str = "auto"
    kv_dtype: str = "auto"
    vision_dtype: str = "auto"
    tp: int | None = None
    pp: int = 1
    framework: str = "auto"
    gpu_memory_utilization: float | None = None  # vLLM util / SGLang mem_fraction_static
    block_size: int | None = None
    max_num_batched_tokens: int | None = None
    eta_memory: float | None = None
    eta_compute: float | None = None


def _pos_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) and not (isinstance(value, float) and value.is_integer()):
        raise SizingError(f"{name} must be a whole number, got {value!r}")
    value = int(value)
    if value < minimum:
        raise SizingError(f"{name} must be >= {minimum}, got {value}")
    return value


def _fraction_in(name: str, value, low: float = 0.0, high: float = 1.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not low < value <= high:
        raise SizingError(f"{name} must be in ({low:g}, {high:g}], got {value!r}")
    return float(value)


def _ceil(x) -> int:
    return int(math.ceil(x)) if not isinstance(x, F) else -((-x.numerator) // x.denominator)


def _round_up(n: int, block: int) -> int:
    return -(-n // block) * block


def gib(n: float) -> str:
    return f"{n / GiB:,.2f} GiB"


def _fmt_bytes(n: float) -> str:
    n = float(n)
    if abs(n) >= GiB:
        return f"{n / GiB:,.2f} GiB"
    if abs(n) >= MiB:
        return f"{n / MiB:,.1f} MiB"
    if abs(n) >= 1024:
        return f"{n / 1024:,.1f} KiB"
    return f"{n:,.0f} B"


def rate(flops: float) -> str:
    """FLOP/s for people: TFLOP/s above 1e12, else GFLOP/s."""
    return f"{flops / 1e12:,.1f} TFLOP/s" if flops >= 1e12 else f"{flops / 1e9:,.1f} GFLOP/s"


FRAMEWORK_LABELS = {"none": "no serving framework (plain)", "vllm": "vLLM", "sglang": "SGLang",
                    "vllm-ascend": "vllm-ascend"}


def _tok(n: int) -> str:
    return f"{n:,}"


# --------------------------------------------------------------------------------------
# the resolved plan


class Plan:
    """Inputs resolved to numbers; cheap memory and speed evaluation for any (batch, context, tp, pp)."""

    def __init__(self, model: ModelSpec, hw: Hardware, workload: Workload, settings: Settings):
        self.model, self.hw, self.settings, self.workload_in = model, hw, settings, workload
        self.warnings: list[str] = []
        self.notes: list[str] = list(model.notes) + ([hw.alias_note] if hw.alias_note else [])
        self._resolve_framework()
        self._resolve_formats()
        self._resolve_parallel()
        self._resolve_workload(workload)
        self._static: dict[tuple[int, int], list[dict]] = {}
        self._platform_warnings()

    # -- resolution ----------------------------------------------------------------
    def _resolve_framework(self) -> None:
        s, hw = self.settings, self.hw
        fw = str(s.framework or "auto").strip().lower()
        if fw == "auto":
            fw = hw.default_framework
        if fw not in FRAMEWORKS:
            raise SizingError(f"unknown framework {s.framework!r}; choose one of: auto, {', '.join(FRAMEWORKS)}")
        if fw == "vllm-ascend" and not hw.is_ascend:
            raise SizingError(f"vllm-ascend runs on Ascend NPUs only; for {hw.name} use vllm, sglang or none")
        if fw == "vllm" and hw.is_ascend:
            self.notes.append("vLLM on Ascend is the vllm-ascend plugin: its rules are applied")
            fw = "vllm-ascend"
        if fw == "sglang" and hw.is_310p:
            self.warnings.append("SGLang has no Ascend 310P support; the budget is SGLang's rule only on paper")
        if fw in ("vllm", "sglang") and hw.device_class in ("apple", "cpu"):
            self.warnings.append(f"{fw} has no Metal backend and a slow CPU path; llama.cpp or MLX is the usual choice here")
        self.framework = fw
        self.ascend_310p_rules = fw == "vllm-ascend" and hw.is_310p
        if fw in ("vllm", "vllm-ascend"):
            util = 0.9 if s.gpu_memory_utilization is None else s.gpu_memory_utilization
            self.util = _fraction_in("gpu_memory_utilization", util)
        elif fw == "sglang":
            self.util = None if s.gpu_memory_utilization is None else _fraction_in(
                "mem_fraction_static", s.gpu_memory_utilization)
        else:
            self.util = None
        if s.block_size is not None:
            self.block = _pos_int("block_size", s.block_size)
        else:
            self.block = {"none": 1, "vllm": 16, "sglang": 1, "vllm-ascend": 128}[fw]
        big = hw.memory_bytes >= 70 * GiB
        if s.max_num_batched_tokens is not None:
            self.batched_tokens = _pos_int("max_num_batched_tokens", s.max_num_batched_tokens)
        else:
            self.batched_tokens = 8192 if (big and fw != "none") else 2048
        self.eta_m = _fraction_in("memory efficiency", hw.eta_memory if s.eta_memory is None else s.eta_memory)
        self.eta_c = _fraction_in("compute efficiency", hw.eta_compute if s.eta_compute is None else s.eta_compute)

    def _sixteen(self, ckpt: str) -> str:
        if ckpt == "fp16" or not self.hw.supports_bf16:
            return "fp16"
        return "bf16"

    def _resolve_formats(self) -> None:
        s, hw, model = self.settings, self.hw, self.model
        ckpt = model.checkpoint_dtype
        self.exact_scale: F | None = None
        requested = str(s.weights or "auto").strip().lower()
        auto = requested in ("auto", "checkpoint")
        if auto:
            if ckpt == "fp8" and (hw.is_ascend or hw.device_class in ("apple", "cpu")):
                fmt = weight_format(self._sixteen("bf16"))
                self.warnings.append(f"the checkpoint is FP8; {hw.name} has no FP8 path, so it is sized as"
                                     f" {fmt.label} (twice the bytes)")
            elif ckpt == "fp8":
                fmt = weight_format("fp8")
            elif ckpt == "fp32":
                fmt = weight_format(self._sixteen("bf16"))
                self.notes.append(f"FP32 checkpoint served in {fmt.label} (choose --weights fp32 to keep 4 B/param)")
            else:
                fmt = weight_format(self._sixteen(ckpt))
        else:
            fmt = weight_format(requested)
            if fmt.key == "bf16" and not hw.supports_bf16:
                self.warnings.append(f"{hw.name} has no BF16: BF16 weights would run as FP16 (--dtype float16);"
                                     " sized as FP16 (same bytes)")
                fmt = weight_format("fp16")
        if fmt.compute == "fp8" and not hw.supports_fp8:
            if hw.is_ascend or hw.device_class in ("apple", "cpu"):
                self.warnings.append(f"{hw.name} has no FP8 support in the usual runtimes; FP8 weights are"
                                     " sized for comparison only")
            else:
                self.notes.append(f"{hw.name} has no FP8 tensor cores: FP8 weights run weight-only"
                                  " (dequantised to 16 bit, Marlin kernels); speed at the FP16 peak")
        if fmt.compute == "int8" and not hw.int8_ops:
            self.notes.append(f"{hw.name} has no INT8 matrix units in this runtime: W8A8 runs at the 16-bit peak")
        self.fmt: WeightFormat = fmt
        self.small_bytes = F(4) if fmt.key == "fp32" else F(2)  # norms, biases, unquantised embeddings
        self.small_for_layers = F(4) if fmt.family == "gguf" else self.small_bytes  # GGUF keeps norms in F32
        self.act_dtype = "fp32" if fmt.key == "fp32" else self._sixteen(ckpt if ckpt in ("bf16", "fp16") else "bf16")
        self.act_bytes = 4 if fmt.key == "fp32" else 2

        kv = str(s.kv_dtype or "auto").strip().lower()
        self.kv: KVDtype = kv_dtype("fp32" if fmt.key == "fp32" else self.act_dtype) if kv == "auto" else kv_dtype(kv)
        if self.kv.key == "bf16" and not hw.supports_bf16:
            self.warnings.append(f"{hw.name} has no BF16: a BF16 KV cache would be FP16 (same bytes)")
            self.kv = kv_dtype("fp16")
        if self.kv.key in ("q8_0", "q4_0") and self.framework != "none":
            self.warnings.append(f"KV type {self.kv.key} is a llama.cpp cache type; {self.framework} does not offer it")
        if self.kv.key == "int4" and self.framework in ("vllm", "sglang", "vllm-ascend"):
            self.warnings.append(f"an INT4 KV cache is not offered by {self.framework}")
        if self.kv.key == "fp8" and (hw.is_ascend or hw.device_class in ("apple",)):
            self.warnings.append(f"an FP8 KV cache is not available on {hw.name}")

        vis = str(s.vision_dtype or "auto").strip().lower()
        if vis == "auto":
            self.vision_fmt = weight_format("fp32" if fmt.key == "fp32" else self.act_dtype)
        else:
            self.vision_fmt = weight_format(vis)
            if self.vision_fmt.key == "bf16" and not hw.supports_bf16:
                self.vision_fmt = weight_format("fp16")
        if vis != "auto" and model.vision is None:
            self.notes.append("--vision-dtype ignored: the model has no vision tower")

        # per-group bytes (Fractions)
        g = self._group_bytes(fmt, self.vision_fmt)
        if auto and model.checkpoint is not None:
            # exact bytes from the safetensors headers, spread over the groups in proportion
            as_stored = self._group_bytes(weight_format(ckpt), weight_format(ckpt))
            formula_total = sum(as_stored["layers"], F(0)) + as_stored["rest"]
            if formula_total:
                self.exact_scale = F(model.checkpoint.stored_bytes) / formula_total
                g = {k: ([b * self.exact_scale for b in v] if isinstance(v, list) else v * self.exact_scale)
                     for k, v in g.items()}
                self.notes.append(f"weights: exact {model.checkpoint.stored_bytes:,} B from {model.checkpoint.tensors}"
                                  f" tensors in {model.checkpoint.files} safetensors file(s)"
                                  f" ({', '.join(model.checkpoint.dtypes)})")
        elif model.checkpoint is not None:
            self.notes.append(f"checkpoint on disk: {model.checkpoint.stored_bytes:,} B"
                              f" ({', '.join(model.checkpoint.dtypes)}); sized as {fmt.label} instead")
        self.layer_bytes, self.expert_bytes = g["layers"], g["experts"]
        self.embed_bytes, self.lm_head_bytes = g["embed"], g["lm_head"]
        self.final_norm_bytes, self.vision_bytes = g["final_norm"], g["vision"]

    def _group_bytes(self, fmt: WeightFormat, vision_fmt: WeightFormat) -> dict:
        model = self.model
        bpp = fmt.bytes_per_param
        small = F(4) if fmt.key == "fp32" else F(2)
        small_layers = F(4) if fmt.family == "gguf" else small
        emb_bpp = bpp if fmt.quantizes_embeddings else small
        g = dict(
            layers=[lay.linear_params * bpp + (lay.params - lay.linear_params) * small_layers for lay in model.layers],
            experts=[lay.expert_params * bpp for lay in model.layers],
            embed=model.embed_params * emb_bpp, lm_head=model.lm_head_params * emb_bpp,
            final_norm=model.final_norm_params * small_layers,
            vision=(model.vision.total_params * vision_fmt.bytes_per_param) if model.vision else F(0),
        )
        g["rest"] = g["embed"] + g["lm_head"] + g["final_norm"] + g["vision"]
        return g

    def _resolve_parallel(self) -> None:
        s, model, hw = self.settings, self.model, self.hw
        pp = _pos_int("pp (pipeline parallel size)", s.pp)
        if s.tp is None:
            tp = hw.devices_per_card if self._tp_valid(hw.devices_per_card) else 1
        else:
            tp = _pos_int("tp (tensor parallel size)", s.tp)
        if tp > MAX_DEVICES or pp > MAX_DEVICES:
            raise SizingError(f"tp and pp must be <= {MAX_DEVICES}")
        if not self._tp_valid(tp):
            raise SizingError(self._tp_problem(tp))
        if pp > model.num_layers:
            raise SizingError(f"pp {pp} is more than the model's {model.num_layers} layers")
        self.tp, self.pp = tp, pp
        if model.num_kv_heads and tp > model.num_kv_heads and model.layers[0].kv_heads:
            self.notes.append(f"TP {tp} > {model.num_kv_heads} KV heads: KV heads are replicated"
                              f" (each device holds 1 KV head per layer)")

    def _tp_problem(self, tp: int) -> str:
        m = self.model
        if m.num_heads and m.num_heads % tp:
            return f"tp {tp} does not divide the {m.num_heads} attention heads"
        kv = m.layers[0].kv_heads
        if kv and kv % tp and tp % kv:
            return f"tp {tp} and the {kv} KV heads must divide one another"
        return ""

    def _tp_valid(self, tp: int) -> bool:
        return tp >= 1 and not self._tp_problem(tp)

    def _resolve_workload(self, w: Workload) -> None:
        model = self.model
        self.batch = _pos_int("batch (concurrent sequences)", w.batch)
        vision = model.vision
        tiles = vision.max_tiles if vision else 0
        if w.tiles is not None:
            tiles = _pos_int("tiles per image", w.tiles)
            if tiles > 40:
                raise SizingError(f"tiles per image must be <= 40 (InternViT's tested maximum), got {tiles}")
        if w.images is not None:
            images = _pos_int("images per sequence", w.images, minimum=0)
            if images and vision is None:
                raise SizingError(f"{model.display_name} has no vision tower; images must be 0")
        else:
            images = None
        per_image = tiles * vision.tokens_per_tile if vision else 0
        out = None if w.output is None else _pos_int("output tokens", w.output)
        prompt = None if w.prompt is None else _pos_int("prompt tokens", w.prompt)
        if w.context is not None:
            context = _pos_int("context (tokens per sequence)", w.context, minimum=2)
        elif prompt is not None:
            context = None
        else:
            context = DEFAULT_CONTEXT if not model.max_position else min(DEFAULT_CONTEXT, model.max_position)
        if context is not None:
            if out is None:
                out = min(DEFAULT_OUTPUT, max(1, context // 8)) if prompt is None else context - prompt
            if out >= context:
                raise SizingError(f"output tokens ({out:,}) must be fewer than the context ({context:,})")
            if images is None:
                images = 1 if vision and per_image + out < context else 0
                if vision and not images:
                    self.notes.append(f"no image assumed: a {tiles}-tile image ({per_image:,} tokens) does not fit"
                                      f" in {context:,} tokens of context")
            text = context - out - images * per_image
            if prompt is not None and prompt != text:
                raise SizingError(f"prompt ({prompt:,}) + images ({images * per_image:,}) + output ({out:,})"
                                  f" != context ({context:,}); give two of them")
            if text < 0:
                raise SizingError(f"{images} image(s) x {tiles} tiles = {images * per_image:,} tokens do not fit in"
                                  f" {context:,} tokens of context with {out:,} output tokens")
            prompt = text
        else:
            out = DEFAULT_OUTPUT if out is None else out
            images = images or 0
            context = prompt + images * per_image + out
        self.context, self.output, self.prompt_text = context, out, prompt
        self.images, self.tiles = images, (tiles if images else 0)
        self.image_tokens = images * per_image
        self.prompt_total = self.prompt_text + self.image_tokens
        if model.max_position and context > model.max_position:
            self.warnings.append(f"context {context:,} is beyond the model's max_position_embeddings"
                                 f" ({model.max_position:,}); vLLM refuses it unless forced")

    def _platform_warnings(self) -> None:
        hw, model = self.hw, self.model
        if hw.is_310p:
            ckpt = model.checkpoint_dtype
            self.warnings.append(
                "310P is FP16-only: no BF16 (MindIE and vllm-ascend); "
                + ("this BF16 checkpoint runs as FP16 (--dtype float16) — same bytes, watch for FP16 overflow"
                   if ckpt in ("bf16", "fp32") else "serve with --dtype float16"))
            default_len = model.max_position or self.context
            self.warnings.append(
                f"always set --max-model-len on 310P: the dense FP16 attention mask is max_model_len^2 x 2 B ="
                f" {_fmt_bytes(ascend_mask_bytes(self.context))} at {self.context:,}"
                + (f"; the model's default {default_len:,} would take {_fmt_bytes(ascend_mask_bytes(default_len))}"
                   if default_len != self.context else ""))
            if self.framework == "vllm-ascend":
                self.warnings.append("vllm-ascend halves the KV budget on 310P (workspace reserve): only half of"
                                     " the memory left after weights goes to the KV cache")
            self.warnings.append("vllm-ascend's 310P path is experimental (eager mode; documented models: Qwen3"
                                 " dense W8A8SC, Qwen2.5-7B on 2 chips, Qwen3-VL early access): check support"
                                 f" for {model.display_name} before relying on this verdict")

    # -- static per (tp, pp) ---------------------------------------------------------
    def stage_sizes(self, pp: int) -> list[int]:
        """Layers per pipeline stage, as vLLM's get_pp_indices splits them (extra layers before the last)."""
        n = self.model.num_layers
        sizes = [n // pp] * pp
        for i in range(2, n % pp + 2):
            sizes[-i] += 1
        return sizes

    def _prefix(self) -> dict:
        """Prefix sums over layers, so a stage's totals cost O(groups), not O(layers)."""
        if hasattr(self, "_prefix_cache"):
            return self._prefix_cache
        model, kv = self.model, self.kv
        n = model.num_layers
        weights = [F(0)] * (n + 1)
        active = [0] * (n + 1)
        state = [0] * (n + 1)
        groups: dict[tuple, list] = {}  # (window, kv_heads) -> prefix of (bytes/token at tp 1)
        flops: dict = {}  # window -> prefix of attention FLOPs per context token
        for i, lay in enumerate(model.layers):
            weights[i + 1] = weights[i] + self.layer_bytes[i]
            active[i + 1] = active[i] + lay.active_params
            state[i + 1] = state[i] + lay.state_elems
            per_tok = (lay.kv_elems * kv.bytes_per_elem + lay.kv_scale_slots * kv.per_head_scale_bytes
                       if lay.kv_elems else F(0))
            for key, table, value in (((lay.window, lay.kv_heads), groups, per_tok),
                                      (lay.window, flops, lay.attn_flops_per_ctx_token)):
                if lay.kv_elems and key not in table:
                    table[key] = [F(0) if table is groups else 0] * (n + 1)
            for key, arr in groups.items():
                arr[i + 1] = arr[i] + (per_tok if (lay.kv_elems and key == (lay.window, lay.kv_heads)) else 0)
            for key, arr in flops.items():
                arr[i + 1] = arr[i] + (lay.attn_flops_per_ctx_token if (lay.kv_elems and key == lay.window) else 0)
        self._prefix_cache = dict(weights=weights, active=active, state=state, groups=groups, flops=flops,
                                  moe=[i for i, lay in enumerate(model.layers) if lay.num_experts])
        return self._prefix_cache

    def static(self, tp: int, pp: int) -> list[dict]:
        key = (tp, pp)
        if key in self._static:
            return self._static[key]
        model, kv = self.model, self.kv
        pre = self._prefix()
        result = []
        start = 0
        for si, size in enumerate(self.stage_sizes(pp)):
            a, b = start, start + size
            start = b
            first, last = si == 0, si == pp - 1
            w = pre["weights"][b] - pre["weights"][a]
            llm_extra = F(0)
            vis = F(0)
            if first:
                llm_extra += self.embed_bytes
                vis = self.vision_bytes
            if last:
                llm_extra += self.lm_head_bytes + self.final_norm_bytes
                if model.tied and pp > 1:
                    llm_extra += self.embed_bytes  # the last stage keeps its own copy of a tied LM head
            kv_by_window: dict[int | None, F] = {}
            for (window, heads), arr in pre["groups"].items():
                per_tok = arr[b] - arr[a]
                if not per_tok:
                    continue
                if heads:
                    share = F(heads // tp if heads >= tp else 1, heads)
                else:
                    share = F(1)  # MLA latent is replicated on every TP rank
                kv_by_window[window] = kv_by_window.get(window, F(0)) + per_tok * share
            attn_flops = {w: arr[b] - arr[a] for w, arr in pre["flops"].items() if arr[b] - arr[a]}
            active = pre["active"][b] - pre["active"][a]
            if first:
                active += model.embed_params
            if last:
                active += model.lm_head_params + model.final_norm_params
            result.append(dict(
                layers=range(a, b), first=first, last=last, weights_llm=(w + llm_extra) / tp,
                weights_vision=vis / tp, weights=(w + llm_extra + vis) / tp, kv_by_window=kv_by_window,
                state=F(pre["state"][b] - pre["state"][a], tp) * kv.bytes_per_elem,
                kv_per_token_full=sum(kv_by_window.values(), F(0)), active_params=active,
                attn_flops_by_window=attn_flops, moe_layers=[i for i in pre["moe"] if a <= i < b],
            ))
        self._static[key] = result
        return result

    # -- memory ------------------------------------------------------------------------
    def capacity(self) -> int:
        return self.hw.memory_bytes

    def usable(self) -> int:
        hw, fw = self.hw, self.framework
        share = hw.usable_fraction
        if fw in ("vllm", "vllm-ascend"):
            return int(hw.memory_bytes * min(self.util, share))
        return int(hw.memory_bytes * share)

    def activation_parts(self, batch: int) -> dict[str, int]:
        return activations.activation_parts(self.model, self.framework, batch=batch, prompt_tokens=self.prompt_total, batched_tokens=self.batched_tokens, act_bytes=self.act_bytes, images=self.images, tiles=self.tiles, tp=self.tp)

    def kv_bytes_stage(self, st: dict, batch: int, context: int) -> F:
        total = F(0)
        for window, per_tok in st["kv_by_window"].items():
            tokens = context if window is None else min(context, window)
            total += batch * _round_up(tokens, self.block) * per_tok
        return total + batch * st["state"]

    def room_tokens(self, st: dict, pool: int) -> int:
        """Longest single-sequence context whose KV fits in ``pool`` bytes (sliding layers saturate)."""
        if pool <= 0 or not st["kv_by_window"]:
            return 0
        per_tok = st["kv_per_token_full"]
        if None in st["kv_by_window"] and len(st["kv_by_window"]) == 1:
            return int(pool // (per_tok * self.block)) * self.block
        ok = lambda s: self.kv_bytes_stage(st, 1, s) - st["state"] <= pool  # noqa: E731
        if not ok(1):
            return 0
        return _search_max(ok, 1, MAX_CONTEXT_SEARCH)

    def memory(self, batch: int, context: int, tp: int | None = None, pp: int | None = None) -> list[dict]:
        """Per-stage, per-device memory (bytes) for this workload; the worst stage decides."""
        tp = self.tp if tp is None else tp
        pp = self.pp if pp is None else pp
        cap = self.capacity()
        usable = self.usable()
        act = sum(v for k, v in self.activation_parts(batch).items() if k != "tokens")
        mask = ascend_mask_bytes(context) if self.ascend_310p_rules else 0
        overhead = self.hw.runtime_overhead_bytes + nccl_bytes(tp * pp)
        frac = None
        if self.framework == "sglang":
            frac = self.util if self.util is not None else sglang_fraction(tp)
        out = []
        for st in self.static(tp, pp):
            weights = _ceil(st["weights"])
            kv = _ceil(self.kv_bytes_stage(st, batch, context))
            non_kv = weights + act + mask + overhead
            if self.framework == "sglang":
                reserve = max(0, int((1 - frac) * cap) - act - overhead)
                pool = min(int(frac * cap) - weights, usable - non_kv)
            elif self.ascend_310p_rules:
                reserve = kv
                pool = (usable - non_kv) // 2
            else:
                reserve = 0
                pool = usable - non_kv
            total = non_kv + kv + reserve
            room = self.room_tokens(st, pool)
            out.append(dict(weights=weights, weights_vision=_ceil(st["weights_vision"]), kv=kv, activations=act, mask=mask, overhead=overhead, reserve=reserve,
                            total=total, usable=usable, capacity=cap, kv_pool=max(0, pool), kv_room_tokens=room,
                            fits=total <= usable, stage_layers=len(st["layers"])))
        return out

    def fits(self, batch: int, context: int, tp: int | None = None, pp: int | None = None) -> bool:
        return all(s["fits"] for s in self.memory(batch, context, tp, pp))

    # -- speed ---------------------------------------------------------------------------
    def speed(self, batch: int, context: int, efficiency: bool = True) -> dict:
        model, hw = self.model, self.hw
        tp, pp = self.tp, self.pp
        eta_m = self.eta_m * self.fmt.eta_factor if efficiency else 1.0
        eta_c = self.eta_c if efficiency else 1.0
        peak, peak_label = hw.peak(self.fmt.compute if self.fmt.compute != "bf16" else self.act_dtype)
        peak16, _ = hw.peak(self.act_dtype)
        link = hw.interconnect or 32e9
        decode_time = 0.0
        decode_mem_time = decode_comp_time = 0.0
        decode_bytes = decode_flops = 0.0
        for st in self.static(tp, pp):
            w = float(st["weights_llm"])
            for i in st["moe_layers"]:  # only the experts a batch touches are read
                lay = model.layers[i]
                distinct = lay.num_experts * (1 - (1 - lay.top_k / lay.num_experts) ** batch)
                w -= float(lay.num_experts * self.expert_bytes[i]) / tp
                w += distinct * float(self.expert_bytes[i]) / tp
            kv = float(self.kv_bytes_stage(st, batch, context))
            bytes_ = w + kv
            attn = sum(f * (context if win is None else min(context, win)) for win, f in st["attn_flops_by_window"].items())
            flops = (2 * st["active_params"] + attn) * batch / tp
            t_mem = bytes_ / (hw.bandwidth * eta_m)
            t_comp = flops / (peak * eta_c)
            decode_time += max(t_mem, t_comp)
            decode_mem_time += t_mem
            decode_comp_time += t_comp
            decode_bytes += bytes_
            decode_flops += flops
        comm = 0.0
        if tp > 1:
            per = 2 * (tp - 1) / tp * batch * model.hidden * self.act_bytes / link + COMM_LATENCY_S
            comm += 2 * model.num_layers * per
        if pp > 1:
            comm += (pp - 1) * (batch * model.hidden * self.act_bytes / link + COMM_LATENCY_S)
        decode_time += comm
        # prefill (all sequences' prompts, chunked at the batched-token budget)
        tokens = batch * self.prompt_total
        p_flops = 0.0
        for st in self.static(tp, pp):
            attn = 0.0
            s = self.prompt_total
            for win, f in st["attn_flops_by_window"].items():
                w_ = s if win is None else min(s, win)
                pairs = s * w_ - w_ * (w_ - 1) / 2  # causal (query, key) pairs
                attn += f * pairs
            p_flops += (2 * st["active_params"] * tokens + attn * batch) / tp
        v_flops = 0.0
        if model.vision and self.images:
            v = model.vision
            n_tiles = batch * self.images * self.tiles
            v_flops = n_tiles * (2 * v.params * v.patch_tokens + 4 * v.layers * v.patch_tokens ** 2 * v.hidden
                                 + 2 * v.projector_params * v.tokens_per_tile) / tp
        chunks = max(1, math.ceil(tokens / self.batched_tokens)) if self.framework != "none" else max(
            1, math.ceil(tokens / self.batched_tokens))
        stages = self.static(tp, pp)
        w_llm = float(sum(st["weights_llm"] for st in stages))
        w_vis = float(sum(st["weights_vision"] for st in stages))
        kv_write = float(sum(self.kv_bytes_stage(st, batch, self.prompt_total) for st in stages))
        p_bytes = chunks * w_llm + (w_vis if self.images else 0) + kv_write
        p_comp = p_flops / (peak * eta_c) + v_flops / (peak16 * eta_c)
        p_mem = p_bytes / (hw.bandwidth * eta_m)
        prefill = max(p_comp, p_mem) + (comm * chunks if tp > 1 or pp > 1 else 0)
        return dict(
            decode_step_s=decode_time, decode_tokens_per_s=1 / decode_time, decode_tokens_per_s_total=batch / decode_time,
            decode_bound="memory" if decode_mem_time >= decode_comp_time else "compute",
            decode_bytes=decode_bytes, decode_flops=decode_flops, comm_s=comm,
            prefill_s=prefill, prefill_bound="compute" if p_comp >= p_mem else "memory",
            prefill_flops=p_flops + v_flops, prefill_bytes=p_bytes, vision_flops=v_flops,
            peak=peak, peak_label=peak_label, bandwidth=hw.bandwidth, eta_memory=eta_m, eta_compute=eta_c,
        )


def _search_max(pred, lo_ok: int, hi: int) -> int:
    """Largest n in [lo_ok, hi] with pred(n), given pred(lo_ok) is True and pred is monotone."""
    if pred(hi):
        return hi
    lo, hi_bad = lo_ok, hi
    while hi_bad - lo > 1:
        mid = (lo + hi_bad) // 2
        if pred(mid):
            lo = mid
        else:
            hi_bad = mid
    return lo
