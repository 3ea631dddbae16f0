"""A step's checkpoint: what ``LLMEngine.step`` restores when anything in the step raises.

Taken before the step: each live request's own checkpoint, and the state of every stateful
collaborator of the loop (intake, scheduler queues, drafter, batch queue, progress watch). The
generators are saved lazily, just before a request draws from one (sampling, a sampled draft,
verification), not for every live request up front. The KV cache keeps its own journal
(``KVCacheManager.begin / rollback / commit``).
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from engine.core.request import Request, RequestCheckpoint


class Stateful(Protocol):
    """A collaborator of the step loop whose state a failed step puts back."""

    def checkpoint(self) -> object: ...

    def restore(self, state: object) -> None: ...


@dataclass(frozen=True)
class StepCheckpoint:
    step_count: int
    requests: tuple[tuple[Request, RequestCheckpoint], ...]
    parts: tuple[tuple[Stateful, object], ...]
    # (generator, state) in the order saved; restored in reverse so the earliest state wins.
    generators: list[tuple[torch.Generator, torch.Tensor]] = field(default_factory=list)

    @staticmethod
    def take(step_count: int, live: Iterable[Request], parts: Iterable[Stateful]) -> StepCheckpoint:
        return StepCheckpoint(step_count, tuple((r, r.checkpoint()) for r in live),
                              tuple((part, part.checkpoint()) for part in parts))

    def save_generators(self, requests: Iterable[Request]) -> None:
        """Remember the generator states of requests about to draw from them."""
        self.generators.extend((r.generator, r.generator.get_state()) for r in requests if r.generator is not None)

    def restore(self) -> None:
        """Every request, generator and collaborator as it was when the checkpoint was taken."""
        for request, saved in self.requests:
            request.restore(saved)
        for generator, state in reversed(self.generators):
            generator.set_state(state)
        for part, saved_state in self.parts:
            part.restore(saved_state)
