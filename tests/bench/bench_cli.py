"""The calculator's command line: start-up + answer for the motivating question, as a user runs it.

``python -m engine.memory --model internvl2-8b --hardware atlas-300v-pro`` in a fresh process,
20 times (median and max reported; the first run also pays for compiling the sources when no
bytecode is cached), plus the answer alone in-process (``main(argv)`` after import).
"""
from __future__ import annotations

import contextlib
import io
import statistics
import subprocess
import sys
import time
from pathlib import Path

ARGS = ["--model", "internvl2-8b", "--hardware", "atlas-300v-pro"]
ROOT = Path(__file__).resolve().parents[2]
RUNS = 20


def _process_seconds() -> list[float]:
    times = []
    for _ in range(RUNS):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "engine.memory", *ARGS], cwd=ROOT, check=True, capture_output=True)
        times.append(time.perf_counter() - t)
    return times


def _bare_python_seconds() -> float:
    times = []
    for _ in range(5):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True, capture_output=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _answer_seconds() -> float:
    from engine.memory import main

    times = []
    for _ in range(RUNS):
        t = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            main(list(ARGS))
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def run() -> dict:
    proc = _process_seconds()
    median = statistics.median(proc)
    return {"name": "cli", "rows": [
        {"metric": "python -m engine.memory (start-up + answer), median", "value": median, "unit": "s",
         "target": "< 1 s", "met": median < 1.0},
        {"metric": "  slowest of the runs", "value": max(proc), "unit": "s", "target": "", "met": None},
        {"metric": "  bare `python -c pass` start-up, median", "value": _bare_python_seconds(), "unit": "s",
         "target": "", "met": None},
        {"metric": "answer alone (main(argv) in-process), median", "value": _answer_seconds(), "unit": "s",
         "target": "", "met": None},
    ], "runs": proc}
