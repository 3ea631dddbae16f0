"""Issue #24 (items 1, 2, 4): the Triton kernels (engine/kernels) run by Triton's interpreter on CPU.

The kernels against their float64 reference (max abs error <= 1e-5 in fp32) over block sizes 1, 4,
16, GQA ratios 1, 3, 4, head dims 16 and 64, contexts crossing block and tile boundaries, mixed
prefill + decode batches and 1..8 split-KV segments (the matrix covered by a few cases, not its
product: the interpreter is slow), float and int8 / fp8 caches; bad inputs refused before a
launch; and tiny-random's greedy tokens identical with attention_backend="triton" and "torch"
through chunked prefill, prefix hits and preemption (and in shorter runs with split-KV decodes
and int8 / fp8 KV caches).

TRITON_INTERPRET=1 is set at import, before anything imports engine.kernels (Triton reads it when
a kernel is defined); pytest imports every test module before running any, so this holds in
every xdist worker too.
"""
from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before engine.kernels is imported (module doc)

import pytest  # noqa: E402
import torch  # noqa: E402

from engine import LLMEngine, SamplingParams  # noqa: E402
from engine.core.trace import StepTrace  # noqa: E402
from engine.kernels import (  # noqa: E402
    INTERPRETED, TRACE_MAX_CONTEXT, paged_attention, paged_attention_reference, write_kv, write_kv_quantized,
)
from engine.model.attention import ATTENTION_BACKENDS, attention_backend  # noqa: E402
from engine.model.forward_batch import ForwardBatch, build_forward_batch  # noqa: E402
from engine.model.kv_quant import QuantizedKV, allocate, quantize  # noqa: E402
from engine.model.kv_quant import write as kv_write  # noqa: E402
from engine.model.shared import get_shared_model  # noqa: E402
from engine.model.triton_attention import TritonAttention, block_tables  # noqa: E402
from tests.conftest import run_to_completion  # noqa: E402
from tests.kernel_cases import CASES, TOL, Request, paged_case  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def test_the_kernels_run_in_the_interpreter() -> None:
    assert INTERPRETED, "engine.kernels was imported before TRITON_INTERPRET=1 was set"


# CASES (tests/kernel_cases.py): every block size, GQA ratio (1, 3, 4), head dim and 1..8 segments.
@pytest.mark.parametrize("requests,block_size,heads,kv_heads,head_dim,segments", CASES,
                         ids=[f"bs{c[1]}-gqa{c[2] // c[3]}-d{c[4]}-seg{c[5]}" for c in CASES])
def test_paged_attention_equals_the_float64_reference(requests: list[Request], block_size: int, heads: int,
                                                      kv_heads: int, head_dim: int, segments: int) -> None:
    args = paged_case(requests, block_size, heads, kv_heads, head_dim)
    ref = paged_attention_reference(*args)
    out = paged_attention(*args, num_segments=segments, block_n=16)  # tiles of 16: contexts cross them
    assert isinstance(out, torch.Tensor) and out.shape == args[0].shape and out.dtype == torch.float32
    assert (out.double() - ref).abs().max().item() <= TOL
    if segments > 1:  # split-KV and one segment agree too (the merge is exact up to rounding)
        one = paged_attention(*args, num_segments=1)  # default tiles (64)
        assert isinstance(one, torch.Tensor)
        assert (one - out).abs().max().item() <= TOL


def test_small_tiles_and_bf16() -> None:
    """KV tiles of 4 positions over blocks of 16 (tiles inside blocks, many online-softmax
    rescales); a bf16 cache and q: equal to the reference on the same bf16 values, within bf16's
    output rounding."""
    args = paged_case([(13, 6), (21, 1)], 16, 6, 2, 16, seed=3)
    out = paged_attention(*args, block_n=4)
    assert isinstance(out, torch.Tensor)
    assert (out.double() - paged_attention_reference(*args)).abs().max().item() <= TOL
    q, k, v, tables, lens, qsl, scale = paged_case([(13, 6), (21, 1)], 4, 4, 2, 16, seed=4, dtype=torch.bfloat16)
    out = paged_attention(q, k, v, tables, lens, qsl, scale, num_segments=2)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16
    ref = paged_attention_reference(q, k, v, tables, lens, qsl, scale)
    assert (out.double() - ref).abs().max().item() <= 2 ** -8 * ref.abs().max().item()


def test_trace_records_the_online_softmax() -> None:
    """trace=True: per tile, m is the running max of the scores seen so far, l the running sum
    relative to it, and the last tile's partial output is the program's output; with split-KV,
    each segment's (m, l, o) merge to the output."""
    requests = [(10, 6), (40, 1)]
    q, k, v, tables, lens, qsl, scale = args = paged_case(requests, 4, 4, 2, 16, seed=5)
    out, tr = paged_attention(*args, num_segments=2, trace=True, block_n=8)
    assert tr.segment_m is not None and tr.segment_l is not None
    assert tr.segment_out is not None
    ref = paged_attention_reference(*args)
    assert (out.double() - ref).abs().max().item() <= TOL
    # Program of request 1 (the decode, context 41): row 0 = its token, query head 0 of KV head 0.
    p = int((tr.work_seq == 1).nonzero()[0])
    count = tr.tile_count[p, 0].tolist()  # tiles per segment: 41 positions / 8 = 6 tiles, 3 + 3
    assert count == [3, 3]
    assert [len(tr.tile_positions(p, s)) for s in range(2)] == count
    assert tr.tile_positions(p, 1)[-1] == range(40, 41)
    row_token = int(qsl[1])
    assert tr.row_of(p, 0, 0) == (row_token, 0) and tr.row_of(p, 0, 1) == (row_token, 1)
    assert tr.row_of(p, 0, tr.group_pad) is None  # the block's second token: past the decode's one
    kh = k[tables[1, torch.arange(41) // 4].long(), torch.arange(41) % 4, 0].double()  # [41, d]
    scores = (q[row_token, 0].double() @ kh.T) * scale  # [41]
    for seg in range(2):
        for i in range(count[seg]):
            seen = scores[(3 * seg) * 8: (3 * seg + i + 1) * 8]  # positions this segment has seen
            m = seen.max()
            assert abs(tr.tile_m[p, 0, seg, i, 0].item() - m.item()) <= TOL
            assert abs(tr.tile_l[p, 0, seg, i, 0].item() - (seen - m).exp().sum().item()) <= 1e-4
        assert abs(tr.segment_m[seg, row_token, 0].item() - tr.tile_m[p, 0, seg, count[seg] - 1, 0].item()) == 0
    w = tr.segment_l[:, row_token, 0].double() * (tr.segment_m[:, row_token, 0].double()
                                                  - tr.segment_m[:, row_token, 0].max()).exp()
    merged = (w[:, None] * tr.segment_out[:, row_token, 0].double()).sum(0) / w.sum()
    assert (merged - ref[row_token, 0]).abs().max().item() <= TOL
    with pytest.raises(ValueError, match="trace"):
        paged_attention(*paged_case([(TRACE_MAX_CONTEXT, 1)], 16, 2, 1, 16), trace=True)


def test_write_kv_scatters_into_the_slots() -> None:
    gen = torch.Generator().manual_seed(0)
    for block_size, kv_heads, d, dtype in ((1, 1, 16, torch.float32), (4, 3, 16, torch.bfloat16),
                                           (16, 2, 64, torch.float32)):
        k_cache = torch.zeros(9, block_size, kv_heads, d, dtype=dtype)
        v_cache = torch.zeros_like(k_cache)
        slots = torch.randperm(9 * block_size, generator=gen)[:7]
        k, v = torch.randn(2, 7, kv_heads, d, generator=gen)
        write_kv(k_cache, v_cache, k, v, slots)
        want_k, want_v = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
        want_k.view(-1, kv_heads, d)[slots] = k.to(dtype)  # torch's rounding: the kernel's too
        want_v.view(-1, kv_heads, d)[slots] = v.to(dtype)
        assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)


def _bad(name: str, **change: object) -> tuple[dict[str, object], str]:
    return change, name


BAD_INPUTS = [
    _bad("q", q=torch.zeros(3, 4)),
    _bad("q", q=torch.zeros(3, 4, 16, dtype=torch.float64)),
    _bad("q", q=torch.zeros(3, 3, 16)),  # 3 heads over 2 KV heads
    _bad("k_cache", k_cache=torch.zeros(6, 4, 2, 8), v_cache=torch.zeros(6, 4, 2, 8)),  # head_dim 8 != 16
    _bad("v_cache", v_cache=torch.zeros(5, 4, 2, 16)),
    _bad("block_tables", block_tables=torch.zeros(2, 3)),  # float
    _bad("block_tables", block_tables=torch.tensor([[0, 1, 7], [2, 3, -1]], dtype=torch.int32)),  # block 7 of 6
    _bad("seq_lens", seq_lens=torch.tensor([14, 5])),  # 14 positions > 3 blocks x 4
    _bad("seq_lens", seq_lens=torch.tensor([9, 0])),  # fewer positions than new tokens
    _bad("query_start_loc", query_start_loc=torch.tensor([0, 2, 2])),
    _bad("query_start_loc", query_start_loc=torch.tensor([0, 2, 5])),  # q has 3 tokens
    _bad("scale", scale=0.0),
    _bad("num_segments", num_segments=0),
    _bad("k_scale", k_scale=torch.ones(6, 4, 2)),  # without v_scale
    _bad("k_cache", k_scale=torch.ones(6, 4, 2), v_scale=torch.ones(6, 4, 2)),  # scales for a float cache
    _bad("v_scale", k_cache=torch.zeros(6, 4, 2, 16, dtype=torch.int8), v_cache=torch.zeros(6, 4, 2, 16, dtype=torch.int8),
         k_scale=torch.ones(6, 4, 2), v_scale=torch.ones(6, 4)),
]


@pytest.mark.parametrize("change,name", BAD_INPUTS, ids=[f"{n}-{i}" for i, (_, n) in enumerate(BAD_INPUTS)])
def test_bad_inputs_are_refused_before_launch(change: dict[str, object], name: str) -> None:
    args: dict[str, object] = dict(
        q=torch.zeros(3, 4, 16), k_cache=torch.zeros(6, 4, 2, 16), v_cache=torch.zeros(6, 4, 2, 16),
        block_tables=torch.tensor([[0, 1, 2], [3, -1, -1]], dtype=torch.int32), seq_lens=torch.tensor([10, 1]),
        query_start_loc=torch.tensor([0, 2, 3]), scale=0.25)
    args.update(change)
    with pytest.raises(ValueError, match=f"^{name}:"):
        paged_attention(**args)  # type: ignore[call-overload]  # deliberately bad arguments


def test_write_kv_refuses_bad_inputs() -> None:
    cache = torch.zeros(2, 4, 1, 16)
    k = torch.zeros(3, 1, 16)
    with pytest.raises(ValueError, match="^slot_mapping:"):
        write_kv(cache, cache.clone(), k, k, torch.tensor([0, 1, 8]))
    with pytest.raises(ValueError, match="^k:"):
        write_kv(cache, cache.clone(), torch.zeros(3, 2, 16), k, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="^k_cache:.*k_scale"):  # an int8 cache without its scales
        write_kv(cache.to(torch.int8), cache.to(torch.int8), k, k, torch.tensor([0, 1, 2]))
    q8 = allocate((2, 4, 1, 16), "int8")
    assert isinstance(q8, QuantizedKV)
    with pytest.raises(ValueError, match="^k:"):  # values not quantized
        write_kv_quantized(q8.data, q8.data.clone(), q8.scale, q8.scale.clone(), k, k, torch.zeros(3, 1),
                           torch.zeros(3, 1), torch.tensor([0, 1, 2]))


def _quantized(shape: tuple[int, int, int, int], name: str) -> QuantizedKV:
    cache = allocate(shape, name)
    assert isinstance(cache, QuantizedKV)
    return cache


@pytest.mark.parametrize("name", ["int8", "fp8"])
def test_quantized_cache_write_and_attention(name: str) -> None:
    """An int8 / fp8 cache: the kernel's scatter of values quantized by kv_quant's rule is
    bit-identical to kv_quant.write; attention over data x scale equals the float64 reference."""
    gen = torch.Generator().manual_seed(1)
    shape = (11, 4, 2, 16)
    k_cache, v_cache, k_want, v_want = (_quantized(shape, name) for _ in range(4))
    slots = torch.randperm(44, generator=gen)[:40]
    k, v = 3 * torch.randn(2, 40, 2, 16, generator=gen)
    (kq, ks), (vq, vs) = quantize(k, name), quantize(v, name)
    write_kv_quantized(k_cache.data, v_cache.data, k_cache.scale, v_cache.scale, kq, vq, ks, vs, slots)
    kv_write(k_want, k, slots)
    kv_write(v_want, v, slots)
    for got, want in ((k_cache, k_want), (v_cache, v_want)):
        assert torch.equal(got.data.view(torch.uint8), want.data.view(torch.uint8))
        assert torch.equal(got.scale, want.scale)
    tables = torch.arange(11, dtype=torch.int32).expand(2, 11).contiguous()  # two requests, one table
    q = torch.randn(7, 4, 16, generator=gen)
    lens, qsl = torch.tensor([29, 43]), torch.tensor([0, 6, 7])
    out = paged_attention(q, k_cache.data, v_cache.data, tables, lens, qsl, 0.25, num_segments=3, block_n=16,
                          k_scale=k_cache.scale, v_scale=v_cache.scale)
    ref = paged_attention_reference(q, k_cache.data, v_cache.data, tables, lens, qsl, 0.25,
                                    k_scale=k_cache.scale, v_scale=v_cache.scale)
    assert isinstance(out, torch.Tensor)
    assert (out.double() - ref).abs().max().item() <= TOL


def test_triton_backend_needs_the_interpreter_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="^attention_backend: 'triton'.*TRITON_INTERPRET=1.*teaching"):
        attention_backend("triton")


def test_block_tables_from_the_forward_batch() -> None:
    """The backend's tables: block b of a request is slots[b * bs] // bs, for prefill chunks and
    for decodes (whose group rows are padded); every slot is table[p // bs] * bs + p % bs."""
    bs = 4
    tables = [[7, 2, 9], [5], [3, 8]]  # blocks per request
    lens = [10, 3, 6]  # context after the step
    slots = [[t[p // bs] * bs + p % bs for p in range(n)] for t, n in zip(tables, lens)]
    batch = build_forward_batch([[1, 2, 3], [4], [5]], [7, 2, 5], slots, [True] * 3)  # prefill, 2 decodes
    got = block_tables(batch, bs)
    assert got.tolist() == [[7, 2, 9], [5, 0, 0], [3, 8, 0]]


# -- the engine: greedy parity with the torch backend ------------------------------------------

PREFIX = list(b"You are a terse assistant for a library. ")  # tiny-random's tokenizer is bytes
QUESTIONS = [list(q) for q in (b"When do you open?", b"Renew online?", b"Lost card fee?")]


def _generate(backend: str) -> tuple[list[tuple[int, ...]], list[int], list[StepTrace]]:
    """One engine: a first request caches PREFIX's blocks, then three sharing it arrive in a pool
    too small for all of them, prefills chunked to 16 tokens per step. -> (outputs, cached
    tokens per request, traces)."""
    engine = LLMEngine(get_shared_model("tiny-random"), attention_backend=backend, block_size=4, num_blocks=20,
                       max_num_batched_tokens=16, enable_prefix_caching=True)
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    ids = [engine.add_request(PREFIX + QUESTIONS[0], params)]
    traces = run_to_completion(engine)
    ids += [engine.add_request(PREFIX + q, params) for q in QUESTIONS]
    traces += run_to_completion(engine)
    outs = [engine.get_output(r) for r in ids]
    return [tuple(o.outputs[0].token_ids) for o in outs], [o.num_cached_tokens or 0 for o in outs], traces


def test_tiny_random_greedy_equal_to_the_torch_backend() -> None:
    """Identical greedy token ids; the run went through chunked prefill, prefix hits and
    preemption (integrity checked after every step)."""
    want, want_cached, _ = _generate("torch")
    got, cached, traces = _generate("triton")
    assert got == want and cached == want_cached
    assert any(c.kind == "prefill" and c.start > 0 and not c.resumed for t in traces for c in t.scheduled), \
        "no prefill was chunked"
    assert any(n > 0 for n in cached[1:]), "no prefix hit"
    assert any(t.preempted for t in traces), "the small pool never preempted"


@pytest.mark.parametrize("variant", ["split-kv", "int8", "fp8"])
def test_tiny_random_greedy_equal_in_variants(variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Shorter runs (chunked prefill, then decodes; integrity checked after every step), tokens
    equal to the torch backend's: split-kv (KV tiles and segments of 32 tokens, so every
    decode-only step past 32 tokens is split, FlashDecoding) and int8 / fp8 KV caches (both backends quantize
    with kv_quant's rule; the kernel dequantizes per tile)."""
    kv_cache_dtype = None if variant == "split-kv" else variant  # None: the weights' dtype
    segments: list[int] = []

    class Splitting(TritonAttention):
        def num_segments(self, batch: ForwardBatch) -> int:
            segments.append(super().num_segments(batch))
            return segments[-1]

    if variant == "split-kv":
        monkeypatch.setitem(ATTENTION_BACKENDS, "triton", lambda device: Splitting(segment_tokens=32, block_n=32))

    def run(backend: str) -> list[tuple[int, ...]]:
        engine = LLMEngine(get_shared_model("tiny-random"), attention_backend=backend, block_size=4, num_blocks=40,
                           max_num_batched_tokens=16, kv_cache_dtype=kv_cache_dtype)
        params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
        ids = [engine.add_request(PREFIX + q, params) for q in QUESTIONS[:2]]
        run_to_completion(engine)
        return [tuple(engine.get_output(r).outputs[0].token_ids) for r in ids]

    assert run("triton") == run("torch")
    assert variant != "split-kv" or max(segments) >= 2, "no decode step was split"
