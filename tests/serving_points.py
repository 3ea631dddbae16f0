"""Published serving benchmarks as simulator runs (tests/data/serving_published.json).

One point: a deployment and a workload as the source states them, and its published figures.
``simulate_point`` runs the simulator on it and returns the same figures, predicted.
Used by tests/test_serving_published.py, tests/fit_serving_rules.py and the docs table."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.costmodel.frameworks import ServingRule
from engine.costmodel.model import simulated_model
from engine.simulate.metrics import summarize
from engine.simulate.simulator import ServingKnobs, simulate
from engine.simulate.workload import generate, parse_lengths
from engine.sizing import Settings

POINTS_FILE = Path(__file__).parent / "data" / "serving_published.json"
TOLERANCE = 0.25


@dataclass(frozen=True)
class Point:
    id: str
    role: str  # "fit" | "validate"
    source: str
    model: str
    hardware: str
    tp: int
    framework: str
    framework_version: str
    weights: str
    max_model_len: int | None
    num_requests: int
    rate: float
    max_concurrency: int | None
    prompt_len: str
    output_len: str
    published: dict[str, float]
    note: str

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Point":
        rate = d["rate"]
        return cls(**{**d, "rate": math.inf if str(rate).startswith("inf") else float(rate)})


def load_points() -> list[Point]:
    return [Point.from_dict(d) for d in json.loads(POINTS_FILE.read_text())["points"]]


def simulate_point(p: Point, max_requests: int | None = None, serving: ServingRule | None = None,
                   seed: int = 0) -> dict[str, float | None]:
    """The point's published metrics, predicted (at most ``max_requests`` of its requests)."""
    sim = simulated_model(p.model, p.hardware, Settings(tp=p.tp, framework=p.framework,
                                                        framework_version=p.framework_version, weights=p.weights),
                          max_model_len=p.max_model_len, serving=serving)
    n = p.num_requests if max_requests is None else min(p.num_requests, max_requests)
    w = generate(n, p.rate, parse_lengths(p.prompt_len, "prompt_len", "prompt"),
                 parse_lengths(p.output_len, "output_len", "output"), seed=seed)
    s = summarize(simulate(sim, w, ServingKnobs(), max_concurrency=p.max_concurrency))
    return {k: getattr(s, k) for k in p.published}


def relative_errors(p: Point, predicted: dict[str, float | None]) -> dict[str, float]:
    return {k: (predicted[k] or 0.0) / v - 1 for k, v in p.published.items()}
