"""Pipeline and tensor parallelism on worker processes, measured (issue #11, must-shows 3-4):
per configuration, per-step time, communication share and bubble fraction, beside GPipe's
(p - 1) / (m + p - 1).

Workload: smollm2-135m (fp32, 30 layers), BATCH (8) requests whose prompts are exactly
PROMPT_TOKENS (64) token ids each, all at once, budget 512 tokens: the first step is one
512-token prefill batch (compute dominates: ~1 s of forward on this CPU), split into m
micro-batches of equal size (8 / m requests each); the next DECODE_STEPS steps are 8-row
decodes (communication and per-step overheads dominate). Prefix caching is off and each
engine runs ROUNDS rounds of the same requests, so every round's first step is a full prefill.
Stages are balanced (30 layers: 15 / 15, or 8 / 8 / 7 / 7 for p = 4).

Every configuration's greedy tokens are compared with the in-process run's (a row each).

Configurations (one fresh engine each; the worker start-up time is reported too):
  * in-process (p = t = 1): the baseline step time
  * gpipe p = 2 and p = 4, m in {1, 2, 4, 8}: the bubble targets (within 0.1 of theory)
  * batch_queue p = 2 and p = 4: the step's requests spread over p batches in flight; its
    bubble is compared with gpipe m = 1 at the same p (target: lower)
  * t = 2, and p = 2 x t = 2 gpipe m = 4: the all-reduce share

Bubble fraction = 1 - (forward + send time of every worker) / (workers x window), window =
first forward start .. last forward end of the step (engine/pipeline_stats.py); median over
the rounds. On this 2-core machine p = 4 runs 4 processes on 2 cores: stages that overlap
share a core, so their forwards stretch and the measured bubble drops below the formula
(it assumes each stage runs at full speed whatever the others do).

``PBENCH_QUICK=1`` (or ``--quick``): one round, p = 2 only: a smoke run.
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from typing import Any

from engine.config import SamplingParams
from engine.engine import LLMEngine, get_shared_model
from engine.pipeline_stats import pipeline_stats
from engine.parallel_layout import theory_bubble

MODEL = "smollm2-135m"
BATCH = 8
PROMPT_TOKENS = 64
DECODE_STEPS = 3
ROUNDS = 3
TOLERANCE = 0.1


def _quick(argv: list[str] | None) -> bool:
    return os.environ.get("PBENCH_QUICK") == "1" or "--quick" in (argv or sys.argv[1:])


def prompts(tokenizer: Any) -> list[list[int]]:
    """BATCH distinct prompts of exactly PROMPT_TOKENS ids (windows of one long text)."""
    text = " ".join(f"Item {i}: the weather in city number {i} was mild and the river was calm." for i in range(80))
    ids = tokenizer.encode(text)
    return [ids[i * 37:i * 37 + PROMPT_TOKENS] for i in range(BATCH)]


def measure(knobs: dict[str, Any], token_prompts: list[list[int]], rounds: int) -> dict[str, Any]:
    """One engine: ``rounds`` x (BATCH prompts -> one prefill step + DECODE_STEPS decode steps)."""
    t0 = time.perf_counter()
    engine = LLMEngine(MODEL, block_size=16, num_blocks=128, max_num_batched_tokens=BATCH * PROMPT_TOKENS,
                       max_num_seqs=BATCH, enable_prefix_caching=False, **knobs)
    start_s = time.perf_counter() - t0
    params = SamplingParams(temperature=0, max_tokens=1 + DECODE_STEPS, ignore_eos=True)
    prefill, decode = [], []
    try:
        for _ in range(rounds):
            for p in token_prompts:
                engine.add_request(p, params)
            first = True
            while engine.has_unfinished_requests():
                trace = engine.step()
                (prefill if first else decode).append(trace)
                first = False
        outputs = [list(r.output_token_ids) for r in engine.requests.values()]
    finally:
        engine.shutdown()

    def summary(traces: list[Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"step_ms": statistics.median(t.forward_ms for t in traces)}
        timelines = [t.pipeline for t in traces if t.pipeline is not None]
        if timelines:
            stats = [pipeline_stats(tl) for tl in timelines]
            out.update(bubble=statistics.median(s.bubble_fraction for s in stats),
                       comm=statistics.median(s.comm_fraction for s in stats),
                       theory=statistics.median(s.theory_bubble for s in stats),
                       units=stats[0].num_units, bubbles=[round(s.bubble_fraction, 3) for s in stats])
        return out

    return {"start_s": start_s, "prefill": summary(prefill), "decode": summary(decode), "outputs": outputs}


def configurations(quick: bool) -> dict[str, dict[str, Any]]:
    configs: dict[str, dict[str, Any]] = {"in-process": {}}
    for p in (2,) if quick else (2, 4):
        for m in (1, 2, 4, 8):
            configs[f"gpipe p={p} m={m}"] = {"pipeline_parallel_size": p, "num_microbatches": m}
        configs[f"batch_queue p={p}"] = {"pipeline_parallel_size": p, "pipeline_schedule": "batch_queue"}
    if not quick:
        configs["t=2"] = {"tensor_parallel_size": 2}
        configs["gpipe p=2 x t=2 m=4"] = {"pipeline_parallel_size": 2, "tensor_parallel_size": 2,
                                          "num_microbatches": 4}
    return configs


def run(argv: list[str] | None = None) -> dict[str, Any]:
    quick = _quick(argv)
    rounds = 1 if quick else ROUNDS
    load_before = os.getloadavg()
    shared = get_shared_model(MODEL)
    token_prompts = prompts(shared.tokenizer)
    results: dict[str, dict[str, Any]] = {}
    for name, knobs in configurations(quick).items():
        t = time.perf_counter()
        results[name] = r = measure(knobs, token_prompts, rounds)
        pf, dc = r["prefill"], r["decode"]
        extra = (f"; bubble prefill {pf['bubble']:.3f} (theory {pf['theory']:.3f}, comm {pf['comm']:.3f}), "
                 f"decode {dc['bubble']:.3f}") if "bubble" in pf else ""
        print(f"  {name:<22} start {r['start_s']:5.1f} s; prefill step {pf['step_ms']:7.1f} ms; decode step "
              f"{dc['step_ms']:6.1f} ms{extra}  ({time.perf_counter() - t:.0f} s)", flush=True)
    load_after = os.getloadavg()
    rows: list[dict[str, Any]] = [
        {"metric": "load average (1 min) before / after", "value": load_before[0], "unit": "",
         "note": f"after {load_after[0]:.2f}; {os.cpu_count()} cores; batch {BATCH} x {PROMPT_TOKENS} tokens"},
    ]
    base = results["in-process"]
    for name, r in results.items():
        pf, dc = r["prefill"], r["decode"]
        rows.append({"metric": f"{name}: prefill step (512 tokens)", "value": pf["step_ms"], "unit": "ms",
                     "note": f"{pf['step_ms'] / base['prefill']['step_ms']:.2f}x in-process"})
        rows.append({"metric": f"{name}: decode step (8 rows)", "value": dc["step_ms"], "unit": "ms",
                     "note": f"{dc['step_ms'] / base['decode']['step_ms']:.2f}x in-process"})
        if "bubble" not in pf:
            continue
        rows.append({"metric": f"{name}: worker start-up", "value": r["start_s"], "unit": "s"})
        rows.append({"metric": f"{name}: greedy tokens identical to in-process", "value": float(
            r["outputs"] == base["outputs"]), "unit": "bool", "target": "1", "met": r["outputs"] == base["outputs"]})
        gpipe = name.startswith("gpipe") and "t=2" not in name
        rows.append({"metric": f"{name}: prefill bubble fraction", "value": pf["bubble"], "unit": "",
                     "target": f"{pf['theory']:.3f} ± {TOLERANCE}" if gpipe else f"theory {pf['theory']:.3f}",
                     "met": abs(pf["bubble"] - pf["theory"]) <= TOLERANCE if gpipe else None,
                     "note": f"{pf['units']} units; rounds {pf['bubbles']}"})
        rows.append({"metric": f"{name}: prefill communication share", "value": pf["comm"], "unit": ""})
        rows.append({"metric": f"{name}: decode bubble fraction", "value": dc["bubble"], "unit": "",
                     "note": f"theory {dc['theory']:.3f}; communication share {dc['comm']:.3f}"})
        if name.startswith("batch_queue"):
            p = name.split("p=")[1]
            ref = results[f"gpipe p={p} m=1"]
            for phase in ("prefill", "decode"):
                rows.append({"metric": f"{name}: {phase} bubble vs gpipe m=1", "value": r[phase]["bubble"],
                             "unit": "", "target": f"< {ref[phase]['bubble']:.3f}",
                             "met": r[phase]["bubble"] < ref[phase]["bubble"]})
    for r in results.values():
        del r["outputs"]
    return {"name": "bench_pipeline", "model": MODEL, "quick": quick, "rows": rows, "results": results,
            "theory": {f"p={p} m={m}": theory_bubble(p, m) for p in (2, 4) for m in (1, 2, 4, 8)}}


if __name__ == "__main__":
    import json
    print(json.dumps(run(sys.argv[1:]), indent=2, default=str))
