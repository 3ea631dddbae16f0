"""Issue #11, the pieces of pipeline / tensor parallelism that need no worker process: the
layout (layer ranges, head and column shards), the new EngineConfig knobs, the micro-batch
split, the batch-queue scheduler, and the bubble fraction measured on hand-built timelines."""
from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.config import EngineConfig, SamplingParams
from engine.parallel.layout import build_layout, even_ranges, stage_layouts, tensor_shards, theory_bubble
from engine.parallel.stats import merge_timelines, pipeline_stats
from engine.core.request import Request
from engine.core.scheduler import ScheduledRequest, SchedulerOutput
from engine.core.trace import PipelineTimeline, PipelineUnit, StageLayout, TensorShard, WorkEvent
from tests.test_scheduler_properties import CI, ControlPlane, admissible, knobs, specs

# -- parallel_layout -----------------------------------------------------------------------


@pytest.mark.parametrize("n,k", [(30, 1), (30, 2), (30, 4), (2, 2), (7, 3), (5, 5)])
def test_even_ranges_are_contiguous_and_differ_by_at_most_one(n: int, k: int) -> None:
    ranges = even_ranges(n, k)
    assert len(ranges) == k and ranges[0][0] == 0 and ranges[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    sizes = [b - a for a, b in ranges]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_stage_layouts_even_and_given_split() -> None:
    assert stage_layouts(30, 4) == (StageLayout(0, 0, 8), StageLayout(1, 8, 16), StageLayout(2, 16, 23),
                                    StageLayout(3, 23, 30))
    assert stage_layouts(30, 2, (20, 10)) == (StageLayout(0, 0, 20), StageLayout(1, 20, 30))
    assert stage_layouts(2, 1) == (StageLayout(0, 0, 2),)


@pytest.mark.parametrize("split", [(10, 10), (15, 15, 0), (31, -1), (29,), (0, 30)])
def test_a_split_that_does_not_fit_names_pipeline_layer_split(split: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="pipeline_layer_split"):
        stage_layouts(30, 2, split)


def test_more_stages_than_layers_names_pipeline_parallel_size() -> None:
    with pytest.raises(ValueError, match="pipeline_parallel_size"):
        stage_layouts(2, 3)


def test_smollm2_heads_split_two_ways_keep_the_gqa_ratio() -> None:
    # 9 q heads / 3 KV heads (3 q per KV), MLP 1536: t = 2 -> KV 2 / 1, q 6 / 3.
    assert tensor_shards(9, 3, 1536, 2) == (TensorShard(0, 0, 6, 0, 2, 0, 768), TensorShard(1, 6, 9, 2, 3, 768, 1536))
    assert [(s.kv_start, s.kv_end) for s in tensor_shards(9, 3, 1536, 3)] == [(0, 1), (1, 2), (2, 3)]


def test_kv_heads_are_replicated_when_t_exceeds_them() -> None:
    # tiny-random: 4 q heads / 2 KV heads; t = 4 -> each KV head on 2 ranks, one q head each.
    shards = tensor_shards(4, 2, 128, 4)
    assert [(s.q_start, s.q_end, s.kv_start, s.kv_end) for s in shards] == [(0, 1, 0, 1), (1, 2, 0, 1),
                                                                            (2, 3, 1, 2), (3, 4, 1, 2)]
    assert [(s.mlp_start, s.mlp_end) for s in shards] == [(0, 32), (32, 64), (64, 96), (96, 128)]
    # Every q head is owned exactly once, and reads the KV head its rank holds.
    for shards in (tensor_shards(8, 2, 64, 4), tensor_shards(8, 2, 64, 8), tensor_shards(9, 3, 64, 3)):
        owned = [h for s in shards for h in range(s.q_start, s.q_end)]
        assert sorted(owned) == list(range(len(owned)))
        group = len(owned) // max(s.kv_end for s in shards)
        assert all(s.kv_start <= h // group < s.kv_end for s in shards for h in range(s.q_start, s.q_end))


@pytest.mark.parametrize("heads,kv,inter,t", [(9, 3, 1536, 4), (9, 3, 1536, 5), (4, 2, 128, 8), (4, 4, 2, 3)])
def test_impossible_head_splits_name_tensor_parallel_size(heads: int, kv: int, inter: int, t: int) -> None:
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        tensor_shards(heads, kv, inter, t)


def test_build_layout_combines_stages_and_shards() -> None:
    layout = build_layout(30, 9, 3, 1536, 2, 2, "batch_queue", 1, (20, 10))
    assert layout.num_workers == 4 and layout.schedule == "batch_queue"
    assert [(s.start_layer, s.end_layer) for s in layout.stages] == [(0, 20), (20, 30)]
    assert len(layout.shards) == 2


def test_theory_bubble() -> None:
    assert theory_bubble(1, 4) == 0
    assert theory_bubble(2, 1) == pytest.approx(1 / 2)
    assert theory_bubble(4, 8) == pytest.approx(3 / 11)


# -- EngineConfig --------------------------------------------------------------------------


@pytest.mark.parametrize("knobs_,field", [
    ({"pipeline_parallel_size": 0}, "pipeline_parallel_size"),
    ({"pipeline_parallel_size": 9}, "pipeline_parallel_size"),
    ({"pipeline_parallel_size": 2.0}, "pipeline_parallel_size"),
    ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
    ({"tensor_parallel_size": "2"}, "tensor_parallel_size"),
    ({"pipeline_parallel_size": 4, "tensor_parallel_size": 4}, "tensor_parallel_size"),
    ({"pipeline_schedule": "1f1b"}, "pipeline_schedule"),
    ({"pipeline_schedule": None}, "pipeline_schedule"),
    ({"num_microbatches": 0}, "num_microbatches"),
    ({"num_microbatches": 65}, "num_microbatches"),
    ({"pipeline_schedule": "batch_queue", "num_microbatches": 2}, "num_microbatches"),
    ({"pipeline_parallel_size": 2, "pipeline_layer_split": (1,)}, "pipeline_layer_split"),
    ({"pipeline_parallel_size": 2, "pipeline_layer_split": (1, 0)}, "pipeline_layer_split"),
    ({"pipeline_parallel_size": 2, "pipeline_layer_split": "1,1"}, "pipeline_layer_split"),
    ({"worker_timeout_s": 0}, "worker_timeout_s"),
    ({"worker_timeout_s": float("nan")}, "worker_timeout_s"),
    ({"worker_timeout_s": 1e9}, "worker_timeout_s"),
])
def test_bad_parallel_knobs_name_the_field(knobs_: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        EngineConfig.from_knobs(**knobs_)


def test_parallel_refuses_speculation_and_tensor_parallel_quantization() -> None:
    with pytest.raises(ValueError, match="speculative_config|pipeline_parallel_size"):
        EngineConfig.from_knobs(pipeline_parallel_size=2, speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="quantization|tensor_parallel_size"):
        EngineConfig.from_knobs(tensor_parallel_size=2, quantization="int8")
    cfg = EngineConfig.from_knobs(pipeline_parallel_size=2, tensor_parallel_size=2, pipeline_layer_split=(1, 1))
    assert cfg.parallel_config.world_size == 4


# -- split_microbatches ----------------------------------------------------------------------


def _scheduled(tokens: list[int]) -> list[ScheduledRequest]:
    return [ScheduledRequest(f"r{i}", n, 0, n > 1) for i, n in enumerate(tokens)]


@settings(max_examples=200, **CI)
@given(tokens=st.lists(st.integers(1, 64), max_size=12), m=st.integers(1, 8))
def test_split_microbatches_keeps_order_and_balances(tokens: list[int], m: int) -> None:
    from engine.parallel.executor import split_microbatches

    scheduled = _scheduled(tokens)
    groups = split_microbatches(scheduled, m)
    assert [s for g in groups for s in g] == scheduled  # order preserved, nothing lost or split
    assert len(groups) == min(m, len(scheduled))
    assert all(groups)
    if len(set(tokens)) == 1 and groups:  # equal requests: group sizes differ by at most one
        sizes = [len(g) for g in groups]
        assert max(sizes) - min(sizes) <= 1, sizes
    if groups:  # no group exceeds its fair share by more than one request's tokens
        total = sum(tokens)
        assert max(sum(s.num_new_tokens for s in g) for g in groups) <= total / len(groups) + max(tokens)


def test_split_microbatches_examples() -> None:
    from engine.parallel.executor import split_microbatches

    names = lambda gs: [[s.request_id for s in g] for g in gs]  # noqa: E731
    assert split_microbatches([], 4) == []
    assert names(split_microbatches(_scheduled([1] * 8), 4)) == [["r0", "r1"], ["r2", "r3"], ["r4", "r5"],
                                                                 ["r6", "r7"]]
    assert names(split_microbatches(_scheduled([1, 1]), 4)) == [["r0"], ["r1"]]
    assert names(split_microbatches(_scheduled([5, 5, 5]), 1)) == [["r0", "r1", "r2"]]


# -- the batch queue's scheduling (engine/parallel/batch_queue.py BatchQueue) ------------------


@settings(max_examples=150, **CI)
@given(cfg=knobs(max_blocks=20), workload=specs(max_requests=8, max_prompt=40, max_out=10),
       n=st.integers(1, 4))
def test_batch_queue_batches_in_flight_are_disjoint(cfg: dict, workload: list, n: int) -> None:
    """Rule (vLLM's batch queue, as the engine drives the scheduler): while fewer than n batches
    are in flight, schedule one more with ``exclude`` = the requests in flight; then retire the
    oldest. Every batch is within the token budget; no request is in two in-flight batches; no
    batch preempts a request in flight; the oldest running request is never preempted while
    another runs; in-flight requests keep their KV; the queues stay consistent
    (``check_integrity`` with the in-flight ids) and every request finishes."""
    cfg = EngineConfig.from_knobs(**cfg)
    cp = ControlPlane(cfg)
    todo = [(i, s) for i, s in enumerate(workload) if admissible(s, cfg, cp.max_model_len)]
    for i, s in todo:
        r = Request(f"r{i}", None, list(s.prompt), SamplingParams(temperature=0, max_tokens=s.max_tokens))
        cp.requests[r.request_id] = r
        cp.scheduler.add(r)
    sched = cp.scheduler
    in_flight: deque[SchedulerOutput] = deque()
    for _ in range(800):
        if not sched.has_work() and not in_flight:
            break
        preempted = False
        while len(in_flight) < n:
            busy = frozenset(s.request_id for b in in_flight for s in b.scheduled)
            cap = max(1, -(-(len(sched.running) + len(sched.waiting)) // n))
            oldest = sched.running[0].request_id if len(sched.running) > 1 else None
            out = sched.schedule(exclude=busy, max_requests=cap, may_admit=not preempted)
            preempted = preempted or bool(out.preempted)
            assert oldest not in out.preempted, "the oldest running request was preempted for a newer one"
            ids = [s.request_id for s in out.scheduled]
            assert len(ids) == len(set(ids)) and len(ids) <= cap
            assert out.num_batched_tokens == sum(s.num_new_tokens for s in out.scheduled) <= cfg.scheduler_config.max_num_batched_tokens
            assert not set(ids) & busy, "a request is in two in-flight batches"
            assert not set(out.preempted) & busy, "a batch preempted a request in flight"
            if out.is_empty:
                break
            in_flight.append(out)
        running = {r.request_id for r in sched.running}
        for b in in_flight:  # every in-flight request is still running with its KV allocated
            for s in b.scheduled:
                assert s.request_id in running
                assert len(cp.kv.block_tables[s.request_id]) * cfg.cache_config.block_size >= s.start + s.num_new_tokens
        if not in_flight:
            continue
        done = in_flight.popleft()
        for s in done.scheduled:  # as the engine: sample where the chunk reached the end
            r = cp.requests[s.request_id]
            if s.is_prefill:
                continue
            r.output_token_ids.append(1)
            if len(r.output_token_ids) >= r.sampling_params.max_tokens or r.num_tokens >= cp.max_model_len:
                sched.remove(r)
                r.status = r.status.FINISHED
                r.finish_reason = "length"
        sched.check_integrity(frozenset(s.request_id for b in in_flight for s in b.scheduled))
        cp.kv.check_integrity([r for r in cp.requests.values() if not r.is_finished])
    assert not sched.has_work() and not in_flight


# -- pipeline_stats on hand-built timelines ---------------------------------------------------


def _gpipe(p: int, m: int, f: float = 10.0, t: int = 1, gap: float = 0.0) -> PipelineTimeline:
    """Perfect GPipe fill and drain: unit u on stage s runs [(s + u) f, (s + u + 1) f)."""
    units = tuple(PipelineUnit(u, 0, u, 4, (f"r{u}",)) for u in range(m))
    events = tuple(WorkEvent(s * t + r, s, r, u, "forward", gap + (s + u) * f, gap + (s + u + 1) * f)
                   for s in range(p) for r in range(t) for u in range(m))
    return PipelineTimeline("gpipe", p, t, m, units, events, gap + (m + p - 1) * f + 1)


@pytest.mark.parametrize("p,m", [(2, 1), (2, 4), (4, 1), (4, 8), (3, 2), (1, 4)])
def test_a_perfect_gpipe_pattern_measures_exactly_the_theory(p: int, m: int) -> None:
    s = pipeline_stats(_gpipe(p, m, gap=3.0))
    assert s.bubble_fraction == pytest.approx(theory_bubble(p, m))
    assert s.theory_bubble == pytest.approx(theory_bubble(p, m))
    assert s.compute_fraction == pytest.approx(1 - theory_bubble(p, m))
    assert s.comm_fraction == 0
    assert s.window_ms == pytest.approx((m + p - 1) * 10.0) and s.num_lanes == p and s.num_units == m


def test_communication_and_waits_are_accounted() -> None:
    # 2 stages x 2 tp ranks, one unit; each forward 10 ms with a 2 ms all-reduce inside; stage 0
    # sends for 1 ms after its forward; stage 1 waits (recv) for it -- a wait is bubble, not work.
    events = []
    for r in range(2):
        events += [WorkEvent(r, 0, r, 0, "forward", 0, 10), WorkEvent(r, 0, r, 0, "all_reduce", 4, 6),
                   WorkEvent(r, 0, r, 0, "send", 10, 11),
                   WorkEvent(2 + r, 1, r, 0, "recv", 0, 11), WorkEvent(2 + r, 1, r, 0, "forward", 11, 21),
                   WorkEvent(2 + r, 1, r, 0, "all_reduce", 15, 17)]
    tl = PipelineTimeline("gpipe", 2, 2, 1, (PipelineUnit(0, 0, 0, 3, ("a",)),), tuple(events), 22)
    s = pipeline_stats(tl)
    total = 4 * 21
    assert s.window_ms == 21 and s.num_lanes == 4
    assert s.comm_fraction == pytest.approx((2 * (2 + 1) + 2 * 2) / total)
    assert s.compute_fraction == pytest.approx(4 * 8 / total)
    assert s.bubble_fraction == pytest.approx(1 - (2 * 11 + 2 * 10) / total)
    assert s.compute_fraction + s.comm_fraction + s.bubble_fraction == pytest.approx(1)


def test_empty_timeline() -> None:
    empty = PipelineTimeline("gpipe", 2, 1, 1, (), (), 0.0)
    assert pipeline_stats(empty).bubble_fraction == 0 and pipeline_stats(empty).window_ms == 0


def _batch(p: int, f: float, offset: float, batch: int) -> PipelineTimeline:
    """One batch through p stages, f ms per stage, sent at ``offset`` ms (the batch queue's unit)."""
    events = tuple(WorkEvent(s, s, 0, 0, "forward", s * f, (s + 1) * f) for s in range(p))
    return PipelineTimeline("batch_queue", p, 1, 1, (PipelineUnit(0, batch, 0, 4, (f"r{batch}",)),), events,
                            p * f, offset)


def test_merged_batches_in_flight_fill_the_pipeline() -> None:
    """k batches sent f ms apart through p stages: the merged stretch is GPipe's fill and drain
    once, (p - 1) / (k + p - 1), where each step alone looks (p - 1) / p idle."""
    p, k, f = 2, 6, 10.0
    timelines = [_batch(p, f, 100.0 + i * f, i) for i in range(k)]
    assert pipeline_stats(timelines[0]).bubble_fraction == pytest.approx((p - 1) / p)
    merged = merge_timelines(timelines)
    assert [u.unit for u in merged.units] == list(range(k)) and [u.batch for u in merged.units] == list(range(k))
    assert merged.offset_ms == 100.0 and merged.span_ms == pytest.approx((k - 1) * f + p * f)
    assert pipeline_stats(merged).bubble_fraction == pytest.approx(theory_bubble(p, k))
    # a gap between the batches (the driver's turn) counts as bubble
    spaced = merge_timelines([_batch(p, f, i * 3 * f, i) for i in range(k)])
    assert pipeline_stats(spaced).bubble_fraction > pipeline_stats(merged).bubble_fraction
    with pytest.raises(ValueError, match="timelines"):
        merge_timelines([])
