"""The audit demonstrated on measurements (issue #23, item 4): this engine on this machine serves
one standard workload with each optimisation flipped against its defaults (engine/audit/this_engine.py).

Each row is a ratio against the baseline run in the same process minutes apart: makespan speedup
(> 1: faster with the change). No targets: the table is the audit's measured evidence, and the
load average is recorded with it.
"""
from __future__ import annotations

from typing import Any

from engine.audit.this_engine import ablation, ablation_json
from engine.simulate.calibrate import use_app_threads


def run() -> dict[str, Any]:
    threads = use_app_threads()
    a = ablation("smollm2-135m", progress=lambda s: print(f"  {s}", flush=True))
    rows: list[dict[str, Any]] = [
        {"metric": "baseline makespan (continuous, chunked, prefix cache, fp32)", "value": a.baseline.makespan_s,
         "unit": "s", "target": "", "met": None}]
    rows += [{"metric": f"{r.title} {r.direction}: makespan speedup", "value": r.speedup, "unit": "x", "target": "",
              "met": None} for r in a.rows]
    if a.decode_measured_tokens_per_s and a.decode_bound_tokens_per_s:
        rows.append({"metric": "baseline decode tokens/s per sequence / batch-1 bandwidth bound",
                     "value": a.decode_measured_tokens_per_s / a.decode_bound_tokens_per_s, "unit": "", "target": "",
                     "met": None})
    rows += [{"metric": "torch threads", "value": threads, "unit": "", "target": "", "met": None},
             {"metric": "load average at the start / end", "value": a.load_average[0], "unit": "", "target": "",
              "met": None}]
    return {"name": "this engine, each optimisation off and on", "rows": rows, "ablation": ablation_json(a)}
