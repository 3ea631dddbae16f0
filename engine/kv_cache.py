"""Block tables and slot mapping: where each request's tokens live in the paged KV pool.

    request r (block_size 4)       block table     physical pool
    tokens 0..3   -> logical 0  ->  7              [ 0][ 1] ... [ 7]=r[0:4] ... [12]=r[4:6]
    tokens 4..5   -> logical 1  ->  12

    slot(position p) = block_table[p // block_size] * block_size + p % block_size

Pure Python; the runner turns slot mappings into tensor indices.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from engine.block_pool import BlockPool
from engine.prefix_cache import NoPrefixCache, PrefixCache
from engine.request import Request, RequestStatus


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class KVCacheManager:
    num_blocks: int
    block_size: int
    prefix_cache: PrefixCache = field(default_factory=NoPrefixCache)
    pool: BlockPool = field(init=False)
    block_tables: dict[str, list[int]] = field(init=False, default_factory=dict)
    # Events since the last drain, for the step trace.
    allocated: list[int] = field(init=False, default_factory=list)
    freed: list[int] = field(init=False, default_factory=list)
    # Undo state of the open step (begin .. commit/rollback): the tables as they were before
    # their first change this step (None = the request had no table), and the event lists.
    _saved_tables: dict[str, list[int] | None] | None = field(init=False, default=None)
    _saved_events: tuple[list[int], list[int]] = field(init=False, default=([], []))

    def __post_init__(self) -> None:
        self.pool = BlockPool(self.num_blocks)

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    def get_computed_blocks(self, request: Request) -> tuple[list[int], int]:
        """Prefix-cache lookup at admission: (shared block ids, tokens they cover)."""
        hits = self.prefix_cache.match(request.all_token_ids[: request.num_tokens - 1])
        return hits, len(hits) * self.block_size

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       computed_blocks: Iterable[int] = (), num_lookahead_tokens: int = 0) -> bool:
        """Make room for ``num_new_tokens`` (+ lookahead) after the request's computed tokens.

        Rule: the table must cover ceil((computed + hit + new + lookahead) / block_size) blocks,
        where ``hit`` = len(computed_blocks) * block_size are prefix-cache tokens not yet counted
        in ``request.num_computed_tokens`` (as in vLLM, the caller advances it after admission).
        All or nothing: returns False, changing nothing, when the pool has too few free
        blocks (the scheduler then preempts or stops admitting).
        """
        computed_blocks = list(computed_blocks)
        self._save_table(request.request_id)
        table = self.block_tables.get(request.request_id, [])
        covered = len(table) + len(computed_blocks)
        num_hit_tokens = len(computed_blocks) * self.block_size
        needed_tokens = request.num_computed_tokens + num_hit_tokens + num_new_tokens + num_lookahead_tokens
        num_needed = max(0, cdiv(needed_tokens, self.block_size) - covered)
        revived = sum(1 for b in computed_blocks if self.pool.blocks[b].ref_count == 0)
        if num_needed > self.pool.num_free - revived:
            return False
        self.pool.touch(computed_blocks)
        new_blocks = self.pool.allocate(num_needed)
        self.allocated.extend(new_blocks)
        self.block_tables[request.request_id] = table + computed_blocks + new_blocks
        return True

    def free(self, request: Request) -> list[int]:
        """Release a finished or preempted request's blocks, tail first."""
        self._save_table(request.request_id)
        table = self.block_tables.pop(request.request_id, [])
        released = self.pool.free(reversed(table))
        self.freed.extend(released)
        return released

    # -- undo (one step at a time) ------------------------------------------------------------
    def begin(self) -> None:
        """Journal every change from here on, so a failed step can be undone exactly."""
        self._saved_tables = {}
        self._saved_events = (list(self.allocated), list(self.freed))
        self.pool.begin()

    def commit(self) -> None:
        self._saved_tables = None
        self.pool.commit()

    def rollback(self) -> None:
        """Block tables, the pool (ref counts, free-queue order) and the events as at ``begin``."""
        for rid, table in (self._saved_tables or {}).items():
            if table is None:
                self.block_tables.pop(rid, None)
            else:
                self.block_tables[rid] = table
        self.allocated, self.freed = list(self._saved_events[0]), list(self._saved_events[1])
        self._saved_tables = None
        self.pool.rollback()

    def _save_table(self, request_id: str) -> None:
        """Remember a table before its first change in the open step (tables are replaced, never
        mutated in place, so keeping the old list object is enough)."""
        if self._saved_tables is not None and request_id not in self._saved_tables:
            self._saved_tables[request_id] = self.block_tables.get(request_id)

    def slot_mapping(self, request_id: str, start: int, end: int) -> list[int]:
        table, bs = self.block_tables[request_id], self.block_size
        return [table[p // bs] * bs + p % bs for p in range(start, end)]

    def drain_events(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        out = (tuple(self.allocated), tuple(self.freed))
        self.allocated.clear()
        self.freed.clear()
        return out

    def check_integrity(self, requests: Iterable[Request] = ()) -> None:
        """Blocks: ref counts equal table references; no slot owned twice; tables cover KV."""
        self.pool.check_integrity()
        refs: dict[int, int] = {}
        for table in self.block_tables.values():
            for block_id in table:
                if not 0 <= block_id < self.num_blocks:
                    raise AssertionError(f"block table holds invalid block id {block_id}")
                refs[block_id] = refs.get(block_id, 0) + 1
        for block in self.pool.blocks:
            if block.ref_count != refs.get(block.block_id, 0):
                raise AssertionError(
                    f"block {block.block_id}: ref_count {block.ref_count} != "
                    f"{refs.get(block.block_id, 0)} table references"
                )
        for request in requests:
            held = self.block_tables.get(request.request_id)
            if request.status is RequestStatus.RUNNING:
                if held is None or len(held) < cdiv(request.num_computed_tokens, self.block_size):
                    raise AssertionError(f"request {request.request_id}: table does not cover its KV")
            elif held is not None:
                raise AssertionError(f"request {request.request_id} ({request.status.value}) holds blocks")
        self.prefix_cache.check_integrity(self.pool)
