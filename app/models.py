"""The models the app runs: the one process-wide cache of loaded weights.

* Engine weights (``shared_model``): one read-only copy per (model, precision) for the whole
  process, shared by every browser session, its comparisons and studies, and by the engine's
  own loads (a draft model, the quantization measurements, the bundled recordings). The cache
  is the engine's (``engine.engine.get_shared_model``); the app keeps no second layer over it,
  so no copy the engine dropped stays alive here and gets loaded again beside it.
* The fp32 weights as read from disk (``fp32_model``): what the Quantization page inspects and
  calibrates SmoothQuant on (the engine keeps only its fused layout). At most two models.
* Model shapes (``model_dims``): from the config alone, no weights loaded.
"""
from __future__ import annotations

import gc
import os
import threading
import weakref
from typing import TYPE_CHECKING, Any

import streamlit as st

from engine.core.config import EngineConfig
from engine.parallel.layout import ModelDims

if TYPE_CHECKING:
    import torch

    from engine.model.shared import SharedModel
    from engine.model.llama import LlamaModel
    from engine.model.loader import LoadedModel

MODELS = ("smollm2-135m", "tiny-random")

_torch_once = threading.Lock()
_torch_done = False
_frozen: weakref.WeakSet[LlamaModel] = weakref.WeakSet()  # models already moved out of the GC's reach


def configure_torch() -> None:
    """Cap torch's intra-op threads once per process (INFERSCOPE_TORCH_THREADS, default 1).

    On small shared machines one thread per session is fastest: the tiny model's ops are too
    small to split, and two sessions stepping at once would fight over the same cores.
    """
    global _torch_done
    with _torch_once:
        if _torch_done:
            return
        import torch

        torch.set_num_threads(max(1, int(os.environ.get("INFERSCOPE_TORCH_THREADS", "1"))))
        _torch_done = True


def check_model(name: str) -> None:
    if name not in MODELS:
        raise ValueError(f"model: choose one of {MODELS}, got {name!r}")


def shared_model(name: str, config: EngineConfig | None = None) -> SharedModel:
    """Weights + tokenizer of ``name`` at the precision ``config`` asks for (fp32 without one),
    from the process-wide cache, with a progress message (the first smollm2 load converts the
    GGUF; the first quantization of a model takes seconds, then its weights come from the disk
    cache). A quantization knob the model cannot take (an int4 group size that does not divide
    one of its dimensions) is the engine's ValueError naming the knob."""
    from engine.model.shared import get_shared_model, shared_model_for

    check_model(name)
    configure_torch()
    if config is None or (config.quantization is None and config.sparsity is None):
        with st.spinner(f"Loading {name} weights (first load converts the bundled model, about a minute)…"):
            model = get_shared_model(name)
    else:
        c = config
        with st.spinner(f"Loading {name} weights as {c.quantization or 'fp32'} (the first quantization takes "
                        f"seconds; it is then cached on disk)…"):
            model = shared_model_for(name, c)
    if model.model not in _frozen:
        # Weights, modules and imports live as long as the process: move them out of the cyclic
        # GC's reach so its full collections (which would pause a step) stay short. Once per
        # load: a freeze also keeps whatever else is alive then, so not on every rerun.
        gc.freeze()
        _frozen.add(model.model)
    return model


@st.cache_resource(show_spinner=False, max_entries=2)
def fp32_model(name: str) -> LoadedModel:
    """The model as loaded from disk: fp32 weights by Hugging Face name (what every scheme
    quantizes) and its config."""
    from engine.model.loader import load_model as load_weights

    check_model(name)
    configure_torch()
    return load_weights(name, progress=lambda *_: None)


def fp32_weights(name: str) -> dict[str, torch.Tensor]:
    return fp32_model(name).weights


@st.cache_data(show_spinner=False)
def model_hf_config(name: str) -> dict[str, Any]:
    """The model's Hugging Face config.json as a dict (no weights loaded)."""
    if name == "tiny-random":
        from engine.model.loader import TINY_RANDOM_CONFIG

        return dict(TINY_RANDOM_CONFIG)
    from engine.sizing import model_preset_config

    return dict(model_preset_config(name))


def model_dims(name: str) -> ModelDims:
    return ModelDims.from_hf(model_hf_config(name))
