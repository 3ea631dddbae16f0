"""Serving benchmark result blocks: ``vllm bench serve`` / ``benchmarks/benchmark_serving.py`` and
SGLang's ``bench_serving`` print the same frame:

    ============ Serving Benchmark Result ============
    Successful requests:                     1000
    Request throughput (req/s):              32.42
    ---------------Time to First Token----------------
    Mean TTFT (ms):                          9626.13
    ...
    ==================================================

Each ``Label (unit): value`` line becomes a figure named after its label: lower case, the unit
kept as a suffix for times (``_ms``, ``_s``), rates without theirs (``request_throughput``,
``output_token_throughput``); a block cut short keeps the lines it has.
"""
from __future__ import annotations

import re

from engine.audit.evidence import Benchmark, Setting
from engine.audit.readers.common import Found, nothing, number

_START = re.compile(r"=+\s*Serving Benchmark Result\s*=+")
_END = re.compile(r"^\s*={5,}\s*$")
_BACKEND = re.compile(r"^\s*Backend:\s+([A-Za-z][\w.-]*)\s*$")  # SGLang's client names the server's framework
_FIGURE = re.compile(r"^\s*([A-Za-z][A-Za-z0-9 ./()%-]*?)\s*(?:\(([^)]*)\))?\s*:\s+(-?[0-9][0-9,]*\.?[0-9]*)\s*$")


def figure_name(label: str, unit: str | None) -> str:
    """``Mean TTFT`` + ``ms`` -> ``mean_ttft_ms``; ``Request throughput`` + ``req/s`` -> ``request_throughput``."""
    base = re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_")
    if unit in ("ms", "s"):
        return f"{base}_{unit}"
    return base


def read(lines: list[str]) -> Found:
    figures: dict[str, float] = {}
    used: set[int] = set()
    backend: Setting | None = None
    inside = False
    for n, line in enumerate(lines, 1):
        if _START.search(line):
            inside = True
            used.add(n)
            continue
        if not inside:
            continue
        if _END.match(line):
            used.add(n)
            inside = False
            continue
        m = _BACKEND.match(line)
        if m and m.group(1).lower() in ("sglang", "vllm"):
            backend = Setting("framework", m.group(1).lower(), "log", line, n)
            used.add(n)
            continue
        m = _FIGURE.match(line)
        if m:
            figures.setdefault(figure_name(m.group(1), m.group(2)), number(m.group(3)))
            used.add(n)
    if not figures:
        return nothing()
    return Found([backend] if backend else [], Benchmark("serving", figures, {}, tuple(sorted(used))), used, [])
