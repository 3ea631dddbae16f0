"""The serving simulator at scale and against published benchmarks (issue #22, must-shows 2 and 4).

Scale: 2,000 requests of Llama-3-70B on 8 x H100 SXM (TP 8, vLLM) at 10 req/s, ShareGPT lengths
(the published statistics), simulated here; target <= 20 s of wall time, and the run's
kv_pool_tokens equal to the calculator's KV room for the same deployment.

Published: every point of tests/data/serving_published.json with up to 1,000 of its requests;
each metric's error against the published figure (target: within 25 %), and the count of
held-out points whose every metric is within it (target >= 5).
"""
from __future__ import annotations

import time

from engine.costmodel.model import simulated_model
from engine.simulate.metrics import summarize
from engine.simulate.simulator import simulate
from engine.simulate.workload import generate, published
from engine.sizing import Settings, Workload, estimate
from tests.serving_points import TOLERANCE, load_points, relative_errors, simulate_point

SCALE = dict(model="llama-3-70b", hardware="h100-sxm", tp=8, requests=2000, rate=10.0)


def _scale() -> list[dict[str, object]]:
    settings = Settings(tp=SCALE["tp"], framework="vllm")  # type: ignore[arg-type]
    t = time.perf_counter()
    sim = simulated_model(str(SCALE["model"]), str(SCALE["hardware"]), settings)
    w = generate(int(SCALE["requests"]), float(SCALE["rate"]), published("sharegpt", "prompt"),
                 published("sharegpt", "output"), seed=0)
    s = summarize(simulate(sim, w))
    wall = time.perf_counter() - t
    room = estimate(str(SCALE["model"]), str(SCALE["hardware"]), Workload(batch=1, context=sim.deployment.max_model_len),
                    settings, detail=False).kv_room_tokens
    return [
        {"metric": "2,000 requests Llama-3-70B 8xH100 @10/s: wall", "value": wall, "unit": "s", "target": "<= 20",
         "met": wall <= 20},
        {"metric": "  its kv_pool_tokens - the calculator's KV room", "value": s.kv_pool_tokens - room, "unit": "tokens",
         "target": "== 0", "met": s.kv_pool_tokens == room},
        {"metric": "  simulated steps", "value": s.steps, "unit": "", "target": "", "met": None},
        {"metric": "  p50 TTFT / p50 TPOT (predicted)", "value": (s.ttft_p50_s or 0) * 1e3, "unit": "ms",
         "target": f"TPOT {(s.tpot_p50_s or 0) * 1e3:.1f} ms", "met": None},
    ]


def _published() -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    held_out_ok = 0
    for p in load_points():
        errors = relative_errors(p, simulate_point(p, 1000))
        ok = all(abs(e) <= TOLERANCE for e in errors.values())
        held_out_ok += ok and p.role == "validate"
        for k, e in errors.items():
            rows.append({"metric": f"{p.id} {k} ({p.role})", "value": 100 * e, "unit": "% error", "target": "|e| <= 25",
                         "met": abs(e) <= TOLERANCE if p.role == "validate" else None})
    rows.insert(0, {"metric": "held-out published points within 25 %", "value": held_out_ok, "unit": "points",
                    "target": ">= 5", "met": held_out_ok >= 5})
    return rows


def run() -> dict[str, object]:
    return {"name": "serving simulator", "scale": SCALE, "rows": _scale() + _published()}
