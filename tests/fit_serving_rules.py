"""Fit each framework's serving constants (engine/costmodel/frameworks.py) to the published points
whose role is "fit", then simulate every point and print (or write) the validation table.

    .venv/bin/python -m tests.fit_serving_rules            # fit, print the table
    .venv/bin/python -m tests.fit_serving_rules --docs     # also write the table of docs/simulator.md

Fit, per rule: per_request_s by a scan (the median TPOT of its fit points); gemm_efficiency by a
scan (the throughput of its prefill-bound fit points: fixed long prompts), if it has any; then
frontend_s = the mean of published minus predicted median TTFT over its fit points (>= 0).
The values printed are copied into frameworks.py by hand, with the point ids, as backends.py's are.
"""
from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from pathlib import Path

from engine.costmodel.frameworks import RULES, ServingRule, serving_rule
from engine.sizing import Settings
from engine.sizing.plan import Plan
from engine.sizing import Workload, get_hardware, get_model
from tests.serving_points import TOLERANCE, Point, load_points, relative_errors, simulate_point

MAX_REQUESTS = 300  # per point while fitting (each scan runs every fit point many times)
TABLE_REQUESTS = 1000  # per point in the table (the bench's figure)
PER_REQUEST_SCAN_US = (0, 50, 100, 150, 200, 250, 300, 400)
GEMM_SCAN = (0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6)
DOCS = Path(__file__).resolve().parents[1] / "docs" / "simulator.md"  # the table goes after its "<!-- table -->"


def rule_of(p: Point) -> ServingRule:
    plan = Plan(get_model(p.model), get_hardware(p.hardware), Workload(),
                Settings(tp=p.tp, framework=p.framework, framework_version=p.framework_version))
    return serving_rule(plan.framework, plan.budget.rule, plan.budget.version_nums)


def _score(points: list[Point], rule: ServingRule, keys: tuple[str, ...]) -> float:
    errs = []
    for p in points:
        e = relative_errors(p, simulate_point(p, MAX_REQUESTS, rule))
        errs += [abs(v) for k, v in e.items() if k in keys]
    return statistics.mean(errs) if errs else 0.0


def fit(rule: ServingRule, points: list[Point]) -> ServingRule:
    best = min(PER_REQUEST_SCAN_US, key=lambda us: _score(points, replace(rule, per_request_s=us * 1e-6),
                                                           ("tpot_p50_s",)))
    rule = replace(rule, per_request_s=best * 1e-6, frontend_s=0.0)
    heavy = [p for p in points if "output_tokens_per_s" in p.published and p.prompt_len.isdigit()]
    if heavy:  # prefill-bound points (fixed long prompts): the framework's end-to-end compute efficiency
        gemm = min(GEMM_SCAN, key=lambda g: _score(heavy, replace(rule, gemm_efficiency=g), ("output_tokens_per_s",)))
        rule = replace(rule, gemm_efficiency=gemm)
    gaps = [p.published["ttft_p50_s"] - (simulate_point(p, MAX_REQUESTS, rule)["ttft_p50_s"] or 0.0)
            for p in points if "ttft_p50_s" in p.published]
    return replace(rule, frontend_s=max(0.0, statistics.mean(gaps)) if gaps else 0.0)


def table(points: list[Point]) -> list[str]:
    rows = ["| point | role | framework | metric | published | predicted | error | within 25 % |",
            "|---|---|---|---|---:|---:|---:|---|"]
    for p in points:
        pred = simulate_point(p, TABLE_REQUESTS)
        for k, e in relative_errors(p, pred).items():
            unit = 1.0 if k.endswith("_per_s") else 1e3  # seconds -> ms; rates as they are
            rows.append(f"| [{p.id}]({p.source}) | {p.role} | {p.framework} {p.framework_version} | {k} |"
                        f" {p.published[k] * unit:,.1f} | {(pred[k] or 0) * unit:,.1f} | {e:+.0%} |"
                        f" {'yes' if abs(e) <= TOLERANCE else 'NO'} |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", action="store_true")
    ap.add_argument("--no-fit", action="store_true")
    ap.add_argument("--rule", help="fit only this rule (frameworks.RULES key)")
    ap.add_argument("--requests", type=int, help=f"requests per point while fitting (default {MAX_REQUESTS})")
    args = ap.parse_args()
    points = load_points()
    if args.requests:
        globals()["MAX_REQUESTS"] = args.requests
    if not args.no_fit:
        for key, rule in RULES.items():
            if args.rule and key != args.rule:
                continue
            mine = [p for p in points if p.role == "fit" and rule_of(p).key == key]
            t = time.perf_counter()
            fitted = fit(rule, mine)
            print(f"{key}: per_request_s={fitted.per_request_s:.6f} frontend_s={fitted.frontend_s:.4f}"
                  f" gemm_efficiency={fitted.gemm_efficiency}"
                  f"  (fit on {[p.id for p in mine]}, {time.perf_counter() - t:.0f} s)", flush=True)
    if args.rule:
        return
    rows = table(points)
    print("\n".join(rows))
    if args.docs:
        body = DOCS.read_text().split("<!-- table -->")[0]
        DOCS.write_text(body + "<!-- table -->\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
