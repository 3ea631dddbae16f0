"""Physical KV blocks: reference counts, a free list in reuse order, and the cached flag.

Pure Python (no torch): the KV tensors live in the model runner; this module only decides
which physical block holds which tokens.

    free_queue (front = reused first)     in use: ref_count > 0       cached, ref_count 0
    [7] -> [2] -> [9] -> ...              in one or more block tables  (evictable: the prefix
                                                                        cache frees them, LRU)

A block's three states: free (in the queue), used (ref_count > 0, cached or not), and
cached-evictable (held only by the prefix cache). ``ref_count`` counts block tables only.

Invariant: a block is in the free queue  <=>  ref_count == 0 and not cached, and
           num_free + num_used + num_evictable == num_blocks.

Undo journal: between ``begin()`` and ``commit()`` every change is journaled, and
``rollback()`` restores ref counts, cached flags and the free queue's exact order (the engine
rolls back a step that failed).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Iterable, Literal

from engine.core.config import MAX_NUM_BLOCKS

# (operation, block id, extra): "alloc" / "touch" / "cache" / "evict" / "free" (extra: whether
# the block went to the free queue).
JournalEntry = tuple[Literal["alloc", "free", "touch", "cache", "evict"], int, int]


@dataclass(slots=True, eq=False)
class Block:
    block_id: int
    ref_count: int = 0
    cached: bool = False  # held by a prefix-cache node: its KV is kept when no table uses it


@dataclass(slots=True)
class BlockPool:
    num_blocks: int
    blocks: list[Block] = field(init=False)
    free_queue: "OrderedDict[int, None]" = field(init=False)
    journal: list[JournalEntry] | None = field(init=False, default=None)
    _num_evictable: int = field(init=False, default=0)
    _num_cached: int = field(init=False, default=0)  # (counted, not summed: a trace reads it every step)

    def __post_init__(self) -> None:
        if isinstance(self.num_blocks, bool) or not isinstance(self.num_blocks, int) \
                or not 1 <= self.num_blocks <= MAX_NUM_BLOCKS:
            raise ValueError(f"num_blocks: must be an integer in 1 .. {MAX_NUM_BLOCKS:,}, got {self.num_blocks!r}")
        self.blocks = [Block(i) for i in range(self.num_blocks)]
        self.free_queue = OrderedDict((i, None) for i in range(self.num_blocks))

    @property
    def num_free(self) -> int:
        return len(self.free_queue)

    @property
    def num_evictable(self) -> int:
        """Cached blocks that no block table uses (the prefix cache gives them up first)."""
        return self._num_evictable

    @property
    def num_cached(self) -> int:
        """Blocks the prefix cache holds, in use or evictable."""
        return self._num_cached

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free_queue) - self._num_evictable

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` blocks from the front of the free queue (ref_count 0 -> 1)."""
        if n > len(self.free_queue):
            raise RuntimeError(f"block pool: asked for {n} blocks, {len(self.free_queue)} free")
        out = []
        for _ in range(n):
            block_id, _ = self.free_queue.popitem(last=False)
            block = self.blocks[block_id]
            block.ref_count = 1
            out.append(block_id)
            if self.journal is not None:
                self.journal.append(("alloc", block_id, 0))
        return out

    def touch(self, block_ids: Iterable[int]) -> None:
        """Share blocks that already hold the right KV (a prefix hit, a fork): ref_count += 1.
        A block with ref_count 0 must be cached (a free block holds nothing to share)."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                if not block.cached:
                    raise RuntimeError(f"block pool: block {block_id} is free, there is nothing to share")
                self._num_evictable -= 1
            block.ref_count += 1
            if self.journal is not None:
                self.journal.append(("touch", block_id, 0))

    def mark_cached(self, block_ids: Iterable[int]) -> None:
        """The prefix cache now holds these blocks (each in use by the table that filled it)."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.cached or block.ref_count == 0:
                raise RuntimeError(f"block pool: block {block_id} cannot be cached "
                                   f"(cached={block.cached}, ref_count={block.ref_count})")
            block.cached = True
            self._num_cached += 1
            if self.journal is not None:
                self.journal.append(("cache", block_id, 0))

    def evict_cached(self, block_ids: Iterable[int]) -> None:
        """The prefix cache gave these unused blocks up: they go to the back of the free queue."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if not block.cached or block.ref_count != 0:
                raise RuntimeError(f"block pool: block {block_id} is not evictable "
                                   f"(cached={block.cached}, ref_count={block.ref_count})")
            block.cached = False
            self._num_evictable -= 1
            self._num_cached -= 1
            self.free_queue[block_id] = None
            if self.journal is not None:
                self.journal.append(("evict", block_id, 0))

    def free(self, block_ids: Iterable[int]) -> list[int]:
        """Drop one reference from each block; an uncached block reaching 0 goes to the back of
        the queue, a cached one becomes evictable (the prefix cache keeps its KV).

        Callers pass a block table reversed, so a request's tail blocks are reused first.
        Returns the ids that went to the free queue.
        """
        released = []
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_count <= 0:
                raise RuntimeError(f"block pool: block {block_id} freed more often than allocated")
            block.ref_count -= 1
            to_queue = block.ref_count == 0 and not block.cached
            if to_queue:
                self.free_queue[block_id] = None
                released.append(block_id)
            elif block.ref_count == 0:
                self._num_evictable += 1
            if self.journal is not None:
                self.journal.append(("free", block_id, int(to_queue)))
        return released

    # -- undo journal (one step at a time) ----------------------------------------------------
    def begin(self) -> None:
        """Start journaling changes (a step begins)."""
        self.journal = []

    def commit(self) -> None:
        """Keep the changes and stop journaling."""
        self.journal = None

    def rollback(self) -> None:
        """Undo every change since ``begin()``, newest first; the free queue's order is exact."""
        for op, block_id, extra in reversed(self.journal or []):
            block = self.blocks[block_id]
            if op == "alloc":
                block.ref_count = 0
                self.free_queue[block_id] = None
                self.free_queue.move_to_end(block_id, last=False)
            elif op == "free":
                block.ref_count += 1
                if extra:
                    del self.free_queue[block_id]
            elif op == "touch":
                block.ref_count -= 1
            elif op == "cache":
                block.cached = False
            else:  # evict: it was appended to the queue's back, which it is again now
                del self.free_queue[block_id]
                block.cached = True
        self._num_evictable = sum(1 for b in self.blocks if b.cached and b.ref_count == 0)
        self._num_cached = sum(1 for b in self.blocks if b.cached)
        self.journal = None

    def check_integrity(self) -> None:
        for block in self.blocks:
            if block.ref_count < 0:
                raise AssertionError(f"block {block.block_id}: negative ref_count")
            in_queue = block.block_id in self.free_queue
            if in_queue != (block.ref_count == 0 and not block.cached):
                raise AssertionError(f"block {block.block_id}: ref_count {block.ref_count}, cached={block.cached} "
                                     f"but in_free_queue={in_queue}")
        evictable = sum(1 for b in self.blocks if b.cached and b.ref_count == 0)
        if evictable != self._num_evictable:
            raise AssertionError(f"block pool: {evictable} evictable blocks, counted {self._num_evictable}")
        if sum(1 for b in self.blocks if b.cached) != self._num_cached:
            raise AssertionError(f"block pool: cached blocks miscounted ({self._num_cached})")
        used = sum(1 for b in self.blocks if b.ref_count > 0)
        if self.num_free + used + evictable != self.num_blocks:
            raise AssertionError("block pool: free + used + cached-evictable != total")
