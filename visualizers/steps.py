"""The step table: one row per engine step (what it scheduled, the pool after it, its timing).

Used under the Generate page's output and exported as CSV from every live page.
"""
from __future__ import annotations

from typing import Sequence

import pandas as pd

from engine.core.trace import StepTrace
from visualizers.theme import request_label

STEP_COLUMNS = ["step", "requests", "prefill tokens", "decode tokens", "batched tokens", "token budget",
                "blocks in use", "free blocks", "cached blocks", "waiting", "running", "preempted", "finished", "sampled",
                "schedule ms", "forward ms", "sample ms", "total ms"]


def step_number(trace: StepTrace) -> int:
    """How every view names a step: steps count from 1. The n-th step of a run (its trace has
    ``StepTrace.step == n - 1``, the engine's 0-based index) is "step n", so the latest step's
    label equals the steps done (``RunView.step``, ``Snapshot.step``, a figure's ``meta.step``):
    after 10 steps the charts end at step 10. A request's ``arrival_step`` (also 0-based: it
    arrives in the step with that index) is shown as ``arrival_step + 1`` by the same rule."""
    return trace.step + 1


def token_piece(text: str | None) -> str:
    """A tokenizer piece made readable: byte-level markers for space/newline become visible glyphs."""
    if text is None:
        return "�"
    return text.replace("Ġ", "␣").replace("Ċ", "⏎").replace("\n", "⏎")


def step_table(traces: Sequence[StepTrace]) -> pd.DataFrame:
    rows = []
    for t in traces:
        rows.append({
            "step": step_number(t),
            "requests": ", ".join(request_label(c.request_id) for c in t.scheduled),
            "prefill tokens": t.num_prefill_tokens,
            "decode tokens": t.num_decode_tokens,
            "batched tokens": t.num_batched_tokens,
            "token budget": t.token_budget,
            "blocks in use": t.num_used_blocks,
            "free blocks": t.num_free_blocks,
            "cached blocks": t.num_cached_blocks,
            "waiting": t.num_waiting,
            "running": t.num_running,
            "preempted": ", ".join(request_label(r) for r in t.preempted),
            "finished": ", ".join(request_label(r) for r in t.finished),
            "sampled": " ".join(token_piece(s.text) for s in t.sampled),
            "schedule ms": round(t.schedule_ms, 2),
            "forward ms": round(t.forward_ms, 2),
            "sample ms": round(t.sample_ms, 2),
            "total ms": round(t.total_ms, 2),
        })
    return pd.DataFrame(rows, columns=STEP_COLUMNS)


def step_table_csv(traces: Sequence[StepTrace]) -> str:
    return str(step_table(traces).to_csv(index=False))
