"""The calculator's answers the pages draw (the Will-it-fit page, the Pipeline page's
Calculator tab): pure functions of their inputs, cached process-wide by value (``st.cache_data``).
"""
from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from engine import memory as calc

CUSTOM = "custom"  # the model / device picked as "custom": a pasted config.json, typed-in figures


@dataclass(frozen=True)
class CustomDevice:
    """The 'custom' device's fields (hashable: a cache key of ``curve``)."""

    memory_gib: float
    bandwidth_gb_s: float
    fp16_tflops: float
    int8_tops: float | None
    bf16: bool
    framework: str

    def hardware(self) -> calc.Hardware:
        return calc.custom_hardware(self.memory_gib, self.bandwidth_gb_s, self.fp16_tflops, int8_tops=self.int8_tops,
                                    bf16=self.bf16, framework=self.framework)


@st.cache_data(show_spinner=False)
def model_label(key: str) -> str:
    cfg = calc.model_preset_config(key)
    spec = calc.get_model(key)
    return f"{cfg.get('_source', {}).get('display_name', key)} ({spec.params_total / 1e9:.2f} B)"


@st.cache_data(show_spinner=False)
def hardware_label(key: str) -> str:
    return calc.preset_info(key).name


def model(model_key: str, config_text: str) -> calc.ModelSpec:
    """A preset by key, or the pasted config.json for "custom"; SizingError says what is wrong."""
    return calc.get_model(model_key) if model_key != CUSTOM else calc.parse_config_text(config_text)


@st.cache_data(show_spinner=False, max_entries=64)
def compare(model_key: str, config_text: str, workload: calc.Workload,
            settings: calc.Settings) -> list[calc.HardwareRow]:
    """The same model and settings on every hardware preset."""
    return calc.compare_hardware(model(model_key, config_text), calc.hardware_presets(), workload, settings)


@st.cache_data(show_spinner=False, max_entries=64)
def curve(model_key: str, config_text: str, hw_key: str, custom_hw: CustomDevice | None, workload: calc.Workload,
          settings: calc.Settings) -> list[calc.CurvePoint]:
    """Longest context against concurrent sequences on one device."""
    hw = custom_hw.hardware() if hw_key == CUSTOM and custom_hw is not None else calc.get_hardware(hw_key)
    return calc.concurrency_curve(model(model_key, config_text), hw, workload, settings)


@st.cache_data(show_spinner=False, max_entries=64)
def layout_estimate(model_key: str, hardware: str, p: int, t: int) -> tuple[calc.Estimate | None, str]:
    """The estimate for a p x t layout of a preset model, or (None, why the calculator refuses it)."""
    try:
        return calc.estimate(model_key, hardware, settings=calc.Settings(tp=t, pp=p)), ""
    except calc.SizingError as e:
        return None, str(e)
