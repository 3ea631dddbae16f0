"""Priority scheduling, vLLM V1's ``SchedulingPolicy.PRIORITY``.

Rule: every request carries ``priority`` (``add_request(priority=)``, lower is served earlier;
default 0). Waiting requests are admitted in (priority, arrival) order; running requests get
the budget in that order too. When the best waiting request cannot be admitted for lack of
seats (max_num_seqs) or blocks, the running request with the worst (priority, arrival) is
preempted if it ranks strictly worse than the waiting one (one per check, until it fits); that
step admits nothing (the scheduler's rule), the next admits it. A running request that needs a
block preempts the worst-ranked running request.

Source: vLLM, vllm/v1/core/sched/scheduler.py (``max(self.running, key=lambda r: (r.priority,
r.arrival_time))`` as the victim, both when a running request needs blocks and when a waiting
one cannot be admitted) and vllm/v1/core/sched/request_queue.py (``PriorityRequestQueue``: a
heap on (priority, arrival_time)).

Invariant: a request is never preempted for one that ranks after it; the best-ranked running
request is never preempted while another runs. Priorities never change, so two requests can
never take turns preempting each other.
"""
from __future__ import annotations

from collections.abc import Sequence

from engine.core.policies.base import RankedPolicy
from engine.core.request import Request


class PriorityPolicy(RankedPolicy):
    name = "priority"
    ranks_running = True
    preempts_for_admission = True

    def rank(self, request: Request) -> tuple[int, ...]:
        return request.priority, request.arrival_seq

    def admission_victim(self, candidate: Request, running: Sequence[Request],
                         exclude: frozenset[str]) -> Request | None:
        movable = [r for r in running if r.request_id not in exclude]
        if not movable:
            return None
        worst = max(movable, key=self.rank)
        return worst if self.rank(worst) > self.rank(candidate) else None
