"""Immutable records that cross from the engine to the views: what one step did, and what the
engine looked like after it. Plain data (ints, strings, tuples) so they serialise to JSON and
replay without the model.
"""
from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from engine.core.config import PipelineSchedule
from engine.core.schema import Length, Range

# Field types with the range each value must lie in: they are the replay file's schema too
# (engine.core.schema reads these annotations when a recording is loaded).
ChunkKind = Literal["prefill", "decode"]
Count = Annotated[int, Range(0)]  # a count, an index, a step number, a position: >= 0
Positive = Annotated[int, Range(1)]  # a size or a budget: >= 1
BlockId = Annotated[int, Range(0)]  # also < the pool's num_blocks (checked per snapshot)
TokenId = Annotated[int, Range(0, 2**31 - 1)]
Millis = Annotated[float, Range(0.0)]  # a measured duration: finite, >= 0
RequestId = Annotated[str, Length(1, 256)]
Probability = Annotated[float, Range(0.0, 1.0)]
SpecMethodName = Literal["ngram", "draft_model", "early_exit"]
DraftOutcomeName = Literal["accepted", "rejected", "unverified"]
FinalKindName = Literal["bonus", "recovered"]
FinishReason = Annotated[str, Length(1, 64)]
WorkKind = Literal["forward", "recv", "send", "all_reduce"]


class RequestStatus(str, enum.Enum):
    """Where a request is in its life; a replay file spells it by value ("running")."""

    PENDING = "pending"  # added, its arrival step has not come yet
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # waiting again, its KV dropped, to be recomputed
    FINISHED = "finished"


@dataclass(frozen=True)
class ScheduledChunk:
    request_id: RequestId
    num_tokens: Positive
    kind: ChunkKind  # "prefill": a prompt (or recompute) chunk; "decode": one new position
    start: Count  # first position computed
    resumed: bool = False  # first chunk after a preemption
    num_spec_tokens: Count = 0  # speculative drafts verified (the chunk is 1 + this many tokens)


@dataclass(frozen=True)
class SampledToken:
    request_id: RequestId
    token_id: TokenId
    text: str | None  # the tokenizer's piece; None for an id it has no piece for


@dataclass(frozen=True)
class DraftToken:
    """One draft token as the target verified it (engine.speculative.spec_decode.rejection_sample).

    p, q: the target's and the draft's probability of this token after the request's sampling
    transform (q = 1.0 for n-gram drafts, which have no distribution: one-hot, as vLLM); greedy
    requests record the one-hot argmax distributions (p = 1.0 where the draft is the target's
    argmax, else 0.0). outcome: "accepted", "rejected" (the first rejection) or "unverified"
    (after a rejection: discarded untested)."""

    token_id: TokenId
    text: str | None
    p: Probability
    q: Probability
    outcome: DraftOutcomeName
    alternatives: tuple[ResidualToken, ...] = ()  # the target's top entries of p at this position


@dataclass(frozen=True)
class ResidualToken:
    """A token with a probability: one of the top entries of the residual distribution
    normalize(max(0, p - q)) at a sampled rejection (where the recovered token was drawn from),
    or of the target's p at a draft position (``DraftToken.alternatives``)."""

    token_id: TokenId
    text: str | None
    prob: Probability


@dataclass(frozen=True)
class SpecVerification:
    """One request's speculative verification in one target step.

    drafts: the k drafts verified (k + 1 query tokens in the step's batch). emitted: the
    tokens the verification produced, 1 .. k + 1: the accepted drafts, then the final token,
    a "bonus" from p_{k+1} when all k were accepted, else the "recovered" token at the first
    rejection. The stop rules then append them one by one (``StepTrace.sampled``), dropping the
    ones after a token that ends the request. residual_top: at a sampled rejection, the
    residual distribution's top entries, largest first (else empty)."""

    request_id: RequestId
    method: SpecMethodName
    drafts: tuple[DraftToken, ...]
    emitted: tuple[TokenId, ...]
    final_kind: FinalKindName
    residual_top: tuple[ResidualToken, ...] = ()

    @property
    def num_accepted(self) -> int:
        return sum(1 for d in self.drafts if d.outcome == "accepted")


@dataclass(frozen=True)
class PrefixNode:
    """One radix-tree node: a block-aligned token segment and the physical blocks holding its KV.

    The root (``parent_id`` None) holds no tokens. ``len(token_ids) == len(block_ids) * block_size``.
    """

    node_id: Count
    parent_id: Count | None
    token_ids: tuple[TokenId, ...]
    block_ids: tuple[BlockId, ...]
    lock_count: Count  # sequences whose cached prefix runs through this node (0 = evictable)
    last_access: Count  # the cache's logical clock at the last match or insert through it
    hit_count: Count  # admissions that reused this node's blocks
    text: str  # the decoded token_ids


@dataclass(frozen=True)
class PrefixLookup:
    """One admission's prefix-cache lookup: what it needed and what the cache already held."""

    request_id: RequestId
    num_tokens: Positive  # tokens the request needs computed (prompt, or prompt + outputs on a resume)
    num_cached_tokens: Count  # of those, served from cached blocks (whole blocks, never the last token)
    node_ids: tuple[Count, ...]  # the matched path, the root's child first


@dataclass(frozen=True)
class BlockCopy:
    """Copy-on-write: ``request_id`` was about to write into a shared partial block, so its KV
    was copied into a fresh block first (a real copy of the KV tensors, every layer)."""

    request_id: RequestId
    src_block: BlockId
    dst_block: BlockId


@dataclass(frozen=True)
class PrefixCacheEvents:
    """What the prefix cache did in one step (all empty with caching off)."""

    lookups: tuple[PrefixLookup, ...] = ()
    inserted: tuple[Count, ...] = ()  # node ids created to hold newly full blocks
    split: tuple[Count, ...] = ()  # node ids created by splitting a node (the new head part)
    evicted: tuple[PrefixNode, ...] = ()  # nodes evicted (LRU), as they were just before
    copies: tuple[BlockCopy, ...] = ()
    forked: tuple[RequestId, ...] = ()  # parallel-sampling sequences created this step

    @property
    def num_cached_tokens(self) -> int:
        return sum(h.num_cached_tokens for h in self.lookups)

    @property
    def num_lookup_tokens(self) -> int:
        return sum(h.num_tokens for h in self.lookups)


@dataclass(frozen=True)
class WorkEvent:
    """One timed unit of a worker's work in a step, on the clock the driver shares
    (CLOCK_MONOTONIC), in ms from the moment the driver sent the step.

    kind "forward": the stage's layers over one unit (embedding on stage 0, logits on the last);
    "recv": blocked waiting for the previous stage's activations (a bubble, not work);
    "send": posting the activations to the next stage; "all_reduce": a tensor-parallel
    all-reduce inside a forward (communication, drawn over it)."""

    rank: Count
    stage: Count
    tp_rank: Count
    unit: Count  # position of the micro-batch / batch in the step's order
    kind: WorkKind
    start_ms: Millis
    end_ms: Millis


@dataclass(frozen=True)
class PipelineUnit:
    """One micro-batch ("gpipe") or one in-flight batch ("batch_queue") of a step."""

    unit: Count
    batch: Count  # the batch's number since the workers started (one per step for "gpipe")
    microbatch: Count  # its piece of that batch (always 0 for "batch_queue")
    num_tokens: Count
    request_ids: tuple[RequestId, ...]


@dataclass(frozen=True)
class PipelineTimeline:
    """Every worker's timed work in one step: what the Gantt chart draws and the bubble
    fraction is measured from (engine/parallel/stats.py)."""

    schedule: PipelineSchedule
    pipeline_parallel_size: Positive
    tensor_parallel_size: Positive
    num_microbatches: Positive  # as configured; len(units) may be fewer
    units: tuple[PipelineUnit, ...]
    events: tuple[WorkEvent, ...]
    span_ms: Millis  # sending the batch until its results were taken
    # When the batch was sent, in ms from the workers' start: places several steps' timelines
    # on one axis (with "batch_queue" a batch's work overlaps the next ones').
    offset_ms: Millis = 0.0


@dataclass(frozen=True)
class StageLayout:
    """Pipeline stage ``stage`` owns layers [start_layer, end_layer) and their KV cache."""

    stage: Count
    start_layer: Count
    end_layer: Count


@dataclass(frozen=True)
class TensorShard:
    """What tensor-parallel rank ``tp_rank`` of every stage holds: query heads [q_start, q_end),
    KV heads [kv_start, kv_end) (a KV head may be on several ranks when t exceeds the KV heads),
    MLP columns [mlp_start, mlp_end)."""

    tp_rank: Count
    q_start: Count
    q_end: Count
    kv_start: Count
    kv_end: Count
    mlp_start: Count
    mlp_end: Count


@dataclass(frozen=True)
class ParallelLayout:
    """How the model is split over the worker processes (rank = stage * t + tp_rank)."""

    pipeline_parallel_size: Positive
    tensor_parallel_size: Positive
    schedule: PipelineSchedule
    num_microbatches: Positive
    stages: tuple[StageLayout, ...]
    shards: tuple[TensorShard, ...]

    @property
    def num_workers(self) -> int:
        return self.pipeline_parallel_size * self.tensor_parallel_size


@dataclass(frozen=True)
class StepTrace:
    """What one engine step scheduled, computed, allocated, freed, preempted and finished."""

    step: Count
    scheduled: tuple[ScheduledChunk, ...]
    token_budget: Positive
    num_batched_tokens: Count
    arrived: tuple[RequestId, ...]
    preempted: tuple[RequestId, ...]
    finished: tuple[RequestId, ...]
    sampled: tuple[SampledToken, ...]
    blocks_allocated: tuple[BlockId, ...]
    blocks_freed: tuple[BlockId, ...]
    num_free_blocks: Count
    num_used_blocks: Count
    num_waiting: Count
    num_running: Count
    schedule_ms: Millis
    forward_ms: Millis
    sample_ms: Millis
    prefix: PrefixCacheEvents = PrefixCacheEvents()
    num_cached_blocks: Count = 0  # blocks held by the prefix cache (locked or evictable)
    num_evictable_blocks: Count = 0  # cached blocks no running request uses (evicted first)
    # Speculative decoding: one record per request that verified drafts this step, and the time
    # spent proposing drafts before scheduling (counted in total_ms).
    spec: tuple[SpecVerification, ...] = ()
    draft_ms: Millis = 0.0
    # Pipeline / tensor parallelism: every worker's timed work this step (None in one process).
    pipeline: PipelineTimeline | None = None

    @property
    def num_prefill_tokens(self) -> int:
        return sum(c.num_tokens for c in self.scheduled if c.kind == "prefill")

    @property
    def num_decode_tokens(self) -> int:
        return sum(c.num_tokens for c in self.scheduled if c.kind == "decode")

    @property
    def total_ms(self) -> float:
        return self.draft_ms + self.schedule_ms + self.forward_ms + self.sample_ms


@dataclass(frozen=True)
class BlockState:
    block_id: BlockId
    ref_count: Count
    owners: tuple[RequestId, ...]  # request ids whose block table holds this block
    num_tokens: Count  # filled slots (0 .. block_size)
    token_ids: tuple[TokenId, ...]
    text: str
    cached: bool = False  # held by a prefix-cache node (ref_count 0 + cached = evictable)


@dataclass(frozen=True)
class RequestState:
    request_id: RequestId
    status: RequestStatus
    arrival_step: Count
    num_prompt_tokens: Count
    num_output_tokens: Count
    num_computed_tokens: Count
    max_tokens: Positive
    block_table: tuple[BlockId, ...]
    num_preemptions: Count
    prompt: str
    output_text: str
    finish_reason: FinishReason | None
    num_cached_tokens: Count = 0  # prompt tokens served from the prefix cache at first admission
    parent_id: RequestId | None = None  # parallel sampling: the request this sequence belongs to


@dataclass(frozen=True)
class RequestMetrics:
    """Latency of one request, in engine steps and in milliseconds."""

    request_id: RequestId
    arrival_step: Count
    first_token_step: Count | None
    finished_step: Count | None
    num_output_tokens: Count
    ttft_steps: Count | None
    ttft_ms: Millis | None
    tpot_ms: Millis | None  # mean time per output token after the first
    e2e_ms: Millis | None
    num_preemptions: Count
    num_cached_tokens: Count = 0  # vLLM's name: prompt tokens served from the prefix cache
    # Speculative decoding: drafts verified, drafts accepted, target steps that verified drafts.
    num_draft_tokens: Count = 0
    num_accepted_tokens: Count = 0
    num_verify_steps: Count = 0

    @property
    def acceptance_rate(self) -> float | None:
        """alpha: accepted / verified drafts; None before any draft was verified."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    @property
    def mean_tokens_per_verify_step(self) -> float | None:
        """Tokens one verifying target step emitted on average: (accepted + one final token per
        step) / steps (before the stop rules cut a last step short); None without such steps."""
        if not self.num_verify_steps:
            return None
        return (self.num_accepted_tokens + self.num_verify_steps) / self.num_verify_steps


@dataclass(frozen=True)
class Snapshot:
    """The engine after a step: block pool, block tables, queues, per-request metrics."""

    step: Count
    block_size: Positive
    num_blocks: Positive
    kv_bytes_per_token: Positive
    blocks: tuple[BlockState, ...]
    requests: tuple[RequestState, ...]
    waiting: tuple[RequestId, ...]
    running: tuple[RequestId, ...]
    metrics: tuple[RequestMetrics, ...]
    prefix_tree: tuple[PrefixNode, ...] = ()  # parents before children; () with caching off
    parallel: ParallelLayout | None = None  # the layer split over worker processes; None in one process

    @property
    def num_free_blocks(self) -> int:
        """Blocks in the free queue: unused and holding nothing cached."""
        return sum(1 for b in self.blocks if b.ref_count == 0 and not b.cached)

    @property
    def num_evictable_blocks(self) -> int:
        """Cached blocks no sequence uses: the cache gives them up (LRU) before anyone is preempted."""
        return sum(1 for b in self.blocks if b.ref_count == 0 and b.cached)


# serialised with "_type": "<class name>"; engine.schema.decode(tp, data, TAGGED) is the inverse
# of to_dict (engine.replay.recording loads with it)
TAGGED: frozenset[type] = frozenset({ScheduledChunk, SampledToken, StepTrace, BlockState, RequestState,
                                     RequestMetrics, Snapshot, PrefixNode, PrefixLookup, BlockCopy,
                                     PrefixCacheEvents, DraftToken, ResidualToken, SpecVerification,
                                     WorkEvent, PipelineUnit, PipelineTimeline, StageLayout, TensorShard,
                                     ParallelLayout})


def to_dict(record: Any) -> Any:
    """A record (or tuple of records) -> JSON-ready dict tagged with its type."""
    if dataclasses.is_dataclass(record):
        out = {"_type": type(record).__name__}
        for f in dataclasses.fields(record):
            out[f.name] = to_dict(getattr(record, f.name))
        return out
    if isinstance(record, (tuple, list)):
        return [to_dict(x) for x in record]
    if isinstance(record, enum.Enum):
        return record.value
    return record
