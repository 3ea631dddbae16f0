"""vLLM's batch queue for pipeline parallelism (``step_with_batch_queue``): each step fills the
queue, then retires the oldest batch.

    in flight:  [B]         schedule A' over the requests not in B, send it -> [B, A']
                wait for B's logits, retire B (this step samples, appends, traces B)

Rule: while fewer than p batches are in flight, schedule one more over the requests no
in-flight batch holds (it may neither schedule nor preempt those), each with at most
ceil(requests / p) requests so the work spreads over the batches, and send it: stage 0 starts
it as soon as it is done with the previous one, so the pipeline stays full across steps. Then
take the oldest batch's results. Invariant: a request is in at most one in-flight batch; its KV
and ``num_computed_tokens`` run ahead of its tokens only while it is in flight. Progress (as the
single-process scheduler): a request is only preempted for an older one, and one whose newer
requests are all in flight waits for them (Scheduler.schedule); once a batch of the step
preempted, no later batch of the step admits (a victim is not re-admitted in the step that
preempted it).
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import torch

from engine.core.batch import RanBatch, logits_rows
from engine.core.kv_cache import KVCacheManager
from engine.core.request import Request
from engine.core.scheduler import Scheduler, SchedulerOutput
from engine.core.trace import PipelineUnit


@dataclass(frozen=True)
class InFlightBatch:
    """A batch sent to the workers and not yet taken back (its step's ``SchedulerOutput``)."""

    batch_id: int
    output: SchedulerOutput
    units: tuple[PipelineUnit, ...]
    t0_ns: int

    @property
    def request_ids(self) -> frozenset[str]:
        return frozenset(s.request_id for s in self.output.scheduled)


class PipelineRunner(Protocol):
    """What the batch queue needs of a runner (engine/parallel/executor.py ParallelRunner)."""

    @property
    def max_batches(self) -> int: ...

    def submit(self, output: SchedulerOutput, requests: dict[str, Request], kv: KVCacheManager,
               num_microbatches: int = 1) -> InFlightBatch: ...

    def collect(self, batch: InFlightBatch) -> torch.Tensor: ...

    def retain(self, in_flight: Iterable[InFlightBatch]) -> None: ...


class BatchQueue:
    """Up to ``runner.max_batches`` batches in flight across steps (a BatchStage)."""

    def __init__(self, runner: PipelineRunner) -> None:
        self.runner = runner
        self.in_flight: deque[InFlightBatch] = deque()

    def run(self, scheduler: Scheduler, requests: dict[str, Request], kv: KVCacheManager) -> RanBatch:
        filled = self.fill(scheduler, requests, kv)
        scheduled_at = time.perf_counter()
        output, logits = self.retire_oldest(filled, requests)
        return RanBatch(output, logits, scheduled_at)

    def fill(self, scheduler: Scheduler, requests: dict[str, Request], kv: KVCacheManager) -> list[SchedulerOutput]:
        """Schedule and send batches until p are in flight (module doc) -> the outputs scheduled
        (the last one empty when the requests ran out before the queue was full)."""
        p = self.runner.max_batches
        filled: list[SchedulerOutput] = []
        while len(self.in_flight) < p:
            cap = max(1, -(-(len(scheduler.running) + len(scheduler.waiting)) // p))
            output = scheduler.schedule(exclude=self.in_flight_ids(), max_requests=cap,
                                        may_admit=not any(o.preempted for o in filled))
            filled.append(output)
            if output.is_empty:
                break
            self.in_flight.append(self.runner.submit(output, requests, kv))
        return filled

    def retire_oldest(self, filled: list[SchedulerOutput], requests: dict[str, Request]
                      ) -> tuple[SchedulerOutput, torch.Tensor | None]:
        """Wait for the oldest in-flight batch -> (its output, with this step's preemptions,
        lookups and copies from ``filled``; its logits rows), or an empty output and None when
        nothing is in flight."""
        preempted = tuple(r for o in filled for r in o.preempted)
        lookups = tuple(x for o in filled for x in o.lookups)
        copies = tuple(c for o in filled for c in o.copies)
        if not self.in_flight:
            return SchedulerOutput((), preempted, 0, lookups, copies), None
        batch = self.in_flight.popleft()
        logits = self.runner.collect(batch)
        # Its requests, less any aborted while it was in flight (and their logits rows).
        scheduled = tuple(s for s in batch.output.scheduled if not requests[s.request_id].is_finished)
        row_of = logits_rows(batch.output)
        rows = [r for s in scheduled if not s.is_prefill
                for r in range(row_of[s.request_id], row_of[s.request_id] + 1 + s.num_spec_tokens)]
        output = SchedulerOutput(scheduled, preempted, sum(s.num_new_tokens for s in scheduled), lookups, copies)
        return output, logits[rows]

    def in_flight_ids(self) -> frozenset[str]:
        """The requests of the batches in flight in the pipeline."""
        return frozenset().union(*(b.request_ids for b in self.in_flight))

    def commit(self) -> None:
        """After a step commits: the workers keep only the results of batches still in flight
        (those of retired and rolled-back batches go)."""
        self.runner.retain(self.in_flight)

    def checkpoint(self) -> object:
        return tuple(self.in_flight)

    def restore(self, state: object) -> None:
        assert isinstance(state, tuple)
        self.in_flight = deque(state)
