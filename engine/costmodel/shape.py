"""What one scheduled batch asks of the hardware: per request, the new tokens and the context
they attend to. Everything a cost model may read, and nothing else (no token ids)."""
from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Mapping
from typing import NamedTuple

from engine.core.scheduler import SchedulerOutput


class ChunkShape(NamedTuple):
    """One request's part of a step."""

    new_tokens: int  # query tokens computed this step
    start: int  # tokens whose KV is already cached (the context before the chunk)
    samples: int  # logits rows it needs (0: a prefill chunk that does not reach the end)

    @property
    def context(self) -> int:
        """Tokens the chunk's last query attends to (its KV after the step)."""
        return self.start + self.new_tokens

    @property
    def causal_pairs(self) -> int:
        """(query, key) pairs of causal attention: each new token sees the cached tokens and the
        new ones up to itself: q x start + q (q + 1) / 2."""
        q = self.new_tokens
        return q * self.start + q * (q + 1) // 2


@dataclass(frozen=True)
class StepShape:
    chunks: tuple[ChunkShape, ...]

    @property
    def num_tokens(self) -> int:
        """M of every GEMM: the batch's tokens."""
        return sum(c.new_tokens for c in self.chunks)

    @property
    def num_samples(self) -> int:
        """Rows of the LM head."""
        return sum(c.samples for c in self.chunks)

    @property
    def num_requests(self) -> int:
        return len(self.chunks)

    @property
    def num_decodes(self) -> int:
        """Chunks of one query token that sample (a decode)."""
        return sum(1 for c in self.chunks if c.new_tokens == 1 and c.samples)

    @property
    def num_prefill_chunks(self) -> int:
        """Chunks of several query tokens (attention's prefill path: one call per chunk and layer)."""
        return sum(1 for c in self.chunks if c.new_tokens > 1)


def step_shape(output: SchedulerOutput, imported: Mapping[str, int] | None = None) -> StepShape:
    """The shape of a scheduler output (speculative drafts count as query tokens and rows).

    ``imported``: request id -> leading tokens whose KV arrived from elsewhere (disaggregated
    prefill: a decode instance receives the prompt's KV); those positions cost nothing, the
    blocks they fill are still the scheduler's to allocate."""
    chunks = []
    for s in output.scheduled:
        samples = 0 if s.is_prefill else 1 + s.num_spec_tokens
        start, new = s.start, s.num_new_tokens
        done = imported.get(s.request_id, 0) if imported else 0
        if done > start:
            new, start = max(0, start + new - done), min(done, start + new)
        if new or samples:
            chunks.append(ChunkShape(new, start, samples))
    return StepShape(tuple(chunks))


def decode_shape(batch: int, context: int) -> StepShape:
    """``batch`` decodes, each at ``context`` tokens (the calculator's decode step)."""
    return StepShape(tuple(ChunkShape(1, context - 1, 1) for _ in range(batch)))


def prefill_shape(tokens: int, start: int = 0) -> StepShape:
    """One prefill of ``tokens`` new tokens after ``start`` cached ones, sampling its first token."""
    return StepShape((ChunkShape(tokens, start, 1),))
