"""Model drafters (speculative_config methods "draft_model" and "early_exit"): a model that
proposes k tokens per request with its OWN paged KV cache and block tables.

    draft_model   a second model with the target's vocabulary (e.g. smollm2-135m int4 for
                  smollm2-135m): every layer, its own weights (shared read-only with any
                  engine that loaded the same model)
    early_exit    the target's own LlamaModel, layers [0, n) + final norm + LM head
                  (``run_layers(hidden, batch, kv, 0, n)`` and ``compute_logits``; no weight
                  copy). It keeps its OWN KV for those n layers rather than sharing the
                  target's: drafting runs ahead of the target (positions the target has not
                  allocated slots for yet, and drafts the target may reject), and the target's
                  KV of layers < n for a rejected draft would have to be rewritten anyway.

Both use the same machinery. Block bookkeeping is a slim allocator (``DraftBlocks``: a free
list and one table per request, no prefix cache, no ref counts: draft blocks are never
shared), sized like the target's pool. Per request the drafter knows how many positions
have draft KV (``computed``); each ``propose``:

    1. catch up: one flattened forward over every drafted request's tokens the draft has not
       computed (the whole prompt on first use, usually the 1..k+1 tokens the last step
       emitted), logits at each request's last token -> draft token x_1
    2. k - 1 batched single-token steps, each feeding the previous draft -> x_2 .. x_k
    q_i = probs_from_logits(row, the request's own temperature / top-k / top-p); a sampled
    request draws x_i from q_i with its own generator, a greedy one takes the argmax.

After verification ``rewind`` drops ``computed`` to the verified length (the stale slots past
it are overwritten by the next catch-up). A request whose draft blocks cannot be allocated is
simply not drafted this step (drafting never preempts anyone).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from engine.speculative.drafter import Draft
from engine.model.forward_batch import build_forward_batch
from engine.core.kv_cache import cdiv
from engine.model.kv_quant import KVCache
from engine.model.llama import LlamaModel
from engine.core.request import Request
from engine.speculative.spec_decode import probs_from_logits


@dataclass
class DraftBlocks:
    """The draft pool's bookkeeping. Invariant: every block id 0 .. num_blocks - 1 is either in
    ``free`` or in exactly one table; a table covers its request's ``computed`` positions."""

    num_blocks: int
    block_size: int

    def __post_init__(self) -> None:
        self.free: list[int] = list(range(self.num_blocks))
        self.tables: dict[str, list[int]] = {}
        self.computed: dict[str, int] = {}

    def ensure(self, request_id: str, num_positions: int) -> bool:
        """Grow the table to cover ``num_positions`` positions; False (nothing changed) when the
        free list is too short."""
        table = self.tables.get(request_id, [])
        need = cdiv(num_positions, self.block_size) - len(table)
        if need > len(self.free):
            return False
        if need > 0:
            taken, self.free = self.free[:need], self.free[need:]
            self.tables[request_id] = table + taken
        else:
            self.tables.setdefault(request_id, table)
        self.computed.setdefault(request_id, 0)
        return True

    def release(self, request_id: str) -> None:
        self.free.extend(reversed(self.tables.pop(request_id, [])))
        self.computed.pop(request_id, None)

    def slots(self, request_id: str, end: int) -> list[int]:
        """Flat slots of positions 0 .. end - 1."""
        table, bs = self.tables[request_id], self.block_size
        return [table[p // bs] * bs + p % bs for p in range(end)]

    def state(self) -> tuple[list[int], dict[str, list[int]], dict[str, int]]:
        return list(self.free), {r: list(t) for r, t in self.tables.items()}, dict(self.computed)

    def set_state(self, state: tuple[list[int], dict[str, list[int]], dict[str, int]]) -> None:
        free, tables, computed = state
        self.free, self.tables, self.computed = list(free), {r: list(t) for r, t in tables.items()}, dict(computed)

    def check_integrity(self, live: set[str]) -> None:
        seen = list(self.free) + [b for t in self.tables.values() for b in t]
        if sorted(seen) != list(range(self.num_blocks)):
            raise AssertionError("draft pool: a block is leaked or owned twice")
        for rid, table in self.tables.items():
            if rid not in live:
                raise AssertionError(f"draft pool: {rid} is not running but holds draft blocks")
            if self.computed.get(rid, 0) > len(table) * self.block_size:
                raise AssertionError(f"draft pool: {rid}'s table does not cover its draft KV")
        if set(self.computed) != set(self.tables):
            raise AssertionError("draft pool: computed counts and tables disagree")


class ModelDrafter:
    """A draft model (or the target's first layers) with its own KV; see the module doc."""

    def __init__(self, method: str, model: LlamaModel, num_layers: int, num_blocks: int, block_size: int) -> None:
        """``num_layers`` of ``model`` (checked by SpeculativeConfig.check_against_model)."""
        self.method = method
        self.model = model
        self.num_layers = num_layers
        c = model.config
        shape = (num_blocks, block_size, c.num_key_value_heads, c.head_dim)  # per layer, K and V
        self.kv_caches: list[tuple[KVCache, KVCache]] = [(torch.zeros(shape, dtype=model.dtype), torch.zeros(shape, dtype=model.dtype))
                          for _ in range(num_layers)]
        self.blocks = DraftBlocks(num_blocks, block_size)

    @property
    def num_used_blocks(self) -> int:
        return self.blocks.num_blocks - len(self.blocks.free)

    @torch.inference_mode()
    def _forward(self, chunks: list[list[int]], starts: list[int], rids: list[str]) -> torch.Tensor:
        """One flattened forward of the draft; -> logits [R, V] fp32 at each chunk's last token."""
        slots = [self.blocks.slots(rid, start + len(chunk)) for rid, start, chunk in zip(rids, starts, chunks)]
        batch = build_forward_batch(chunks, starts, slots, [1] * len(chunks))
        hidden = self.model.run_layers(self.model.embed(batch), batch, self.kv_caches, 0, self.num_layers)
        return self.model.compute_logits(hidden, batch)

    def _pick(self, request: Request, logits: torch.Tensor) -> tuple[int, torch.Tensor | None]:
        """logits [V] -> (draft token, q [V] or None for a greedy request)."""
        p = request.sampling_params
        if p.greedy:
            return int(logits.argmax()), None
        q = probs_from_logits(logits[None], p.temperature, p.top_k, p.top_p)[0]
        return int(torch.multinomial(q, 1, generator=request.generator)), q

    def propose(self, requests: Sequence[tuple[Request, int]]) -> dict[str, Draft]:
        """Catch-up forward, then k - 1 single-token steps, batched over the requests (module doc).
        Rule: after it, ``computed`` = len(tokens) + k - 1 (the last draft has no KV yet)."""
        todo: list[tuple[Request, int, list[int]]] = []
        for request, k in requests:
            rid = request.request_id
            tokens = request.prompt_token_ids + request.output_token_ids
            if k <= 0 or not self.blocks.ensure(rid, len(tokens) + k - 1):
                continue
            self.blocks.computed[rid] = min(self.blocks.computed[rid], len(tokens) - 1)
            todo.append((request, k, tokens))
        if not todo:
            return {}
        starts = [self.blocks.computed[r.request_id] for r, _, _ in todo]
        logits = self._forward([t[s:] for (_, _, t), s in zip(todo, starts)], starts,
                               [r.request_id for r, _, _ in todo])
        drafted: dict[str, list[int]] = {}
        probs: dict[str, list[torch.Tensor]] = {}
        for (request, _, tokens), row in zip(todo, logits):
            token, q = self._pick(request, row)
            drafted[request.request_id] = [token]
            probs[request.request_id] = [] if q is None else [q]
            self.blocks.computed[request.request_id] = len(tokens)
        for step in range(1, max(k for _, k, _ in todo)):
            active = [(r, t) for r, k, t in todo if k > step]
            rids = [r.request_id for r, _ in active]
            starts = [len(t) + step - 1 for _, t in active]
            logits = self._forward([[drafted[rid][-1]] for rid in rids], starts, rids)
            for (request, _), row in zip(active, logits):
                token, q = self._pick(request, row)
                drafted[request.request_id].append(token)
                if q is not None:
                    probs[request.request_id].append(q)
                self.blocks.computed[request.request_id] += 1
        return {rid: Draft(tuple(ids), torch.stack(probs[rid]) if probs[rid] else None)
                for rid, ids in drafted.items()}

    def rewind(self, request: Request, num_verified: int) -> None:
        """Only positions < num_verified are verified tokens: draft KV beyond them is stale."""
        rid = request.request_id
        if rid in self.blocks.computed:
            self.blocks.computed[rid] = min(self.blocks.computed[rid], num_verified)

    def release(self, request_id: str) -> None:
        self.blocks.release(request_id)

    def checkpoint(self) -> object:
        return self.blocks.state()

    def restore(self, state: object) -> None:
        self.blocks.set_state(state)  # type: ignore[arg-type]

    def check_integrity(self, live: Iterable[Request]) -> None:
        self.blocks.check_integrity({r.request_id for r in live})
