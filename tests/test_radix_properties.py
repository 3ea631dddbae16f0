"""Property tests of the prefix cache (issue #8), in two parts.

(a) ``RadixCache`` + ``BlockPool`` driven directly by random operation sequences (seeded
    ``random.Random``, 1,200 sequences): sequences are admitted with a prefix match (which may
    split a node), computed (insert, with duplicate blocks swapped for the cached ones), grown
    (copy-on-write of a shared partial block), forked, freed (unlock), and the cache is asked
    to evict. A small model on the side records which tokens each block holds (the "KV"), the
    block tables and the locked nodes. After every operation: both ``check_integrity``s, ref
    counts equal table references, every cached block and every table block holds the tokens
    it claims. Each lookup is checked against a brute-force longest cached prefix; each
    eviction is replayed against a reference LRU (only unlocked leaves, least recently used
    first, a parent only once its last child is gone, no more nodes than needed). At the end
    everything is freed and evicted: no block is leaked. The undo journal is checked the same
    way: begin, random operations, rollback -> the tree and the pool exactly as before.
(b) The real engine on tiny-random with random knobs and prompts built from a few shared
    stems, with parallel sampling and seeded sampling mixed in: integrity after every step,
    every request finishes, no block in use at the end, greedy outputs equal to the same run
    with caching off.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from engine.core.block_pool import BlockPool
from engine.core.config import SamplingParams
from engine.serving.engine import LLMEngine
from engine.core.prefix_cache import RadixCache, RadixNode
from tests.conftest import run_to_completion

# -- (a) the radix tree and the pool, directly ------------------------------------------------

SEQUENCES_PER_CHUNK = 150
CHUNKS = 8  # 8 x 150 = 1,200 random operation sequences
OPS_PER_SEQUENCE = 40


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class Seq:
    """A running sequence as the KV cache manager keeps it: tokens, block table, the deepest
    tree node it locks, and how many of its table's blocks are in the tree."""

    tokens: list[int]
    table: list[int]
    node: RadixNode | None
    done: int


@dataclass
class World:
    """The cache under test plus the side model: the tokens each block holds, the sequences."""

    rng: random.Random
    block_size: int
    num_blocks: int
    pool: BlockPool = field(init=False)
    cache: RadixCache = field(init=False)
    kv: dict[int, tuple[int, ...]] = field(default_factory=dict)  # block -> the tokens written in it
    seqs: list[Seq] = field(default_factory=list)
    stems: list[list[int]] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.pool = BlockPool(self.num_blocks)
        self.cache = RadixCache(self.pool, self.block_size)
        bs, rng = self.block_size, self.rng
        # A tiny alphabet and a few stems: prompts share whole blocks, and diverge inside nodes.
        self.stems = [[rng.randrange(3) for _ in range(rng.randint(bs, 4 * bs))] for _ in range(3)]

    def count(self, what: str) -> None:
        self.stats[what] = self.stats.get(what, 0) + 1

    # -- workload ---------------------------------------------------------------------------
    def prompt(self) -> list[int]:
        rng = self.rng
        if rng.random() < 0.2 and self.seqs:
            base = list(rng.choice(self.seqs).tokens)  # an earlier conversation, continued
        else:
            base = list(rng.choice(self.stems))
        base = base[: rng.randint(1, len(base))] if rng.random() < 0.4 else base
        return base + [rng.randrange(3) for _ in range(rng.randint(0, 2 * self.block_size))]

    def path_tokens(self, node: RadixNode) -> list[int]:
        return [t for n in node.path() for t in n.key]

    def locked_blocks(self) -> set[int]:
        return {b for n in self.cache.nodes() if n.lock_count > 0 for b in n.block_ids}

    # -- primitives, each checked --------------------------------------------------------------
    def lookup(self, tokens: list[int]) -> tuple[RadixNode | None, list[int]]:
        """match_prefix, checked: whole blocks, a real prefix, the longest cached one."""
        bs = self.block_size
        best = 0
        for node in self.cache.nodes():
            path = self.path_tokens(node)
            n = 0
            while n < min(len(path), len(tokens)) and path[n] == tokens[n]:
                n += 1
            best = max(best, n // bs * bs)
        splits_before = len(self.cache.events.split)
        match = self.cache.match_prefix(tokens)
        blocks = list(match.block_ids)
        assert len(blocks) * bs == best, f"matched {len(blocks) * bs} tokens, the longest cached prefix is {best}"
        for i, b in enumerate(blocks):
            assert self.kv[b] == tuple(tokens[i * bs:(i + 1) * bs]), "a matched block holds other tokens"
        if match.node is None:
            assert not blocks
        else:
            assert [b for n in match.node.path() for b in n.block_ids] == blocks
            assert self.path_tokens(match.node) == tokens[: len(blocks) * bs]
        if len(self.cache.events.split) > splits_before:
            self.count("split")
        if blocks:
            self.count("hit")
        return match.node, blocks

    def evict(self, n: int) -> list[int]:
        """cache.evict, replayed against a reference LRU over the tree as it was."""
        bs = self.block_size
        locked = self.locked_blocks() | {b.block_id for b in self.pool.blocks if b.ref_count > 0}
        sim = {node.node_id: [node.parent.node_id if node.parent else None, node.last_access, node.lock_count,
                              {c.node_id for c in node.children.values()}, len(node.block_ids)]
               for node in self.cache.nodes()}
        root = self.cache.root.node_id
        self.cache.drain_events()
        freed = self.cache.evict(n)
        evicted = self.cache.drain_events().evicted
        assert not set(freed) & locked, "evicted a block that a sequence holds"
        assert len(freed) == len(set(freed)) == sum(len(e.block_ids) for e in evicted)
        count = 0
        for i, e in enumerate(evicted):
            leaves = [k for k, (_, _, lock, children, _) in sim.items() if k != root and not children and lock == 0]
            assert e.node_id in leaves, f"evicted node {e.node_id}, which is locked or still has children"
            assert all(sim[e.node_id][1] <= sim[k][1] for k in leaves), "eviction is not least recently used"
            assert count < n, "evicted more nodes than needed"
            count += sim[e.node_id][4]
            parent = sim.pop(e.node_id)[0]
            sim[parent][3].discard(e.node_id)
        if len(freed) < n:  # everything evictable went
            assert self.pool.num_evictable == 0
            assert all(node.lock_count > 0 for node in self.cache.nodes() if node is not self.cache.root
                       and not node.children)
        for b in freed:
            self.kv.pop(b, None)
        if freed:
            self.count("evict")
        return freed

    def take(self, k: int) -> list[int] | None:
        """k blocks from the free queue, evicting (LRU) when it is short; None if impossible."""
        if k > self.pool.num_free + self.pool.num_evictable:
            return None
        if k > self.pool.num_free:
            self.evict(k - self.pool.num_free)
        return self.pool.allocate(k)

    def write(self, seq: Seq, start: int) -> None:
        """The forward: tokens from ``start`` on are written into the table's blocks."""
        bs = self.block_size
        for i in range(start // bs, cdiv(len(seq.tokens), bs)):
            self.kv[seq.table[i]] = tuple(seq.tokens[i * bs:(i + 1) * bs])

    # -- operations -----------------------------------------------------------------------------
    def op_admit(self) -> None:
        tokens = self.prompt()
        bs = self.block_size
        full = (len(tokens) - 1) // bs  # the last token is always computed
        node, hits = self.lookup(tokens[: full * bs])
        revived = sum(1 for b in hits if self.pool.blocks[b].ref_count == 0)
        need = cdiv(len(tokens), bs) - len(hits)
        if need > self.pool.num_free + self.pool.num_evictable - revived:
            return
        self.pool.touch(hits)
        self.cache.lock(node)
        self.cache.record_hit(node)
        new = self.take(need)
        assert new is not None
        seq = Seq(tokens, hits + new, node, len(hits))
        self.write(seq, len(hits) * bs)
        self.seqs.append(seq)
        self.count("admit")

    def op_cache(self) -> None:
        """Hand the newly full blocks to the tree (KVCacheManager.cache_blocks)."""
        if self.seqs:
            self.cache_seq(self.rng.choice(self.seqs))

    def cache_seq(self, seq: Seq) -> None:
        bs = self.block_size
        full = len(seq.tokens) // bs
        if full <= seq.done:
            return
        mine = seq.table[seq.done:full]
        result = self.cache.insert(seq.node, seq.tokens[seq.done * bs: full * bs], mine)
        assert len(result.block_ids) == len(mine)
        for i, b in enumerate(result.block_ids):
            j = seq.done + i
            assert self.kv[b] == tuple(seq.tokens[j * bs:(j + 1) * bs]), "insert returned a block with other tokens"
        swapped = [(own, cached) for own, cached in zip(mine, result.block_ids) if own != cached]
        if swapped:
            self.pool.touch(c for _, c in swapped)
            for b in self.pool.free(o for o, _ in swapped):
                self.kv.pop(b, None)
            self.count("swap")
        seq.table = seq.table[: seq.done] + list(result.block_ids) + seq.table[full:]
        self.cache.lock(result.node)
        self.cache.unlock(seq.node)
        seq.node, seq.done = result.node, full
        self.count("insert")

    def op_grow(self) -> None:
        """Decode a few tokens: copy-on-write of a shared partial block, new blocks as needed."""
        if not self.seqs:
            return
        seq = self.rng.choice(self.seqs)
        bs = self.block_size
        start = len(seq.tokens)
        extra = [self.rng.randrange(3) for _ in range(self.rng.randint(1, bs + 1))]
        index = start // bs
        shared = index < len(seq.table) and self.pool.blocks[seq.table[index]].ref_count > 1
        need = cdiv(start + len(extra), bs) - len(seq.table) + shared
        new = self.take(need)
        if new is None:
            return
        if shared:
            src, dst = seq.table[index], new.pop()
            assert not self.pool.blocks[src].cached, "a partial block is never cached"
            self.kv[dst] = self.kv[src]
            seq.table = seq.table[:index] + [dst] + seq.table[index + 1:]
            self.pool.free([src])
            self.count("copy-on-write")
        seq.table = seq.table + new
        seq.tokens = seq.tokens + extra
        self.write(seq, start)

    def op_fork(self) -> None:
        """Parallel sampling: the engine forks after the parent's full blocks are in the tree
        (so every full block's ref count is its node's lock count); only the partial block
        is shared outside the tree."""
        if not self.seqs:
            return
        seq = self.rng.choice(self.seqs)
        self.cache_seq(seq)
        self.pool.touch(seq.table)
        self.cache.lock(seq.node)
        self.seqs.append(Seq(list(seq.tokens), list(seq.table), seq.node, seq.done))
        self.count("fork")

    def op_free(self) -> None:
        if not self.seqs:
            return
        seq = self.seqs.pop(self.rng.randrange(len(self.seqs)))
        self.cache.unlock(seq.node)
        for b in self.pool.free(reversed(seq.table)):
            self.kv.pop(b, None)
        self.count("free")

    def op_evict(self) -> None:
        self.evict(self.rng.randint(1, self.num_blocks))

    def op_lookup(self) -> None:
        tokens = self.prompt()
        self.lookup(tokens[: len(tokens) // self.block_size * self.block_size])

    OPS = (("admit", 4), ("cache", 4), ("grow", 3), ("fork", 1), ("free", 2), ("evict", 1), ("lookup", 1))

    def random_op(self) -> None:
        names, weights = zip(*self.OPS)
        getattr(self, "op_" + self.rng.choices(names, weights)[0])()

    # -- invariants --------------------------------------------------------------------------
    def check(self) -> None:
        bs = self.block_size
        self.pool.check_integrity()
        self.cache.check_integrity(self.pool, [s.node for s in self.seqs if s.node is not None])
        refs: dict[int, int] = {}
        for s in self.seqs:
            for b in s.table:
                refs[b] = refs.get(b, 0) + 1
            assert len(s.table) == cdiv(len(s.tokens), bs)
            for i, b in enumerate(s.table):
                assert self.kv.get(b) == tuple(s.tokens[i * bs:(i + 1) * bs]), "a table block lost its tokens"
            if s.node is not None:
                assert s.table[: s.done] == [b for n in s.node.path() for b in n.block_ids]
        for b in self.pool.blocks:
            assert b.ref_count == refs.get(b.block_id, 0), f"block {b.block_id}: ref count != table references"
        for node in self.cache.nodes():
            for i, b in enumerate(node.block_ids):
                assert self.kv.get(b) == tuple(node.key[i * bs:(i + 1) * bs]), "a cached block holds other tokens"

    def drain(self) -> None:
        """Free every sequence and evict everything: the pool must be whole again."""
        while self.seqs:
            self.op_free()
            self.check()
        self.evict(self.num_blocks)
        self.check()
        assert self.pool.num_free == self.num_blocks, "blocks leaked"
        assert self.pool.num_evictable == 0 and not self.cache.root.children


def world(seed: int) -> World:
    rng = random.Random(seed)
    bs = rng.choice([1, 2, 3, 4])
    return World(rng, bs, rng.randint(4, 24))


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_random_operation_sequences_keep_every_invariant(chunk: int) -> None:
    totals: dict[str, int] = {}
    for seed in range(chunk * SEQUENCES_PER_CHUNK, (chunk + 1) * SEQUENCES_PER_CHUNK):
        w = world(seed)
        try:
            for _ in range(OPS_PER_SEQUENCE):
                w.random_op()
                w.check()
            w.drain()
        except AssertionError as e:
            raise AssertionError(f"seed {seed}: {e}") from e
        for k, v in w.stats.items():
            totals[k] = totals.get(k, 0) + v
    # The workload really exercises each path (a few hundred times per chunk).
    for what in ("admit", "hit", "split", "insert", "swap", "evict", "copy-on-write", "fork", "free"):
        assert totals.get(what, 0) >= 10, f"only {totals.get(what, 0)} {what} in this chunk: {totals}"


def dump(cache: RadixCache, pool: BlockPool, ordered: bool = False) -> tuple:
    """The tree and the pool, structurally (node ids, keys, blocks, counts, the clock, the
    free queue's order). ``ordered``: children in their dict order too."""
    nodes = [(n.node_id, n.parent.node_id if n.parent else None, tuple(n.key), tuple(n.block_ids), n.lock_count,
              n.last_access, n.hit_count,
              tuple(c.node_id for c in n.children.values()) if ordered else tuple(sorted(
                  c.node_id for c in n.children.values())),
              tuple(sorted(n.children)) if not ordered else tuple(n.children))
             for n in cache.nodes()]
    if not ordered:
        nodes.sort()
    blocks = tuple((b.ref_count, b.cached) for b in pool.blocks)
    return tuple(nodes), cache.clock, cache._peek_id(), blocks, tuple(pool.free_queue), pool.num_evictable


UNDO_SEEDS = 300


def test_undo_journal_restores_the_tree_and_the_pool_exactly() -> None:
    changed = 0
    for seed in range(10_000, 10_000 + UNDO_SEEDS):
        w = world(seed)
        for _ in range(w.rng.randint(0, 30)):
            w.random_op()
        w.check()
        before, before_ordered = dump(w.cache, w.pool), dump(w.cache, w.pool, ordered=True)
        saved = ([Seq(list(s.tokens), list(s.table), s.node, s.done) for s in w.seqs], dict(w.kv))
        w.pool.begin()
        w.cache.begin()
        for _ in range(w.rng.randint(1, 20)):
            w.random_op()
            w.check()
        changed += dump(w.cache, w.pool) != before
        w.pool.rollback()
        w.cache.rollback()
        w.seqs, w.kv = saved  # the side model goes back too (a failed step wrote nothing)
        assert dump(w.cache, w.pool) == before, f"seed {seed}: rollback did not restore the tree and the pool"
        assert dump(w.cache, w.pool, ordered=True) == before_ordered, f"seed {seed}: rollback changed the children's order"
        w.check()
        for _ in range(10):  # and the restored state keeps working
            w.random_op()
            w.check()
        w.drain()
    assert changed >= UNDO_SEEDS // 2, "most journaled runs should have changed something to undo"


def test_rollback_keeps_a_node_that_a_restored_sequence_locks() -> None:
    """Regression (found by the random engine runs with a failing forward): a step preempts V,
    whose cached prefix becomes evictable, evicts it to make room for R, and then fails. The
    rollback restores V and its lock on that node; dropping the node as "handed out again"
    then hit ``_remove``'s assertion (a locked node) and the rollback itself raised, hiding the
    step's error and leaving the engine half restored. The node stays (V's table holds its
    blocks exactly as before the step) and the tree is restored exactly."""
    from engine.core.kv_cache import KVCacheManager
    from engine.core.request import Request, RequestStatus

    def request(rid: str, tokens: list[int]) -> Request:
        r = Request(rid, None, tokens, SamplingParams(temperature=0))
        r.status = RequestStatus.RUNNING
        return r

    kv = KVCacheManager(num_blocks=4, block_size=2, enable_prefix_caching=True)
    v, r = request("v", [1, 2, 3, 4]), request("r", [5, 6, 7, 8, 9, 10])
    assert kv.allocate_slots(v, 4)
    v.num_computed_tokens = 4
    kv.cache_blocks(v)  # V's two blocks are one tree node, locked by V
    assert kv.num_free_blocks == 2
    assert isinstance(kv.prefix_cache, RadixCache)
    before = dump(kv.prefix_cache, kv.pool, ordered=True)
    kv.begin()
    kv.free(v)  # preempted: its node is now an unlocked, evictable leaf
    assert kv.allocate_slots(r, 6) is not None  # 3 blocks: 2 free + 1 evicted from V's node
    assert not kv.prefix_cache.root.children
    kv.rollback()  # the forward failed
    kv.check_integrity([v])
    assert dump(kv.prefix_cache, kv.pool, ordered=True) == before
    assert kv.block_tables == {"v": [0, 1]}


# -- (b) the real engine on tiny-random --------------------------------------------------------

ENGINE_SEEDS = 60


def engine_workload(seed: int) -> tuple[dict, list[tuple[list[int], SamplingParams, int]]]:
    rng = random.Random(seed)
    bs = rng.choice([1, 2, 3, 4, 8])
    knobs = dict(block_size=bs, max_num_batched_tokens=rng.choice([8, 16, 32, 64]),
                 max_num_seqs=rng.randint(2, 6), enable_chunked_prefill=rng.random() < 0.7)
    stems = [[rng.randrange(40, 80) for _ in range(rng.randint(4, 24))] for _ in range(3)]
    requests = []
    for _ in range(rng.randint(4, 8)):
        prompt = list(rng.choice(stems))
        if rng.random() < 0.3:
            prompt += rng.choice(stems)
        prompt = prompt[: rng.randint(1, len(prompt))] if rng.random() < 0.3 else prompt
        prompt += [rng.randrange(40, 80) for _ in range(rng.choice([0, 0, 1, 3, 7]))]
        if not knobs["enable_chunked_prefill"]:
            prompt = prompt[: knobs["max_num_batched_tokens"]]
        n = rng.choice([1, 1, 1, 2, 3, 4])
        n = min(n, knobs["max_num_seqs"])
        max_tokens = rng.randint(1, 8)
        if rng.random() < 0.3:
            params = SamplingParams(temperature=0.8, seed=rng.randrange(1000), n=n, max_tokens=max_tokens,
                                    ignore_eos=True)
        else:
            params = SamplingParams(temperature=0, n=n, max_tokens=max_tokens)
        requests.append((prompt, params, rng.randint(0, 6)))
    longest = max(len(p) + sp.max_tokens for p, sp, _ in requests)
    # From "the longest request barely fits" to "a few requests fit": evictions and preemptions.
    knobs["num_blocks"] = cdiv(longest, bs) + rng.randint(0, cdiv(longest, bs))
    return knobs, requests


def run_workload(tiny, knobs: dict, requests, caching: bool):
    engine = LLMEngine(tiny, enable_prefix_caching=caching, **knobs)
    ids = [engine.add_request(p, sp, arrival_step=a) for p, sp, a in requests]
    traces = run_to_completion(engine, max_steps=5_000)
    assert engine.scheduler.kv.pool.num_used == 0 and engine.kv.pool.num_used == 0
    assert not engine.kv.block_tables
    outs = [engine.get_output(i) for i in ids]
    for o, (_, sp, _) in zip(outs, requests):
        assert o.finished and len(o.outputs) == sp.n
        assert all(c.finish_reason in ("stop", "length") for c in o.outputs)
    return outs, traces


_ENGINE_TALLY: dict[str, int] = {}


@pytest.mark.usefixtures("torch_single_thread")
@pytest.mark.parametrize("seed", range(ENGINE_SEEDS))
def test_random_engine_runs_with_caching_match_caching_off(tiny, seed: int) -> None:
    knobs, requests = engine_workload(seed)
    on, traces = run_workload(tiny, knobs, requests, caching=True)
    off, _ = run_workload(tiny, knobs, requests, caching=False)
    for a, b, (_, sp, _) in zip(on, off, requests):
        if sp.greedy:
            assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
            assert len({c.token_ids for c in a.outputs}) == 1, "greedy parallel sequences differ"
    for key, hit in (("hit", any(t.prefix.num_cached_tokens for t in traces)),
                     ("split", any(t.prefix.split for t in traces)),
                     ("evict", any(t.prefix.evicted for t in traces)),
                     ("preempt", any(t.preempted for t in traces)),
                     ("copy-on-write", any(t.prefix.copies for t in traces))):
        _ENGINE_TALLY[key] = _ENGINE_TALLY.get(key, 0) + hit
    _ENGINE_TALLY["runs"] = _ENGINE_TALLY.get("runs", 0) + 1


def test_random_engine_runs_covered_every_path() -> None:
    """Runs after the seeds above (file order): each path happened in several of them."""
    if _ENGINE_TALLY.get("runs", 0) != ENGINE_SEEDS:
        pytest.skip("not every random engine run ran in this session")
    for key in ("hit", "split", "evict", "preempt", "copy-on-write"):
        assert _ENGINE_TALLY.get(key, 0) >= 3, f"{key}: only in {_ENGINE_TALLY.get(key, 0)} runs: {_ENGINE_TALLY}"


FAILURE_SEEDS = 30


@pytest.mark.usefixtures("torch_single_thread")
@pytest.mark.parametrize("seed", range(FAILURE_SEEDS))
def test_random_engine_runs_survive_failed_steps(tiny, seed: int) -> None:
    """The same workloads with the forward failing at random steps (about one in four): the step
    raises that very error (the rollback itself never raises), requests, queues and tables are
    as before it, the tree only lost nodes whose blocks the step handed out, integrity holds, and
    the run ends with the greedy tokens of a clean run."""
    knobs, requests = engine_workload(seed)
    clean, _ = run_workload(tiny, knobs, requests, caching=False)
    engine = LLMEngine(tiny, enable_prefix_caching=True, **knobs)
    ids = [engine.add_request(p, sp, arrival_step=a) for p, sp, a in requests]
    rng = random.Random(seed)
    original = engine.runner.execute
    failures = 0

    def fail(*args, **kwargs):
        raise RuntimeError("injected forward failure")

    for _ in range(5_000):
        if not engine.has_unfinished_requests():
            break
        if rng.random() < 0.25:
            before = engine.snapshot()
            engine.runner.execute = fail  # type: ignore[method-assign]
            try:
                engine.step()
            except RuntimeError as e:
                assert "injected" in str(e)
                failures += 1
                after = engine.snapshot()
                assert (after.step, after.requests, after.waiting, after.running) == \
                       (before.step, before.requests, before.waiting, before.running)
                assert set(after.prefix_tree) <= set(before.prefix_tree)
            finally:
                engine.runner.execute = original  # type: ignore[method-assign]
        else:
            engine.step()
        engine.check_integrity()
    assert not engine.has_unfinished_requests()
    assert engine.kv.pool.num_used == 0
    for rid, ref, (_, sp, _) in zip(ids, clean, requests):
        out = engine.get_output(rid)
        assert out.finished
        if sp.greedy:
            assert [c.token_ids for c in out.outputs] == [c.token_ids for c in ref.outputs]
    assert failures > 0
