"""Issue #12: decode attention without padding to the longest context.

The paged attention (prefill chunks + decode groups) must equal a straightforward per-request
reference — one attention per request over exactly the slots it owns — on random paged caches
with mixed lengths, block sizes, GQA ratios and chunk + decode mixes.
"""
from __future__ import annotations

import random

import pytest
import torch

from engine.model.attention import paged_attention, write_kv
from engine.model.forward_batch import GROUP_OVERHEAD_SLOTS, ForwardBatch, build_forward_batch, group_decodes

Request = tuple[int, int]  # (start = cached positions before the step, new tokens this step)


def _random_tables(requests: list[Request], block_size: int, rng: random.Random) -> tuple[list[list[int]], int]:
    """Disjoint, scrambled block tables -> (flat slots of every request's positions, num_blocks)."""
    needs = [-(-(start + n) // block_size) for start, n in requests]
    num_blocks = sum(needs) + 3  # a few blocks nobody owns
    blocks = list(range(num_blocks))
    rng.shuffle(blocks)
    tables, at = [], 0
    for need, (start, n) in zip(needs, requests):
        table, at = blocks[at: at + need], at + need
        tables.append([table[p // block_size] * block_size + p % block_size for p in range(start + n)])
    return tables, num_blocks


def _reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, requests: list[Request],
               tables: list[list[int]], scale: float) -> torch.Tensor:
    """One attention per request over exactly its slots, in float64, GQA by repeating K/V heads."""
    heads, d = q.shape[1], q.shape[2]
    kvh = k_cache.shape[2]
    k_flat = k_cache.reshape(-1, kvh, d).double()
    v_flat = v_cache.reshape(-1, kvh, d).double()
    out, row = [], 0
    for (start, n), slots in zip(requests, tables):
        seq_len = start + n
        idx = torch.tensor(slots[:seq_len])
        k = k_flat[idx].repeat_interleave(heads // kvh, dim=1)  # [L, H, d]
        v = v_flat[idx].repeat_interleave(heads // kvh, dim=1)
        qs = q[row: row + n].double()  # [n, H, d]
        scores = torch.einsum("nhd,lhd->hnl", qs, k) * scale  # [H, n, L]
        allowed = torch.arange(seq_len)[None, :] <= torch.arange(start, seq_len)[:, None]  # [n, L]
        probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        out.append(torch.einsum("hnl,lhd->nhd", probs, v))
        row += n
    return torch.cat(out).float()


def _case(requests: list[Request], block_size: int, heads: int, kv_heads: int, seed: int,
          head_dim: int = 16, cache_dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Fill a random paged cache, write this step's K/V, run ours and the reference."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    tables, num_blocks = _random_tables(requests, block_size, rng)
    shape = (num_blocks, block_size, kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(cache_dtype)
    v_cache = torch.randn(shape, generator=gen).to(cache_dtype)
    chunks = [[rng.randrange(100) for _ in range(n)] for _, n in requests]
    batch = build_forward_batch(chunks, [s for s, _ in requests], tables, [True] * len(requests))
    T = batch.num_tokens
    q = torch.randn(T, heads, head_dim, generator=gen)
    k_new = torch.randn(T, kv_heads, head_dim, generator=gen)
    v_new = torch.randn(T, kv_heads, head_dim, generator=gen)
    write_kv(k_cache, v_cache, k_new, v_new, batch.slot_mapping)
    scale = head_dim ** -0.5
    ours = paged_attention(q, k_cache, v_cache, batch, scale)
    return ours, _reference(q, k_cache, v_cache, requests, tables, scale)


def _random_mix(rng: random.Random, num: int, max_len: int, decode_share: float) -> list[Request]:
    requests = []
    for _ in range(num):
        start = rng.randrange(0, max_len)
        n = 1 if rng.random() < decode_share else rng.randrange(2, 24)
        requests.append((start, n))
    return requests


@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 2), (9, 3), (6, 1)])
def test_decodes_of_mixed_lengths_equal_reference(block_size: int, heads: int, kv_heads: int) -> None:
    rng = random.Random(block_size * 100 + heads * 10 + kv_heads)
    requests = [(rng.randrange(0, 60), 1) for _ in range(7)] + [(930, 1), (0, 1)]  # 1-token context too
    ours, ref = _case(requests, block_size, heads, kv_heads, seed=block_size + heads)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", range(12))
def test_random_chunk_and_decode_mixes_equal_reference(seed: int) -> None:
    rng = random.Random(seed)
    heads, kv_heads = rng.choice([(4, 4), (8, 2), (9, 3), (8, 1)])
    requests = _random_mix(rng, rng.randrange(1, 14), rng.choice([8, 64, 600]), rng.random())
    rng.shuffle(requests)
    ours, ref = _case(requests, rng.choice([1, 2, 4, 16]), heads, kv_heads, seed=seed)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("requests", [
    [(0, 1)],  # the first token of a one-token prompt
    [(41, 1)] * 8,  # equal lengths: one group, no mask (decode-only fast path)
    [(17, 1)] * 7 + [(905, 1)],  # the case: the long one in its own group
    [(0, 12), (30, 1), (5, 7), (400, 1)],  # whole-prompt prefill, chunk over a cached prefix, decodes
    [(0, 12)],  # prefill only, no decodes
])
def test_named_layouts_equal_reference(requests: list[Request]) -> None:
    ours, ref = _case(requests, block_size=4, heads=9, kv_heads=3, seed=len(requests))
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


def test_bf16_cache_equals_reference_of_the_same_cache() -> None:
    requests = [(13, 1), (200, 1), (3, 5)]
    ours, ref = _case(requests, block_size=4, heads=8, kv_heads=2, seed=3, cache_dtype=torch.bfloat16)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


# -- the grouping rule and the batch layout -----------------------------------------------

def _cost(groups: list[list[int]], lengths: list[int]) -> int:
    return sum(GROUP_OVERHEAD_SLOTS + len(g) * max(lengths[i] for i in g) for g in groups)


@pytest.mark.parametrize("seed", range(20))
def test_grouping_is_a_partition_no_worse_than_one_group_or_singletons(seed: int) -> None:
    rng = random.Random(seed)
    lengths = [rng.choice([rng.randrange(1, 64), rng.randrange(1, 2000)]) for _ in range(rng.randrange(1, 40))]
    groups = group_decodes(lengths)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    assert all(g == sorted(g) for g in groups)
    # Contiguous in length order: no group's length range straddles another's.
    spans = sorted((min(lengths[i] for i in g), max(lengths[i] for i in g)) for g in groups)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    assert _cost(groups, lengths) <= _cost([list(range(len(lengths)))], lengths)
    assert _cost(groups, lengths) <= _cost([[i] for i in range(len(lengths))], lengths)


def test_grouping_puts_one_long_context_alone_and_equal_lengths_together() -> None:
    assert group_decodes([40] * 8) == [list(range(8))]
    assert group_decodes([40, 41, 40, 910, 42, 40, 40, 40]) == [[0, 1, 2, 4, 5, 6, 7], [3]]
    assert group_decodes([]) == []


def _own_slots(batch: ForwardBatch) -> dict[int, list[int]]:
    """Decode row -> the slots its group gives it, unpadded by the mask."""
    seen = {}
    for g in batch.decode_groups:
        slots = g.slots.view(g.num_rows, g.width)
        for i, row in enumerate(g.rows.tolist()):
            keep = g.mask[i, 0, 0] if g.mask is not None else torch.ones(g.width, dtype=torch.bool)
            assert set(slots[i, ~keep].tolist()) <= {slots[i, keep][-1].item()}  # pads repeat its own last
            seen[row] = slots[i, keep].tolist()
    return seen


def test_each_decode_row_gets_exactly_its_own_slots_once() -> None:
    rng = random.Random(5)
    requests = [(rng.randrange(0, 50), 1) for _ in range(6)] + [(3, 6), (980, 1), (0, 1)]
    tables, _ = _random_tables(requests, 4, rng)
    batch = build_forward_batch([[1] * n for _, n in requests], [s for s, _ in requests], tables,
                                [True] * len(requests))
    rows = [batch.query_start_loc[i] for i, (_, n) in enumerate(requests) if n == 1]
    own = _own_slots(batch)
    assert sorted(own) == sorted(batch.decode_rows.tolist()) == rows
    for i, (start, n) in enumerate(requests):
        if n == 1:
            assert own[batch.query_start_loc[i]] == tables[i][: start + 1]
    widths = sorted(g.width for g in batch.decode_groups)
    assert widths[-1] == 981 and widths[0] < 100  # the long one did not widen the short ones


def test_decode_grouping_off_is_one_padded_group_with_the_same_greedy_tokens() -> None:
    """EngineConfig.decode_grouping=False (what the audit's ablation measures): every decode in one
    group padded to the longest context; the outputs do not change, only the work."""
    from engine.core.config import SamplingParams
    from engine.model.forward_batch import ONE_GROUP_OVERHEAD
    from engine.serving.engine import LLMEngine
    from tests.conftest import run_to_completion

    rng = random.Random(3)
    requests = [(2, 1), (40, 1), (300, 1)]
    tables, _ = _random_tables(requests, 16, rng)
    chunks = [[1] * n for _, n in requests]
    grouped = build_forward_batch(chunks, [s for s, _ in requests], tables, [1, 1, 1])
    padded = build_forward_batch(chunks, [s for s, _ in requests], tables, [1, 1, 1], ONE_GROUP_OVERHEAD)
    assert len(grouped.decode_groups) > 1 and len(padded.decode_groups) == 1
    assert padded.decode_groups[0].width == 301

    outputs = []
    for grouping in (True, False):
        with LLMEngine("tiny-random", num_blocks=64, block_size=4, decode_grouping=grouping) as engine:
            for i, n in enumerate((3, 17, 45)):
                engine.add_request([5 + i] * n, SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
            traces = run_to_completion(engine)
            outputs.append(sorted((r.request_id, tuple(r.output_token_ids)) for r in engine.requests.values()))
            assert traces
    assert outputs[0] == outputs[1]
