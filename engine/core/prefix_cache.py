"""Prefix caching: a radix tree over token blocks (SGLang's RadixAttention, block-granular).

    root
     └── [You are a helpful | assistant. Q: ]  blocks 3 7    lock 2   two running sequences
          ├── [What is 2+2? A:]                block 9       lock 1
          └── [Name a colour. ]                block 4       lock 0   evictable leaf (LRU)

A node holds a block-aligned run of token ids and the physical blocks holding their KV (one
block per ``block_size`` tokens); a path from the root spells a cached prefix. Children are
keyed by their first block's tokens, so no two children start with the same block.

Rules
- ``match_prefix(tokens)``: walk down while whole blocks match; a match that ends inside a
  node splits it there, so the matched path ends on a node boundary. Lookups count as use.
- ``insert(node, tokens, blocks)``: from a sequence's locked node, add its newly full blocks;
  where those tokens are cached already the cached block is returned instead (the caller
  swaps its table entry and frees its duplicate).
- ``lock(node)`` / ``unlock(node)``: +1 / -1 on every node from ``node`` up to the root. A
  node is locked while a running sequence's cached prefix runs through it; that sequence's
  block table holds the node's blocks, so a node's lock count equals its blocks' ref counts.
- ``evict(n)``: free the least recently used unlocked leaves (by a logical clock) until ``n``
  blocks are free; a parent becomes an evictable leaf once its last child is gone.

Invariants (``check_integrity``): every cached block is in exactly one node and marked cached
in the pool; a node's lock count equals its blocks' ref counts and the number of sequences
locking it or a descendant; keys are whole blocks; children are keyed by their first block.

Undo journal: between ``begin()`` and ``commit()`` every change pushes its inverse, and
``rollback()`` runs them newest first (the engine rolls back a step that failed).
"""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Protocol, Sequence

from engine.core.block_pool import BlockPool

PageKey = tuple[int, ...]


@dataclass(eq=False)
class RadixNode:
    node_id: int
    key: list[int]  # token ids, a whole number of blocks
    block_ids: list[int]  # one per block of ``key``
    parent: "RadixNode | None"
    children: dict[PageKey, "RadixNode"] = field(default_factory=dict)
    lock_count: int = 0
    last_access: int = 0
    hit_count: int = 0

    def path(self) -> list["RadixNode"]:
        """The nodes from the root's child down to this one (empty for the root)."""
        out = []
        node: RadixNode | None = self
        while node is not None and node.parent is not None:
            out.append(node)
            node = node.parent
        return out[::-1]


@dataclass(frozen=True)
class PrefixMatch:
    """The result of a lookup: the deepest matched node and the blocks along its path."""

    node: RadixNode | None  # None: nothing matched
    block_ids: tuple[int, ...]


@dataclass(frozen=True)
class InsertResult:
    """The node now ending the inserted path, and the cached block for each inserted block
    (the caller's own block, or the one the tree already held for the same tokens)."""

    node: RadixNode
    block_ids: tuple[int, ...]


@dataclass
class CacheEvents:
    """What the cache did since the last drain (node ids; evicted nodes as they were)."""

    inserted: list[int] = field(default_factory=list)
    split: list[int] = field(default_factory=list)
    evicted: list[RadixNode] = field(default_factory=list)


class PrefixCache(Protocol):
    """What the KV cache manager needs from a prefix cache, enabled or not."""

    enabled: bool

    def match_prefix(self, token_ids: Sequence[int]) -> PrefixMatch: ...
    def insert(self, node: RadixNode | None, token_ids: Sequence[int], block_ids: Sequence[int]) -> InsertResult: ...
    def lock(self, node: RadixNode | None) -> None: ...
    def unlock(self, node: RadixNode | None) -> None: ...
    def move_lock(self, old: RadixNode | None, new: RadixNode | None) -> None: ...
    def record_hit(self, node: RadixNode | None) -> None: ...
    def evict(self, num_blocks: int) -> list[int]: ...
    def drop_blocks(self, block_ids: set[int]) -> None: ...
    def nodes(self) -> Iterator[RadixNode]: ...
    def drain_events(self) -> CacheEvents: ...
    def begin(self) -> None: ...
    def commit(self) -> None: ...
    def rollback(self) -> None: ...
    def check_integrity(self, pool: BlockPool, locked: Iterable[RadixNode]) -> None: ...


class NoPrefixCache:
    """Prefix caching disabled: nothing matches, nothing is kept."""

    enabled = False

    def match_prefix(self, token_ids: Sequence[int]) -> PrefixMatch:
        return PrefixMatch(None, ())

    def insert(self, node: RadixNode | None, token_ids: Sequence[int], block_ids: Sequence[int]) -> InsertResult:
        raise RuntimeError("prefix caching is disabled")

    def lock(self, node: RadixNode | None) -> None:
        return None

    def unlock(self, node: RadixNode | None) -> None:
        return None

    def move_lock(self, old: RadixNode | None, new: RadixNode | None) -> None:
        return None

    def record_hit(self, node: RadixNode | None) -> None:
        return None

    def evict(self, num_blocks: int) -> list[int]:
        return []

    def drop_blocks(self, block_ids: set[int]) -> None:
        return None

    def nodes(self) -> Iterator[RadixNode]:
        return iter(())

    def drain_events(self) -> CacheEvents:
        return CacheEvents()

    def begin(self) -> None:
        return None

    def commit(self) -> None:
        return None

    def rollback(self) -> None:
        return None

    def check_integrity(self, pool: BlockPool, locked: Iterable[RadixNode]) -> None:
        if any(b.cached for b in pool.blocks):
            raise AssertionError("prefix caching is off but the pool holds cached blocks")


class RadixCache:
    """The radix tree (module doc). Pure Python; block ref counts live in the pool."""

    enabled = True

    def __init__(self, pool: BlockPool, block_size: int) -> None:
        self.pool = pool
        self.block_size = block_size
        self.root = RadixNode(0, [], [], None)
        self.clock = 0  # logical: one tick per lookup or insert, so LRU order is deterministic
        self._ids = itertools.count(1)
        self.events = CacheEvents()
        self._undo: list[Callable[[], None]] | None = None
        self._saved: tuple[int, int, CacheEvents] | None = None

    # -- lookups --------------------------------------------------------------------------
    def _page(self, tokens: Sequence[int], i: int = 0) -> PageKey:
        return tuple(tokens[i: i + self.block_size])

    def _common_blocks(self, key: Sequence[int], tokens: Sequence[int], start: int) -> int:
        """Whole blocks that ``key`` and ``tokens[start:]`` share, from the first."""
        bs, n = self.block_size, 0
        limit = min(len(key), len(tokens) - start) // bs
        while n < limit and list(key[n * bs:(n + 1) * bs]) == list(tokens[start + n * bs: start + (n + 1) * bs]):
            n += 1
        return n

    def match_prefix(self, token_ids: Sequence[int]) -> PrefixMatch:
        """The longest cached whole-block prefix of ``token_ids`` (rule in the module doc)."""
        tick = self._tick()
        node, blocks, i = self.root, [], 0
        while len(token_ids) - i >= self.block_size:
            child = node.children.get(self._page(token_ids, i))
            if child is None:
                break
            n = self._common_blocks(child.key, token_ids, i)
            self._touch(child, tick)
            if n * self.block_size < len(child.key):
                child = self._split(child, n)
            blocks.extend(child.block_ids)
            i += len(child.key)
            node = child
        return PrefixMatch(None if node is self.root else node, tuple(blocks))

    # -- changes --------------------------------------------------------------------------
    def insert(self, node: RadixNode | None, token_ids: Sequence[int], block_ids: Sequence[int]) -> InsertResult:
        """Add whole blocks after ``node`` (None = the root). -> the node ending the path and the
        cached block id per inserted block (module doc: rules)."""
        bs = self.block_size
        if len(token_ids) != len(block_ids) * bs:
            raise RuntimeError("prefix cache: insert needs one block per block_size tokens")
        tick = self._tick()
        at = node or self.root
        out: list[int] = []
        i = 0
        while i < len(token_ids):
            child = at.children.get(self._page(token_ids, i))
            if child is None:
                leaf = self._new_node(list(token_ids[i:]), list(block_ids[i // bs:]), at, tick)
                self.events.inserted.append(leaf.node_id)
                out.extend(leaf.block_ids)
                return InsertResult(leaf, tuple(out))
            n = self._common_blocks(child.key, token_ids, i)
            self._touch(child, tick)
            if n * bs < len(child.key):
                child = self._split(child, n)
            out.extend(child.block_ids)
            i += len(child.key)
            at = child
        return InsertResult(at, tuple(out))

    def lock(self, node: RadixNode | None) -> None:
        self._add_lock(node, 1)

    def unlock(self, node: RadixNode | None) -> None:
        self._add_lock(node, -1)

    def move_lock(self, old: RadixNode | None, new: RadixNode | None) -> None:
        """``lock(new); unlock(old)``. When ``old`` is an ancestor of ``new`` (a request's lock
        moving down as its blocks are cached) only the nodes below ``old`` change: one node per
        step for a decoding request, not its whole path (with 1-token blocks a path is as long as
        the sequence)."""
        segment: list[RadixNode] = []
        node = new
        while node is not None and node is not old and node.parent is not None:
            segment.append(node)
            node = node.parent
        if old is not None and node is not old:  # not an ancestor: the plain way
            self._add_lock(new, 1)
            self._add_lock(old, -1)
            return
        for n in segment:
            n.lock_count += 1

        def undo() -> None:
            for n in segment:
                n.lock_count -= 1
        self._journal(undo)

    def evict(self, num_blocks: int) -> list[int]:
        """Free at least ``num_blocks`` blocks (or every evictable one), LRU leaves first.

        Whole nodes are evicted, so this may free more than asked. -> the freed block ids.
        """
        heap = [(n.last_access, n.node_id, n) for n in self.nodes() if self._evictable(n)]
        heapq.heapify(heap)
        freed: list[int] = []
        while len(freed) < num_blocks and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            freed.extend(self._remove(leaf))
            if parent is not None and self._evictable(parent):
                heapq.heappush(heap, (parent.last_access, parent.node_id, parent))
        return freed

    def drop_blocks(self, block_ids: set[int]) -> None:
        """Remove every node holding one of ``block_ids``, with its subtree (after a failed step
        whose forward may have overwritten those blocks: their KV is no longer trusted).

        A locked node stays: the rollback gave it back to a sequence that held it before the
        step (one the step had preempted), whose restored block table holds those blocks too,
        as it was; the step's redo preempts and evicts it the same way."""
        doomed = [n for n in self.nodes() if n is not self.root and n.lock_count == 0
                  and block_ids.intersection(n.block_ids)]
        for node in doomed:
            if node.parent is not None and node.parent.children.get(self._page(node.key)) is node:
                for sub in reversed(list(_subtree(node))):
                    self._remove(sub)

    # -- records --------------------------------------------------------------------------
    def nodes(self) -> Iterator[RadixNode]:
        """Every node, parents before children (root first)."""
        return _subtree(self.root)

    def drain_events(self) -> CacheEvents:
        out, self.events = self.events, CacheEvents()
        return out

    # -- undo journal -----------------------------------------------------------------------
    def begin(self) -> None:
        self._undo = []
        self._saved = (self.clock, self._peek_id(), self.events)
        self.events = CacheEvents(list(self.events.inserted), list(self.events.split), list(self.events.evicted))

    def commit(self) -> None:
        self._undo = None
        self._saved = None

    def rollback(self) -> None:
        for undo in reversed(self._undo or []):
            undo()
        if self._saved is not None:
            self.clock, next_id, self.events = self._saved
            self._ids = itertools.count(next_id)
        self._undo = None
        self._saved = None

    def _peek_id(self) -> int:
        next_id = next(self._ids)
        self._ids = itertools.count(next_id)
        return next_id

    def _journal(self, undo: Callable[[], None]) -> None:
        if self._undo is not None:
            self._undo.append(undo)

    # -- primitives (each journals its inverse) ---------------------------------------------
    def _tick(self) -> int:
        self.clock += 1
        return self.clock

    def _touch(self, node: RadixNode, tick: int) -> None:
        old = node.last_access
        node.last_access = tick
        self._journal(lambda: setattr(node, "last_access", old))

    def record_hit(self, node: RadixNode | None) -> None:
        """An admission reused the blocks of ``node``'s path: each node's hit count + 1."""
        for n in node.path() if node is not None else []:
            n.hit_count += 1
            self._journal(lambda n=n: setattr(n, "hit_count", n.hit_count - 1))  # type: ignore[misc]

    def _add_lock(self, node: RadixNode | None, delta: int) -> None:
        for n in node.path() if node is not None else []:
            n.lock_count += delta
            if n.lock_count < 0:
                raise RuntimeError(f"prefix cache: node {n.node_id} unlocked more often than locked")
        if node is not None:
            self._journal(lambda: self._add_lock_raw(node, -delta))

    def _add_lock_raw(self, node: RadixNode, delta: int) -> None:
        for n in node.path():
            n.lock_count += delta

    def _new_node(self, key: list[int], block_ids: list[int], parent: RadixNode, tick: int) -> RadixNode:
        node = RadixNode(next(self._ids), key, block_ids, parent, last_access=tick)
        page = self._page(key)
        parent.children[page] = node
        self.pool.mark_cached(block_ids)

        def undo() -> None:
            del parent.children[page]
        self._journal(undo)
        return node

    def _split(self, child: RadixNode, n: int) -> RadixNode:
        """Cut ``child`` after its first n blocks: a new head node takes them and becomes the
        parent of ``child`` (which keeps its id, its tail and its subtree). -> the head."""
        bs, parent = self.block_size, child.parent
        assert parent is not None and 0 < n * bs < len(child.key)
        old_key, old_blocks = child.key, child.block_ids
        head = RadixNode(next(self._ids), old_key[: n * bs], old_blocks[:n], parent,
                         lock_count=child.lock_count, last_access=child.last_access, hit_count=child.hit_count)
        page = self._page(old_key)
        parent.children[page] = head
        child.key, child.block_ids, child.parent = old_key[n * bs:], old_blocks[n:], head
        head.children[self._page(child.key)] = child
        self.events.split.append(head.node_id)

        def undo() -> None:
            child.key, child.block_ids, child.parent = old_key, old_blocks, parent
            parent.children[page] = child
        self._journal(undo)
        return head

    def _remove(self, node: RadixNode) -> list[int]:
        """Detach a leaf and return its blocks to the pool's free queue."""
        parent = node.parent
        assert parent is not None and not node.children and node.lock_count == 0
        page = self._page(node.key)
        order = list(parent.children) if self._undo is not None else []
        del parent.children[page]
        self.pool.evict_cached(node.block_ids)
        self.events.evicted.append(RadixNode(node.node_id, list(node.key), list(node.block_ids), parent,
                                             lock_count=0, last_access=node.last_access, hit_count=node.hit_count))

        def undo() -> None:  # back in its place among its siblings, so the tree lists as before
            children = dict(parent.children)
            children[page] = node
            parent.children.clear()
            parent.children.update((k, children.pop(k)) for k in order if k in children)
            parent.children.update(children)
        self._journal(undo)
        return list(node.block_ids)

    def _evictable(self, node: RadixNode) -> bool:
        return node is not self.root and not node.children and node.lock_count == 0

    # -- invariants -------------------------------------------------------------------------
    def check_integrity(self, pool: BlockPool, locked: Iterable[RadixNode]) -> None:
        """Tree shape, block ownership and lock counts (module doc: invariants).

        ``locked``: each running sequence's deepest locked node (one entry per sequence)."""
        bs = self.block_size
        expected: dict[int, int] = {}
        for node in locked:
            for n in node.path():
                expected[n.node_id] = expected.get(n.node_id, 0) + 1
        seen: dict[int, int] = {}
        for node in self.nodes():
            if node is self.root:
                continue
            parent = node.parent
            if parent is None or parent.children.get(self._page(node.key)) is not node:
                raise AssertionError(f"prefix cache: node {node.node_id} is not its parent's child for its first block")
            if not node.key or len(node.key) != len(node.block_ids) * bs:
                raise AssertionError(f"prefix cache: node {node.node_id} holds {len(node.key)} tokens in "
                                     f"{len(node.block_ids)} blocks of {bs}")
            if node.lock_count != expected.get(node.node_id, 0):
                raise AssertionError(f"prefix cache: node {node.node_id} lock count {node.lock_count} != "
                                     f"{expected.get(node.node_id, 0)} sequences on its path")
            if parent is not self.root and parent.lock_count < node.lock_count:
                raise AssertionError(f"prefix cache: node {node.node_id} locked more than its parent")
            for b in node.block_ids:
                if b in seen:
                    raise AssertionError(f"prefix cache: block {b} in nodes {seen[b]} and {node.node_id}")
                seen[b] = node.node_id
                block = pool.blocks[b]
                if not block.cached:
                    raise AssertionError(f"prefix cache: block {b} of node {node.node_id} not marked cached")
                if block.ref_count != node.lock_count:
                    raise AssertionError(f"prefix cache: block {b} ref_count {block.ref_count} != lock count "
                                         f"{node.lock_count} of node {node.node_id}")
        stray = [b.block_id for b in pool.blocks if b.cached and b.block_id not in seen]
        if stray:
            raise AssertionError(f"prefix cache: blocks {stray[:5]} marked cached but in no node")


def _subtree(node: RadixNode) -> Iterator[RadixNode]:
    """``node`` and its descendants, parents before children (iterative: deep trees are fine)."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(list(n.children.values())))
