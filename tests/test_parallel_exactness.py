"""Issue #11, must show 1: greedy outputs of the engine over pipeline-stage / tensor-parallel
worker processes are token-identical to the single-process engine and to Hugging Face
``generate``, through chunked prefill, preemption by recompute, prefix-cache hits and both
schedules; every step's trace carries a PipelineTimeline that accounts for every unit on every
worker, and the batch queue never puts one request in two in-flight batches.

Engines are module-scoped (start-up costs seconds) and always shut down; tiny-random carries
the breadth, smollm2-135m one case per path.
"""
from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache
from typing import Any

import pytest

from engine import LLMEngine
from engine.core.config import SamplingParams
from engine.model.shared import get_shared_model
from engine.parallel.layout import build_layout
from engine.core.trace import PipelineTimeline, StepTrace
from tests.parity import PROMPTS, assert_matches_hf, run_engine

MAX_TOKENS = 12
# Tight pool, small budget: prompts are chunked and requests get preempted and recomputed.
TINY_KNOBS: dict[str, Any] = dict(block_size=4, num_blocks=24, max_num_batched_tokens=16, max_num_seqs=8)
TINY_BATCH = PROMPTS[:4] + PROMPTS[5:9]  # 8 requests, 7 .. 52 tokens on the byte tokenizer
# The second prompt extends the first and arrives once the first is prefilled: a prefix hit.
PREFIX = [PROMPTS[2], PROMPTS[2] + " and back again."]
PREFIX_ARRIVALS = [0, 6]

TINY_CASES = {
    "p2-gpipe-m1": dict(pipeline_parallel_size=2),
    "p2-gpipe-m2": dict(pipeline_parallel_size=2, num_microbatches=2),
    "p2-gpipe-m4": dict(pipeline_parallel_size=2, num_microbatches=4),
    "t2": dict(tensor_parallel_size=2, num_microbatches=3),
    "p2-batch_queue": dict(pipeline_parallel_size=2, pipeline_schedule="batch_queue"),
    "p2xt2-batch_queue": dict(pipeline_parallel_size=2, tensor_parallel_size=2, pipeline_schedule="batch_queue"),
}


@lru_cache(maxsize=16)
def single_process(name: str, prompts: tuple[str, ...], max_tokens: int, arrivals: tuple[int, ...] | None,
                   knobs: tuple[tuple[str, Any], ...]) -> tuple[tuple[int, ...], ...]:
    """The reference: the same knobs, one process."""
    outputs, _ = run_engine(LLMEngine(name, **dict(knobs)), list(prompts), max_tokens,
                            list(arrivals) if arrivals else None)
    return tuple(outputs)


def check_timelines(engine: LLMEngine, traces: list[StepTrace]) -> None:
    """Every step that ran the model carries a timeline: one forward per (worker, unit), a recv
    per unit on every later stage, a send on every earlier one; the units are the scheduled
    requests, in order; with the batch queue no request is in two units (batches)."""
    layout = engine.runner.layout
    p, t = layout.pipeline_parallel_size, layout.tensor_parallel_size
    for trace in traces:
        tl = trace.pipeline
        if not trace.scheduled:
            assert tl is None
            continue
        assert isinstance(tl, PipelineTimeline)
        assert (tl.schedule, tl.pipeline_parallel_size, tl.tensor_parallel_size, tl.num_microbatches) == (
            layout.schedule, p, t, layout.num_microbatches)
        assert [u.unit for u in tl.units] == list(range(len(tl.units)))
        in_units = [rid for u in tl.units for rid in u.request_ids]
        assert in_units == [c.request_id for c in trace.scheduled], "units are not the scheduled requests in order"
        assert len(in_units) == len(set(in_units)), "a request is in two units of one step"
        assert sum(u.num_tokens for u in tl.units) == trace.num_batched_tokens
        assert all(u.request_ids and u.num_tokens >= 1 for u in tl.units)
        assert len({u.batch for u in tl.units}) == 1, "a step retires one batch"
        assert trace.num_batched_tokens <= trace.token_budget
        if layout.schedule == "gpipe":
            assert len(tl.units) == min(layout.num_microbatches, len(trace.scheduled))
            assert [u.microbatch for u in tl.units] == list(range(len(tl.units)))
        else:
            assert len(tl.units) == 1 and tl.units[0].microbatch == 0
        units = range(len(tl.units))
        for kind, stages in (("forward", range(p)), ("recv", range(1, p)), ("send", range(p - 1))):
            got = sorted((e.rank, e.unit) for e in tl.events if e.kind == kind)
            want = sorted((s * t + r, u) for s in stages for r in range(t) for u in units)
            assert got == want, f"{kind} events {got} != {want}"
        if t > 1:  # two all-reduces per layer per unit on every worker
            for s, stage in enumerate(layout.stages):
                for r in range(t):
                    n = sum(e.kind == "all_reduce" and e.rank == s * t + r for e in tl.events)
                    assert n == 2 * (stage.end_layer - stage.start_layer) * len(tl.units)
        for e in tl.events:
            assert (e.stage, e.tp_rank) == divmod(e.rank, t)
            assert 0 <= e.start_ms <= e.end_ms
        # Per worker the units run in order (a stage's forward of unit u+1 starts after unit u's ends).
        for rank in range(p * t):
            fw = sorted((e.unit, e.start_ms, e.end_ms) for e in tl.events if e.kind == "forward" and e.rank == rank)
            assert all(a[2] <= b[1] for a, b in zip(fw, fw[1:]))
    check_in_flight_batches_are_disjoint([t.pipeline for t in traces if t.pipeline is not None])
    snap = engine.snapshot()
    assert snap.parallel == layout


def overlaps(a: PipelineTimeline, b: PipelineTimeline) -> bool:
    """The two batches were in flight at the same time (one sent before the other was taken)."""
    return a.offset_ms < b.offset_ms + b.span_ms and b.offset_ms < a.offset_ms + a.span_ms


def check_in_flight_batches_are_disjoint(timelines: list[PipelineTimeline]) -> None:
    """The batch queue's rule: no request in two batches that were in flight together."""
    for i, a in enumerate(timelines):
        for b in timelines[i + 1:]:
            if overlaps(a, b):
                ids_a = {rid for u in a.units for rid in u.request_ids}
                ids_b = {rid for u in b.units for rid in u.request_ids}
                assert not ids_a & ids_b, f"requests {ids_a & ids_b} in two in-flight batches"


def run_checked(engine: LLMEngine, prompts: list[str], max_tokens: int = MAX_TOKENS,
                arrivals: list[int] | None = None) -> tuple[list[tuple[int, ...]], list[StepTrace]]:
    outputs, traces = run_engine(engine, prompts, max_tokens, arrivals)  # check_integrity every step
    check_timelines(engine, traces)
    return outputs, traces


def knob_key(knobs: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(knobs.items()))


# -- tiny-random: every configuration ------------------------------------------------------------

@pytest.fixture(scope="module", params=list(TINY_CASES), ids=list(TINY_CASES))
def tiny_engine(request: pytest.FixtureRequest) -> Iterator[LLMEngine]:
    with LLMEngine("tiny-random", **TINY_KNOBS, **TINY_CASES[request.param]) as engine:
        assert len(engine.runner.executor.pids) == engine.config.parallel_config.world_size
        yield engine


def test_tiny_chunked_prefill_and_preemption_are_exact(tiny_engine: LLMEngine) -> None:
    outputs, traces = run_checked(tiny_engine, TINY_BATCH)
    assert any(c.num_tokens < 7 and c.kind == "prefill" for t in traces for c in t.scheduled), \
        "no prompt was chunked"
    assert sum(len(t.preempted) for t in traces) > 0, "the small pool never forced a preemption"
    assert outputs == list(single_process("tiny-random", tuple(TINY_BATCH), MAX_TOKENS, None, knob_key(TINY_KNOBS)))
    assert_matches_hf("tiny-random", TINY_BATCH, outputs, MAX_TOKENS)
    if tiny_engine.config.parallel_config.pipeline_schedule == "batch_queue":
        tls = [t.pipeline for t in traces if t.pipeline]
        assert any(overlaps(a, b) for a, b in zip(tls, tls[1:])), "never two batches in flight"
    elif tiny_engine.config.parallel_config.num_microbatches > 1:
        assert max(len(t.pipeline.units) for t in traces if t.pipeline) == tiny_engine.config.parallel_config.num_microbatches


def test_tiny_prefix_hits_are_exact(tiny_engine: LLMEngine) -> None:
    outputs, traces = run_checked(tiny_engine, PREFIX, arrivals=PREFIX_ARRIVALS)
    assert sum(t.prefix.num_cached_tokens for t in traces) >= 32, "the second prompt missed the cache"
    assert outputs == list(single_process("tiny-random", tuple(PREFIX), MAX_TOKENS, tuple(PREFIX_ARRIVALS),
                                          knob_key(TINY_KNOBS)))
    assert_matches_hf("tiny-random", PREFIX, outputs, MAX_TOKENS)


def test_tiny_abort_while_in_flight_leaves_the_others_exact(tiny_engine: LLMEngine) -> None:
    """Aborting a request whose batch is in flight (batch queue; between steps otherwise): it
    gets no token after the abort, the batch's other requests go on exactly, integrity holds
    (its blocks are free although its batch was still in the pipeline)."""
    engine = tiny_engine
    prompts = TINY_BATCH[:4]
    ids = [engine.add_request(p, SamplingParams(temperature=0, max_tokens=MAX_TOKENS)) for p in prompts]
    for _ in range(3):
        engine.step()
        engine.check_integrity()
    in_flight = sorted(engine.batches.in_flight_ids())
    if engine.config.parallel_config.pipeline_schedule == "batch_queue":
        assert in_flight, "nothing in flight between steps"
    victim = in_flight[0] if in_flight else ids[0]
    before = engine.get_output(victim).outputs[0].token_ids
    engine.abort_request(victim)
    engine.check_integrity()
    while engine.has_unfinished_requests():
        engine.step()
        engine.check_integrity()
    aborted = engine.get_output(victim).outputs[0]
    assert aborted.finish_reason == "abort" and aborted.token_ids == before
    kept = [(p, i) for p, i in zip(prompts, ids) if i != victim]
    assert_matches_hf("tiny-random", [p for p, _ in kept],
                      [engine.get_output(i).outputs[0].token_ids for _, i in kept], MAX_TOKENS)


def test_tiny_int8_kv_cache_equals_the_single_process_engine() -> None:
    knobs = dict(TINY_KNOBS, kv_cache_dtype="int8")
    with LLMEngine("tiny-random", **knobs, pipeline_parallel_size=2, num_microbatches=2) as engine:
        outputs, _ = run_checked(engine, TINY_BATCH)
    assert outputs == list(single_process("tiny-random", tuple(TINY_BATCH), MAX_TOKENS, None, knob_key(knobs)))


# -- smollm2-135m: one case per path --------------------------------------------------------------

SMOL_MAX_TOKENS = 8
SMOL_KNOBS: dict[str, Any] = dict(block_size=4, num_blocks=8, max_num_batched_tokens=8, max_num_seqs=4)
SMOL_PROMPTS = [PROMPTS[0], PROMPTS[2], PROMPTS[7]]  # 7 .. 11 tokens
SMOL_CASES = {
    "p2-gpipe-m2-split20x10": dict(pipeline_parallel_size=2, num_microbatches=2, pipeline_layer_split=(20, 10)),
    "p3-gpipe-m3": dict(pipeline_parallel_size=3, num_microbatches=3),
    "t2": dict(tensor_parallel_size=2),
    "p2xt2-batch_queue": dict(pipeline_parallel_size=2, tensor_parallel_size=2, pipeline_schedule="batch_queue"),
}


# SmolLM2 once per path in `make test`: the batch queue with tensor shards on each stage, and GPipe
# with micro-batches over an uneven layer split; the other two (every path also on tiny-random
# above) run with the sweeps.
SMOL_COVERING = ("p2xt2-batch_queue", "p2-gpipe-m2-split20x10")


@pytest.mark.parametrize("case", [pytest.param(c, marks=() if c in SMOL_COVERING else pytest.mark.sweep)
                                  for c in SMOL_CASES])
def test_smollm2_is_exact(case: str) -> None:
    with LLMEngine("smollm2-135m", **SMOL_KNOBS, **SMOL_CASES[case]) as engine:
        layout = engine.runner.layout
        c = get_shared_model("smollm2-135m").model.config
        assert layout == build_layout(c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
                                      c.intermediate_size, engine.config.parallel_config.pipeline_parallel_size,
                                      engine.config.parallel_config.tensor_parallel_size, engine.config.parallel_config.pipeline_schedule,
                                      engine.config.parallel_config.num_microbatches, engine.config.parallel_config.pipeline_layer_split)
        outputs, traces = run_checked(engine, SMOL_PROMPTS, SMOL_MAX_TOKENS)
    assert any(c.kind == "prefill" and c.start > 0 for t in traces for c in t.scheduled), "no prompt was chunked"
    assert sum(len(t.preempted) for t in traces) > 0, "the small pool never forced a preemption"
    assert outputs == list(single_process("smollm2-135m", tuple(SMOL_PROMPTS), SMOL_MAX_TOKENS, None,
                                          knob_key(SMOL_KNOBS)))
    assert_matches_hf("smollm2-135m", SMOL_PROMPTS, outputs, SMOL_MAX_TOKENS)
