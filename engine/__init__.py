"""InferScope's inference engine: a real, in-process LLM engine with a paged KV cache.

``from engine import LLM, SamplingParams`` loads torch on first use, not on import, so
``python -m engine.memory`` (the calculator) stays torch-free.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.core.config import EngineConfig, SamplingParams

if TYPE_CHECKING:
    from engine.serving.engine import LLM, LLMEngine, RequestOutput
    from engine.studies.evaluation import perplexity

_LAZY = {"LLM", "LLMEngine", "RequestOutput", "CompletionOutput", "get_shared_model", "SharedModel"}


def __getattr__(name: str) -> Any:
    if name == "perplexity":
        from engine.studies.evaluation import perplexity

        return perplexity
    if name in _LAZY:
        from engine.serving import engine as _engine
        return getattr(_engine, name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")


__all__ = ["LLM", "LLMEngine", "EngineConfig", "SamplingParams", "RequestOutput", "perplexity"]
