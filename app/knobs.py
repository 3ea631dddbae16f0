"""The controls as engine knobs: what a widget holds vs what the engine takes; ``app.scenarios``
turns them into the ``RunSpec`` (app/run_spec.py) the session's run is built from.

Most knobs are one widget each (``session.knob(name)``); three come from several widgets:
speculative_config (``SpecChoice``: four widgets), pipeline_layer_split (two: ``layer_split``)
and the int4 group size (counts only with int4).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app import session
from app.models import model_dims
from engine.core.config import DEFAULT_GROUP_SIZE, EngineConfig
from engine.parallel.layout import front_heavy_split, parse_layer_split
from engine.replay.scenario import Scenario

KNOBS = ("block_size", "num_blocks", "max_num_batched_tokens", "max_num_seqs", "enable_chunked_prefill", "policy",
         "enable_prefix_caching", "quantization", "quantization_group_size", "kv_cache_dtype",
         "pipeline_parallel_size", "tensor_parallel_size", "pipeline_schedule", "num_microbatches")
# pipeline_layer_split comes from two widgets (split mode, split text): see layer_split().
SPLIT_MODES = ("even", "front-heavy", "custom")
# Knobs whose engine value None (off / the default) is a word in the widget, since a select
# widget's None means "nothing chosen": quantization None = "none", kv_cache_dtype None = "auto"
# (vLLM's word: the weights' dtype).
NONE_WORDS = {"quantization": "none", "kv_cache_dtype": "auto"}
SPEC_METHOD_NONE = "none"


def scenario_knobs(sc: Scenario) -> dict[str, Any]:
    """The scenario's knobs with EngineConfig defaults for the ones it leaves out."""
    defaults = EngineConfig().to_knobs()
    return {k: sc.knobs.get(k, defaults[k]) for k in KNOBS}


def widget_value(knob: str, value: Any) -> Any:
    """An engine knob's value as its widget holds it (None is a word, see NONE_WORDS)."""
    return NONE_WORDS[knob] if value is None and knob in NONE_WORDS else value


def engine_value(knob: str, value: Any) -> Any:
    """A widget's value as the engine knob takes it (the inverse of ``widget_value``)."""
    return None if knob in NONE_WORDS and value == NONE_WORDS[knob] else value


@dataclass(frozen=True)
class SpecChoice:
    """The four speculation widgets: drafter, k, early-exit layers, draft model precision."""

    method: str = SPEC_METHOD_NONE
    k: int = 4
    layers: int = 8
    draft_quant: str = "int4"  # "none": fp32

    @classmethod
    def of(cls, config: Any) -> SpecChoice:
        """The widgets' values for a scenario's ``speculative_config`` (a vLLM-shaped dict or None;
        a bad one is left to the engine, whose message names the key)."""
        if not isinstance(config, Mapping):
            return cls()
        d = cls()
        return cls(config.get("method", SPEC_METHOD_NONE), config.get("num_speculative_tokens", d.k),
                   config.get("num_layers", d.layers), config.get("quantization") or "none")

    @classmethod
    def current(cls) -> SpecChoice:
        return cls(session.spec_method.get(), session.spec_k.get(), session.spec_layers.get(),
                   session.spec_draft_quant.get())

    def put(self, only_unset: bool = False) -> None:
        """Into the widgets (``only_unset``: a new session's defaults, kept where already set)."""
        if only_unset:
            session.spec_method.setdefault(self.method)
            session.spec_k.setdefault(self.k)
            session.spec_layers.setdefault(self.layers)
            session.spec_draft_quant.setdefault(self.draft_quant)
            return
        session.spec_method.set(self.method)
        session.spec_k.set(self.k)
        session.spec_layers.set(self.layers)
        session.spec_draft_quant.set(self.draft_quant)

    def config(self, model: str) -> dict[str, Any] | None:
        """vLLM's ``speculative_config`` dict (None when off). draft_model drafts with the run's own
        model at the chosen quantization (a self-draft: same vocabulary)."""
        if self.method == SPEC_METHOD_NONE:
            return None
        config: dict[str, Any] = {"method": self.method, "num_speculative_tokens": self.k}
        if self.method == "early_exit":
            config["num_layers"] = self.layers
        elif self.method == "draft_model":
            config.update(model=model, quantization=None if self.draft_quant == "none" else self.draft_quant)
        return config


def requested_knobs(model: str) -> dict[str, Any]:
    """The controls as flat engine knobs (``model``: the run's, for the draft model and the
    layer split). The int4 group size counts only with int4: any other scheme gets the default,
    so its disabled widget neither rebuilds the run nor loads another copy."""
    knobs = {k: engine_value(k, session.knob(k).get()) for k in KNOBS}
    if knobs["quantization"] != "int4":
        knobs["quantization_group_size"] = DEFAULT_GROUP_SIZE
    knobs["speculative_config"] = SpecChoice.current().config(model)
    if knobs["pipeline_schedule"] == "batch_queue":  # whole batches in flight: m is GPipe's only
        knobs["num_microbatches"] = 1
    knobs["pipeline_layer_split"] = layer_split(model, knobs["pipeline_parallel_size"])
    return knobs


def layer_split(model: str, p: Any) -> tuple[int, ...] | str | None:
    """pipeline_layer_split from the split widgets: None for "even" (or one stage), the 2:1
    front-heavy split for the model's layers, or the custom text's counts (the text itself when
    it does not parse, so the engine's ValueError names pipeline_layer_split)."""
    mode = session.split_mode.get()
    if not isinstance(p, int) or p < 2 or mode == "even":
        return None
    if mode == "front-heavy":
        layers = model_dims(model).num_layers
        return front_heavy_split(layers, p) if p <= layers else None  # too many stages: the engine says so
    text = str(session.split_text.get())
    try:
        return parse_layer_split(text)
    except ValueError:
        return text


def put_scenario_knobs(sc: Scenario, only_unset: bool = False) -> None:
    """The scenario's knobs into their widgets (``only_unset``: a new session's defaults)."""
    for knob, value in scenario_knobs(sc).items():
        slot = session.knob(knob)
        if only_unset:
            slot.setdefault(widget_value(knob, value))
        else:
            slot.set(widget_value(knob, value))
    SpecChoice.of(sc.knobs.get("speculative_config")).put(only_unset)
    if only_unset:
        session.split_mode.setdefault("even")
        session.split_text.setdefault("")
        return
    split = sc.knobs.get("pipeline_layer_split")
    session.split_mode.set("custom" if split else "even")
    session.split_text.set(", ".join(map(str, split)) if split else "")
