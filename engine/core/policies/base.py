"""The interface every scheduling policy implements (the registry is in ``__init__``).

The scheduler (engine/core/scheduler.py) owns the mechanics: budget, chunking, block allocation,
preemption by recompute, the batch-queue exclusions. A policy only answers ordering questions:

    admission_order   in which order waiting requests are tried for admission (the scheduler
                      stops at the first that does not fit: no overtaking within that order)
    running_order     in which order running requests get the step's budget; it is also the
                      rank the preemption victim is chosen by, so a victim is always served
                      after its preemptor
    victim            whom a running request that needs a block preempts
    admission_victim  whom the best waiting request may preempt when it cannot be admitted
                      (none, except under "priority")

Rule for every policy: the first request in ``running_order`` is never preempted while another
non-excluded request runs, so it always progresses (the scheduler's no-livelock argument). A
policy that keeps state returns it from ``checkpoint`` so a failed step puts it back
(``Scheduler.checkpoint``); the built-in ones derive everything from the requests.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

from engine.core.kv_cache import KVCacheManager
from engine.core.request import Request


class SchedulingPolicy:
    """FCFS answers; the other policies override some of them."""

    name: ClassVar[str] = ""
    preempts_for_admission: ClassVar[bool] = False  # True: the scheduler asks admission_victim

    def admission_order(self, waiting: Sequence[Request], kv: KVCacheManager) -> list[Request]:
        """Waiting requests in the order they are tried for admission."""
        return list(waiting)

    def running_order(self, running: Sequence[Request]) -> list[Request]:
        """Running requests from first served (never preempted while others run) to last."""
        return list(running)

    def victim(self, request: Request, running: Sequence[Request], exclude: frozenset[str]) -> Request | None:
        """The running request ``request`` preempts to get a block: the last one in
        ``running_order`` ranked after it and not in ``exclude`` (in flight); ``request`` itself
        when it is last; None when every request ranked after it is in flight (it waits)."""
        order = self.running_order(running)
        at = order.index(request)
        for j in range(len(order) - 1, at, -1):
            if order[j].request_id not in exclude:
                return order[j]
        return request if at == len(order) - 1 else None

    def admission_victim(self, candidate: Request, running: Sequence[Request],
                         exclude: frozenset[str]) -> Request | None:
        """A running request to preempt so the waiting ``candidate`` (first in admission order)
        can be admitted; None: it waits its turn."""
        return None

    def checkpoint(self) -> object:
        return None

    def restore(self, state: object) -> None:
        return None


class RankedPolicy(SchedulingPolicy, ABC):
    """A policy that ranks requests by a key (lower = earlier), for the waiting queue and,
    when ``ranks_running``, the running batch too (and so its preemption victims)."""

    ranks_running: ClassVar[bool] = False

    @abstractmethod
    def rank(self, request: Request) -> tuple[int, ...]:
        """The request's sort key; ties end with ``arrival_seq`` (by arrival)."""

    def admission_order(self, waiting: Sequence[Request], kv: KVCacheManager) -> list[Request]:
        return sorted(waiting, key=self.rank)

    def running_order(self, running: Sequence[Request]) -> list[Request]:
        # sorted() is stable: parallel-sampling siblings (same key) keep their running order.
        return sorted(running, key=self.rank) if self.ranks_running else list(running)
