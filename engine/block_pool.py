"""Physical KV blocks: reference counts and a free list in eviction order.

Pure Python (no torch): the KV tensors live in the model runner; this module only decides
which physical block holds which tokens.

    free_queue (front = reused first)        blocks with ref_count > 0
    [7] -> [2] -> [9] -> ...                 owned by one or more block tables

Invariant: a block is in the free queue  <=>  its ref_count == 0, and
           num_free + num_used == num_blocks.

Undo journal: between ``begin()`` and ``commit()`` every change is journaled, and
``rollback()`` restores ref counts and the free queue's exact order (the engine rolls back a
step that failed). A block reused in a rolled-back step keeps ``block_hash = None``: the failed
forward may have overwritten its KV, so its cached content is dropped, never trusted.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Iterable, Literal

from engine.config import MAX_NUM_BLOCKS

# (operation, block id, extra): "alloc" / "free" (extra: whether the block became free) /
# "touch" (extra: the block's index in the free queue when it was revived, else -1).
JournalEntry = tuple[Literal["alloc", "free", "touch"], int, int]


@dataclass(slots=True, eq=False)
class Block:
    block_id: int
    ref_count: int = 0
    # Set by a prefix cache once the block is full and computed (seam; unused without one).
    block_hash: bytes | None = None


@dataclass(slots=True)
class BlockPool:
    num_blocks: int
    blocks: list[Block] = field(init=False)
    free_queue: "OrderedDict[int, None]" = field(init=False)
    journal: list[JournalEntry] | None = field(init=False, default=None)

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
    def num_used(self) -> int:
        return self.num_blocks - len(self.free_queue)

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` blocks from the front of the free queue (ref_count 0 -> 1)."""
        if n > len(self.free_queue):
            raise RuntimeError(f"block pool: asked for {n} blocks, {len(self.free_queue)} free")
        out = []
        for _ in range(n):
            block_id, _ = self.free_queue.popitem(last=False)
            block = self.blocks[block_id]
            block.block_hash = None  # reusing a block evicts whatever it cached
            block.ref_count = 1
            out.append(block_id)
            if self.journal is not None:
                self.journal.append(("alloc", block_id, 0))
        return out

    def touch(self, block_ids: Iterable[int]) -> None:
        """Share blocks that already hold the right KV (a prefix hit): ref_count += 1."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            index = -1
            if block.ref_count == 0:
                if self.journal is not None:  # O(num_free), only for prefix hits on freed blocks
                    index = list(self.free_queue).index(block_id)
                del self.free_queue[block_id]
            block.ref_count += 1
            if self.journal is not None:
                self.journal.append(("touch", block_id, index))

    def free(self, block_ids: Iterable[int]) -> list[int]:
        """Drop one reference from each block; blocks reaching 0 go to the back of the queue.

        Callers pass a block table reversed, so a request's tail blocks are reused first and
        its prefix (the part most likely to be shared) stays cached longest.
        Returns the ids that became free.
        """
        released = []
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_count <= 0:
                raise RuntimeError(f"block pool: block {block_id} freed more often than allocated")
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_queue[block_id] = None
                released.append(block_id)
            if self.journal is not None:
                self.journal.append(("free", block_id, int(block.ref_count == 0)))
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
            else:  # touch
                block.ref_count -= 1
                if extra >= 0:
                    order = list(self.free_queue)
                    order.insert(extra, block_id)
                    self.free_queue = OrderedDict.fromkeys(order)
        self.journal = None

    def check_integrity(self) -> None:
        for block in self.blocks:
            if block.ref_count < 0:
                raise AssertionError(f"block {block.block_id}: negative ref_count")
            in_queue = block.block_id in self.free_queue
            if in_queue != (block.ref_count == 0):
                raise AssertionError(
                    f"block {block.block_id}: ref_count {block.ref_count} but in_free_queue={in_queue}"
                )
        if self.num_free + self.num_used != self.num_blocks:
            raise AssertionError("block pool: free + used != total")
