"""Immutable records that cross from the engine to the views: what one step did, and what the
engine looked like after it. Plain data (ints, strings, tuples) so they serialise to JSON and
replay without the model.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

ChunkKind = Literal["prefill", "decode"]


@dataclass(frozen=True)
class ScheduledChunk:
    request_id: str
    num_tokens: int
    kind: ChunkKind  # "prefill": a prompt (or recompute) chunk; "decode": one new position
    start: int  # first position computed
    resumed: bool = False  # first chunk after a preemption


@dataclass(frozen=True)
class SampledToken:
    request_id: str
    token_id: int
    text: str


@dataclass(frozen=True)
class StepTrace:
    """What one engine step scheduled, computed, allocated, freed, preempted and finished."""

    step: int
    scheduled: tuple[ScheduledChunk, ...]
    token_budget: int
    num_batched_tokens: int
    arrived: tuple[str, ...]
    preempted: tuple[str, ...]
    finished: tuple[str, ...]
    sampled: tuple[SampledToken, ...]
    blocks_allocated: tuple[int, ...]
    blocks_freed: tuple[int, ...]
    num_free_blocks: int
    num_used_blocks: int
    num_waiting: int
    num_running: int
    schedule_ms: float
    forward_ms: float
    sample_ms: float

    @property
    def num_prefill_tokens(self) -> int:
        return sum(c.num_tokens for c in self.scheduled if c.kind == "prefill")

    @property
    def num_decode_tokens(self) -> int:
        return sum(c.num_tokens for c in self.scheduled if c.kind == "decode")

    @property
    def total_ms(self) -> float:
        return self.schedule_ms + self.forward_ms + self.sample_ms


@dataclass(frozen=True)
class BlockState:
    block_id: int
    ref_count: int
    owners: tuple[str, ...]  # request ids whose block table holds this block
    num_tokens: int  # filled slots (0 .. block_size)
    token_ids: tuple[int, ...]
    text: str


@dataclass(frozen=True)
class RequestState:
    request_id: str
    status: str  # pending / waiting / running / preempted / finished
    arrival_step: int
    num_prompt_tokens: int
    num_output_tokens: int
    num_computed_tokens: int
    max_tokens: int
    block_table: tuple[int, ...]
    num_preemptions: int
    prompt: str
    output_text: str
    finish_reason: str | None


@dataclass(frozen=True)
class RequestMetrics:
    """Latency of one request, in engine steps and in milliseconds."""

    request_id: str
    arrival_step: int
    first_token_step: int | None
    finished_step: int | None
    num_output_tokens: int
    ttft_steps: int | None
    ttft_ms: float | None
    tpot_ms: float | None  # mean time per output token after the first
    e2e_ms: float | None
    num_preemptions: int


@dataclass(frozen=True)
class Snapshot:
    """The engine after a step: block pool, block tables, queues, per-request metrics."""

    step: int
    block_size: int
    num_blocks: int
    kv_bytes_per_token: int
    blocks: tuple[BlockState, ...]
    requests: tuple[RequestState, ...]
    waiting: tuple[str, ...]
    running: tuple[str, ...]
    metrics: tuple[RequestMetrics, ...]

    @property
    def num_free_blocks(self) -> int:
        return sum(1 for b in self.blocks if b.ref_count == 0)


_RECORDS = {cls.__name__: cls for cls in (ScheduledChunk, SampledToken, StepTrace, BlockState,
                                          RequestState, RequestMetrics, Snapshot)}


def to_dict(record: Any) -> Any:
    """A record (or tuple of records) -> JSON-ready dict tagged with its type."""
    if dataclasses.is_dataclass(record):
        out = {"_type": type(record).__name__}
        for f in dataclasses.fields(record):
            out[f.name] = to_dict(getattr(record, f.name))
        return out
    if isinstance(record, (tuple, list)):
        return [to_dict(x) for x in record]
    return record


def from_dict(data: Any) -> Any:
    """Inverse of ``to_dict``; lists become tuples so records stay hashable and frozen."""
    if isinstance(data, dict) and "_type" in data:
        cls = _RECORDS.get(data["_type"])
        if cls is None:
            raise ValueError(f"trace: unknown record type {data['_type']!r}")
        kwargs = {k: from_dict(v) for k, v in data.items() if k != "_type"}
        return cls(**kwargs)
    if isinstance(data, list):
        return tuple(from_dict(x) for x in data)
    return data
