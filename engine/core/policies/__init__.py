"""Scheduling policies: who is admitted first and who is preempted (the ``scheduling_policy`` knob).

One small module per policy, each behind ``SchedulingPolicy`` (base.py); its docstring states the
rule, its source and its invariant:

    fcfs      fcfs.py      arrival order, no overtaking (vLLM's default)
    priority  priority.py  (priority, arrival); a better waiting request preempts worse running ones (vLLM V1)
    sjf       sjf.py       fewest prompt tokens first (SGLang-style prefill-length sort)
    lpm       lpm.py       longest prefix-cache hit first (SGLang's cache-aware LPM)
    mlfq      mlfq.py      skip-join multi-level feedback queue (FastServe, arXiv 2305.05920)

``make_policy(name)`` builds one; the names are ``engine.core.config.SCHEDULING_POLICIES``.
"""
from __future__ import annotations

from engine.core.policies.base import RankedPolicy, SchedulingPolicy
from engine.core.policies.fcfs import FCFSPolicy
from engine.core.policies.lpm import LPMPolicy
from engine.core.policies.mlfq import MLFQPolicy
from engine.core.policies.priority import PriorityPolicy
from engine.core.policies.sjf import SJFPolicy

POLICIES: dict[str, type[SchedulingPolicy]] = {
    cls.name: cls for cls in (FCFSPolicy, PriorityPolicy, SJFPolicy, LPMPolicy, MLFQPolicy)}


def make_policy(name: str) -> SchedulingPolicy:
    """The policy named ``name`` (a SCHEDULING_POLICIES name; SchedulerConfig checked it)."""
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"scheduling_policy: must be one of {tuple(POLICIES)}, got {name!r}") from None


__all__ = ["POLICIES", "RankedPolicy", "SchedulingPolicy", "make_policy"]
