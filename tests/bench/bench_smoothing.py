"""SmoothQuant for w8a8 on SmolLM2 (engine/model/smoothing.py): perplexity with and without it.

Perplexity of the first 1,024 tokens of presets/texts/sqlite3_h_comments.txt, window 512 /
stride 256 (the engine's own forward, ``from engine import perplexity``), for fp32, w8a8 and
w8a8 with quantization_smoothing_strength in STRENGTHS; plus, from the calibration record, how
many (layer, linear, channel) activations exceed the LLM.int8() threshold (the columns w8a8
keeps in floating point) before and after the fold, and the qkv channel spread (max / median
absmax) of layers 12-24 before and after. Reports figures; no target (the issue sets none for
smoothing), so ``met`` is None. Then the same with the LLM.int8() decomposition off (every
activation column int8): SmoothQuant's own setting.

    PYTHONPATH=. python -m tests.bench smoothing
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from engine import LLM, perplexity
from engine.model.shared import get_shared_model

MODEL = "smollm2-135m"
TEXT = Path(__file__).resolve().parents[2] / "presets" / "texts" / "sqlite3_h_comments.txt"
MAX_TOKENS, WINDOW, STRIDE = 1024, 512, 256
STRENGTHS = (0.5, 0.8)
THRESHOLD = 6.0  # DEFAULT_OUTLIER_THRESHOLD
NO_DECOMPOSITION = 1e30  # an outlier threshold no activation reaches


def _ppl(**knobs: Any) -> float:
    llm = LLM(MODEL, num_blocks=64, **knobs)
    return perplexity(llm, TEXT.read_text("utf-8"), window=WINDOW, stride=STRIDE, max_tokens=MAX_TOKENS).ppl


def run() -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    fp32 = _ppl()
    rows.append({"metric": "ppl fp32", "value": fp32, "unit": "", "target": "", "met": None})
    w8a8 = _ppl(quantization="w8a8")
    rows.append({"metric": "ppl w8a8", "value": w8a8, "unit": "", "target": "", "met": None})
    rows.append({"metric": "ppl w8a8 vs fp32", "value": 100 * (w8a8 / fp32 - 1), "unit": "%", "target": "",
                 "met": None})
    for alpha in STRENGTHS:
        ppl = _ppl(quantization="w8a8", quantization_smoothing_strength=alpha)
        rows.append({"metric": f"ppl w8a8 + smoothing {alpha}", "value": ppl, "unit": "", "target": "", "met": None})
        rows.append({"metric": f"ppl w8a8 + smoothing {alpha} vs fp32", "value": 100 * (ppl / fp32 - 1),
                     "unit": "%", "target": "", "met": None})
        smoothing = get_shared_model(MODEL, quantization="w8a8", quantization_smoothing_strength=alpha).model.smoothing
        assert smoothing is not None
        over_b = sum(v > THRESHOLD for e in smoothing.linears for v in e.act_absmax_before)
        over_a = sum(v > THRESHOLD for e in smoothing.linears for v in e.act_absmax_after)
        rows.append({"metric": f"alpha {alpha}: channels > {THRESHOLD} before", "value": over_b, "unit": "channels",
                     "target": "", "met": None})
        rows.append({"metric": f"alpha {alpha}: channels > {THRESHOLD} after", "value": over_a, "unit": "channels",
                     "target": "", "met": None})
        spreads = [smoothing.of(layer, "qkv").act_spread() for layer in range(12, 25)]
        rows.append({"metric": f"alpha {alpha}: qkv act max/median L12-24 before", "unit": "x", "target": "",
                     "value": statistics.mean(b for b, _ in spreads), "met": None})
        rows.append({"metric": f"alpha {alpha}: qkv act max/median L12-24 after", "unit": "x", "target": "",
                     "value": statistics.mean(a for _, a in spreads), "met": None})
        wspreads = [smoothing.of(layer, "qkv").weight_spread() for layer in range(12, 25)]
        rows.append({"metric": f"alpha {alpha}: qkv weight max/median L12-24 after", "unit": "x", "target": "",
                     "value": statistics.mean(a for _, a in wspreads), "met": None})
    # SmoothQuant's own setting: every activation column int8 (no LLM.int8() float columns;
    # a threshold no |x| reaches turns the decomposition off).
    plain = _ppl(quantization="w8a8", quantization_outlier_threshold=NO_DECOMPOSITION)
    rows.append({"metric": "ppl w8a8 all-int8 (no outlier columns)", "value": plain, "unit": "", "target": "",
                 "met": None})
    for alpha in STRENGTHS:
        ppl = _ppl(quantization="w8a8", quantization_outlier_threshold=NO_DECOMPOSITION,
                   quantization_smoothing_strength=alpha)
        rows.append({"metric": f"ppl w8a8 all-int8 + smoothing {alpha}", "value": ppl, "unit": "", "target": "",
                     "met": None})
    return {"name": "smoothing", "model": MODEL, "text": TEXT.name, "max_tokens": MAX_TOKENS, "window": WINDOW,
            "stride": STRIDE, "rows": rows}
