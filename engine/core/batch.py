"""The "run the batch" stage of a step: schedule, then run the forward, one batch per step.

A runner picks how steps feed it (``Runner.batch_stage``): ``SingleBatch`` here (schedule, then
one forward whose logits come back in the same step) or the pipeline's batch queue
(engine/parallel/batch_queue.py: up to p batches in flight, the oldest retired each step).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple, Protocol

import torch

from engine.core.kv_cache import KVCacheManager
from engine.core.request import Request
from engine.core.scheduler import Scheduler, SchedulerOutput

#: A runner's forward: the scheduled batch -> logits [rows, V] (one row per sampling request,
#: 1 + k rows for one verifying k drafts).
Forward = Callable[[SchedulerOutput, dict[str, Request], KVCacheManager], torch.Tensor]


class RanBatch(NamedTuple):
    """What a step ran: the scheduler's output (retired, for a pipeline), its logits rows (None
    when nothing ran), and when scheduling ended (perf_counter seconds; the trace's split of
    schedule and forward time)."""

    output: SchedulerOutput
    logits: torch.Tensor | None
    scheduled_at: float


class BatchStage(Protocol):
    """Schedules and runs one step's batch; its state is part of a step's checkpoint."""

    def run(self, scheduler: Scheduler, requests: dict[str, Request], kv: KVCacheManager) -> RanBatch: ...

    def in_flight_ids(self) -> frozenset[str]: ...

    def commit(self) -> None: ...

    def checkpoint(self) -> object: ...

    def restore(self, state: object) -> None: ...


class SingleBatch:
    """Schedule, then one forward: the batch is done within the step (nothing in flight)."""

    def __init__(self, forward: Forward, on_commit: Callable[[], None] | None = None) -> None:
        self.forward = forward
        self.on_commit = on_commit

    def run(self, scheduler: Scheduler, requests: dict[str, Request], kv: KVCacheManager) -> RanBatch:
        output = scheduler.schedule()
        scheduled_at = time.perf_counter()
        return RanBatch(output, None if output.is_empty else self.forward(output, requests, kv), scheduled_at)

    def in_flight_ids(self) -> frozenset[str]:
        return frozenset()

    def commit(self) -> None:
        """After a step commits: the runner's own clean-up, if it has one."""
        if self.on_commit is not None:
            self.on_commit()

    def checkpoint(self) -> object:
        return None

    def restore(self, state: object) -> None:
        """Nothing in flight to restore."""


def logits_rows(output: SchedulerOutput) -> dict[str, int]:
    """The first logits row of each scheduled request that samples: one row per request,
    1 + k consecutive rows for one verifying k drafts."""
    row_of, row = {}, 0
    for s in output.scheduled:
        if not s.is_prefill:
            row_of[s.request_id] = row
            row += 1 + s.num_spec_tokens
    return row_of

