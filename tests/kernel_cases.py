"""Paged-attention test cases shared by the interpreter tests (tests/test_kernels.py) and the
compiled-kernel tests on a GPU (tests/test_cuda.py). Torch only: importing this never imports
engine.kernels, so it leaves Triton's interpreter setting to the test module."""
from __future__ import annotations

import random

import torch

TOL = 1e-5
Request = tuple[int, int]  # (cached positions before the step, new tokens this step)


def paged_case(requests: list[Request], block_size: int, heads: int, kv_heads: int, head_dim: int,
               seed: int = 0, dtype: torch.dtype = torch.float32
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                           float]:
    """Random q and paged caches with scrambled, disjoint block tables (padded with -1, which the
    kernel never reads) -> (q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale)."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    needs = [-(-(start + n) // block_size) for start, n in requests]
    num_blocks = sum(needs) + 2  # blocks nobody owns
    order = list(range(num_blocks))
    rng.shuffle(order)
    tables = torch.full((len(requests), max(needs) + 1), -1, dtype=torch.int32)
    at = 0
    for i, need in enumerate(needs):
        tables[i, :need] = torch.tensor(order[at: at + need])
        at += need
    shape = (num_blocks, block_size, kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    tokens = sum(n for _, n in requests)
    q = torch.randn(tokens, heads, head_dim, generator=gen).to(dtype)
    qsl = torch.tensor([0] + [sum(n for _, n in requests[: i + 1]) for i in range(len(requests))])
    seq_lens = torch.tensor([start + n for start, n in requests])
    return q, k_cache, v_cache, tables, seq_lens, qsl, head_dim ** -0.5


# (requests, block_size, heads, kv_heads, head_dim, num_segments): every block size, GQA ratio
# (1, 3, 4), head dim and 1..8 segments appears; every case crosses block boundaries and mixes
# a prefill chunk over a cached prefix with decodes.
CASES = [
    ([(0, 7), (9, 1), (33, 1)], 1, 4, 4, 16, 1),
    ([(5, 12), (17, 1), (2, 1), (40, 3)], 4, 3, 1, 16, 3),
    ([(0, 20), (35, 1)], 16, 4, 1, 64, 8),
    ([(20, 9), (3, 1), (60, 1)], 4, 4, 1, 16, 2),
    ([(30, 1), (47, 1), (16, 1)], 16, 12, 4, 16, 5),
]
