"""Builds the records a step emits (engine/core/trace.py) from the engine's state: the
``StepTrace`` of each step, the ``Snapshot`` of the whole engine, each request's metrics.

Reads only: nothing here changes a request, a queue or a block (draining the KV cache's event
log is the one exception, and that log exists for these records).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from engine.core.config import EngineConfig
from engine.core.kv_cache import KVCacheManager
from engine.core.prefix_cache import RadixNode
from engine.core.request import Request
from engine.core.scheduler import Scheduler, SchedulerOutput
from engine.core.trace import (BlockState, ParallelLayout, PipelineTimeline, PrefixCacheEvents, PrefixNode,
                               RequestMetrics, RequestState, SampledToken, ScheduledChunk, Snapshot, SpecVerification,
                               StepTrace)


class StepTimings(NamedTuple):
    """Milliseconds of a step's stages (the trace's timing fields)."""

    draft_ms: float
    schedule_ms: float
    forward_ms: float
    sample_ms: float


class StepRecord(NamedTuple):
    """What one step did, as the stages returned it: the trace is built from this alone."""

    step: int
    output: SchedulerOutput
    arrived: tuple[str, ...]
    finished: tuple[str, ...]
    appended: Sequence[tuple[Request, int]]
    forked: Sequence[Request]
    spec: tuple[SpecVerification, ...]
    timings: StepTimings
    pipeline: PipelineTimeline | None


def request_metrics(r: Request) -> RequestMetrics:
    ttft_ms = tpot_ms = e2e_ms = None
    if r.first_token_time is not None and r.arrival_time is not None:
        ttft_ms = (r.first_token_time - r.arrival_time) * 1e3
    if r.finished_time is not None and r.arrival_time is not None:
        e2e_ms = (r.finished_time - r.arrival_time) * 1e3
        if len(r.output_token_ids) > 1 and r.first_token_time is not None:
            tpot_ms = (r.finished_time - r.first_token_time) * 1e3 / (len(r.output_token_ids) - 1)
    return RequestMetrics(
        request_id=r.request_id, arrival_step=r.arrival_step,
        first_token_step=r.first_token_step, finished_step=r.finished_step,
        num_output_tokens=len(r.output_token_ids),
        ttft_steps=None if r.first_token_step is None else r.first_token_step - r.arrival_step + 1,
        ttft_ms=ttft_ms, tpot_ms=tpot_ms, e2e_ms=e2e_ms, num_preemptions=r.num_preemptions,
        num_cached_tokens=r.num_cached_tokens or 0, num_draft_tokens=r.num_draft_tokens,
        num_accepted_tokens=r.num_accepted_tokens, num_verify_steps=r.num_verify_steps)


class TraceBuilder:
    """StepTraces and Snapshots of one engine (its config, KV cache, scheduler and tokenizer)."""

    def __init__(self, config: EngineConfig, kv: KVCacheManager, scheduler: Scheduler, tokenizer: Any,
                 decode: Callable[[Iterable[int]], str]) -> None:
        self.config, self.kv, self.scheduler, self.tokenizer, self.decode = config, kv, scheduler, tokenizer, decode

    def step_trace(self, record: StepRecord, num_pending: int) -> StepTrace:
        output, t = record.output, record.timings
        allocated, freed, events = self.kv.drain_events()
        tokens = [tok for _, tok in record.appended]
        pieces = self.tokenizer.convert_ids_to_tokens(tokens) if tokens else []
        return StepTrace(
            step=record.step,
            scheduled=tuple(ScheduledChunk(s.request_id, s.num_new_tokens, s.kind, s.start, s.resumed, s.num_spec_tokens)
                            for s in output.scheduled),
            token_budget=self.config.scheduler_config.max_num_batched_tokens,
            num_batched_tokens=output.num_batched_tokens,
            arrived=record.arrived,
            preempted=output.preempted,
            finished=record.finished,
            sampled=tuple(SampledToken(r.request_id, tok, p) for (r, tok), p in zip(record.appended, pieces)),
            blocks_allocated=allocated,
            blocks_freed=freed,
            num_free_blocks=self.kv.num_free_blocks,
            num_used_blocks=self.kv.pool.num_used,
            num_waiting=len(self.scheduler.waiting) + num_pending,
            num_running=len(self.scheduler.running),
            schedule_ms=t.schedule_ms,
            forward_ms=t.forward_ms,
            sample_ms=t.sample_ms,
            prefix=PrefixCacheEvents(
                lookups=output.lookups, inserted=tuple(events.inserted), split=tuple(events.split),
                evicted=tuple(self.prefix_node(n) for n in events.evicted), copies=output.copies,
                forked=tuple(r.request_id for r in record.forked)),
            num_cached_blocks=self.kv.pool.num_cached,
            num_evictable_blocks=self.kv.pool.num_evictable,
            spec=record.spec,
            draft_ms=t.draft_ms,
            pipeline=None if output.is_empty else record.pipeline,
        )

    def prefix_node(self, node: RadixNode) -> PrefixNode:
        return PrefixNode(node.node_id, None if node.parent is None else node.parent.node_id, tuple(node.key),
                          tuple(node.block_ids), node.lock_count, node.last_access, node.hit_count,
                          self.decode(node.key) if node.key else "")

    def snapshot(self, step: int, requests: Mapping[str, Request], pending: Sequence[Request],
                 kv_bytes_per_token: int, parallel: ParallelLayout | None) -> Snapshot:
        bs = self.config.cache_config.block_size
        owners: dict[int, list[tuple[Request, int]]] = {}
        for rid, table in self.kv.block_tables.items():
            for logical, block_id in enumerate(table):
                owners.setdefault(block_id, []).append((requests[rid], logical))
        tree = [self.prefix_node(n) for n in self.kv.prefix_cache.nodes()]
        cached_ids = {b: node.token_ids[i * bs:(i + 1) * bs] for node in tree for i, b in enumerate(node.block_ids)}
        blocks = []
        for block in self.kv.pool.blocks:
            held = owners.get(block.block_id, [])
            ids: tuple[int, ...] = cached_ids.get(block.block_id, ())
            if held and not ids:
                r, logical = held[0]
                lo = logical * bs
                ids = tuple(r.all_token_ids[lo: min(lo + bs, r.num_computed_tokens)])
            blocks.append(BlockState(block.block_id, block.ref_count,
                                     tuple(r.request_id for r, _ in held), len(ids), ids,
                                     self.decode(ids) if ids else "", block.cached))
        return Snapshot(
            step=step, block_size=bs, num_blocks=self.config.cache_config.num_blocks,
            kv_bytes_per_token=kv_bytes_per_token, blocks=tuple(blocks),
            requests=tuple(self.request_state(r) for r in requests.values()),
            waiting=tuple(r.request_id for r in pending) + tuple(r.request_id for r in self.scheduler.waiting),
            running=tuple(r.request_id for r in self.scheduler.running),
            metrics=tuple(request_metrics(r) for r in requests.values()),
            prefix_tree=tuple(tree), parallel=parallel)

    def request_state(self, r: Request) -> RequestState:
        return RequestState(
            request_id=r.request_id, status=r.status, arrival_step=r.arrival_step,
            num_prompt_tokens=r.num_prompt_tokens, num_output_tokens=len(r.output_token_ids),
            num_computed_tokens=r.num_computed_tokens, max_tokens=r.sampling_params.max_tokens,
            block_table=tuple(self.kv.block_tables.get(r.request_id, ())),
            num_preemptions=r.num_preemptions,
            prompt=r.prompt if r.prompt is not None else self.decode(r.prompt_token_ids),
            output_text=r.output_text if r.is_finished else self.decode(r.output_token_ids),
            finish_reason=r.finish_reason, num_cached_tokens=r.num_cached_tokens or 0, parent_id=r.parent_id)
