"""The Quantization page's activation views, from real statistics of the engine's own forward
(tiny-random) and a real SmoothQuant record; every figure is validated by Plotly."""
from __future__ import annotations

import pytest

from engine import LLM
from engine.model.activations import LINEARS
from engine.studies.evaluation import activation_stats
from engine.model.shared import calibrated_smoothing
from engine.model.smoothing import SMOOTHED_LINEARS
from tests.parity import PROMPTS
from visualizers import quant_activations as qa
from visualizers.figures import validated

TINY = "tiny-random"


@pytest.fixture(scope="module")
def stats():
    llm = LLM(TINY)
    tok = llm.llm_engine.tokenizer
    ids = [list(tok(p, add_special_tokens=False).input_ids) for p in PROMPTS[:4]]
    return activation_stats(llm, ids, threshold=0.5, histogram_linear="down")


def test_absmax_heatmap_is_layers_by_channels(stats) -> None:
    for linear in LINEARS:
        fig = validated(qa.absmax_heatmap(stats, linear))
        rows = stats.absmax_of(linear)
        z = fig.data[0].z
        assert len(z) == len(rows) and all(len(a) == len(b) for a, b in zip(z, rows))
        assert fig.data[0].customdata[0][0] == pytest.approx(rows[0][0], rel=1e-2)


def test_histogram_marks_values_beyond_the_threshold(stats) -> None:
    hist = stats.histogram
    fig = validated(qa.activation_histogram(hist, stats.threshold))
    assert sum(fig.data[0].y) == hist.num_values
    red = [n for c, n, col in zip(fig.data[0].x, fig.data[0].y, fig.data[0].marker.color) if col == qa.THRESHOLD_COLOR]
    assert all(abs(c) > stats.threshold for c, col in zip(fig.data[0].x, fig.data[0].marker.color)
               if col == qa.THRESHOLD_COLOR)
    assert f"{sum(red):,} of {hist.num_values:,} values in bins beyond" in fig.layout.title.text
    assert [s.x0 for s in fig.layout.shapes] == [-stats.threshold, stats.threshold]


def test_float_columns_count_the_outlier_channels(stats) -> None:
    frame = qa.float_columns_frame(stats)
    assert len(frame) == len(LINEARS) * len(stats.absmax_of("qkv"))
    assert int(frame["kept in float"].sum()) == len(stats.outliers) > 0
    fig = validated(qa.float_columns_figure(stats))
    assert [t.name for t in fig.data] == list(LINEARS)
    assert sum(sum(t.y) for t in fig.data) == len(stats.outliers)


def test_smoothing_views_show_the_range_moved() -> None:
    _, smoothing = calibrated_smoothing(TINY, 0.5)
    frame = qa.smoothing_frame(smoothing, threshold=0.5)
    assert len(frame) == len(smoothing.linears) and set(frame["linear"]) == set(SMOOTHED_LINEARS)
    first = smoothing.linears[0]
    assert frame.iloc[0]["act max/median before"] == pytest.approx(first.act_spread()[0])
    assert frame.iloc[0]["weight max/median after"] == pytest.approx(first.weight_spread()[1])
    assert frame.iloc[0]["channels above threshold after"] == sum(v > 0.5 for v in first.act_absmax_after)
    widest = qa.widest_layer(smoothing, "qkv")
    spreads = [e.act_spread()[0] for e in smoothing.linears if e.linear == "qkv"]
    assert spreads[widest] == max(spreads)
    fig = validated(qa.smoothing_figure(smoothing, 0, "qkv"))
    entry = smoothing.of(0, "qkv")
    assert len(fig.data) == 4 and len(fig.data[1].y) == len(entry.scales)
    assert fig.data[1].y[0] == pytest.approx(entry.act_absmax_after[0], rel=1e-2)
