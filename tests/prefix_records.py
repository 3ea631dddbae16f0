"""Hand-made prefix-cache records for the pure visualizer tests (tests/test_prefix_visualizers.py).

Small, exact trees whose expected drawing can be worked out by hand: the engine's own runs are
used everywhere else. Block size 4; node ``i``'s tokens are its blocks' ids repeated, so every
node's tokens differ and sibling order (by tokens) is the order of the first block id.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from engine.core.trace import (BlockState, PrefixCacheEvents, PrefixNode, RequestState, Snapshot, StepTrace)

BLOCK_SIZE = 4
NUM_BLOCKS = 64


def node(node_id: int, parent_id: int | None, blocks: Sequence[int], lock: int = 0, last: int = 0, hits: int = 0,
         text: str | None = None) -> PrefixNode:
    tokens = tuple(b for b in blocks for _ in range(BLOCK_SIZE))
    return PrefixNode(node_id=node_id, parent_id=parent_id, token_ids=tokens, block_ids=tuple(blocks),
                      lock_count=lock, last_access=last, hit_count=hits,
                      text=text if text is not None else f"node{node_id} " + " ".join(map(str, blocks)))


def root() -> PrefixNode:
    return PrefixNode(0, None, (), (), 0, 0, 0, "")


@dataclass
class Req:
    request_id: str
    block_table: tuple[int, ...]
    status: str = "running"
    parent_id: str | None = None


def snapshot(nodes: Sequence[PrefixNode], requests: Sequence[Req] = (), step: int = 1,
             num_blocks: int = NUM_BLOCKS) -> Snapshot:
    """A snapshot whose pool agrees with the tree and the running requests' block tables (ref count =
    running tables holding the block); other requests keep their tables, which own nothing."""
    cached = {b for n in nodes for b in n.block_ids}
    owners: dict[int, list[str]] = {}
    for r in requests:
        for b in r.block_table if r.status == "running" else ():
            owners.setdefault(b, []).append(r.request_id)
    blocks = tuple(BlockState(block_id=b, ref_count=len(owners.get(b, [])), owners=tuple(owners.get(b, [])),
                              num_tokens=BLOCK_SIZE if b in cached or b in owners else 0,
                              token_ids=(b,) * BLOCK_SIZE if b in cached or b in owners else (),
                              text="x" * BLOCK_SIZE if b in cached or b in owners else "", cached=b in cached)
                   for b in range(num_blocks))
    states = tuple(RequestState(request_id=r.request_id, status=r.status, arrival_step=0,
                                num_prompt_tokens=len(r.block_table) * BLOCK_SIZE, num_output_tokens=0,
                                num_computed_tokens=len(r.block_table) * BLOCK_SIZE, max_tokens=8,
                                block_table=r.block_table, num_preemptions=0, prompt="p", output_text="",
                                finish_reason=None, parent_id=r.parent_id) for r in requests)
    return Snapshot(step=step, block_size=BLOCK_SIZE, num_blocks=num_blocks, kv_bytes_per_token=1, blocks=blocks,
                    requests=states, waiting=(), running=tuple(r.request_id for r in requests if r.status == "running"),
                    metrics=(), prefix_tree=tuple(nodes))


def trace(step: int = 0, events: PrefixCacheEvents = PrefixCacheEvents(), prefill: int = 0,
          cached_blocks: int = 0, evictable_blocks: int = 0) -> StepTrace:
    from engine.core.trace import ScheduledChunk

    scheduled = (ScheduledChunk("0", prefill, "prefill", 0),) if prefill else ()
    return StepTrace(step=step, scheduled=scheduled, token_budget=max(prefill, 1), num_batched_tokens=prefill,
                     arrived=(), preempted=(), finished=(), sampled=(), blocks_allocated=(), blocks_freed=(),
                     num_free_blocks=0, num_used_blocks=NUM_BLOCKS, num_waiting=0, num_running=0, schedule_ms=0.0,
                     forward_ms=0.0, sample_ms=0.0, prefix=events, num_cached_blocks=cached_blocks,
                     num_evictable_blocks=evictable_blocks)


@dataclass
class Tree:
    """A convenience: nodes by id, built up in order."""

    nodes: list[PrefixNode] = field(default_factory=lambda: [root()])

    def add(self, *args: object, **kwargs: object) -> "Tree":
        self.nodes.append(node(*args, **kwargs))  # type: ignore[arg-type]
        return self
