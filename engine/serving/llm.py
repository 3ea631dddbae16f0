"""Offline batch generation, as vLLM's ``LLM``: ``LLM(model).generate(prompts, params)``."""
from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence, Set
from typing import Any

from engine.core.config import SamplingParams, check_priority
from engine.serving.engine import LLMEngine
from engine.serving.limits import MAX_GENERATE_PROMPTS
from engine.serving.outputs import RequestOutput


class LLM:
    """Offline batch generation, as vLLM's ``LLM``: ``LLM(model).generate(prompts, params)``.
    ``with LLM(..., pipeline_parallel_size=2) as llm:`` stops its worker processes on exit."""

    def __init__(self, model: str = "smollm2-135m", **knobs: Any) -> None:
        self.llm_engine = LLMEngine(model, **knobs)

    def shutdown(self) -> None:
        """Stop the worker processes, if any (idempotent; later steps raise WorkerError)."""
        self.llm_engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def get_tokenizer(self) -> Any:
        return self.llm_engine.tokenizer

    def generate(self, prompts: str | Sequence[int] | Iterable[str | Sequence[int]],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 priority: Sequence[int] | None = None) -> list[RequestOutput]:
        """Outputs in the order of ``prompts``; ``[]`` for no prompts.

        Rules: every prompt is validated before any is added (a bad one adds nothing); the
        engine is stepped only until the requests added here are finished (requests added
        earlier through ``llm_engine`` are stepped along but never waited for); a step that
        makes no progress raises RuntimeError instead of spinning; if a step raises, the
        requests added here are aborted and the exception propagates. ``priority``: one per
        prompt (vLLM's list; lower is served earlier), used by ``scheduling_policy="priority"``.
        """
        prompt_list = _prompt_list(prompts)
        params = _params_list(sampling_params, len(prompt_list))
        priorities = _priority_list(priority, len(prompt_list))
        engine = self.llm_engine
        prepared = [engine.intake.prepare(p, sp, None, engine.step_count) for p, sp in zip(prompt_list, params)]
        ids = [engine.enqueue(request, priority=pr) for request, pr in zip(prepared, priorities)]
        try:
            self._run_until_finished(ids)
        except BaseException:
            for rid in ids:
                engine.abort_request(rid)
            raise
        return [engine.get_output(i) for i in ids]

    def _run_until_finished(self, ids: list[str]) -> None:
        engine = self.llm_engine
        remaining = [engine.requests[i] for i in ids]
        while remaining:
            trace = engine.step()
            reason = engine.no_progress_reason(trace)
            if reason is not None:
                raise RuntimeError(f"generate: no progress at step {trace.step} ({reason}; {len(remaining)} "
                                   f"unfinished requests); the engine is stuck")
            remaining = [r for r in remaining if not engine.is_finished(r)]


def _prompt_list(prompts: object) -> list[Any]:
    """Rule: one prompt (a string, or a list of token ids) or an ordered collection of prompts
    (list, tuple, or an iterator such as a generator, read in order). Sets and mappings are
    refused: their iteration order would decide which output belongs to which prompt."""
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, (Set, Mapping)):
        raise ValueError(f"prompts: a {type(prompts).__name__} has no order, and the order of the prompts is "
                         f"the order of the outputs; pass a list")
    if isinstance(prompts, (bytes, bytearray)) or not isinstance(prompts, (Sequence, Iterator)):
        raise ValueError(f"prompts: must be a string, a list of token ids, or a list of those, got "
                         f"{type(prompts).__name__}")
    items = list(itertools.islice(prompts, MAX_GENERATE_PROMPTS + 1))
    if len(items) > MAX_GENERATE_PROMPTS:
        raise ValueError(f"prompts: at most {MAX_GENERATE_PROMPTS:,} prompts in one generate call")
    if items and isinstance(items[0], int) and not isinstance(items[0], bool):
        return [items]  # one prompt given as token ids
    return items


def _params_list(sampling_params: object, n: int) -> list[SamplingParams | None]:
    if isinstance(sampling_params, SamplingParams) or sampling_params is None:
        return [sampling_params] * n
    if not isinstance(sampling_params, (list, tuple)):
        raise ValueError(f"sampling_params: a SamplingParams or a list of them, got {type(sampling_params).__name__}")
    if len(sampling_params) != n:
        raise ValueError("sampling_params: one per prompt, or a single one for all")
    return list(sampling_params)


def _priority_list(priority: object, n: int) -> list[int]:
    """None (all 0) or one int per prompt, as vLLM's ``generate(priority=[...])``."""
    if priority is None:
        return [0] * n
    if not isinstance(priority, (list, tuple)):
        raise ValueError(f"priority: a list of integers, one per prompt, got {type(priority).__name__}")
    if len(priority) != n:
        raise ValueError(f"priority: one per prompt ({n}), got {len(priority)}")
    return [check_priority(p) for p in priority]
