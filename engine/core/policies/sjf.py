"""Shortest job first, by prompt: the waiting request with the fewest tokens to prefill goes first.

Rule: waiting requests are admitted in order of ``num_tokens`` (the prompt, plus the outputs so
far for a preempted request: what its admission must compute, before any prefix-cache hit),
ties by arrival; admission stops at the first that does not fit. Running requests and
preemption victims are as FCFS (newest admitted).

Source: shortest job first (shortest remaining processing time) with the prompt as the job size,
the one size a scheduler knows at arrival; FastServe (arXiv 2305.05920, section 2) discusses why
it cuts mean latency against FCFS's head-of-line blocking. SGLang's schedule_policy.py orders its
waiting queue the same way by other keys (its cache-agnostic "lof": longest output first).

Invariant: among waiting requests, a shorter one is never admitted after a longer one that
arrived with it; a long prompt can wait while shorter ones keep arriving (SJF's known
starvation: no guard here, the workloads are finite).
"""
from __future__ import annotations

from engine.core.policies.base import RankedPolicy
from engine.core.request import Request


class SJFPolicy(RankedPolicy):
    name = "sjf"

    def rank(self, request: Request) -> tuple[int, ...]:
        return request.num_tokens, request.arrival_seq
