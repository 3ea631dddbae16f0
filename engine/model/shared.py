"""The process-wide model cache: one copy of each model's weights per (dtype, quantization with its
smoothing strength, sparsity), shared read-only by every engine and worker in the process.

    fp32 weights -> SmoothQuant's fold (if a strength is set) -> 2:4 pruning (if set, by the
    smoothed magnitudes) -> quantization (if set) of the result
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

from engine.core.config import EngineConfig, check_smoothing
from engine.model.activations import ActivationStats, model_activation_stats
from engine.model.llama import LlamaModel
from engine.model.loader import check_model_name, load_model
from engine.core.config import QuantConfig
from engine.model.quantization import DEFAULT_GROUP_SIZE, DEFAULT_OUTLIER_THRESHOLD, check_quant_knobs
from engine.model.runner import DTYPES
from engine.model.smoothing import Smoothing, smooth_weights
from engine.model.sparsity import check_sparsity, sparsified_weights

__all__ = ["SharedModel", "calibrated_smoothing", "calibration_stats", "check_device", "clear_shared_models",
           "get_shared_model", "shared_model_for"]


@dataclass(frozen=True)
class SharedModel:
    """Weights and tokenizer, shared read-only by every engine in the process."""

    name: str
    model: LlamaModel
    tokenizer: Any
    sparsity: str | None = None  # "2:4": the projections were pruned (engine/model/sparsity.py)


def get_shared_model(model: str, dtype: str = "auto", quantization: str | None = None,
                     quantization_group_size: int = DEFAULT_GROUP_SIZE,
                     quantization_outlier_threshold: float = DEFAULT_OUTLIER_THRESHOLD,
                     quantization_smoothing_strength: float | None = None,
                     sparsity: str | None = None, device: str = "cpu") -> SharedModel:
    """The process-wide weights for ``model`` (one copy per model, dtype, quantization with its
    smoothing strength, sparsity and device); a bad name, dtype or quantization knob is a ValueError,
    checked before the cache (an unhashable argument must not surface as lru_cache's
    TypeError). dtype "auto" is float32, or bfloat16 when quantized (see EngineConfig)."""
    model = check_model_name(model)
    check_quant_knobs(quantization, quantization_group_size, quantization_outlier_threshold)
    check_smoothing(quantization, quantization_smoothing_strength)
    check_sparsity(sparsity)
    if dtype == "auto":
        dtype = "float32" if quantization is None else "bfloat16"
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise ValueError(f"dtype: must be 'auto' or one of {tuple(DTYPES)}, got {str(dtype)[:40]!r}")
    strength = None if quantization_smoothing_strength is None else float(quantization_smoothing_strength)
    quant = None if quantization is None else QuantConfig(quantization, quantization_group_size,
                                                          float(quantization_outlier_threshold), strength)
    return _shared_model(model, dtype, quant, sparsity, device)  # every argument given: one cache key per model


def clear_shared_models() -> None:
    """Drop every cached model (a worker keeps only its shard once it has cut it)."""
    _shared_model.cache_clear()


def check_device(device: str) -> None:
    """A ValueError naming device when ``device`` is "cuda" and torch sees no CUDA GPU."""
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: 'cuda' needs a CUDA GPU and a CUDA build of torch; this torch "
                         f"({torch.__version__}) sees none. Use device='cpu'")


@lru_cache(maxsize=4)
def _shared_model(model: str, dtype: str, quantization: QuantConfig | None = None,
                  sparsity: str | None = None, device: str = "cpu") -> SharedModel:
    """fp32 weights -> SmoothQuant's fold (if a strength is set) -> 2:4 pruning (if set, by the
    smoothed magnitudes) -> quantization (if set) of the result, on ``device`` (unquantized only:
    EngineConfig refuses a quantization on CUDA)."""
    check_device(device)
    loaded = load_model(model)
    weights, smoothing = loaded.weights, None
    if quantization is not None and quantization.smoothing_strength is not None:
        weights, smoothing = calibrated_smoothing(model, quantization.smoothing_strength, loaded.weights)
    weights = sparsified_weights(weights, sparsity)  # after smoothing: pruned by the smoothed magnitudes
    if device != "cpu":
        weights = {k: v.to(device) for k, v in weights.items()}
    return SharedModel(loaded.name, LlamaModel(loaded.config, weights, DTYPES[dtype], quantization, smoothing),
                       loaded.tokenizer, sparsity)


def calibrated_smoothing(model: str, strength: float, weights: dict[str, torch.Tensor] | None = None,
                         ) -> tuple[dict[str, torch.Tensor], Smoothing]:
    """SmoothQuant with ``strength`` on ``model``: activation absmax over the shipped
    calibration prompts (presets/calibration.json) from the fp32 model, then the fold
    (engine/model/smoothing.py) of ``weights`` (the model's fp32 weights; read from disk when the
    caller has not loaded them already). Returns the smoothed fp32 weights and the record.
    Deterministic."""
    return smooth_weights(load_model(model).weights if weights is None else weights, calibration_stats(model),
                          strength)


@lru_cache(maxsize=4)
def calibration_stats(model: str) -> ActivationStats:
    """Activation statistics of the shipped calibration prompts on the fp32 model: the same for
    every smoothing strength, so computed once per model and process. The private pool is a
    default engine's (block size, fp32 KV), as an fp32 ``LLMEngine`` would run them."""
    shared = _shared_model(model, "float32", None, None, "cpu")
    return model_activation_stats(shared.model, shared.tokenizer, shared.model.config.max_position_embeddings,
                                  EngineConfig().cache_config.block_size, "float32")


def shared_model_for(model: str | SharedModel, c: EngineConfig) -> SharedModel:
    """The weights an engine with config ``c`` runs: loaded (and cached) by name, or a
    SharedModel passed in, which must have been loaded with ``c``'s sparsity and quantization."""
    if not isinstance(model, (str, SharedModel)):
        raise ValueError(f"model: must be a model name (a string), got {type(model).__name__}")
    shared = model if isinstance(model, SharedModel) else _shared_model(check_model_name(model), c.dtype,
                                                                           c.quant_config, c.sparsity, c.device)
    if shared.model.device.type != c.device:
        raise ValueError(f"device: the SharedModel passed lives on {shared.model.device.type!r}, not "
                         f"device={c.device!r}; pass the model name")
    if shared.sparsity != c.sparsity:
        raise ValueError(f"sparsity: the SharedModel passed was loaded with sparsity={shared.sparsity!r}, "
                         f"not {c.sparsity!r}; pass the model name, or get_shared_model(..., sparsity=...)")
    quant = shared.model.quantization
    if c.quant_config is not None and quant != c.quant_config:
        raise ValueError(f"quantization: the SharedModel passed was loaded with {quant}, not "
                         f"quantization={c.quantization!r}; pass the model name, or get_shared_model(..., "
                         f"quantization=...)")
    return shared
