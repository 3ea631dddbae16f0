"""A plan: the inputs resolved by concern, then memory per device and roofline speed for any
(batch, context, tp, pp).

Concerns, one module each (this module only puts them together):
  budget      the serving framework's budget rule (usable memory, block size, reserve, pool)
  precision   weight / KV / vision formats and the weight bytes they give
  parallel    TP and PP sizes, pipeline stages, the fewest-devices layout
  workload    batch and token counts, with their documented maxima

Memory per device, per pipeline stage (the worst stage decides):
  total = weights/TP + KV + activations + mask (310P) + overhead (runtime + NCCL) + reserve
  fits  = total <= usable
Decode step: sum over stages of max(bytes / (BW x eta_mem), FLOPs / (peak x eta_c))
  + TP all-reduces (2 per layer) + PP hops + t0; eta_mem and t0 from the serving backend's fitted rule
  (backends.py), else the preset's efficiency and t0 = 0. Roofline: eta = 1, t0 = 0.  Prefill: max(FLOPs / (peak x eta), bytes / (BW x eta)).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction as F
from functools import cached_property

from . import activations
from .activations import ACT_COEFF, Activations
from .arch import ModelSpec
from .backends import BackendRule, backend_rule, serving_tool
from .budget import (FRAMEWORK_LABELS, Budget, ascend_mask_bytes, nccl_bytes, resolve_budget,
                     sglang_fraction)
from .checks import Remarks
from .formats import KVDtype, WeightFormat
from .hardware import Hardware
from .parallel import MAX_DEVICES, Parallel, resolve_parallel, stage_sizes, tp_valid
from .precision import Precision, WeightGroups, resolve_precision
from .units import ceil_exact, fmt_bytes, gib, rate, round_up, search_max
from .workload import MAX_BATCH, MAX_CONTEXT, ResolvedWorkload, Workload, resolve_workload

__all__ = ["ACT_COEFF", "COMM_LATENCY_S", "MAX_DEVICES", "MAX_CONTEXT", "MAX_BATCH", "FRAMEWORK_LABELS", "Activations",
           "Plan", "Settings", "Speed", "StageMemory", "StageStatic", "Workload", "ascend_mask_bytes", "gib",
           "nccl_bytes", "rate", "roofline_decode_tokens_per_s", "sglang_fraction"]

COMM_LATENCY_S = 8e-6  # per all-reduce / stage hop (assumed)
DEFAULT_LINK = 32e9  # bytes/s between devices when the hardware gives no interconnect (PCIe 4 x16)


def roofline_decode_tokens_per_s(bytes_per_token: float, bandwidth: float, efficiency: float = 1.0) -> float:
    """Memory-bound decode: tokens/s = bandwidth x efficiency / bytes read per token."""
    return bandwidth * efficiency / bytes_per_token


@dataclass(frozen=True)
class Settings:
    """How it is served (None / "auto" = the default for the hardware)."""

    weights: str = "auto"
    kv_dtype: str = "auto"
    vision_dtype: str = "auto"
    tp: int | None = None
    pp: int = 1
    framework: str = "auto"
    framework_version: str | None = None  # "0.7", "0.10.1", ...: picks the framework's budget rule (budget.py)
    gpu_memory_utilization: float | None = None  # vLLM util / SGLang mem_fraction_static
    block_size: int | None = None
    max_num_batched_tokens: int | None = None
    eta_memory: float | None = None
    eta_compute: float | None = None


# --------------------------------------------------------------------------------------
# typed results


@dataclass(frozen=True)
class StageStatic:
    """What one pipeline stage holds per device, independent of the workload."""

    first_layer: int
    end_layer: int  # exclusive
    first: bool
    last: bool
    weights_llm: F  # bytes per device
    weights_vision: F
    kv_by_window: Mapping[int | None, F]  # KV bytes per context token per device, by sliding window
    state: F  # recurrent state bytes per sequence per device
    active_params: int  # parameters touched per token in this stage (whole, before TP)
    attn_flops_by_window: Mapping[int | None, int]  # attention FLOPs per (query x context token)
    moe_layers: tuple[int, ...]

    @property
    def weights(self) -> F:
        return self.weights_llm + self.weights_vision

    @property
    def num_layers(self) -> int:
        return self.end_layer - self.first_layer

    @property
    def kv_per_token_full(self) -> F:
        """KV bytes per token per device while every layer still grows (below all windows)."""
        return sum(self.kv_by_window.values(), F(0))


@dataclass(frozen=True)
class StageMemory:
    """Bytes on one device of one pipeline stage for one workload (``fits``: total <= usable)."""

    weights: int
    weights_vision: int
    kv: int
    activations: int
    mask: int
    overhead: int
    reserve: int
    total: int
    usable: int
    capacity: int
    kv_pool: int
    kv_room_tokens: int
    fits: bool
    stage_layers: int

    @property
    def over(self) -> int:
        """Bytes over the usable memory (negative: to spare)."""
        return self.total - self.usable


@dataclass(frozen=True)
class Speed:
    """Roofline (or efficiency-scaled) speed for one workload on one layout."""

    decode_step_s: float
    decode_tokens_per_s: float  # per sequence (steps per second)
    decode_tokens_per_s_total: float  # over the batch
    decode_bound: str  # "memory" | "compute"
    decode_bytes: float  # bytes read per decode step, all stages
    decode_flops: float
    comm_s: float  # TP/PP communication per decode step
    prefill_s: float
    prefill_bound: str
    prefill_flops: float
    prefill_bytes: float
    vision_flops: float
    peak: float
    peak_label: str
    bandwidth: float
    eta_memory: float  # decode: the backend's eta (x the format's kernel factor where it applies)
    eta_compute: float
    overhead_s: float = 0.0  # the backend's fixed time per decode step (t0; 0 on the roofline)
    backend: str = ""  # BACKENDS key whose rule gave the decode figure ('' = the preset's efficiency)


@dataclass(frozen=True)
class _Prefix:
    """Prefix sums over layers, so a stage's totals cost O(groups), not O(layers)."""

    weights: tuple[F, ...]
    active: tuple[int, ...]
    state: tuple[int, ...]
    kv_groups: Mapping[tuple[int | None, int], tuple[F, ...]]  # (window, kv heads) -> KV bytes/token at TP 1
    attn_flops: Mapping[int | None, tuple[int, ...]]  # window -> attention FLOPs per context token
    moe: tuple[int, ...]


def _prefix_sums(model: ModelSpec, layer_bytes: tuple[F, ...], kv: KVDtype) -> _Prefix:
    n = model.num_layers
    weights, active, state = [F(0)] * (n + 1), [0] * (n + 1), [0] * (n + 1)
    groups: dict[tuple[int | None, int], list[F]] = {}
    flops: dict[int | None, list[int]] = {}
    for i, lay in enumerate(model.layers):
        weights[i + 1] = weights[i] + layer_bytes[i]
        active[i + 1] = active[i] + lay.active_params
        state[i + 1] = state[i] + lay.state_elems
        per_tok = (lay.kv_elems * kv.bytes_per_elem + lay.kv_scale_slots * kv.per_head_scale_bytes
                   if lay.kv_elems else F(0))
        if lay.kv_elems:
            groups.setdefault((lay.window, lay.kv_heads), [F(0)] * (n + 1))
            flops.setdefault(lay.window, [0] * (n + 1))
        for gkey, garr in groups.items():
            garr[i + 1] = garr[i] + (per_tok if (lay.kv_elems and gkey == (lay.window, lay.kv_heads)) else 0)
        for fkey, farr in flops.items():
            farr[i + 1] = farr[i] + (lay.attn_flops_per_ctx_token if (lay.kv_elems and fkey == lay.window) else 0)
    return _Prefix(tuple(weights), tuple(active), tuple(state), {k: tuple(v) for k, v in groups.items()},
                   {k: tuple(v) for k, v in flops.items()},
                   tuple(i for i, lay in enumerate(model.layers) if lay.num_experts))


# --------------------------------------------------------------------------------------
# the plan


class Plan:
    """Inputs resolved by concern; cheap memory and speed evaluation for any (batch, context, tp, pp)."""

    def __init__(self, model: ModelSpec, hw: Hardware, workload: Workload, settings: Settings):
        self.model, self.hw, self.settings, self.workload_in = model, hw, settings, workload
        self.remarks = Remarks(notes=list(model.notes) + ([hw.alias_note] if hw.alias_note else []))
        s = settings
        self.budget: Budget = resolve_budget(hw, s.framework, s.gpu_memory_utilization, s.block_size,
                                             s.max_num_batched_tokens, s.eta_memory, s.eta_compute, self.remarks,
                                             framework_version=s.framework_version,
                                             multimodal=model.vision is not None)
        if self.budget.rule_label:
            self.remarks.note(f"budget rule: {self.budget.rule_label}"
                              + ("" if self.budget.version else " (the default; set framework_version for another)"))
        self.precision: Precision = resolve_precision(model, hw, s.weights, s.kv_dtype, s.vision_dtype,
                                                      self.budget.framework, self.remarks)
        self.parallel: Parallel = resolve_parallel(model, hw, s.tp, s.pp, self.remarks)
        self.work: ResolvedWorkload = resolve_workload(model, workload, self.remarks)
        self._static: dict[tuple[int, int], tuple[StageStatic, ...]] = {}
        self._platform_warnings()

    # -- short names for what the advice and the answer read ---------------------------
    @property
    def framework(self) -> str:
        return self.budget.framework

    @property
    def fmt(self) -> WeightFormat:
        return self.precision.fmt

    @property
    def kv(self) -> KVDtype:
        return self.precision.kv

    @property
    def weights(self) -> WeightGroups:
        return self.precision.weights

    @property
    def tp(self) -> int:
        return self.parallel.tp

    @property
    def pp(self) -> int:
        return self.parallel.pp

    @property
    def batch(self) -> int:
        return self.work.batch

    @property
    def context(self) -> int:
        return self.work.context

    @property
    def batched_tokens(self) -> int:
        return self.budget.batched_tokens

    @property
    def prompt_total(self) -> int:
        """Prompt tokens per sequence, text + image tokens."""
        return self.work.prompt_total

    @property
    def images(self) -> int:
        return self.work.images

    @property
    def tiles(self) -> int:
        return self.work.tiles

    @property
    def act_bytes(self) -> int:
        """Bytes per activation element (2, or 4 in FP32)."""
        return self.precision.act_bytes

    @property
    def warnings(self) -> list[str]:
        return self.remarks.warnings

    @property
    def notes(self) -> list[str]:
        return self.remarks.notes

    def tp_valid(self, tp: int) -> bool:
        return tp_valid(self.model, tp)

    def stage_sizes(self, pp: int) -> list[int]:
        return stage_sizes(self.model.num_layers, pp)

    # -- warnings that need every concern ----------------------------------------------
    def _platform_warnings(self) -> None:
        hw, model, ctx = self.hw, self.model, self.context
        if not hw.is_310p:
            return
        ckpt = model.checkpoint_dtype
        self.remarks.warn(
            "310P is FP16-only: no BF16 (MindIE and vllm-ascend); "
            + ("this BF16 checkpoint runs as FP16 (--dtype float16) — same bytes, watch for FP16 overflow"
               if ckpt in ("bf16", "fp32") else "serve with --dtype float16"))
        default_len = model.max_model_len or ctx
        self.remarks.warn(
            f"always set --max-model-len on 310P: the dense FP16 attention mask is max_model_len^2 x 2 B ="
            f" {fmt_bytes(ascend_mask_bytes(ctx))} at {ctx:,}"
            + (f"; the model's default {default_len:,} would take {fmt_bytes(ascend_mask_bytes(default_len))}"
               if default_len != ctx else ""))
        if self.framework == "vllm-ascend":
            self.remarks.warn("vllm-ascend halves the KV budget on 310P (workspace reserve): only half of"
                              " the memory left after weights goes to the KV cache")
        if self.framework != "mindie":
            self.remarks.warn("vllm-ascend's 310P path is experimental (documented models: Qwen3 dense W8A8SC,"
                              " Qwen2.5-7B on 2 chips, Qwen3-VL early access; eager mode before the v0.18 images):"
                              " check support"
                              f" for {model.display_name} before relying on this verdict")

    # -- static per (tp, pp) -----------------------------------------------------------
    @cached_property
    def _prefix(self) -> _Prefix:
        return _prefix_sums(self.model, self.weights.layers, self.kv)

    def _stage(self, a: int, b: int, first: bool, last: bool, tp: int, pp: int) -> StageStatic:
        """Stage of layers [a, b): embeddings (and the vision tower) on the first stage, final
        norm and LM head on the last (a tied head is copied there when PP > 1); KV heads split
        over TP (replicated when TP > heads; an MLA latent is replicated on every rank)."""
        model, pre, g = self.model, self._prefix, self.weights
        extra, vis = F(0), F(0)
        if first:
            extra += g.embed
            vis = g.vision
        if last:
            extra += g.lm_head + g.final_norm
            if model.tied and pp > 1:
                extra += g.embed
        kv_by_window: dict[int | None, F] = {}
        for (window, heads), arr in pre.kv_groups.items():
            per_tok = arr[b] - arr[a]
            if per_tok:
                share = F(heads // tp if heads >= tp else 1, heads) if heads else F(1)
                kv_by_window[window] = kv_by_window.get(window, F(0)) + per_tok * share
        active = pre.active[b] - pre.active[a]
        if first:
            active += model.embed_params
        if last:
            active += model.lm_head_params + model.final_norm_params
        return StageStatic(
            first_layer=a, end_layer=b, first=first, last=last,
            weights_llm=(pre.weights[b] - pre.weights[a] + extra) / tp, weights_vision=vis / tp,
            kv_by_window=kv_by_window, state=F(pre.state[b] - pre.state[a], tp) * self.kv.bytes_per_elem,
            active_params=active,
            attn_flops_by_window={w: arr[b] - arr[a] for w, arr in pre.attn_flops.items() if arr[b] - arr[a]},
            moe_layers=tuple(i for i in pre.moe if a <= i < b))

    def static(self, tp: int, pp: int) -> tuple[StageStatic, ...]:
        """Per-stage static figures for a TP x PP layout (cached)."""
        key = (tp, pp)
        if key not in self._static:
            stages, start = [], 0
            for si, size in enumerate(self.stage_sizes(pp)):
                stages.append(self._stage(start, start + size, si == 0, si == pp - 1, tp, pp))
                start += size
            self._static[key] = tuple(stages)
        return self._static[key]

    # -- memory ------------------------------------------------------------------------
    def capacity(self) -> int:
        return self.hw.memory_bytes

    def usable(self) -> int:
        return self.budget.usable

    def activation_parts(self, batch: int, tp: int | None = None) -> Activations:
        """Activation memory per device (engine/sizing/activations.py: vLLM's profiling peak), at this
        plan's TP unless ``tp`` is given: the one call site of the estimator."""
        return activations.activation_parts(self.model, self.framework, batch=batch, prompt_tokens=self.prompt_total,
                                            batched_tokens=self.batched_tokens, act_bytes=self.act_bytes,
                                            images=self.images, tiles=self.tiles, tp=self.tp if tp is None else tp,
                                            rule=self.budget.rule)

    def kv_bytes_stage(self, st: StageStatic, batch: int, context: int) -> F:
        """KV = B x sum over windows of round_up(min(S, window), block) x bytes/token, + B x state."""
        total = F(0)
        block = self.budget.block
        for window, per_tok in st.kv_by_window.items():
            tokens = context if window is None else min(context, window)
            total += batch * round_up(tokens, block) * per_tok
        return total + batch * st.state

    def room_tokens(self, st: StageStatic, pool: int) -> int:
        """KV room of ``pool`` bytes, in tokens.

        No sliding layer, or every layer sliding: the pool's token slots, pool / KV per token (whole
        blocks). With full attention that is also the longest single context; with a window on every
        layer a sequence never keeps more than its window, so the slots are shared by sequences and do
        not limit the context (``Estimate.kv_window``). Mixed (Gemma-2): the longest single-sequence
        context whose KV fits, the sliding layers stopping at their window.
        """
        if pool <= 0 or not st.kv_by_window:
            return 0
        block = self.budget.block
        if list(st.kv_by_window) == [None] or None not in st.kv_by_window or self.framework == "sglang":
            # SGLang's pool sizes every layer as full attention: token slots (whole pages)
            return int(pool // (st.kv_per_token_full * block)) * block

        def ok(s: int) -> bool:
            return self.kv_bytes_stage(st, 1, s) - st.state <= pool

        return search_max(ok, 1, MAX_CONTEXT) if ok(1) else 0

    def window_sequences(self, pool: int, tp: int | None = None, pp: int | None = None) -> int | None:
        """With a window on every KV layer: how many sequences at a full window the ``pool`` (bytes per
        device) holds, the worst stage deciding; None when some layer keeps every token."""
        if self.model.kv_window_bound is None:
            return None
        tp = self.tp if tp is None else tp
        pp = self.pp if pp is None else pp
        per_seq = max(self.kv_bytes_stage(st, 1, self.model.kv_window_bound) - st.state
                      for st in self.static(tp, pp))
        return int(max(pool, 0) // per_seq) if per_seq > 0 else None

    def memory(self, batch: int, context: int, tp: int | None = None, pp: int | None = None) -> list[StageMemory]:
        """Per-stage, per-device memory (bytes) for this workload; the worst stage decides."""
        tp = self.tp if tp is None else tp
        pp = self.pp if pp is None else pp
        b = self.budget
        act = self.activation_parts(batch, tp).total
        mask = b.mask_bytes(context)
        out = []
        for st in self.static(tp, pp):
            overhead = b.overhead(tp * pp, st.num_layers)
            weights = ceil_exact(st.weights)
            kv = ceil_exact(self.kv_bytes_stage(st, batch, context))
            reserve, pool = b.reserve_and_pool(weights, kv, act, overhead, mask, tp, pp)
            total = weights + act + mask + overhead + kv + reserve
            out.append(StageMemory(
                weights=weights, weights_vision=ceil_exact(st.weights_vision), kv=kv, activations=act, mask=mask,
                overhead=overhead, reserve=reserve, total=total, usable=b.usable, capacity=b.capacity,
                kv_pool=max(0, pool), kv_room_tokens=self.room_tokens(st, pool), fits=total <= b.usable,
                stage_layers=st.num_layers))
        return out

    def fits(self, batch: int, context: int, tp: int | None = None, pp: int | None = None) -> bool:
        return all(s.fits for s in self.memory(batch, context, tp, pp))

    # -- speed ---------------------------------------------------------------------------
    @property
    def serving_tool(self) -> str:
        """The tool that serves this plan (vllm, sglang, vllm-ascend, mindie, llama.cpp)."""
        return serving_tool(self.framework, self.fmt.family, self.hw.device_class)

    @cached_property
    def backend(self) -> BackendRule | None:
        """The fitted decode rule for the serving tool on this device (backends.py); None when the
        caller set the memory efficiency, or no rule was fitted for it (the preset's efficiency then)."""
        if self.settings.eta_memory is not None:
            return None
        return backend_rule(self.serving_tool, self.hw.device_class)

    def decode_eta(self) -> tuple[float, float]:
        """(eta, t0 seconds) for decode: the backend's rule, else the budget's eta x the format factor
        and no fixed cost."""
        rule = self.backend
        if rule is None:
            return self.budget.eta_memory * self.fmt.eta_factor, 0.0
        return rule.eta * (self.fmt.eta_factor if rule.format_factors else 1.0), rule.t0_s

    def weight_bytes_read(self, st: StageStatic, batch: int, tp: int) -> float:
        """LLM weight bytes one decode step reads: MoE layers read only the experts a batch
        touches, E x (1 - (1 - k/E)^B) of E."""
        w = float(st.weights_llm)
        for i in st.moe_layers:
            lay = self.model.layers[i]
            distinct = lay.num_experts * (1 - (1 - lay.top_k / lay.num_experts) ** batch)
            expert = float(self.weights.experts[i]) / tp
            w += (distinct - lay.num_experts) * expert
        return w

    def comm_seconds(self, batch: int, tp: int, pp: int) -> float:
        """TP: 2 ring all-reduces per layer of B x h x act bytes (2 (tp-1)/tp of it over the link);
        PP: one hop of B x h x act bytes per stage boundary; each + a fixed latency."""
        m, link = self.model, self.hw.interconnect or DEFAULT_LINK
        act = self.precision.act_bytes
        comm = 0.0
        if tp > 1:
            comm += 2 * m.num_layers * (2 * (tp - 1) / tp * batch * m.hidden * act / link + COMM_LATENCY_S)
        if pp > 1:
            comm += (pp - 1) * (batch * m.hidden * act / link + COMM_LATENCY_S)
        return comm

    def _prefill_flops(self, stages: tuple[StageStatic, ...], batch: int, tp: int) -> float:
        """2 x active params x B x prompt + causal attention pairs x FLOPs per pair, / TP."""
        s, total = self.work.prompt_total, 0.0
        for st in stages:
            attn = 0.0
            for win, f in st.attn_flops_by_window.items():
                w_ = s if win is None else min(s, win)
                attn += f * (s * w_ - w_ * (w_ - 1) / 2)  # causal (query, key) pairs
            total += (2 * st.active_params * batch * s + attn * batch) / tp
        return total

    def _vision_flops(self, batch: int, tp: int) -> float:
        """ViT: tiles x (2 x params x patch tokens + 4 x layers x patch tokens^2 x hidden) + projector."""
        v, w = self.model.vision, self.work
        if v is None or not w.images:
            return 0.0
        tiles = batch * w.images * w.tiles
        return tiles * (2 * v.params * v.patch_tokens + 4 * v.layers * v.patch_tokens ** 2 * v.hidden
                        + 2 * v.projector_params * v.tokens_per_tile) / tp

    def speed(self, batch: int, context: int, efficiency: bool = True) -> Speed:
        """Decode and prefill time at this plan's TP x PP (module doc); efficiency=False: the roofline."""
        hw, tp, pp = self.hw, self.tp, self.pp
        eta_m, t0 = self.decode_eta() if efficiency else (1.0, 0.0)
        eta_p = self.budget.eta_memory * self.fmt.eta_factor if efficiency else 1.0  # prefill: the preset's
        eta_c = self.budget.eta_compute if efficiency else 1.0
        act_dtype = self.precision.act_dtype
        peak, peak_label = hw.peak(self.fmt.compute if self.fmt.compute != "bf16" else act_dtype)
        peak16, _ = hw.peak(act_dtype)
        stages = self.static(tp, pp)
        step = t_mem_sum = t_comp_sum = d_bytes = d_flops = 0.0
        for st in stages:
            bytes_ = self.weight_bytes_read(st, batch, tp) + float(self.kv_bytes_stage(st, batch, context))
            attn = sum(f * (context if win is None else min(context, win))
                       for win, f in st.attn_flops_by_window.items())
            flops = (2 * st.active_params + attn) * batch / tp
            t_mem, t_comp = bytes_ / (hw.bandwidth * eta_m), flops / (peak * eta_c)
            step += max(t_mem, t_comp)
            t_mem_sum, t_comp_sum = t_mem_sum + t_mem, t_comp_sum + t_comp
            d_bytes, d_flops = d_bytes + bytes_, d_flops + flops
        comm = self.comm_seconds(batch, tp, pp)
        step += comm + t0
        # prefill: every sequence's prompt, chunked at the batched-token budget (weights read per chunk)
        tokens = batch * self.work.prompt_total
        p_flops, v_flops = self._prefill_flops(stages, batch, tp), self._vision_flops(batch, tp)
        chunks = max(1, math.ceil(tokens / self.batched_tokens))
        w_llm = float(sum((st.weights_llm for st in stages), F(0)))
        w_vis = float(sum((st.weights_vision for st in stages), F(0)))
        kv_write = float(sum((self.kv_bytes_stage(st, batch, self.work.prompt_total) for st in stages), F(0)))
        p_bytes = chunks * w_llm + (w_vis if self.work.images else 0) + kv_write
        p_comp = p_flops / (peak * eta_c) + v_flops / (peak16 * eta_c)
        p_mem = p_bytes / (hw.bandwidth * eta_p)
        prefill = max(p_comp, p_mem) + (comm * chunks if tp > 1 or pp > 1 else 0)
        return Speed(
            decode_step_s=step, decode_tokens_per_s=1 / step, decode_tokens_per_s_total=batch / step,
            decode_bound="memory" if t_mem_sum >= t_comp_sum else "compute", decode_bytes=d_bytes,
            decode_flops=d_flops, comm_s=comm, prefill_s=prefill,
            prefill_bound="compute" if p_comp >= p_mem else "memory",
            prefill_flops=p_flops + v_flops, prefill_bytes=p_bytes, vision_flops=v_flops, peak=peak,
            peak_label=peak_label, bandwidth=hw.bandwidth, eta_memory=eta_m, eta_compute=eta_c, overhead_s=t0,
            backend=self.backend.key if efficiency and self.backend else "")

