"""Block tables and slot mapping: where each request's tokens live in the paged KV pool.

    request r (block_size 4)       block table     physical pool
    tokens 0..3   -> logical 0  ->  7              [ 0][ 1] ... [ 7]=r[0:4] ... [12]=r[4:6]
    tokens 4..5   -> logical 1  ->  12

    slot(position p) = block_table[p // block_size] * block_size + p % block_size

With prefix caching, a request's table starts with the blocks of its cached prefix (shared
with the radix tree and with every other sequence on that path), and full blocks are handed
to the tree as they fill. A write into a block that another sequence also holds (parallel
sampling shares the prompt's last, partial block) first copies it: copy-on-write.

Pure Python; the runner turns slot mappings into tensor indices and does the copies.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from engine.core.block_pool import BlockPool
from engine.core.prefix_cache import CacheEvents, NoPrefixCache, PrefixCache, RadixCache, RadixNode
from engine.core.request import Request, RequestStatus


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class KVCacheBlocks:
    """The prefix-cache hit of one admission: the typed boundary between scheduler and cache
    manager (vLLM's name). Whole blocks only, never covering the request's last token."""

    block_ids: tuple[int, ...] = ()
    num_tokens: int = 0  # tokens the blocks hold (len(block_ids) * block_size)
    node: RadixNode | None = None  # the deepest matched tree node


NO_BLOCKS = KVCacheBlocks()


@dataclass(frozen=True)
class SlotAllocation:
    """What ``allocate_slots`` did for one request: blocks taken from the free queue, and the
    copy-on-write copies (src, dst) the runner must make before this step's forward."""

    new_block_ids: tuple[int, ...]
    copies: tuple[tuple[int, int], ...] = ()


NO_ALLOCATION = SlotAllocation(())


@dataclass(frozen=True)
class CachedPrefix:
    """A sequence's share of the tree: the deepest node it locks and the blocks up to it."""

    node: RadixNode
    num_blocks: int


@dataclass
class KVCacheManager:
    num_blocks: int
    block_size: int
    enable_prefix_caching: bool = False
    pool: BlockPool = field(init=False)
    prefix_cache: PrefixCache = field(init=False)
    block_tables: dict[str, list[int]] = field(init=False, default_factory=dict)
    cached_prefix: dict[str, CachedPrefix] = field(init=False, default_factory=dict)
    # Events since the last drain, for the step trace.
    allocated: list[int] = field(init=False, default_factory=list)
    freed: list[int] = field(init=False, default_factory=list)
    # Undo state of the open step (begin .. commit/rollback): per request, its table and cached
    # prefix as they were before their first change this step (None = it had none).
    _saved: dict[str, tuple[list[int] | None, CachedPrefix | None]] | None = field(init=False, default=None)
    _saved_events: tuple[list[int], list[int]] = field(init=False, default=([], []))
    _step_allocated: set[int] = field(init=False, default_factory=set)

    def __post_init__(self) -> None:
        self.pool = BlockPool(self.num_blocks)
        self.prefix_cache = RadixCache(self.pool, self.block_size) if self.enable_prefix_caching \
            else NoPrefixCache()

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    def get_computed_blocks(self, request: Request) -> KVCacheBlocks:
        """Prefix-cache lookup at admission: the cached whole blocks of the request's tokens,
        leaving at least its last token to compute (its logits are needed to sample)."""
        if not self.prefix_cache.enabled:
            return NO_BLOCKS
        bs = self.block_size
        full = (request.num_tokens - 1) // bs
        match = self.prefix_cache.match_prefix(request.all_token_ids[: full * bs])
        return KVCacheBlocks(match.block_ids, len(match.block_ids) * bs, match.node)

    def allocate_slots(self, request: Request, num_new_tokens: int, computed: KVCacheBlocks = NO_BLOCKS,
                       num_lookahead_tokens: int = 0) -> SlotAllocation | None:
        """Make room for ``num_new_tokens`` (+ lookahead) after the request's computed tokens.

        Rule: the table must cover ceil((computed + hit + new + lookahead) / block_size) blocks,
        where hit = ``computed.num_tokens`` are prefix-cache tokens not yet counted in
        ``request.num_computed_tokens`` (as in vLLM, the caller advances it after admission);
        a write into a block another sequence also holds copies it first (copy-on-write).
        Free blocks are used first, then evictable cached blocks are evicted (LRU).
        All or nothing: returns None, changing nothing, when free + evictable blocks are too few
        (the scheduler then preempts or stops admitting).
        """
        rid = request.request_id
        table = self.block_tables.get(rid, [])
        hits = list(computed.block_ids)
        num_needed, shared = self._blocks_needed(request, num_new_tokens, computed, num_lookahead_tokens)
        num_alloc = num_needed + (shared is not None)
        if num_alloc == 0 and not hits and rid in self.block_tables:
            return NO_ALLOCATION  # the table covers the new tokens already (most decode steps)
        if not self._fits(num_alloc, computed):
            return None
        self._save(rid)
        if hits:
            assert computed.node is not None
            self.pool.touch(hits)
            self.prefix_cache.lock(computed.node)
            self.prefix_cache.record_hit(computed.node)
            self.cached_prefix[rid] = CachedPrefix(computed.node, len(hits))
        if num_alloc > self.pool.num_free:
            self.prefix_cache.evict(num_alloc - self.pool.num_free)
        new_blocks = self.pool.allocate(num_alloc)
        self.allocated.extend(new_blocks)
        self._step_allocated.update(new_blocks)
        table = table + hits + new_blocks[: num_needed]
        copies: tuple[tuple[int, int], ...] = ()
        if shared is not None:
            src, dst = table[shared], new_blocks[-1]
            table[shared] = dst
            self.freed.extend(self.pool.free([src]))
            copies = ((src, dst),)
        self.block_tables[rid] = table
        return SlotAllocation(tuple(new_blocks), copies)

    def can_allocate(self, request: Request, num_new_tokens: int, computed: KVCacheBlocks = NO_BLOCKS) -> bool:
        """Whether ``allocate_slots`` with these arguments would succeed now (changes nothing)."""
        num_needed, shared = self._blocks_needed(request, num_new_tokens, computed, 0)
        return self._fits(num_needed + (shared is not None), computed)

    def _blocks_needed(self, request: Request, num_new_tokens: int, computed: KVCacheBlocks,
                       num_lookahead_tokens: int) -> tuple[int, int | None]:
        """(new blocks the table needs, the index of a shared block a write must copy first or None)."""
        table = self.block_tables.get(request.request_id, [])
        needed_tokens = request.num_computed_tokens + computed.num_tokens + num_new_tokens + num_lookahead_tokens
        num_needed = max(0, cdiv(needed_tokens, self.block_size) - len(table) - len(computed.block_ids))
        return num_needed, self._shared_write_block(request, table, num_new_tokens)

    def _fits(self, num_alloc: int, computed: KVCacheBlocks) -> bool:
        """Free + evictable blocks cover ``num_alloc``, not counting the hit's unreferenced
        (evictable) blocks, which the hit itself revives."""
        revived = sum(1 for b in computed.block_ids if self.pool.blocks[b].ref_count == 0)
        return num_alloc <= self.pool.num_free + self.pool.num_evictable - revived

    def _shared_write_block(self, request: Request, table: list[int], num_new_tokens: int) -> int | None:
        """The table index of the existing block this step writes into first, if another
        sequence holds it too (only parallel-sampling siblings share a partial block)."""
        if num_new_tokens <= 0:
            return None
        index = request.num_computed_tokens // self.block_size
        if index < len(table) and self.pool.blocks[table[index]].ref_count > 1:
            return index
        return None

    def cache_blocks(self, request: Request) -> None:
        """After a forward: hand the request's newly full, computed blocks to the prefix cache.

        Where the tree already holds the same tokens (another sequence computed them first),
        the request's table switches to the cached block and its duplicate is freed. The
        request's lock moves down to the new deepest node.
        """
        if not self.prefix_cache.enabled:
            return
        rid, bs = request.request_id, self.block_size
        prefix = self.cached_prefix.get(rid)
        done = prefix.num_blocks if prefix else 0
        full = min(request.num_computed_tokens, request.num_tokens) // bs
        if full <= done:
            return
        self._save(rid)
        table = self.block_tables[rid]
        mine = table[done:full]
        result = self.prefix_cache.insert(prefix.node if prefix else None,
                                          request.all_token_ids[done * bs: full * bs], mine)
        swapped = [(own, cached) for own, cached in zip(mine, result.block_ids) if own != cached]
        if swapped:
            self.pool.touch(cached for _, cached in swapped)
            self.freed.extend(self.pool.free(own for own, _ in swapped))
            self.block_tables[rid] = table[:done] + list(result.block_ids) + table[full:]
        self.prefix_cache.move_lock(prefix.node if prefix else None, result.node)
        self.cached_prefix[rid] = CachedPrefix(result.node, full)

    def fork(self, parent: Request, child: Request) -> None:
        """Parallel sampling: ``child`` starts with the parent's blocks (every ref count + 1)
        and the parent's share of the tree."""
        self._save(child.request_id)
        table = list(self.block_tables[parent.request_id])
        self.pool.touch(table)
        self.block_tables[child.request_id] = table
        prefix = self.cached_prefix.get(parent.request_id)
        if prefix is not None:
            self.prefix_cache.lock(prefix.node)
            self.cached_prefix[child.request_id] = prefix

    def truncate(self, request: Request, num_tokens: int) -> list[int]:
        """Speculative rollback: keep only the blocks that positions 0 .. num_tokens - 1 need
        (ceil(num_tokens / block_size)) and return the rest to the pool, tail first (journaled
        like every change). Rule: the released blocks hold only rejected draft positions, which
        are never cached (the prefix cache only takes full blocks of verified tokens), so each
        goes back with ref count 0 to the free queue. -> the released block ids."""
        rid = request.request_id
        table = self.block_tables.get(rid)
        keep = cdiv(max(num_tokens, 0), self.block_size)
        if table is None or len(table) <= keep:
            return []
        prefix = self.cached_prefix.get(rid)
        if prefix is not None and prefix.num_blocks > keep:
            raise AssertionError(f"request {rid}: truncate below its cached prefix")
        self._save(rid)
        self.block_tables[rid] = table[:keep]
        released = self.pool.free(reversed(table[keep:]))
        self.freed.extend(released)
        return released

    def free(self, request: Request) -> list[int]:
        """Release a finished or preempted request's blocks, tail first; its cached blocks stay
        in the tree (evictable once no one else uses them)."""
        rid = request.request_id
        self._save(rid)
        prefix = self.cached_prefix.pop(rid, None)
        if prefix is not None:
            self.prefix_cache.unlock(prefix.node)
        table = self.block_tables.pop(rid, [])
        released = self.pool.free(reversed(table))
        self.freed.extend(released)
        return released

    # -- undo (one step at a time) ------------------------------------------------------------
    def begin(self) -> None:
        """Journal every change from here on, so a failed step can be undone exactly."""
        self._saved = {}
        self._saved_events = (list(self.allocated), list(self.freed))
        self._step_allocated = set()
        self.pool.begin()
        self.prefix_cache.begin()

    def commit(self) -> None:
        self._saved = None
        self.pool.commit()
        self.prefix_cache.commit()

    def rollback(self) -> None:
        """Block tables, the pool (ref counts, free-queue order), the tree and the events as at
        ``begin``. Tree nodes whose blocks this step handed out again (evicted, then allocated)
        are dropped: the failed forward may have overwritten their KV."""
        for rid, (table, prefix) in (self._saved or {}).items():
            if table is None:
                self.block_tables.pop(rid, None)
            else:
                self.block_tables[rid] = table
            if prefix is None:
                self.cached_prefix.pop(rid, None)
            else:
                self.cached_prefix[rid] = prefix
        self.allocated, self.freed = list(self._saved_events[0]), list(self._saved_events[1])
        self._saved = None
        self.pool.rollback()
        self.prefix_cache.rollback()
        self.prefix_cache.drop_blocks(self._step_allocated)

    def _save(self, request_id: str) -> None:
        """Remember a request's table and cached prefix before their first change in the open
        step (tables are replaced, never mutated in place, so keeping the old list is enough)."""
        if self._saved is not None and request_id not in self._saved:
            self._saved[request_id] = (self.block_tables.get(request_id), self.cached_prefix.get(request_id))

    def slot_mapping(self, request_id: str, start: int, end: int) -> list[int]:
        table, bs = self.block_tables[request_id], self.block_size
        return [table[p // bs] * bs + p % bs for p in range(start, end)]

    def drain_events(self) -> tuple[tuple[int, ...], tuple[int, ...], CacheEvents]:
        out = (tuple(self.allocated), tuple(self.freed), self.prefix_cache.drain_events())
        self.allocated.clear()
        self.freed.clear()
        return out

    def check_integrity(self, requests: Iterable[Request] = ()) -> None:
        """Blocks: ref counts equal table references; no slot owned twice; tables cover KV; a
        sequence's table starts with its cached prefix's blocks; the tree's own invariants."""
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
        for rid, prefix in self.cached_prefix.items():
            path_blocks = [b for n in prefix.node.path() for b in n.block_ids]
            if rid not in self.block_tables or self.block_tables[rid][: len(path_blocks)] != path_blocks \
                    or len(path_blocks) != prefix.num_blocks:
                raise AssertionError(f"request {rid}: table does not start with its cached prefix's blocks")
        self.prefix_cache.check_integrity(self.pool, (p.node for p in self.cached_prefix.values()))
