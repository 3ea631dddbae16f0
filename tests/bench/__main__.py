"""`make bench`: run every benchmark module side by side, print a table, write JSON.

Each module in tests/bench named bench_*.py exposes ``run() -> dict`` returning
{"name": str, "rows": [{"metric": str, "value": float, "unit": str, "target": str, "met": bool|None}], ...}.
"""
from __future__ import annotations

import importlib
import json
import pkgutil
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def main(argv: list[str]) -> int:
    names = sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)]) if m.name.startswith("bench_"))
    if argv:
        names = [n for n in names if any(a in n for a in argv)]
    RESULTS.mkdir(exist_ok=True)
    missed = 0
    for name in names:
        module = importlib.import_module(f"tests.bench.{name}")
        print(f"== {name}", flush=True)
        t0 = time.perf_counter()
        result = module.run()
        result["wall_seconds"] = round(time.perf_counter() - t0, 1)
        (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2))
        for row in result["rows"]:
            met = {True: "met", False: "MISSED", None: ""}[row.get("met")]
            missed += row.get("met") is False
            print(f"  {row['metric']:<52} {row['value']:>12.3f} {row.get('unit', ''):<10} "
                  f"{row.get('target', ''):<14} {met}")
        print(f"  -> {RESULTS / (name + '.json')}")
    print(f"{missed} target(s) missed" if missed else "all targets met")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
