"""Longest prefix match (SGLang's cache-aware policy): the waiting request that reuses the most
cached KV goes first.

Rule: waiting requests are admitted in order of their prefix-cache hit (whole cached blocks,
the same lookup admission makes: ``KVCacheManager.get_computed_blocks``, which locks and
allocates nothing; like SGLang's ``match_prefix`` it refreshes the matched nodes' LRU time),
longest first, ties by arrival. So requests of a prefix group that is in the cache now run
before its blocks are evicted by other groups. With prefix caching off every hit is 0 and the
order is FCFS's. Running requests and victims are as FCFS.

Source: SGLang, python/sglang/srt/managers/schedule_policy.py (``CacheAwarePolicy.LPM``:
``waiting_queue.sort(key=lambda r: -len(r.prefix_indices))``; SGLang falls back to FCFS above
128 waiting requests to bound the lookups' cost, not done here).

Invariant: the order depends only on the tree and the queue (no state of its own); a request
is never admitted before another of the same arrival with a strictly longer hit.
"""
from __future__ import annotations

from collections.abc import Sequence

from engine.core.kv_cache import KVCacheManager
from engine.core.policies.base import SchedulingPolicy
from engine.core.request import Request


class LPMPolicy(SchedulingPolicy):
    name = "lpm"

    def admission_order(self, waiting: Sequence[Request], kv: KVCacheManager) -> list[Request]:
        if not kv.prefix_cache.enabled:
            return list(waiting)
        hits = {id(r): kv.get_computed_blocks(r).num_tokens for r in waiting}
        return sorted(waiting, key=lambda r: (-hits[id(r)], r.arrival_seq))
