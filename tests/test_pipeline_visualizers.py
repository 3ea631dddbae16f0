"""visualizers/pipeline.py and the layout arithmetic behind the calculator view, on timelines a
real tiny-random engine produced with two pipeline stages (module-scoped, shut down at the end)."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from engine.core.config import EngineConfig, SamplingParams
from engine.serving.engine import LLMEngine
from engine.model.loader import TINY_RANDOM_CONFIG
from engine.parallel.layout import (ModelDims, build_layout, comm_bytes_per_token, front_heavy_split,
                                    parse_layer_split, worker_bytes)
from engine.parallel.stats import pipeline_stats
from engine.replay.run import SweepPoint
from engine.sizing import Settings, SizingError, estimate
from engine.core.trace import StepTrace
from visualizers import pipeline as pv

SMOLLM2 = ModelDims(num_layers=30, hidden=576, intermediate=1536, num_heads=9, num_kv_heads=3, head_dim=64,
                    vocab=49152, tied=True)


@pytest.fixture(scope="module")
def run() -> Iterator[tuple[LLMEngine, list[StepTrace]]]:
    """Four steps of 4 requests on p = 2, GPipe m = 2."""
    with LLMEngine("tiny-random", pipeline_parallel_size=2, num_microbatches=2, num_blocks=64, block_size=16,
                   max_num_seqs=4) as engine:
        for i in range(4):
            engine.add_request([1 + (i * 5 + j) % 90 for j in range(12)],
                               SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
        traces = [engine.step() for _ in range(4)]
        yield engine, traces


def test_gantt_draws_every_event_once_in_its_lane(run) -> None:
    engine, traces = run
    timeline = traces[0].pipeline
    assert timeline is not None
    layout = engine.snapshot().parallel
    fig = pv.gantt_figure(timeline, layout, 12, 1)
    lanes = fig.layout.meta["lanes"]
    assert lanes == ["stage 0 · tp 0 (L0–0)", "stage 1 · tp 0 (L1–1)"]
    assert list(fig.layout.yaxis.categoryarray) == lanes and fig.layout.yaxis.autorange == "reversed"
    assert fig.layout.barmode == "overlay" and all(d.type == "bar" and d.orientation == "h" for d in fig.data)
    by_name = {d.name: d for d in fig.data}
    forwards = [e for e in timeline.events if e.kind == "forward"]
    drawn = [(y, b, x) for d in fig.data if d.name.startswith("mb ") for y, b, x in zip(d.y, d.base, d.x)]
    assert sorted(drawn) == sorted((lanes[e.rank], e.start_ms, e.end_ms - e.start_ms) for e in forwards)
    assert {"mb 0", "mb 1"} <= set(by_name) and "send" in by_name
    assert len(fig.data) <= len(timeline.units) + 4  # a trace per unit and per kind, not per event
    s = pipeline_stats(timeline)
    assert fig.layout.meta["bubble"] == s.bubble_fraction and f"{s.theory_bubble:.0%}" in fig.layout.title.text
    if "idle" in by_name:  # the grey bars are exactly the uncovered parts of each lane's window
        idle = by_name["idle"]
        start = min(e.start_ms for e in forwards)
        end = max(e.end_ms for e in forwards)
        assert all(start <= b and b + x <= end + 1e-9 for b, x in zip(idle.base, idle.x))


def test_stats_frame_has_a_row_per_step_whose_shares_sum_to_one(run) -> None:
    _, traces = run
    frame = pv.stats_frame(traces)
    assert list(frame["step"]) == [t.step + 1 for t in traces]
    assert ((frame["compute"] + frame["comm"] + frame["bubble"]).round(9) == 1).all()
    assert frame["tokens"].iloc[0] == 48 and (frame["tokens"].iloc[1:] == 4).all()  # prefill, then decodes


def test_sweep_figure_puts_measured_beside_theory() -> None:
    points = [SweepPoint(m, 0.5, (2 - 1) / (m + 1), 10.0) for m in (1, 2, 4, 8)]
    fig = pv.sweep_figure(points, 2)
    theory = next(d for d in fig.data if d.name.startswith("GPipe"))
    assert list(theory.y) == pytest.approx([1 / 2, 1 / 3, 1 / 5, 1 / 9]) and list(theory.x) == [1, 2, 4, 8]
    assert list(pv.sweep_frame(points)["m"]) == [1, 2, 4, 8]


def test_worker_bytes_add_up_to_the_model() -> None:
    one = worker_bytes(build_layout(30, 9, 3, 1536, 1, 1), SMOLLM2, 4, 0)
    assert one[0].weight_bytes == 134_515_008 * 4  # SmolLM2-135M's parameter count, fp32
    four = worker_bytes(build_layout(30, 9, 3, 1536, 2, 2), SMOLLM2, 4, 1000)
    # t = 2 splits 3 KV heads 2/1: rank 0 of a stage holds twice rank 1's KV
    assert [w.kv_bytes for w in four] == [1000 * 15 * 2 * 2 * 64 * 4, 1000 * 15 * 2 * 64 * 4] * 2
    # tied head: with p > 1 the last stage holds its own copy of the embedding as the LM head
    two = worker_bytes(build_layout(30, 9, 3, 1536, 2, 1), SMOLLM2, 4, 0)
    assert sum(w.weight_bytes for w in two) == one[0].weight_bytes + 49152 * 576 * 4
    tiny = ModelDims.from_hf(TINY_RANDOM_CONFIG)
    assert tiny.num_layers == 2 and tiny.head_dim == 16 and not tiny.tied


def test_comm_bytes_and_splits() -> None:
    c = comm_bytes_per_token(576, 30, 2, 2, 4)
    assert c.pipeline == 576 * 4 and c.tensor == 30 * 2 * 576 * 4  # 2(t-1)/t = 1 for t = 2
    assert comm_bytes_per_token(576, 30, 1, 1, 4) == (0, 0)
    assert front_heavy_split(30, 2) == (20, 10) and front_heavy_split(2, 2) == (1, 1)
    assert sum(front_heavy_split(30, 4)) == 30
    assert parse_layer_split("20:10") == (20, 10)
    with pytest.raises(ValueError, match="pipeline_layer_split"):
        parse_layer_split("twenty")


def test_calculator_view_on_smollm2_layouts() -> None:
    layout = build_layout(30, 9, 3, 1536, 3, 1)
    est = estimate("smollm2-135m", "l4", settings=Settings(tp=1, pp=3))
    view = pv.calculator_view(layout, SMOLLM2, EngineConfig.from_knobs(num_blocks=256, block_size=16), est)
    assert list(view.workers["layers"]) == [10, 10, 10] and not view.refusal
    assert "roofline decode tokens/s" in list(view.calculator["figure"])
    model_rows = view.throughput[view.throughput["kind"] == "model"]
    assert model_rows["tokens/s"].iloc[1] == pytest.approx(est.decode_tokens_per_s_roofline * (1 - 2 / 3))
    with pytest.raises(SizingError, match="does not divide the 9 attention heads"):
        estimate("smollm2-135m", "l4", settings=Settings(tp=2, pp=1))  # vLLM refuses it; this engine does not
    refused = pv.calculator_view(build_layout(30, 9, 3, 1536, 1, 2), SMOLLM2,
                                 EngineConfig.from_knobs(num_blocks=1, block_size=16), None, "tp 2 does not divide")
    assert refused.calculator.empty and refused.refusal
