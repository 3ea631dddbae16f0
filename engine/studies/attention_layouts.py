"""MHA, GQA and MQA on the real engine: one workload, one KV-cache memory budget, three pools.

The three ``tiny-random`` variants (engine/model/loader.py) share everything but the number of
KV heads: 4 query heads of 16 over 4 (MHA), 2 (GQA) or 1 (MQA) KV heads, so one token's K and V
take 2 : 1 : 1/2 the bytes. Given the same bytes for the KV cache, the engine's block pool
therefore holds 1 : 2 : 4 times the blocks (``num_blocks = budget // (block_size x KV bytes per
token)``), and the same requests find room for more sequences at once, with fewer preemptions.

Each engine runs the workload to the end, step by step; after every step its integrity is
checked and its pool (who owns each physical block, how full it is) and queues are recorded as
frozen ``LayoutStep``s. The page steps the three records together.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.core.config import SamplingParams
from engine.model.runner import kv_cache_bytes_per_token
from engine.model.shared import get_shared_model
from engine.serving.engine import LLMEngine

__all__ = ["LAYOUTS", "LayoutRun", "LayoutStep", "LayoutStudy", "LayoutWorkload", "run_layouts"]

#: (layout, model): the same hidden size (64), query heads (4) and head_dim (16); 4, 2, 1 KV heads
LAYOUTS: tuple[tuple[str, str], ...] = (("MHA", "tiny-random-mha"), ("GQA", "tiny-random"),
                                        ("MQA", "tiny-random-mqa"))
KV_CACHE_DTYPE = "float32"  # the engine's default pool dtype for these fp32 models
MAX_STEPS = 2000  # far above any workload the limits below allow (a guard, not a limit users meet)
#: every prompt is this many bytes (one token each with the byte tokenizer): equal requests, so
#: a pool's capacity reads directly as "sequences"
PROMPT_CHARS = 24


@dataclass(frozen=True)
class LayoutWorkload:
    """The requests and the memory budget every layout gets.

    kv_budget_bytes  bytes for the KV cache, the same for each layout (4 KiB .. 1 MiB)
    num_requests     equal requests, all arriving at step 0 (1 .. 16)
    max_tokens       tokens each generates, greedy, EOS ignored (1 .. 64)
    block_size       tokens per KV block (1 .. 16)
    """

    kv_budget_bytes: int = 64 * 1024
    num_requests: int = 8
    max_tokens: int = 16
    block_size: int = 4

    def __post_init__(self) -> None:
        for name, low, high in (("kv_budget_bytes", 4 * 1024, 2**20), ("num_requests", 1, 16),
                                ("max_tokens", 1, 64), ("block_size", 1, 16)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise ValueError(f"{name}: must be an integer in {low} .. {high}, got {value!r}")

    @property
    def tokens_per_request(self) -> int:
        return PROMPT_CHARS + self.max_tokens

    def prompts(self) -> list[str]:
        """``num_requests`` different prompts of PROMPT_CHARS bytes each."""
        return [f"Request {i:02d}: the fox ran."[:PROMPT_CHARS].ljust(PROMPT_CHARS, ".")
                for i in range(self.num_requests)]


@dataclass(frozen=True)
class LayoutStep:
    """One engine after ``steps_done`` steps (0: the requests queued, nothing run)."""

    steps_done: int
    blocks_used: int
    num_blocks: int
    running: int  # sequences admitted and holding KV blocks
    waiting: int  # queued, or preempted and waiting to be recomputed
    finished: int  # requests done so far
    preempted_now: tuple[str, ...]  # request ids preempted in this step
    preemptions: int  # preemptions so far
    block_owners: tuple[str | None, ...]  # per physical block: the owning request id, None if free
    block_tokens: tuple[int, ...]  # per physical block: the token slots filled


@dataclass(frozen=True)
class LayoutRun:
    """One layout's engine run to the end: its shape, its pool and every step."""

    layout: str  # "MHA" | "GQA" | "MQA"
    model: str
    num_layers: int
    num_query_heads: int
    num_kv_heads: int
    head_dim: int
    kv_bytes_per_token: int  # the engine's own figure (K and V, every layer, the pool's dtype)
    block_size: int
    num_blocks: int
    kv_pool_bytes: int  # the engine's allocated pool: num_blocks x block_size x kv_bytes_per_token
    steps: tuple[LayoutStep, ...]  # steps[0] before the first step, steps[-1] when all finished

    @property
    def num_steps(self) -> int:
        return len(self.steps) - 1

    @property
    def peak_running(self) -> int:
        return max(s.running for s in self.steps)

    @property
    def preemptions(self) -> int:
        return self.steps[-1].preemptions

    def at(self, steps_done: int) -> LayoutStep:
        """The state after ``steps_done`` steps; a run that already finished stays finished."""
        return self.steps[max(0, min(steps_done, self.num_steps))]


@dataclass(frozen=True)
class LayoutStudy:
    workload: LayoutWorkload
    runs: tuple[LayoutRun, ...]  # in LAYOUTS order

    @property
    def num_steps(self) -> int:
        """Steps until the slowest layout finished."""
        return max(r.num_steps for r in self.runs)


def pool_blocks(budget_bytes: int, block_size: int, kv_bytes_per_token: int) -> int:
    """Whole blocks that fit in the budget."""
    return budget_bytes // (block_size * kv_bytes_per_token)


def _record(engine: LLMEngine, steps_done: int, preempted: tuple[str, ...], preemptions: int,
            finished: int) -> LayoutStep:
    snap = engine.snapshot()
    owners = tuple(b.owners[0] if b.ref_count > 0 and b.owners else None for b in snap.blocks)
    return LayoutStep(steps_done=steps_done, blocks_used=sum(1 for b in snap.blocks if b.ref_count > 0),
                      num_blocks=snap.num_blocks, running=len(snap.running), waiting=len(snap.waiting),
                      finished=finished, preempted_now=preempted, preemptions=preemptions,
                      block_owners=owners, block_tokens=tuple(b.num_tokens if o is not None else 0
                                                              for b, o in zip(snap.blocks, owners)))


def run_layout(layout: str, model: str, workload: LayoutWorkload) -> LayoutRun:
    """``model``'s engine with the budget's blocks, the workload run to the end, every step
    recorded; ValueError (the engine's, naming the limit) when the pool cannot hold one request."""
    shared = get_shared_model(model)
    mc = shared.model.config
    per_token = kv_cache_bytes_per_token(mc, KV_CACHE_DTYPE)
    blocks = pool_blocks(workload.kv_budget_bytes, workload.block_size, per_token)
    need = -(-workload.tokens_per_request // workload.block_size)
    if blocks < need:
        raise ValueError(f"kv_budget_bytes: {layout} ({model}) gets {blocks} block(s) of {workload.block_size} tokens"
                         f" from {workload.kv_budget_bytes:,} B at {per_token:,} B/token, but one request needs {need}"
                         f" ({workload.tokens_per_request} tokens): raise the budget or shorten the requests")
    # the budget, not the batch caps, decides who runs: every request may be scheduled at once
    engine = LLMEngine(shared, kv_cache_dtype=KV_CACHE_DTYPE, num_blocks=blocks, block_size=workload.block_size,
                       max_num_seqs=workload.num_requests, max_num_batched_tokens=max(256, workload.num_requests
                                                                                      * workload.tokens_per_request))
    params = SamplingParams(temperature=0, max_tokens=workload.max_tokens, ignore_eos=True)
    for prompt in workload.prompts():
        engine.add_request(prompt, params)
    steps = [_record(engine, 0, (), 0, 0)]
    preemptions = finished = 0
    while engine.has_unfinished_requests():
        if len(steps) > MAX_STEPS:
            raise RuntimeError(f"{layout}: not finished after {MAX_STEPS} steps")
        trace = engine.step()
        engine.check_integrity()
        preemptions += len(trace.preempted)
        finished += len(trace.finished)
        steps.append(_record(engine, len(steps), tuple(trace.preempted), preemptions, finished))
    return LayoutRun(layout=layout, model=model, num_layers=mc.num_hidden_layers,
                     num_query_heads=mc.num_attention_heads, num_kv_heads=mc.num_key_value_heads,
                     head_dim=mc.head_dim, kv_bytes_per_token=engine.kv_cache_bytes_per_token,
                     block_size=workload.block_size, num_blocks=blocks, kv_pool_bytes=engine.kv_cache_total_bytes,
                     steps=tuple(steps))


def run_layouts(workload: LayoutWorkload | None = None) -> LayoutStudy:
    """MHA, GQA and MQA on ``workload`` with the same KV budget (LAYOUTS order)."""
    workload = workload or LayoutWorkload()
    return LayoutStudy(workload, tuple(run_layout(layout, model, workload) for layout, model in LAYOUTS))
