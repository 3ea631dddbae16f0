"""First come, first served: the engine's behaviour before scheduling policies existed.

Rule: waiting requests are admitted in queue order (arrival order, preempted requests at the
front), and admission stops at the first one that does not fit: no overtaking. A running
request that needs a block preempts the newest running request admitted after it (itself when
it is the newest).

Source: vLLM's scheduler, ``SchedulingPolicy.FCFS`` (vllm/v1/core/sched/scheduler.py), which
preempts ``self.running.pop()``: the last admitted.

Invariant: the oldest running request is never preempted while another runs, so it progresses;
a request never waits behind one that arrived after it (except a preempted one, which had
arrived before it too).
"""
from __future__ import annotations

from engine.core.policies.base import SchedulingPolicy


class FCFSPolicy(SchedulingPolicy):
    name = "fcfs"
