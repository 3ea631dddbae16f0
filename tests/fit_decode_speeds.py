"""Re-run the decode-speed fit behind engine/sizing/backends.py.

For each backend: (eta, t0) minimising first the number of points beyond 20 %, then the sum of squared
relative errors, on the points of tests/data/decode_speeds.json, with the calculator's own roofline
bytes per step (memory-bound decode: step = roofline step / (eta x format factor) + communication + t0).
SGLang's points are all on one H100, which cannot separate eta from t0: it takes vLLM's eta.

    python tests/fit_decode_speeds.py [-v]     (-v: every point's error)
"""
from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.decode_speed_points import DecodePoint, load_points, plan_for  # noqa: E402

# backend -> (apply the formats' kernel factors, take eta from this backend instead of fitting it)
CHOICE: dict[str, tuple[bool, str | None]] = {
    "llama.cpp-metal": (False, None), "llama.cpp-cuda": (False, None), "llama.cpp-cpu": (False, None),
    "vllm-cuda": (True, None), "sglang-cuda": (True, "vllm-cuda"), "mindie": (True, None)}
Row = tuple[DecodePoint, float, float, float]  # point, memory time at eta 1, communication, format factor


def _rows() -> dict[str, list[Row]]:
    by: dict[str, list[Row]] = defaultdict(list)
    for p in load_points():
        plan = plan_for(p)
        roof = plan.speed(plan.batch, plan.context, efficiency=False)
        by[p.backend].append((p, roof.decode_step_s - roof.comm_s, roof.comm_s, plan.fmt.eta_factor))
    return by


def _errors(rows: list[Row], use_fmt: bool, eta: float, t0: float) -> list[float]:
    return [1 / (p.measured * (x / (eta * (f if use_fmt else 1.0)) + c + t0)) - 1 for p, x, c, f in rows]


def fit(rows: list[Row], use_fmt: bool, etas: list[float]) -> tuple[float, float, list[float]]:
    best: tuple[tuple[int, float], float, float, list[float]] | None = None
    for eta in etas:
        for t0 in (j * 5e-5 for j in range(1000)):
            errs = _errors(rows, use_fmt, eta, t0)
            key = (sum(abs(e) > 0.2 for e in errs), sum(e * e for e in errs))
            if best is None or key < best[0]:
                best = (key, eta, t0, errs)
    assert best is not None
    return best[1], best[2], best[3]


def main() -> None:
    by = _rows()
    fitted: dict[str, float] = {}
    for backend, (use_fmt, share) in CHOICE.items():
        etas = [fitted[share]] if share else [i / 1000 for i in range(400, 1001, 5)]
        eta, t0, errs = fit(by[backend], use_fmt, etas)
        fitted[backend] = eta
        fails = [p.id for (p, *_), e in zip(by[backend], errs) if abs(e) > 0.2]
        ok = [abs(e) for e in errs if abs(e) <= 0.2]
        print(f"{backend}: eta {eta:.3f}, t0 {t0 * 1e3:.2f} ms, format factors {use_fmt}; {len(ok)} of {len(errs)}"
              f" within 20 % (worst {max(ok, default=0):.3f}); beyond: {fails}")
        if "-v" in sys.argv:
            for (p, *_), e in zip(by[backend], errs):
                print(f"    {p.id:22} measured {p.measured:8.2f}  error {e:+.3f}")


if __name__ == "__main__":
    main()
