"""Weight-quantization inspection (engine/studies/quant_inspect.py) and its views
(visualizers/quant_weights.py), checked on real weights: tiny-random for every path (all its
input dimensions, 64 and 128, are multiples of 32, so int4 g32 runs on it), one SmolLM2 case.

What is checked: both whole-matrix histograms count every weight once; every dequantized value
of the detail row / group is one of its grid levels; int8 |err| <= scale/2; nothing clips under
absmax scaling, and a group that does clip is counted; the error grid is engine.quantization's
own QuantError for each matrix and table; bad input is a ValueError naming the field; the
figures hold the record's numbers.
"""
from __future__ import annotations

import json
import math
from functools import lru_cache

import plotly.graph_objects as go
import pytest
import torch

from engine.model.loader import load_model
from engine.studies.quant_inspect import (MATRICES, ErrorGrid, WeightInspection, error_grid, fp8_grid, inspect_weight,
                                  weight_name)
from engine.model.quantization import QuantConfig, quantize_fp8, quantize_int4, quantize_int8, quantize_table
from visualizers import quant_weights as qw
from visualizers.figures import validated

SCHEMES = ["int8", "int4", "fp8", "w8a8"]
EPS = 1e-6


@lru_cache(maxsize=2)
def _weights(name: str) -> dict[str, torch.Tensor]:
    return load_model(name, progress=lambda *a, **k: None).weights


def tiny() -> dict[str, torch.Tensor]:
    return _weights("tiny-random")


def check(fig: go.Figure) -> go.Figure:
    validated(fig)
    json.loads(fig.to_json())
    return fig


def by_name(fig: go.Figure, name: str) -> go.Scatter:
    found = [t for t in fig.data if t.name == name]
    assert len(found) == 1, [t.name for t in fig.data]
    return found[0]


# -- records ------------------------------------------------------------------------------

@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("matrix", ["k_proj", "down_proj"])
def test_histograms_count_every_weight_on_shared_edges(scheme: str, matrix: str) -> None:
    ins = inspect_weight(tiny(), scheme, 1, matrix, bins=40)
    n, k = tiny()[weight_name(1, matrix)].shape
    assert ins.shape == (n, k)
    assert ins.original.edges == ins.dequantized.edges and len(ins.original.edges) == 41
    assert ins.original.total == ins.dequantized.total == n * k
    w = tiny()[weight_name(1, matrix)]
    assert ins.original.edges[0] <= float(w.min()) and float(w.max()) <= ins.original.edges[-1]
    assert ins.scales.total == (n * k // 32 if scheme == "int4" else n)
    assert ins.scheme == ("int8" if scheme == "w8a8" else scheme) and ins.mode == scheme
    assert ins.group_size == (32 if scheme == "int4" else None)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("row", [None, 0, 5])
def test_dequantized_values_lie_on_the_detail_grid(scheme: str, row: int | None) -> None:
    ins = inspect_weight(tiny(), scheme, 0, "gate_proj", row=row)
    d = ins.detail
    assert set(d.dequantized) <= set(d.grid)
    assert list(d.grid) == sorted(set(d.grid))
    assert len(d.grid) == {"int8": 255, "w8a8": 255, "int4": 16, "fp8": 253}[scheme]
    w = tiny()[weight_name(0, "gate_proj")]
    start, end = d.columns
    assert d.original == tuple(w[d.row, start:end].tolist())
    assert end - start == (32 if scheme == "int4" else w.shape[1])
    if row is not None:
        assert d.index == row
    else:  # the largest scale
        scales = (quantize_int4(w, 32).scales[..., 0].float().t().reshape(-1) if scheme == "int4"
                  else (quantize_fp8(w) if scheme == "fp8" else quantize_int8(w)).scales.float())
        assert d.scale == float(scales.max())
    assert d.grid[0] <= min(d.original) and max(d.original) <= d.grid[-1] or scheme == "int4"


def test_int8_error_within_half_a_step_and_nothing_clips() -> None:
    for layer in (0, 1):
        for m in MATRICES:
            ins = inspect_weight(tiny(), "int8", layer, m)
            d = ins.detail
            assert max(abs(a - b) for a, b in zip(d.original, d.dequantized)) <= d.scale / 2 + EPS
            assert ins.error_bound_ratio <= 1 + 1e-5
            assert ins.num_clipped == 0 and d.num_clipped == 0
            assert d.grid[-1] == pytest.approx(127 * d.scale) and d.grid[0] == pytest.approx(-127 * d.scale)


@pytest.mark.parametrize("scheme", ["int4", "fp8"])
def test_int4_and_fp8_within_their_bounds_and_nothing_clips(scheme: str) -> None:
    for m in MATRICES:
        ins = inspect_weight(tiny(), scheme, 1, m)
        assert ins.error_bound_ratio <= 1 + 1e-5, m
        assert ins.num_clipped == 0 and ins.detail.num_clipped == 0


def test_clipping_is_counted_not_assumed() -> None:
    """A constant group whose value bf16 cannot hold: its scale is the floor, the bf16 zero point
    misses the value by far more than half a step, so the clamp moves every code of it."""
    w = {weight_name(0, m): 0.02 * torch.randn(64, 64, generator=torch.Generator().manual_seed(1)) for m in MATRICES}
    w[weight_name(0, "q_proj")][3, 32:64] = 0.1234567
    ins = inspect_weight(w, "int4", 0, "q_proj", row=3 * 2 + 1)
    assert ins.num_clipped == 32 and ins.detail.num_clipped == 32
    assert set(ins.detail.dequantized) <= set(ins.detail.grid)
    assert ins.error_bound_ratio <= 1 + 1e-5  # within 2^-9 |zero|: the clamp lands on the nearest level anyway


def test_fp8_grid_is_every_finite_e4m3_value() -> None:
    g = fp8_grid()
    assert g.numel() == 253 and float(g.max()) == 448.0 and float(g.min()) == -448.0
    steps = torch.diff(g[g >= 0])
    assert float(steps.min()) == 2.0 ** -9 and float(steps.max()) == 32.0  # subnormal spacing .. top binade
    ins = inspect_weight(tiny(), "fp8", 0, "up_proj")
    gaps = torch.diff(torch.tensor(ins.detail.grid))
    assert float(gaps.max()) > 1000 * float(gaps.min())  # non-uniform, as drawn


@pytest.mark.parametrize("scheme", SCHEMES)
def test_error_grid_is_the_quantizers_error(scheme: str) -> None:
    calls: list[tuple[int, int]] = []
    grid = error_grid(tiny(), scheme, progress=lambda done, total: calls.append((done, total)))
    assert grid.layers == (0, 1) and grid.matrices == MATRICES
    fmt = "int8" if scheme == "w8a8" else scheme
    for i in grid.layers:
        for j, m in enumerate(MATRICES):
            w = tiny()[weight_name(i, m)]
            q = quantize_int4(w, 32) if fmt == "int4" else (quantize_fp8(w) if fmt == "fp8" else quantize_int8(w))
            assert grid.relative[i][j] == q.error.relative_frobenius
            assert grid.max_abs[i][j] == q.error.max_abs
    assert grid.tables == ("model.embed_tokens.weight", "lm_head.weight")  # tiny-random is untied
    for name, rel in zip(grid.tables, grid.table_relative):
        assert rel == quantize_table(tiny()[name], QuantConfig(scheme)).error.relative_frobenius
    assert grid.table_scheme == ("fp8" if scheme == "fp8" else "int8")
    assert grid.table_error == grid.table_relative[0]
    assert calls == [(d, 2 * 7 + 2) for d in range(1, 17)]
    ins = inspect_weight(tiny(), scheme, 1, "o_proj")
    assert ins.error == QuantError_of(grid, 1, "o_proj")


def QuantError_of(grid: ErrorGrid, layer: int, matrix: str) -> object:
    from engine.model.quantization import QuantError

    j = grid.matrices.index(matrix)
    return QuantError(grid.relative[layer][j], grid.max_abs[layer][j])


@pytest.mark.parametrize("kwargs, field", [
    (dict(scheme="int3"), "scheme"), (dict(scheme=None), "scheme"),
    (dict(layer=2), "layer"), (dict(layer=-1), "layer"), (dict(layer="0"), "layer"), (dict(layer=True), "layer"),
    (dict(matrix="qkv_proj"), "matrix"), (dict(matrix="embed_tokens"), "matrix"),
    (dict(scheme="int4", group_size=48), "group_size"), (dict(scheme="int4", group_size=128, matrix="q_proj"), "group_size"),
    (dict(scheme="int4", group_size=32.0), "group_size"),
    (dict(bins=0), "bins"), (dict(bins=10**6), "bins"), (dict(bins=2.5), "bins"),
    (dict(row=64), "row"), (dict(row=-1), "row"), (dict(scheme="int4", row=128 * 2), "row"), (dict(row="1"), "row"),
])
def test_bad_input_names_the_field(kwargs: dict, field: str) -> None:
    args = dict(scheme="int8", layer=0, matrix="down_proj", group_size=32, row=None, bins=80) | kwargs
    with pytest.raises(ValueError, match=f"^{field}: "):
        inspect_weight(tiny(), **args)  # type: ignore[arg-type]


def test_error_grid_bad_input() -> None:
    with pytest.raises(ValueError, match="^scheme: "):
        error_grid(tiny(), "nf4")
    with pytest.raises(ValueError, match="^group_size: "):
        error_grid(tiny(), "int4", group_size=128)  # down_proj's K is 128, the others' 64
    w = dict(tiny())
    del w[weight_name(1, "v_proj")]
    with pytest.raises(ValueError, match="^matrix: .*layers.1.self_attn.v_proj"):
        error_grid(w, "int8")
    assert error_grid(tiny(), "int8", group_size=128).group_size is None  # only int4 uses it


# -- figures ------------------------------------------------------------------------------

@pytest.mark.parametrize("scheme", SCHEMES)
def test_histogram_figure_holds_the_record(scheme: str) -> None:
    ins = inspect_weight(tiny(), scheme, 1, "down_proj", bins=30)
    fig = check(qw.histogram_figure(ins, font_size=14))
    orig, deq = by_name(fig, "original"), by_name(fig, "dequantized")
    assert sum(orig.y) == sum(deq.y) == 64 * 128 and len(orig.x) == 30
    d = ins.detail
    levels = by_name(fig, f"grid levels ({len(d.grid)})")
    assert [x for x in levels.x if x is not None] == [g for g in d.grid for _ in (0, 1)]
    assert list(by_name(fig, "original values").x) == list(d.original)
    landed = by_name(fig, "dequantized values")
    assert set(landed.x) <= set(d.grid) and sum(landed.customdata) == len(d.original)
    assert scheme in fig.layout.title.text and "layer 1" in fig.layout.title.text and "down_proj" in fig.layout.title.text
    assert f"{ins.error.relative_frobenius:.2%}" in fig.layout.title.text
    assert fig.layout.font.size == 14 and fig.layout.yaxis.type == "log"
    assert check(qw.histogram_figure(ins, 12, log_y=False)).layout.yaxis.type == "linear"


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_scales_figure_counts_every_scale(scheme: str) -> None:
    ins = inspect_weight(tiny(), scheme, 0, "up_proj", bins=20)
    fig = check(qw.scales_figure(ins, font_size=12))
    assert sum(by_name(fig, "scales").y) == (128 * 64 // 32 if scheme == "int4" else 128)
    assert ("group of 32" in fig.layout.title.text) == (scheme == "int4")


def test_error_heatmap_and_frame() -> None:
    grid = error_grid(tiny(), "int4", group_size=64)
    fig = check(qw.error_heatmap(grid, font_size=12))
    (hm,) = fig.data
    assert [list(r) for r in hm.z] == [list(r) for r in grid.relative]
    assert list(hm.x) == list(MATRICES) and list(hm.y) == [0, 1]
    assert hm.customdata[1][6][0] == f"{grid.relative[1][6]:.3%}"
    assert "int4 g64" in fig.layout.title.text and f"{grid.table_error:.2%}" in fig.layout.title.text
    ins = inspect_weight(tiny(), "w8a8", 1, "q_proj")
    frame = qw.inspection_frame(ins)
    assert list(frame.columns) == qw.FRAME_COLUMNS and len(frame) == 1
    row = frame.iloc[0]
    assert row["scheme"] == "w8a8" and row["weight format"] == "int8" and row["bits"] == 8
    assert row["shape"] == "64 x 64" and row["clipped"] == 0
    assert row["relative error"] == ins.error.relative_frobenius
    assert isinstance(ins, WeightInspection)


# -- SmolLM2, once ------------------------------------------------------------------------

@pytest.mark.slow
def test_smollm2_int4_error_grid() -> None:
    """30 layers x 7 matrices, every error finite and in (0, 1). SmolLM2 ships as a Q4_1 GGUF
    (groups of 32 along K with a scale and a minimum), so int4 g32 nearly re-finds its grid:
    the errors are small, from the bf16 rounding of scale and zero point."""
    grid = error_grid(_weights("smollm2-135m"), "int4", group_size=32)
    assert len(grid.relative) == 30 and all(len(r) == 7 for r in grid.relative)
    flat = [v for r in grid.relative for v in r]
    assert all(math.isfinite(v) and 0 < v < 1 for v in flat)
    assert grid.tables == ("model.embed_tokens.weight",)  # tied
    assert grid.table_error is not None and 0 < grid.table_error < 1
