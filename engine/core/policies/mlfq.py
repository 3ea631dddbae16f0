"""FastServe's skip-join multi-level feedback queue (Wu et al., "Fast Distributed Inference
Serving for Large Language Models", arXiv 2305.05920, section 4).

Rule: K = ``LEVELS`` queues; level i has quantum q_i = ``BASE_QUANTUM`` x 2^i tokens. Skip-join:
a new request joins the first level whose quantum covers its prefill cost (its prompt tokens),
so a long prompt does not sit in level 0 ahead of short ones. Each quantum of generated tokens
spent at a level demotes it one level (the last level keeps it). Lower levels are preferred:
waiting requests are admitted, and running requests get the budget, in (level, arrival) order;
a running request that needs a block preempts the running request with the highest level
(newest on ties).

Costs are counted in tokens, FastServe's iteration time's proxy here: a prefill's time grows
with its tokens and each decode iteration is one token. No starvation guard (FastServe's
optional promotion of long-waiting jobs): the workloads here are finite, so a demoted request
runs once the lower levels drain.

Source: FastServe (arXiv 2305.05920): the skip-join MLFQ of its section 4.1 (quanta doubling per
level, join by the first iteration's cost, demotion when a quantum is used up), without its
proactive KV swapping (this engine preempts by recompute).

State: the level is a function of the request (its prompt and how many tokens it has generated),
so the request's own checkpoint (``Request.checkpoint``) restores it with a failed step and
nothing else needs saving.

Invariant: a level never goes down, and it only goes up when the
request generated a token, so two requests cannot preempt each other back and forth without
progress.
"""
from __future__ import annotations

from engine.core.policies.base import RankedPolicy
from engine.core.request import Request

LEVELS = 6
BASE_QUANTUM = 8  # tokens: q = 8, 16, 32, 64, 128, 256


def quantum(level: int) -> int:
    return BASE_QUANTUM << level


def join_level(num_prompt_tokens: int) -> int:
    """Skip-join: the first level whose quantum covers the prefill (the last level otherwise)."""
    return next((i for i in range(LEVELS) if quantum(i) >= num_prompt_tokens), LEVELS - 1)


def level(request: Request) -> int:
    """The request's level now: its join level, demoted once per quantum of generated tokens."""
    lvl, left = join_level(request.num_prompt_tokens), len(request.output_token_ids)
    while lvl < LEVELS - 1 and left >= quantum(lvl):
        left -= quantum(lvl)
        lvl += 1
    return lvl


class MLFQPolicy(RankedPolicy):
    name = "mlfq"
    ranks_running = True

    def rank(self, request: Request) -> tuple[int, ...]:
        return level(request), request.arrival_seq
