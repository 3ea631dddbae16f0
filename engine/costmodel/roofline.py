"""Roofline x efficiency: a step's time on any hardware preset, for any model the calculator knows.

Per pipeline stage, each operator kind takes the longer of its memory time and its compute time
(at the efficiency the framework reaches on that device), and the kinds run one after another:

    gemm       max(weight bytes read / (BW x eta_mem),  2 x active params x M / (peak x eta_gemm))
               (MoE: only the experts the M tokens touch, E x (1 - (1 - k/E)^M) of E, are read;
               the LM head runs on the sampled rows only)
    attention  max((KV read + KV written) / (BW x eta_mem),  FLOPs per (query, key) pair x pairs
               / (peak x eta_attention)); a decode reads its whole context, a prefill chunk of q
               tokens after s cached ones has q x s + q (q + 1) / 2 causal pairs
    elementwise  ELEMENTWISE_PASSES x M x hidden x activation bytes per layer / (BW x eta_mem)
    comm       TP: 2 ring all-reduces of M x hidden per layer; PP: one hop per stage boundary
               (the calculator's ``Plan.comm_seconds``)
    overhead   the framework's fixed time per step + a time per scheduled request

The same Plan the calculator answers from gives every byte and FLOP (one source of truth): for
a batch of B decodes this is the calculator's decode step (``Plan.speed``) plus the elementwise
term, which is a few tenths of a percent of it.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.costmodel.cost import StepCost
from engine.costmodel.shape import StepShape
from engine.sizing.plan import Plan, StageStatic

#: hidden-sized reads + writes per token per layer outside the GEMMs, replicated on every TP rank:
#: two fused add + RMSNorm kernels (read x and the residual, write both: 4 passes each) and rotary
#: on q and k (about 2): an estimate, small beside the weights except in long prefills.
ELEMENTWISE_PASSES = 10


@dataclass(frozen=True)
class Efficiency:
    """Shares of the roofline a framework reaches on a device, and its fixed costs."""

    memory: float  # weight and KV reads (the decode rule: engine/sizing/backends.py)
    gemm: float  # dense GEMMs at large M, share of the dense peak
    attention: float  # prefill attention (FlashAttention-class kernels), share of the peak
    overhead_s: float  # per step: scheduling, launches, sampling
    per_request_s: float = 0.0  # per scheduled request per step (input preparation)
    source: str = ""

    def __post_init__(self) -> None:
        for name in ("memory", "gemm", "attention"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ValueError(f"efficiency {name}: must be in (0, 1], got {value!r}")
        if self.overhead_s < 0 or self.per_request_s < 0:
            raise ValueError("efficiency: overheads must be >= 0 seconds")


#: Prefill attention's share of the dense peak where no measurement says otherwise: FlashAttention-2
#: reaches 50-73 % of A100's BF16 peak in the forward pass (Dao 2023, arXiv 2307.08691, Fig. 4);
#: the low end, since serving runs mixed lengths and paged KV.
DEFAULT_ATTENTION_EFFICIENCY = 0.5


def plan_efficiency(plan: Plan) -> Efficiency:
    """The calculator's own efficiencies for this plan: its decode rule (eta and t0 of the serving
    backend, engine/sizing/backends.py) for reads, the preset's compute efficiency for GEMMs."""
    eta, t0 = plan.decode_eta()
    rule = plan.backend
    source = rule.words if rule else f"{plan.hw.name} preset: memory {eta:.2f}, compute {plan.budget.eta_compute:.2f}"
    return Efficiency(memory=min(eta, 1.0), gemm=plan.budget.eta_compute, attention=DEFAULT_ATTENTION_EFFICIENCY,
                      overhead_s=t0, source=source)


class RooflineCost:
    """The cost model of one deployment (a calculator Plan: model, hardware, precision, TP x PP)."""

    def __init__(self, plan: Plan, efficiency: Efficiency | None = None) -> None:
        self.plan = plan
        self.eff = efficiency or plan_efficiency(plan)
        self.stages: tuple[StageStatic, ...] = plan.static(plan.tp, plan.pp)
        hw, prec = plan.hw, plan.precision
        fmt = plan.fmt
        self.peak, _ = hw.peak(fmt.compute if fmt.compute != "bf16" else prec.act_dtype)
        self.peak_act, _ = hw.peak(prec.act_dtype)
        self.act_bytes = prec.act_bytes
        m = plan.model
        self.head_params = m.vocab * m.hidden  # the LM head's matmul (tied or not)
        # per stage (by its first layer), per window: KV bytes per token and attention FLOPs per pair, as floats
        self._kv = {st.first_layer: {w: float(b) for w, b in st.kv_by_window.items()} for st in self.stages}
        self._attn = {st.first_layer: {w: float(f) for w, f in st.attn_flops_by_window.items()} for st in self.stages}
        self._windows = {w for st in self.stages for w in (*st.kv_by_window, *st.attn_flops_by_window)}

    @property
    def label(self) -> str:
        p = self.plan
        return (f"roofline x efficiency: {p.model.display_name} on {p.tp * p.pp} x {p.hw.name} (TP {p.tp}, PP {p.pp}),"
                f" {p.fmt.key} weights, {p.kv.key} KV; {self.eff.source}")

    def _stage(self, st: StageStatic, shape: StepShape, sums: dict[int | None, tuple[int, int]]) -> tuple[float, float, float]:
        """(gemm, attention, elementwise) seconds of one pipeline stage; ``sums``: per window, the
        step's KV tokens read + written and its causal (query, key) pairs (``_window_sums``)."""
        p, eff, tp = self.plan, self.eff, self.plan.tp
        bw = p.hw.bandwidth * eff.memory
        m_tokens, rows = shape.num_tokens, shape.num_samples
        body = st.active_params - (p.model.embed_params if st.first else 0) \
            - ((p.model.lm_head_params + p.model.final_norm_params) if st.last else 0)
        flops = 2 * body * m_tokens + (2 * self.head_params * rows if st.last else 0)
        gemm = max(p.weight_bytes_read(st, m_tokens, tp) / bw, flops / tp / (self.peak * eff.gemm))
        kv_bytes = sum(per_token * sums[w][0] for w, per_token in self._kv[st.first_layer].items())
        pairs_flops = sum(f * sums[w][1] for w, f in self._attn[st.first_layer].items())
        attention = max(kv_bytes / bw, pairs_flops / tp / (self.peak_act * eff.attention))
        # (norms and residuals run on the whole hidden vector on every TP rank)
        elementwise = ELEMENTWISE_PASSES * m_tokens * p.model.hidden * self.act_bytes * st.num_layers / bw
        return gemm, attention, elementwise

    @staticmethod
    def _window_sums(shape: StepShape, windows: set[int | None]) -> dict[int | None, tuple[int, int]]:
        """Per attention window: KV tokens the step reads (each chunk's kept context) and writes (its
        new tokens), and its causal (query, key) pairs (a window caps the keys each query sees)."""
        out = {}
        for w in windows:
            kv = pairs = 0
            for c in shape.chunks:
                ctx = c.context
                kv += (ctx if w is None or ctx <= w else w) + c.new_tokens
                pairs += c.causal_pairs if w is None or ctx <= w else c.new_tokens * w
            out[w] = (kv, pairs)
        return out

    def step_cost(self, shape: StepShape) -> StepCost:
        if not shape.chunks:
            return StepCost(0.0, 0.0, 0.0, 0.0, 0.0)
        sums = self._window_sums(shape, self._windows)
        gemm = attention = elementwise = 0.0
        for st in self.stages:
            g, a, e = self._stage(st, shape, sums)
            gemm, attention, elementwise = gemm + g, attention + a, elementwise + e
        comm = self.plan.comm_seconds(shape.num_tokens, self.plan.tp, self.plan.pp)
        overhead = self.eff.overhead_s + self.eff.per_request_s * shape.num_requests
        return StepCost(gemm, attention, elementwise, comm, overhead)
