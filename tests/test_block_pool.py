"""BlockPool and KVCacheManager: ref counts, free-queue order, all-or-nothing allocation,
slot mapping, and check_integrity catching deliberate corruption. Pure Python, no model."""
from __future__ import annotations

import pytest

from engine.core.block_pool import BlockPool
from engine.core.config import SamplingParams
from engine.core.kv_cache import KVCacheManager, cdiv
from engine.core.request import Request, RequestStatus


def make_request(rid: str, num_prompt: int, status: RequestStatus = RequestStatus.RUNNING) -> Request:
    r = Request(rid, None, list(range(num_prompt)), SamplingParams(temperature=0))
    r.status = status
    return r


# -- BlockPool ------------------------------------------------------------------------------

def test_fresh_pool_is_all_free_in_id_order():
    pool = BlockPool(5)
    assert pool.num_free == 5 and pool.num_used == 0
    assert list(pool.free_queue) == [0, 1, 2, 3, 4]
    assert all(b.ref_count == 0 for b in pool.blocks)
    pool.check_integrity()


def test_allocate_takes_from_the_front_and_sets_ref_one():
    pool = BlockPool(6)
    assert pool.allocate(2) == [0, 1]
    assert pool.allocate(3) == [2, 3, 4]
    assert [pool.blocks[i].ref_count for i in range(6)] == [1, 1, 1, 1, 1, 0]
    assert pool.num_free == 1 and pool.num_used == 5
    assert list(pool.free_queue) == [5]
    pool.check_integrity()


def test_allocate_zero_is_a_no_op():
    pool = BlockPool(3)
    assert pool.allocate(0) == []
    assert pool.num_free == 3
    pool.check_integrity()


def test_allocate_more_than_free_raises_and_changes_nothing():
    pool = BlockPool(4)
    pool.allocate(3)
    before = (list(pool.free_queue), [b.ref_count for b in pool.blocks])
    with pytest.raises(RuntimeError):
        pool.allocate(2)
    assert (list(pool.free_queue), [b.ref_count for b in pool.blocks]) == before
    pool.check_integrity()


def test_free_appends_to_the_back_so_a_reversed_table_reuses_tail_blocks_first():
    pool = BlockPool(6)
    table = pool.allocate(4)  # [0, 1, 2, 3]; free queue now [4, 5]
    released = pool.free(reversed(table))
    assert released == [3, 2, 1, 0]
    # Never-used blocks first, then this table's tail before its head (head stays cached longest).
    assert list(pool.free_queue) == [4, 5, 3, 2, 1, 0]
    assert pool.allocate(6) == [4, 5, 3, 2, 1, 0]
    pool.check_integrity()


def test_touch_revives_an_evictable_cached_block_and_shares_a_used_one():
    pool = BlockPool(4)
    a = pool.allocate(2)  # [0, 1]
    pool.mark_cached([a[1]])
    pool.free([a[1]])  # cached, unused: evictable, not in the free queue
    assert list(pool.free_queue) == [2, 3] and pool.num_evictable == 1
    pool.touch([1])  # revived: ref 1, no longer evictable
    assert pool.blocks[1].ref_count == 1 and pool.num_evictable == 0
    pool.touch([0])  # shared: ref 2
    assert pool.blocks[0].ref_count == 2
    pool.check_integrity()
    # A shared block becomes free only when its last reference goes.
    assert pool.free([0]) == []
    assert 0 not in pool.free_queue
    assert pool.free([0]) == [0]
    assert list(pool.free_queue) == [2, 3, 0]
    pool.check_integrity()


def test_a_free_uncached_block_cannot_be_shared():
    pool = BlockPool(2)
    (b,) = pool.allocate(1)
    pool.free([b])
    with pytest.raises(RuntimeError, match="nothing to share"):
        pool.touch([b])


def test_evicting_a_cached_block_returns_it_to_the_back_of_the_free_queue():
    pool = BlockPool(3)
    (b,) = pool.allocate(1)
    pool.mark_cached([b])
    pool.free([b])
    assert b not in pool.free_queue and pool.num_evictable == 1
    pool.evict_cached([b])
    assert list(pool.free_queue)[-1] == b and pool.num_evictable == 0 and not pool.blocks[b].cached
    pool.check_integrity()


def test_double_free_raises():
    pool = BlockPool(3)
    (b,) = pool.allocate(1)
    pool.free([b])
    with pytest.raises(RuntimeError):
        pool.free([b])
    pool.check_integrity()


def test_pool_rejects_non_positive_size():
    for n in (0, -1):
        with pytest.raises(ValueError, match="num_blocks"):
            BlockPool(n)


def test_pool_check_integrity_catches_used_block_in_free_queue():
    pool = BlockPool(4)
    (b,) = pool.allocate(1)
    pool.free_queue[b] = None  # corrupt: a used block is also free
    with pytest.raises(AssertionError):
        pool.check_integrity()


def test_pool_check_integrity_catches_free_block_missing_from_queue():
    pool = BlockPool(4)
    del pool.free_queue[2]  # corrupt: ref 0 but not free -> leaked
    with pytest.raises(AssertionError):
        pool.check_integrity()


def test_pool_check_integrity_catches_negative_ref_count():
    pool = BlockPool(4)
    pool.blocks[1].ref_count = -1
    with pytest.raises(AssertionError):
        pool.check_integrity()


# -- KVCacheManager -------------------------------------------------------------------------

def test_allocate_slots_covers_exactly_ceil_tokens_over_block_size():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    r = make_request("r", 10)
    assert kv.allocate_slots(r, 10)
    assert len(kv.block_tables["r"]) == cdiv(10, 4) == 3
    # Growing within the last block's free slots allocates nothing.
    r.num_computed_tokens = 10
    assert kv.allocate_slots(r, 2)
    assert len(kv.block_tables["r"]) == 3
    # Crossing the block boundary allocates exactly one more.
    r.num_computed_tokens = 12
    assert kv.allocate_slots(r, 1)
    assert len(kv.block_tables["r"]) == 4
    # Lookahead slots count too.
    r.num_computed_tokens = 13
    assert kv.allocate_slots(r, 1, num_lookahead_tokens=3)
    assert len(kv.block_tables["r"]) == cdiv(13 + 1 + 3, 4) == 5
    assert kv.num_free_blocks == 5
    kv.check_integrity([r])


def test_allocate_slots_is_all_or_nothing():
    kv = KVCacheManager(num_blocks=4, block_size=2)
    a, b = make_request("a", 4), make_request("b", 6)
    assert kv.allocate_slots(a, 4)  # 2 blocks, 2 left
    before_tables = {k: list(v) for k, v in kv.block_tables.items()}
    before_free = list(kv.pool.free_queue)
    assert not kv.allocate_slots(b, 6)  # needs 3
    assert kv.block_tables == before_tables
    assert "b" not in kv.block_tables
    assert list(kv.pool.free_queue) == before_free
    # A running request that cannot grow keeps exactly what it had.
    a.num_computed_tokens = 4
    assert kv.allocate_slots(b, 4)  # takes the last 2
    b.num_computed_tokens = 4
    assert not kv.allocate_slots(a, 1)
    assert kv.block_tables["a"] == before_tables["a"]
    assert kv.num_free_blocks == 0
    kv.check_integrity([a, b])


def _cached_owner(kv: KVCacheManager, n: int) -> list[int]:
    """A request that computed ``n`` tokens and handed its full blocks to the prefix cache."""
    owner = make_request("owner", n)
    assert kv.allocate_slots(owner, n)
    owner.num_computed_tokens = n
    kv.cache_blocks(owner)
    return list(kv.block_tables["owner"])


def test_allocate_slots_with_prefix_hits_covers_hit_tokens_plus_new_tokens():
    """Admission with a prefix hit: the table must cover the hit blocks' tokens plus the new
    chunk, ceil((hit_tokens + new) / block_size) blocks in all (engine.md 6.1 can_admit)."""
    bs = 4
    kv = KVCacheManager(num_blocks=16, block_size=bs, enable_prefix_caching=True)
    hits = _cached_owner(kv, 8)  # 2 full blocks = 8 tokens of shared prefix
    newcomer = make_request("new", 20, status=RequestStatus.WAITING)
    newcomer.prompt_token_ids[:8] = list(range(8))  # make_request's tokens: the owner's prefix
    hit = kv.get_computed_blocks(newcomer)
    assert list(hit.block_ids) == hits and hit.num_tokens == 8
    n = newcomer.num_tokens - hit.num_tokens  # 12 tokens still to compute
    assert kv.allocate_slots(newcomer, n, hit)
    table = kv.block_tables["new"]
    assert table[:2] == hits
    assert len(table) * bs >= hit.num_tokens + n, (
        f"table of {len(table)} blocks covers {len(table) * bs} tokens, "
        f"but {hit.num_tokens} hit + {n} new tokens were scheduled")
    assert len(table) == cdiv(hit.num_tokens + n, bs)
    assert all(kv.pool.blocks[b].ref_count == 2 for b in hits)


def test_allocate_slots_revived_prefix_blocks_use_free_capacity():
    bs = 2
    kv = KVCacheManager(num_blocks=3, block_size=bs, enable_prefix_caching=True)
    owner = make_request("owner", 4)
    hits = _cached_owner(kv, 4)
    kv.free(owner)  # both blocks unused (ref 0) but cached: evictable
    assert kv.pool.num_evictable == 2 and kv.num_free_blocks == 1
    newcomer = make_request("new", 8, status=RequestStatus.WAITING)
    hit = kv.get_computed_blocks(newcomer)
    assert list(hit.block_ids) == hits
    # 4 hit tokens (2 revived blocks) + 4 new tokens need 4 blocks > 3: refused, nothing changes.
    assert kv.allocate_slots(newcomer, 4, hit) is None
    assert "new" not in kv.block_tables
    assert kv.num_free_blocks == 1 and kv.pool.num_evictable == 2
    assert all(kv.pool.blocks[b].ref_count == 0 for b in hits)
    kv.check_integrity()


def test_free_releases_tail_first_and_records_events():
    kv = KVCacheManager(num_blocks=6, block_size=2)
    r = make_request("r", 7)
    assert kv.allocate_slots(r, 7)
    table = list(kv.block_tables["r"])
    assert table == [0, 1, 2, 3]
    released = kv.free(r)
    assert released == [3, 2, 1, 0]
    assert "r" not in kv.block_tables
    assert list(kv.pool.free_queue) == [4, 5, 3, 2, 1, 0]
    allocated, freed, _ = kv.drain_events()
    assert allocated == (0, 1, 2, 3) and freed == (3, 2, 1, 0)
    assert kv.drain_events()[:2] == ((), ())
    # Freeing a request that holds nothing is harmless.
    assert kv.free(make_request("ghost", 3)) == []
    kv.check_integrity()


def test_slot_mapping_formula():
    bs = 4
    kv = KVCacheManager(num_blocks=8, block_size=bs)
    filler = make_request("filler", 8)
    assert kv.allocate_slots(filler, 8)  # blocks 0, 1
    r = make_request("r", 10)
    assert kv.allocate_slots(r, 10)  # blocks 2, 3, 4
    kv.free(filler)  # 1, 0 to the back
    filler.status = RequestStatus.FINISHED
    r.num_computed_tokens = 10
    assert kv.allocate_slots(r, 3)  # needs 13 tokens -> 4th block: block 5
    table = kv.block_tables["r"]
    assert table == [2, 3, 4, 5]
    slots = kv.slot_mapping("r", 0, 13)
    assert slots == [table[p // bs] * bs + p % bs for p in range(13)]
    assert slots[:5] == [8, 9, 10, 11, 12]
    assert slots[12] == 5 * bs + 0
    assert kv.slot_mapping("r", 9, 11) == slots[9:11]
    assert len(set(slots)) == len(slots)
    kv.check_integrity([r, filler])


def test_slot_mappings_of_two_requests_never_overlap():
    bs = 3
    kv = KVCacheManager(num_blocks=12, block_size=bs)
    reqs = [make_request(f"r{i}", 5 + 3 * i) for i in range(3)]
    for r in reqs:
        assert kv.allocate_slots(r, r.num_tokens)
    all_slots = [s for r in reqs for s in kv.slot_mapping(r.request_id, 0, r.num_tokens)]
    assert len(all_slots) == len(set(all_slots))
    assert all(0 <= s < 12 * bs for s in all_slots)


def test_kv_check_integrity_catches_block_in_two_tables():
    kv = KVCacheManager(num_blocks=6, block_size=2)
    a, b = make_request("a", 4), make_request("b", 4)
    assert kv.allocate_slots(a, 4) and kv.allocate_slots(b, 4)
    kv.check_integrity([a, b])
    kv.block_tables["b"][0] = kv.block_tables["a"][0]  # corrupt: one block owned twice
    with pytest.raises(AssertionError):
        kv.check_integrity([a, b])


def test_kv_check_integrity_catches_ref_count_drift():
    kv = KVCacheManager(num_blocks=6, block_size=2)
    a = make_request("a", 4)
    assert kv.allocate_slots(a, 4)
    kv.pool.blocks[kv.block_tables["a"][0]].ref_count += 1  # corrupt: a phantom reference
    with pytest.raises(AssertionError):
        kv.check_integrity([a])


def test_kv_check_integrity_catches_invalid_block_id():
    kv = KVCacheManager(num_blocks=4, block_size=2)
    a = make_request("a", 2)
    assert kv.allocate_slots(a, 2)
    kv.block_tables["a"].append(99)
    with pytest.raises(AssertionError):
        kv.check_integrity([a])


def test_kv_check_integrity_catches_table_too_short_for_computed_tokens():
    kv = KVCacheManager(num_blocks=4, block_size=2)
    a = make_request("a", 4)
    assert kv.allocate_slots(a, 4)
    a.num_computed_tokens = 5  # corrupt: claims KV beyond its 2 blocks
    with pytest.raises(AssertionError):
        kv.check_integrity([a])


def test_kv_check_integrity_catches_finished_request_holding_blocks():
    kv = KVCacheManager(num_blocks=4, block_size=2)
    a = make_request("a", 4)
    assert kv.allocate_slots(a, 4)
    kv.check_integrity([a])
    a.status = RequestStatus.FINISHED  # corrupt: finished without freeing
    with pytest.raises(AssertionError):
        kv.check_integrity([a])


def test_kv_check_integrity_catches_leaked_block():
    kv = KVCacheManager(num_blocks=4, block_size=2)
    a = make_request("a", 4)
    assert kv.allocate_slots(a, 4)
    kv.block_tables.pop("a")  # corrupt: table dropped without freeing -> ref counts dangle
    with pytest.raises(AssertionError):
        kv.check_integrity()
