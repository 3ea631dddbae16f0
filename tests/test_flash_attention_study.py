"""The FlashAttention page's study (engine/studies/flash_attention.py) and views
(visualizers/flash_attention.py), on small records: random tensors in a scrambled paged cache,
one tiny-random step, hand-computed traffic numbers.

TRITON_INTERPRET=1 is set at import, before anything imports engine.kernels (tests/test_kernels.py).
"""
from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before engine.kernels is imported

import math  # noqa: E402
from dataclasses import replace  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from engine import LLMEngine, SamplingParams  # noqa: E402
from engine.core.config import EngineConfig  # noqa: E402
from engine.studies.flash_attention import (  # noqa: E402
    MAX_TRACE_TILES, TRACE_CONTEXT, Candidate, FlashStudy, LayerTensors, Traffic, candidates, estimated_tiles,
    flash_study, layer_tensors, live_cache_difference, preset_traffic, traceable_width,
)
from visualizers import flash_attention as fv  # noqa: E402
from visualizers.figures import validated  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_single_thread")

TOL = 1e-5
NUM_BLOCKS = 12
BLOCK_SIZE = 4
TABLE = (7, 2, 10, 0, 5, 9)  # scrambled physical blocks: positions 0..23


def _tensors(seq_len: int, heads: int = 4, kv_heads: int = 2, d: int = 16, seed: int = 0) -> LayerTensors:
    g = torch.Generator().manual_seed(seed)
    return LayerTensors(torch.randn(seq_len, heads, d, generator=g), torch.randn(seq_len, kv_heads, d, generator=g),
                        torch.randn(seq_len, kv_heads, d, generator=g), d ** -0.5)


def _study(start: int, n: int, segments: int = 1, head: int = 3, block_n: int = 4) -> tuple[FlashStudy, LayerTensors]:
    tensors = _tensors(start + n)
    cand = Candidate("r1", "decode" if n == 1 else "prefill", start, n, TABLE, tuple(range(start + n)))
    return flash_study(cand, tensors, NUM_BLOCKS, BLOCK_SIZE, 0, head, 5, num_segments=segments,
                       block_n=block_n), tensors


def _softmax_out(tensors: LayerTensors, start: int, n: int, head: int, group: int = 2) -> torch.Tensor:
    """softmax(q·kᵀ·scale)·V in float64 for query positions start .. start + n - 1 of ``head``."""
    q = tensors.q[start:start + n, head].double()
    k, v = tensors.k[:, head // group].double(), tensors.v[:, head // group].double()
    s = q @ k.T * tensors.scale
    mask = torch.arange(start + n)[None, :] > torch.arange(start, start + n)[:, None]
    return s.masked_fill(mask, float("-inf")).softmax(-1) @ v


# -- the study -------------------------------------------------------------------------------

def test_a_prefill_chunk_after_a_cached_prefix_matches_the_float64_softmax() -> None:
    """A chunk of 9 tokens after 10 cached positions (block and tile boundaries crossed): the
    kernel's output, last m and last l per row equal the float64 ones; every row's tiles cover
    exactly the positions its query block may see, in visiting order."""
    study, tensors = _study(10, 9)
    ref = _softmax_out(tensors, 10, 9, 3)
    assert torch.allclose(torch.tensor(study.out, dtype=torch.float64), ref, atol=TOL)
    assert study.max_abs_diff <= TOL and study.group_max_abs_diff <= TOL
    assert study.block_m == 8 and study.block_n == 4 and study.group == 2 and study.kv_head == 1
    assert [t.order for t in study.tiles] == list(range(len(study.tiles)))
    for i, tile in study.final_tiles().items():
        for j, row in enumerate(tile.rows):
            assert tile.m[j] == pytest.approx(study.ref_m[row], abs=TOL)
            assert tile.l[j] == pytest.approx(study.ref_l[row], rel=TOL)
    for block in {t.query_block for t in study.tiles}:
        tiles = [t for t in study.tiles if t.query_block == block]
        last_pos = 10 + tiles[0].rows[-1]
        assert tiles[0].positions[0] == 0 and tiles[-1].positions[1] == last_pos + 1
        assert all(a.positions[1] == b.positions[0] for a, b in zip(tiles, tiles[1:]))
    # the running sum after the first tile of block 0's first row: exactly its visible scores there
    first = study.tiles[0]
    s = study.scores[0][first.positions[0]:first.positions[1]]
    assert first.l[0] == pytest.approx(sum(math.exp(x - max(s)) for x in s), rel=TOL)
    assert first.alpha[0] == 0.0  # nothing summed before: exp(-inf)


def test_a_split_decode_merges_to_the_unsplit_output() -> None:
    study, tensors = _study(22, 1, segments=4)
    assert len(study.segments) == 4 and study.merged_vs_unsplit is not None and study.merged_vs_unsplit <= TOL
    assert study.unsplit is not None
    ref = _softmax_out(tensors, 22, 1, 3)[0]
    assert torch.allclose(torch.tensor(study.out[0], dtype=torch.float64), ref, atol=TOL)
    # the merge from the segments' own (m, l, o): sum w_s o_s / sum w_s
    big_m = max(s.m for s in study.segments if s.l > 0)
    w = [s.l * math.exp(s.m - big_m) if s.l > 0 else 0.0 for s in study.segments]
    merged = [sum(wi * s.out[i] for wi, s in zip(w, study.segments)) / sum(w) for i in range(study.head_dim)]
    assert max(abs(a - b) for a, b in zip(merged, study.out[0])) <= TOL
    # segments tile the context in order: 23 positions, 6 tiles of 4 -> 2 tiles per segment
    assert [s.positions for s in study.segments] == [(0, 8), (8, 16), (16, 23), (23, 23)]
    frame = fv.segments_frame(study)
    assert list(frame["positions"]) == ["0–7", "8–15", "16–22", "empty"]
    assert frame["w_s = l_s·exp(m_s − M)"].iloc[-1] == 0.0 and frame["m_s"].iloc[-1] == float("-inf")
    text = fv.merge_markdown(study)
    assert f"{study.out[0][0]:.6f}" in text and f"{study.merged_vs_unsplit:.2e}" in text


def test_the_tile_estimate_is_the_kernels_count_and_bounds_the_trace() -> None:
    prefill, _ = _study(10, 9)
    decode, _ = _study(22, 1, segments=4)
    assert estimated_tiles(10, 9, 2, 4) == len(prefill.tiles)
    assert estimated_tiles(22, 1, 2, 4) == len(decode.tiles) == 6  # split-KV cuts the same tiles
    # a 500-token prompt: tiles of 4 would be ~4,000 (half a minute in the interpreter)
    assert estimated_tiles(0, 500, 2, 4) > MAX_TRACE_TILES
    width = traceable_width(0, 500, 2, 4)
    assert estimated_tiles(0, 500, 2, width) <= MAX_TRACE_TILES < estimated_tiles(0, 500, 2, width // 2)
    assert traceable_width(10, 9, 2, 4) == 4 and traceable_width(0, 500, 2, 64) == 64


def test_bad_arguments_are_refused() -> None:
    tensors = _tensors(5)
    cand = Candidate("r", "prefill", 0, 5, TABLE, tuple(range(5)))
    for kwargs, word in (({"query_head": 4}, "query_head"), ({"block_n": 3}, "block_n"),
                         ({"num_segments": 9}, "num_segments"), ({"num_segments": 2}, "split-KV")):
        args = {"query_head": 0, "block_n": 4, "num_segments": 1, **kwargs}
        with pytest.raises(ValueError, match=word):
            flash_study(cand, tensors, NUM_BLOCKS, BLOCK_SIZE, 0, args["query_head"], 1,
                        num_segments=args["num_segments"], block_n=args["block_n"])


def test_layer_tensors_are_what_the_engine_caches(tiny) -> None:
    """The recomputed K/V of every position equal the live engine's cache after a chunked
    prefill and a decode (the engine computed them in two chunks; the study in one)."""
    config = EngineConfig.from_knobs(block_size=4, num_blocks=32, max_num_batched_tokens=8, max_num_seqs=2)
    engine = LLMEngine(tiny, config=config)
    engine.add_request(list(range(1, 14)), SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    for _ in range(3):
        trace = engine.step()
    snap = engine.snapshot()
    cands, notes = candidates(snap, trace)
    assert len(cands) == 1 and not notes and cands[0].kind == "decode" and cands[0].seq_len == 14
    cand = cands[0]
    assert cand.token_ids[:13] == tuple(range(1, 14))
    model = engine.runner.model
    for layer in range(2):
        tensors = layer_tensors(model, cand.token_ids, layer, 4, "float32")
        assert tensors.q.shape == (14, 4, 16) and tensors.k.shape == (14, 2, 16)
        assert live_cache_difference(engine.runner.kv_caches[layer], cand.block_table, 4, tensors) <= TOL
    with pytest.raises(ValueError, match="layer"):
        layer_tensors(model, cand.token_ids, 2, 4, "float32")
    # a context past the trace's bound is left out with a note, not cut
    long = replace(trace, scheduled=(replace(trace.scheduled[0], start=TRACE_CONTEXT),))
    assert candidates(snap, long) == ([], [f"{cand.request_id}: only 14 of the {TRACE_CONTEXT + 1} positions this "
                                           "step computed were kept (rejected drafts)"])
    bigger = replace(snap, requests=tuple(replace(r, num_computed_tokens=TRACE_CONTEXT + 1) for r in snap.requests))
    cands, notes = candidates(bigger, long)
    assert not cands and "over the 512" in notes[0]


# -- memory traffic ---------------------------------------------------------------------------

def test_traffic_follows_the_formula_by_hand() -> None:
    # tiny-random decode at context 49, fp32: H 4, KVH 2, d 16
    t = Traffic("step", 4, 2, 16, 4, 49, 1, 8, 2)
    assert (t.q_bytes, t.kv_bytes, t.s_bytes) == (4 * 1 * 4 * 16, 2 * 4 * 49 * 2 * 16, 4 * 4 * 1 * 49)
    assert t.naive == 512 + 12_544 + 4 * 784 == 16_192
    assert t.tiled == 512 + 12_544 == 13_056
    # Llama-3-8B (calculator preset: 32 heads, 8 KV heads, head_dim 128, bf16) at 32k
    d = preset_traffic("llama-3-8b", 32768, 1)
    assert (d.heads, d.kv_heads, d.head_dim, d.dtype_bytes, d.layers) == (32, 8, 128, 2, 32)
    assert d.naive == 16_384 + 134_217_728 + 4 * 2_097_152 and d.tiled == 16_384 + 134_217_728
    p = preset_traffic("llama-3-8b", 32768, 32768, block_m=128)
    assert p.passes == 256 and p.tiled == 2 * 2 * 32768 * 32 * 128 + 134_217_728 * 256
    assert p.naive == 2 * 2 * 32768 * 32 * 128 + 134_217_728 + 4 * 2 * 32 * 32768 * 32768
    text = fv.traffic_markdown(t)
    assert "16,192 B" in text and "13,056 B" in text
    frame = fv.traffic_frame([t, d]).set_index("quantity")
    assert list(frame.columns) == ["step", "Llama-3-8B"]
    assert frame.loc["naive / tiled"].tolist() == [f"{16_192 / 13_056:.2f}", f"{d.naive / d.tiled:.2f}"]
    assert frame.loc["K + V", "Llama-3-8B"] == "128.0 MiB" and frame.loc["N (context)", "Llama-3-8B"] == "32,768"
    with pytest.raises(ValueError, match="query_tokens"):
        preset_traffic("llama-3-8b", 10, 11)


# -- the views --------------------------------------------------------------------------------

def test_views_draw_the_tiles_and_the_tables() -> None:
    study, _ = _study(10, 9)
    focus = study.tiles[2]
    fig = validated(fv.score_figure(study, focus.order, 12))
    spec = fig.to_dict()
    rects = spec["layout"]["shapes"]
    assert len(rects) == len(study.tiles) and spec["layout"]["meta"]["step"] == 5
    assert [r["line"]["color"] for r in rects].count(fv.FOCUS_COLOR) == 1
    assert [a["text"] for a in spec["layout"]["annotations"]] == [str(t.order) for t in study.tiles]
    z = spec["data"][0]["z"]
    assert z[0][11] is None and z[0][10] is not None  # query position 10 sees keys 0..10 only
    frame = fv.tile_frame(study, focus)
    assert list(frame["query position"]) == [10 + r for r in focus.rows]
    assert list(frame["m (running max)"]) == list(focus.m)
    validated(fv.partial_output_figure(study, focus, 12))
    validated(fv.running_figure(study, 8, 12))
    final = fv.final_frame(study)
    assert (final["kernel m"] - final["float64 m"]).abs().max() <= TOL
    assert final["max |out − reference|"].max() <= TOL
    assert len(fv.output_frame(study)) == 16
    assert fv.segments_frame(study).empty and fv.merge_markdown(study) == ""
    assert fv.fmt_bytes(1536) == "1.5 KiB" and fv.fmt_bytes(100) == "100 B"
    # past MAX_OUTLINED tiles only the selected tile's query block is outlined
    many = replace(study, tiles=tuple(replace(t, order=i) for i, t in
                                      enumerate(study.tiles * (fv.MAX_OUTLINED // len(study.tiles) + 1))))
    spec = fv.score_figure(many, 0, 12).to_dict()["layout"]
    assert len(spec["shapes"]) == sum(1 for t in many.tiles if t.query_block == many.tiles[0].query_block)
    assert "outlined: the selected tile's query block" in spec["title"]["text"]


def test_summary_escapes_the_request_id() -> None:
    study, _ = _study(10, 1)
    odd = replace(study, request_id="*[x](http://e)*")
    text = fv.summary_markdown(odd)
    assert "\\*" in text and "\\[" in text and "decode of 1 token(s)" in text
