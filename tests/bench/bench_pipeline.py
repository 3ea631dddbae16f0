"""Pipeline and tensor parallelism on worker processes, measured (issue #11, must-shows 3-4):
per configuration, per-step time, communication share and bubble fraction, beside GPipe's
(p - 1) / (m + p - 1).

Workload: smollm2-135m (fp32, 30 layers), BATCH (8) requests whose prompts are exactly
PROMPT_TOKENS (64) token ids each, all at once, budget 512 tokens: the first step is one
512-token prefill batch (compute dominates: ~1 s of forward on this CPU), split into m
micro-batches of equal size (8 / m requests each) under gpipe; then DECODE_STEPS (15) tokens
of decoding per request (8-row batches: per-step overheads dominate). Prefix caching is off and each
engine runs ROUNDS rounds of the same requests, so every round's first step is a full prefill.
Stages are balanced (30 layers: 15 / 15, or 8 / 8 / 7 / 7 for p = 4).

Every configuration's greedy tokens are compared with the in-process run's (a row each).

Configurations (one fresh engine each; the worker start-up time is reported too):
  * in-process (p = t = 1): the baseline throughput
  * gpipe p = 2 and p = 4, m in {1, 2, 4, 8}: the first step's bubble within 0.1 of theory
  * batch_queue p = 2 and p = 4: up to p batches in flight across steps (vLLM's batch queue);
    its bubble is compared with gpipe at the same p: target lower than m = 1 (one batch per
    step, as the batch queue's batches are whole); the other m are rows beside it with their
    throughput: micro-batches of one decode row each lower the bubble fraction by keeping the
    stages busy re-reading the same weights per micro-batch, so tokens/s fall while it drops
  * t = 2, and p = 2 x t = 2 gpipe m = 4: the all-reduce share

Bubble fraction = 1 - (forward + send time of every worker) / (workers x window)
(engine/parallel/stats.py). "First step": window = that step's first forward start .. last
forward end. "Whole run": every step of the round on one axis (merge_timelines), so the
workers' idle time between steps (the driver sampling and scheduling) counts too: GPipe fills
and drains every step, the batch queue keeps the pipeline busy across steps. "Decode phase":
the same over the steps with no prefill token (the steady state). Medians over the
rounds. On this 2-core machine p = 4 runs 4 processes on 2 cores: stages that overlap share a
core, so their forwards stretch and the measured bubble drops below the formula (which
assumes each stage runs at full speed whatever the others do).

``PBENCH_QUICK=1`` (or ``--quick``): one round, p = 2 only: a smoke run.
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from typing import Any

from engine.core.config import SamplingParams
from engine.serving.engine import LLMEngine
from engine.model.shared import get_shared_model
from engine.parallel.stats import merge_timelines, pipeline_stats
from engine.parallel.layout import theory_bubble

MODEL = "smollm2-135m"
BATCH = 8
PROMPT_TOKENS = 64
DECODE_STEPS = 15
ROUNDS = 2
TOLERANCE = 0.1


def _quick(argv: list[str] | None) -> bool:
    return os.environ.get("PBENCH_QUICK") == "1" or "--quick" in (argv or sys.argv[1:])


def prompts(tokenizer: Any) -> list[list[int]]:
    """BATCH distinct prompts of exactly PROMPT_TOKENS ids (windows of one long text)."""
    text = " ".join(f"Item {i}: the weather in city number {i} was mild and the river was calm." for i in range(80))
    ids = tokenizer.encode(text)
    return [ids[i * 37:i * 37 + PROMPT_TOKENS] for i in range(BATCH)]


def measure(knobs: dict[str, Any], token_prompts: list[list[int]], rounds: int) -> dict[str, Any]:
    """One engine: ``rounds`` x (BATCH prompts, run to the end: a prefill then DECODE_STEPS decodes).
    Per round: wall time and tokens/s; the first step's bubble (GPipe: the step is one 512-token
    batch); the whole round's bubble and communication share, every step on one axis
    (pipeline_stats.merge_timelines: gaps between steps count); median over the rounds."""
    t0 = time.perf_counter()
    engine = LLMEngine(MODEL, block_size=16, num_blocks=128, max_num_batched_tokens=BATCH * PROMPT_TOKENS,
                       max_num_seqs=BATCH, enable_prefix_caching=False, **knobs)
    start_s = time.perf_counter() - t0
    params = SamplingParams(temperature=0, max_tokens=1 + DECODE_STEPS, ignore_eos=True)
    rows: list[dict[str, Any]] = []
    try:
        for _ in range(rounds):
            for p in token_prompts:
                engine.add_request(p, params)
            traces = []
            t = time.perf_counter()
            while engine.has_unfinished_requests():
                traces.append(engine.step())
            wall = time.perf_counter() - t
            row: dict[str, Any] = {"wall_s": wall, "tok_s": BATCH * (1 + DECODE_STEPS) / wall,
                                   "steps": len(traces), "first_step_ms": traces[0].forward_ms}
            timelines = [x.pipeline for x in traces if x.pipeline is not None]
            if timelines:
                first, run = pipeline_stats(timelines[0]), pipeline_stats(merge_timelines(timelines))
                decode = decode_phase(traces)
                row.update(first_bubble=first.bubble_fraction, first_theory=first.theory_bubble,
                           first_units=first.num_units, first_comm=first.comm_fraction,
                           run_bubble=run.bubble_fraction, run_comm=run.comm_fraction,
                           decode_bubble=decode.bubble_fraction, decode_comm=decode.comm_fraction)
            rows.append(row)
        outputs = [list(r.output_token_ids) for r in engine.requests.values()]
    finally:
        engine.shutdown()
    summary = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    summary["first_bubbles"] = [round(r.get("first_bubble", 0.0), 3) for r in rows]
    return {"start_s": start_s, **summary, "outputs": outputs}


def decode_phase(traces: list[Any]) -> Any:
    """Every step on one axis, measured from the first forward of the first step with no prefill
    token: the steady state, with work still in flight from earlier batches counted as work."""
    timelines = [x.pipeline for x in traces if x.pipeline is not None]
    merged = merge_timelines(timelines)
    first = next(x.pipeline for x in traces if x.pipeline is not None and x.num_prefill_tokens == 0)
    since = first.offset_ms - merged.offset_ms + min(e.start_ms for e in first.events if e.kind == "forward")
    return pipeline_stats(merged, since_ms=since)


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
        extra = (f"; first-step bubble {r['first_bubble']:.3f} (theory {r['first_theory']:.3f}); whole-run bubble "
                 f"{r['run_bubble']:.3f}, decode {r['decode_bubble']:.3f}, comm {r['run_comm']:.3f}"
                 if "run_bubble" in r else "")
        print(f"  {name:<22} start {r['start_s']:5.1f} s; {r['tok_s']:6.1f} tok/s{extra}  "
              f"({time.perf_counter() - t:.0f} s)", flush=True)
    load_after = os.getloadavg()
    rows: list[dict[str, Any]] = [
        {"metric": "load average (1 min) before / after", "value": load_before[0], "unit": "",
         "note": f"after {load_after[0]:.2f}; {os.cpu_count()} cores; batch {BATCH} x {PROMPT_TOKENS} tokens"},
    ]
    base = results["in-process"]
    for name, r in results.items():
        same = r["outputs"] == base["outputs"]
        rows.append({"metric": f"{name}: throughput (prefill + {DECODE_STEPS} decodes x {BATCH})",
                     "value": r["tok_s"], "unit": "tok/s", "note": f"{r['tok_s'] / base['tok_s']:.2f}x in-process; "
                     f"first step {r['first_step_ms']:.0f} ms; {r['steps']:.0f} steps"})
        if "run_bubble" not in r:
            continue
        rows.append({"metric": f"{name}: worker start-up", "value": r["start_s"], "unit": "s"})
        rows.append({"metric": f"{name}: greedy tokens identical to in-process", "value": float(same),
                     "unit": "bool", "target": "1", "met": same})
        if name.startswith("gpipe") and "t=2" not in name:
            ok = abs(r["first_bubble"] - r["first_theory"]) <= TOLERANCE
            rows.append({"metric": f"{name}: prefill step bubble fraction", "value": r["first_bubble"], "unit": "",
                         "target": f"{r['first_theory']:.3f} ± {TOLERANCE}", "met": ok,
                         "note": f"{r['first_units']:.0f} micro-batches of {BATCH // int(r['first_units'])} x "
                                 f"{PROMPT_TOKENS} tokens; rounds {r['first_bubbles']}"})
        rows.append({"metric": f"{name}: whole-run bubble fraction", "value": r["run_bubble"], "unit": "",
                     "note": f"communication share {r['run_comm']:.3f}"})
        rows.append({"metric": f"{name}: decode-phase bubble fraction", "value": r["decode_bubble"], "unit": "",
                     "note": f"communication share {r['decode_comm']:.3f}"})
        if name.startswith("batch_queue"):
            p = name.split("p=")[1]
            for phase in ("run", "decode"):
                m1 = results[f"gpipe p={p} m=1"][f"{phase}_bubble"]
                rows.append({"metric": f"{name}: {phase} bubble vs gpipe m=1 (one batch per step)",
                             "value": r[f"{phase}_bubble"], "unit": "", "target": f"< {m1:.3f}",
                             "met": r[f"{phase}_bubble"] < m1})
                for k, v in results.items():
                    if k.startswith(f"gpipe p={p} m=") and not k.endswith("m=1"):
                        rows.append({"metric": f"{name}: {phase} bubble vs {k}", "value": r[f"{phase}_bubble"],
                                     "unit": "", "note": f"{k}: {v[f'{phase}_bubble']:.3f} at "
                                                         f"{v['tok_s']:.1f} tok/s (batch queue {r['tok_s']:.1f})"})
    for r in results.values():
        del r["outputs"]
    return {"name": "bench_pipeline", "model": MODEL, "quick": quick, "rows": rows, "results": results,
            "theory": {f"p={p} m={m}": theory_bubble(p, m) for p in (2, 4) for m in (1, 2, 4, 8)}}


if __name__ == "__main__":
    import json
    print(json.dumps(run(sys.argv[1:]), indent=2, default=str))
