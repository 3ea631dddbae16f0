"""The Quantization page's studies: each scheme's effect on one weight matrix and on every
layer, SmoothQuant's record, the KV-cache dtypes' trade-off and the measured scheme trade-offs.

All are process-wide read-only records (shared by every session), computed from the fp32
weights of app/models.py.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import streamlit as st

from app import session
from app.current_run import live_run
from app.models import configure_torch, fp32_model, fp32_weights

if TYPE_CHECKING:
    from engine.studies.quant_inspect import ErrorGrid, WeightInspection
    from engine.studies.quant_tradeoff import KVTradeoffRow, TradeoffResult
    from engine.model.smoothing import Smoothing


def num_layers(name: str) -> int:
    """The model's layer count: from the session's live engine when it runs ``name`` (no load),
    else from the fp32 weights the Weights tab loads anyway (a replay)."""
    current = live_run()
    if current is not None and current.meta.model == name:
        return current.engine.facts.num_hidden_layers  # the driver's copy, parallel or not
    return int(fp32_model(name).config.num_hidden_layers)


@st.cache_resource(show_spinner=False, max_entries=32)
def weight_inspection(name: str, scheme: str, group_size: int, layer: int, matrix: str) -> WeightInspection:
    from engine.studies.quant_inspect import inspect_weight

    return inspect_weight(fp32_weights(name), scheme, layer, matrix, group_size=group_size)


@st.cache_resource(show_spinner=False, max_entries=8)
def error_grid(name: str, scheme: str, group_size: int) -> ErrorGrid:
    from engine.studies.quant_inspect import error_grid as grid

    return grid(fp32_weights(name), scheme, group_size)


@st.cache_resource(show_spinner=False, max_entries=4)
def smoothing(name: str, strength: float) -> Smoothing:
    """SmoothQuant's record for ``strength`` (calibration prompts on the fp32 model)."""
    from engine.model.shared import calibrated_smoothing

    configure_torch()
    return calibrated_smoothing(name, strength, dict(fp32_weights(name)))[1]


@st.cache_resource(show_spinner=False, max_entries=2)
def kv_tradeoff(name: str) -> tuple[KVTradeoffRow, ...]:
    from engine.studies.quant_tradeoff import kv_tradeoff as measure

    configure_torch()
    return measure(name)


@st.cache_resource(show_spinner=False)
def _tradeoff_store() -> dict[str, TradeoffResult]:
    """model -> the last TradeoffResult measured in this process (the page's "Measure" button)."""
    return {}


def tradeoff_result(name: str) -> TradeoffResult | None:
    return _tradeoff_store().get(name)


def measure_tradeoffs(name: str, progress: Callable[[str, float], None]) -> None:
    """Measure every scheme on this machine (the page's quick settings); kept for every session."""
    from engine.studies.quant_tradeoff import PAGE, measure_tradeoffs as measure

    configure_torch()
    try:
        _tradeoff_store()[name] = measure(name, PAGE, progress=progress)
    except (ValueError, RuntimeError, OSError) as e:
        session.error.set(f"measurement failed: {e}")
