"""The audit demonstrated on measurements: this project's engine, on this machine, serves one
standard workload with each of its optimisations off and on (``python -m engine.audit --this-engine``,
``make bench``, the /audit page).

    baseline     what the engine does by default: continuous batching, chunked prefill, prefix
                 caching, float weights and KV cache, no speculation
    one change   each optimisation flipped alone against that baseline: the lossless ones turned
                 off (continuous -> static batching, chunked prefill off, prefix caching off, decode
                 groups off: every decode padded to the longest), the opt-in ones turned on (int8 /
                 int4 weights, int8 KV cache, n-gram speculation)

Every run is the real engine (``run_real``: wall-clock times) on the same workload: requests in
two groups sharing a system prompt, arriving together. The figures are measured, not predicted;
their noise on a shared machine is the load's (the result records the load average).
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.simulate.metrics import Summary, summarize
from engine.simulate.simulator import ServingKnobs, run_real
from engine.simulate.workload import Lengths, Workload, generate
from engine.sizing.estimate import estimate
from engine.sizing.formats import SizingError
from engine.sizing.plan import Settings
from engine.sizing.plan import Workload as SizingWorkload

NUM_BLOCKS = 512
BLOCK_SIZE = 16


@dataclass(frozen=True)
class Variant:
    """One optimisation flipped against the baseline."""

    name: str  # the knowledge table's optimisation name
    title: str
    direction: str  # "off" (a default the engine has) | "on" (an opt-in)
    knobs: dict[str, Any]  # engine knobs of the run (ServingKnobs fields or engine knobs)
    lossless: bool  # greedy outputs unchanged (quantization changes them)


VARIANTS: tuple[Variant, ...] = (
    Variant("continuous_batching", "Continuous batching", "off", {"policy": "static"}, True),
    Variant("chunked_prefill", "Chunked prefill", "off", {"enable_chunked_prefill": False}, True),
    Variant("prefix_caching", "Prefix caching", "off", {"enable_prefix_caching": False}, True),
    Variant("weight_quant_w8a8", "int8 weights", "on", {"quantization": "int8"}, False),
    Variant("weight_quant_awq_gptq", "int4 weights (W4A16)", "on", {"quantization": "int4"}, False),
    Variant("kv_cache_quant", "int8 KV cache", "on", {"kv_cache_dtype": "int8"}, False),
    Variant("speculative_ngram", "n-gram speculation (k = 3)", "on",
            {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3}}, True),
    Variant("unpadded_decode_attention", "Unpadded decode attention", "off", {"decode_grouping": False}, True),
)
#: this engine's own optimisations, not in the knowledge table (no other framework has them by that name)
ENGINE_ONLY = frozenset({"unpadded_decode_attention"})
_SERVING_FIELDS = ("enable_prefix_caching", "enable_chunked_prefill")


@dataclass(frozen=True)
class Figures:
    makespan_s: float
    output_tokens_per_s: float
    ttft_p50_s: float | None
    tpot_p50_s: float | None

    @classmethod
    def of(cls, s: Summary) -> Figures:
        return cls(s.makespan_s, s.output_tokens_per_s, s.ttft_p50_s, s.tpot_p50_s)


@dataclass(frozen=True)
class AblationRow:
    name: str
    title: str
    direction: str
    figures: Figures
    speedup: float  # baseline makespan / this run's makespan (> 1: this run is faster)


@dataclass(frozen=True)
class Ablation:
    model: str
    workload: str
    baseline: Figures
    rows: tuple[AblationRow, ...]
    decode_bound_tokens_per_s: float | None  # the calculator's bandwidth bound here, batch 1, fp32 (None: a
    # model the calculator does not know, e.g. tiny-random)
    decode_measured_tokens_per_s: float | None  # 1 / the baseline's p50 TPOT
    load_average: tuple[float, float]
    seconds: float
    notes: tuple[str, ...] = field(default_factory=tuple)


def standard_workload(num_requests: int = 12, prompt: int = 160, output: int = 24, prefix: int = 96) -> Workload:
    return generate(num_requests, float("inf"), Lengths("uniform", prompt - 32, prompt + 32), Lengths("fixed", output),
                    seed=5, prefix_groups=2, prefix_tokens=prefix,
                    name=f"{num_requests} requests at once, prompts {prompt - 32}..{prompt + 32} tokens (2 groups sharing "
                         f"{prefix}), {output} tokens out")


def _run(model: str, work: Workload, knobs: dict[str, Any]) -> Figures:
    serving = ServingKnobs(**{k: v for k, v in knobs.items() if k in _SERVING_FIELDS})
    engine = {k: v for k, v in knobs.items() if k not in _SERVING_FIELDS}
    return Figures.of(summarize(run_real(model, work, serving, num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE, **engine)))


def ablation(model: str = "smollm2-135m", work: Workload | None = None,
             progress: Callable[[str], None] | None = None) -> Ablation:
    """The baseline and each variant, measured (module doc)."""
    t0 = time.perf_counter()
    load0 = os.getloadavg()[0]
    work = work or standard_workload()
    say = progress or (lambda _: None)
    say(f"this engine, {model}: baseline ({work.name})")
    base = _run(model, work, {})
    rows = []
    for i, v in enumerate(VARIANTS, 1):
        say(f"[{i}/{len(VARIANTS)}] {v.title} {v.direction}")
        f = _run(model, work, v.knobs)
        rows.append(AblationRow(v.name, v.title, v.direction, f, base.makespan_s / f.makespan_s if f.makespan_s else 0.0))
    try:
        bound: float | None = estimate(model, "this-machine", SizingWorkload(batch=1, context=256),
                                       Settings(weights="fp32", kv_dtype="fp32"), detail=False).decode_tokens_per_s_roofline
    except SizingError:
        bound = None
    measured = 1.0 / base.tpot_p50_s if base.tpot_p50_s else None
    return Ablation(model, work.name, base, tuple(rows), bound, measured,
                    (load0, os.getloadavg()[0]), time.perf_counter() - t0,
                    ("measured on this machine; times move with its load (load average recorded)",))


def ablation_json(a: Ablation) -> dict[str, Any]:
    def figs(f: Figures) -> dict[str, Any]:
        return {"makespan_s": f.makespan_s, "output_tokens_per_s": f.output_tokens_per_s,
                "ttft_p50_s": f.ttft_p50_s, "tpot_p50_s": f.tpot_p50_s}
    return {"model": a.model, "workload": a.workload, "baseline": figs(a.baseline),
            "rows": [{"name": r.name, "title": r.title, "direction": r.direction, "speedup": r.speedup,
                      **figs(r.figures)} for r in a.rows],
            "roofline": {"decode_bound_tokens_per_s": a.decode_bound_tokens_per_s,
                         "decode_measured_tokens_per_s": a.decode_measured_tokens_per_s,
                         "bandwidth_utilisation": (a.decode_measured_tokens_per_s / a.decode_bound_tokens_per_s
                                                   if a.decode_measured_tokens_per_s and a.decode_bound_tokens_per_s
                                                   else None)},
            "load_average": list(a.load_average), "seconds": a.seconds, "notes": list(a.notes)}


def ablation_text(a: Ablation) -> str:
    b = a.baseline
    lines = [f"This engine ({a.model}) on this machine: {a.workload}",
             f"  baseline (continuous batching, chunked prefill, prefix caching; fp32): makespan {b.makespan_s:.2f} s, "
             f"{b.output_tokens_per_s:.1f} output tokens/s"]
    for r in a.rows:
        f = r.figures
        lines.append(f"  {r.title:<28} {r.direction:>3}: makespan {f.makespan_s:6.2f} s  x{r.speedup:.2f}  "
                     f"TTFT p50 {(f.ttft_p50_s or 0):.2f} s  TPOT p50 {(f.tpot_p50_s or 0) * 1e3:.0f} ms")
    if a.decode_measured_tokens_per_s and a.decode_bound_tokens_per_s:
        lines.append(f"  roofline: decode {a.decode_measured_tokens_per_s:.1f} tokens/s per sequence at the baseline's "
                     f"batch against a batch-1 bound of {a.decode_bound_tokens_per_s:.1f}")
    return "\n".join(lines)
