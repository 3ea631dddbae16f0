"""The published decode speeds of tests/data/decode_speeds.json as calculator inputs (used by
tests/test_decode_speeds.py and tests/fit_decode_speeds.py)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.sizing.arch import ModelSpec
from engine.sizing.hardware import Hardware, get_hardware, hardware_from_dict
from engine.sizing.models import get_model, parse_config_text
from engine.sizing.plan import Plan, Settings, Workload

DATA = Path(__file__).parent / "data" / "decode_speeds.json"


@dataclass(frozen=True)
class DecodePoint:
    id: str
    backend: str
    measured: float  # tok/s per sequence
    failing: bool
    source: str
    quote: str
    raw: dict[str, Any]


def load_points() -> list[DecodePoint]:
    rows = json.loads(DATA.read_text())["points"]
    return [DecodePoint(r["id"], r["backend"], float(r["measured_tok_s"]), bool(r["failing"]), r["source"], r["quote"], r)
            for r in rows]


def _hardware(h: str | dict[str, Any]) -> Hardware:
    if isinstance(h, dict):
        return hardware_from_dict({k: v for k, v in h.items() if not k.startswith("_")})
    if "#" in h:  # "preset#n": the preset's n-th variant (Ascend 910B4 beside the 910B)
        base, n = h.split("#")
        return get_hardware(base).variants[int(n) - 1]
    return get_hardware(h)


def _model(m: str | dict[str, Any]) -> ModelSpec:
    return get_model(m) if isinstance(m, str) else parse_config_text(json.dumps(m["config"]))


def plan_for(p: DecodePoint, framework: str | None = None) -> Plan:
    r = p.raw
    return Plan(_model(r["model"]), _hardware(r["hardware"]),
                Workload(batch=r["batch"], prompt=r["prompt"], output=r["output"], context=r["prompt"] + r["output"]),
                Settings(weights=r["weights"], framework=framework or r["framework"], tp=r["tp"]))
