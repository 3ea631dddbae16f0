"""InferScope's inference engine: a real, in-process LLM engine with a paged KV cache.

``from engine import LLM, SamplingParams`` loads torch on first use, not on import, so
``python -m engine.memory`` (the calculator) stays torch-free.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.core.config import EngineConfig, SamplingParams

if TYPE_CHECKING:
    from engine.serving.llm import LLM
    from engine.serving.engine import LLMEngine
    from engine.serving.outputs import RequestOutput
    from engine.studies.evaluation import perplexity

# The public names and the module each lives in (imported on first use: torch loads then).
_LAZY = {"LLM": "engine.serving.llm", "LLMEngine": "engine.serving.engine", "RequestOutput": "engine.serving.outputs",
         "CompletionOutput": "engine.serving.outputs", "get_shared_model": "engine.model.shared",
         "SharedModel": "engine.model.shared", "perplexity": "engine.studies.evaluation"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")


__all__ = ["LLM", "LLMEngine", "EngineConfig", "SamplingParams", "RequestOutput", "perplexity"]
