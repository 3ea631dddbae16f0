"""One flattened batch per step: every scheduled token of every request, in one row.

    requests    r0 (decode)   r1 (prefill chunk of 3)   r2 (decode)
    input_ids   [ a  |  b  c  d  |  e ]               T = 5 tokens
    query_start_loc  [0, 1, 4, 5]
    seq_lens         [17, 9, 30]       context length after this step, per request
    slot_mapping     where each token's K/V is written in the paged pool
    logits_indices   rows whose logits are sampled (the last token of requests that reached
                     the end of their known tokens; mid-prompt chunks sample nothing; a
                     speculative verification of k drafts gets its last k + 1 rows)

Built once per step by the model runner and passed explicitly to every layer (no globals),
so two engines can live in one process. Everything attention needs that does not depend on
the layer (slot indices, masks, decode groups) is built here once, not once per layer.

Decode groups: decodes (one query token each) are attended in groups, each padded only to
its own longest member, never to the longest decode of the whole batch:

    context lengths      40 40 41 40 42 40 40 | 910
    groups               [ 7 rows x 42 slots ] | [ 1 row x 910 ]
    slots gathered       294 + 910 = 1,204      (one padded batch: 8 x 910 = 7,280)

Rule (``group_decodes``): sort the decodes by length and cut that order into contiguous runs
minimising  sum over groups of (GROUP_OVERHEAD_SLOTS + rows x longest), where
GROUP_OVERHEAD_SLOTS prices the fixed cost of one more group (a few more ops per layer) in
gathered slots. Equal lengths always share a group; one long context gets its own group as
soon as its padding would cost more than a group does.

Invariant: every decode row belongs to exactly one group, and within a group row i's first
len_i slots are exactly its own context slots in position order; the rest are padding
(repeating the row's own last slot, so no other request's K/V is ever read) and masked out.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

# Fixed cost of one more decode group, in gathered K/V slots: one group costs about 30 µs per
# layer of dispatch (gather K, gather V, SDPA, write back) and one slot about 0.2 µs on the
# 2-core CPU this was measured on (smollm2-135m shapes), so ~150 slots; rounded down.
GROUP_OVERHEAD_SLOTS = 128
#: a group's price when grouping is off: never worth a second group, so every decode is in one,
#: padded to the longest context (EngineConfig.decode_grouping = False)
ONE_GROUP_OVERHEAD = 1 << 62


def decode_group_overhead(grouping: bool) -> int:
    """The ``group_decodes`` overhead for EngineConfig.decode_grouping."""
    return GROUP_OVERHEAD_SLOTS if grouping else ONE_GROUP_OVERHEAD


@dataclass(frozen=True)
class SequenceKV:
    """Per-request attention inputs: its query rows and where its whole context lives."""

    q_start: int
    q_len: int
    seq_len: int
    kv_slots: torch.Tensor  # [seq_len] flat slot index of every cached position
    # [q_len, seq_len] bool (True = attend), or None when the chunk is the whole sequence
    # (then plain causal attention applies).
    mask: torch.Tensor | None = None

    def to(self, device: torch.device) -> SequenceKV:
        return replace(self, kv_slots=self.kv_slots.to(device), mask=_to(self.mask, device))


@dataclass(frozen=True)
class DecodeGroup:
    """Decodes attended together, padded to the group's own longest context."""

    rows: torch.Tensor  # [n] int64 row in the flat batch, ascending
    slots: torch.Tensor  # [n * width] int64 flat slot indices, row-major (see module doc)
    width: int  # the longest context in the group
    mask: torch.Tensor | None  # [n, 1, 1, width] bool, True = attend; None when all rows are full

    @property
    def num_rows(self) -> int:
        return int(self.rows.shape[0])

    def to(self, device: torch.device) -> DecodeGroup:
        return replace(self, rows=self.rows.to(device), slots=self.slots.to(device), mask=_to(self.mask, device))


def _to(t: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    return None if t is None else t.to(device)


@dataclass(frozen=True)
class ForwardBatch:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    slot_mapping: torch.Tensor  # [T] int64, flat index into [num_blocks * block_size]
    query_start_loc: tuple[int, ...]  # [B + 1]
    seq_lens: tuple[int, ...]  # [B]
    logits_indices: torch.Tensor  # [S] int64 rows to sample from
    prefills: tuple[SequenceKV, ...]  # requests with more than one query token
    decode_rows: torch.Tensor  # [D] int64 row of every decode in the flat batch
    decode_groups: tuple[DecodeGroup, ...]  # a partition of the decodes (module doc)
    #: logits_indices is every row in order (a decode-only step): the LM head takes the rows as they are
    logits_all_rows: bool = False

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    def to(self, device: torch.device) -> ForwardBatch:
        """This batch with every tensor on ``device`` (built on CPU, moved once per step on CUDA)."""
        if self.input_ids.device == device:
            return self
        return replace(self, input_ids=self.input_ids.to(device), positions=self.positions.to(device),
                       slot_mapping=self.slot_mapping.to(device), logits_indices=self.logits_indices.to(device),
                       prefills=tuple(p.to(device) for p in self.prefills), decode_rows=self.decode_rows.to(device),
                       decode_groups=tuple(g.to(device) for g in self.decode_groups))


def group_decodes(lengths: list[int], overhead: int = GROUP_OVERHEAD_SLOTS) -> list[list[int]]:
    """Partition decode indices into groups (module doc: rule). -> index lists, each ascending.

    Exact dynamic programme over the length-sorted order: best[j] is the cheapest split of
    the j shortest decodes; O(D^2) comparisons for D decodes, once per step.
    """
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    sorted_lens = [lengths[i] for i in order]
    best = [0] * (len(order) + 1)
    cut = [0] * (len(order) + 1)
    for j in range(1, len(order) + 1):
        width = sorted_lens[j - 1]  # the longest of positions i..j-1
        best[j], cut[j] = min((best[i] + overhead + (j - i) * width, i) for i in range(j))
    groups: list[list[int]] = []
    j = len(order)
    while j > 0:
        groups.append(sorted(order[cut[j]:j]))
        j = cut[j]
    return groups[::-1]


def _decode_group(rows: list[int], contexts: list[list[int]]) -> DecodeGroup:
    """rows[i] attends over the slots contexts[i] (its positions 0 .. len - 1)."""
    width = max(len(c) for c in contexts)
    padded: list[int] = []
    for c in contexts:
        padded.extend(c)
        padded.extend([c[-1]] * (width - len(c)))  # own last slot: masked, never foreign
    mask = None
    if any(len(c) != width for c in contexts):
        lens = torch.tensor([len(c) for c in contexts], dtype=torch.long)  # [n]
        mask = (torch.arange(width).unsqueeze(0) < lens.unsqueeze(1)).view(len(rows), 1, 1, width)
    return DecodeGroup(rows=torch.tensor(rows, dtype=torch.long),
                       slots=torch.tensor(padded, dtype=torch.long), width=width, mask=mask)


def _prefill_kv(row: int, n: int, seq_len: int, slots: list[int]) -> SequenceKV:
    """A chunk of n queries at positions seq_len - n .. seq_len - 1 over positions 0 .. seq_len - 1."""
    mask = None
    if n != seq_len:  # cached prefix: query at position p sees keys 0..p
        q_pos = torch.arange(seq_len - n, seq_len).unsqueeze(1)  # [n, 1]
        mask = torch.arange(seq_len).unsqueeze(0) <= q_pos  # [n, seq_len]
    return SequenceKV(row, n, seq_len, torch.tensor(slots[:seq_len], dtype=torch.long), mask)


def build_forward_batch(
    token_chunks: list[list[int]],
    starts: list[int],
    slot_tables: list[list[int]],
    sample_flags: Sequence[int],
    group_overhead: int = GROUP_OVERHEAD_SLOTS,
) -> ForwardBatch:
    """Flatten per-request chunks into a ForwardBatch.

    token_chunks[i]  the tokens request i computes this step
    starts[i]        its first position (num_computed_tokens before the step)
    slot_tables[i]   flat slots of positions 0 .. starts[i] + len(chunk) - 1
    sample_flags[i]  how many of the chunk's last tokens get a logits row: False / 0 (a
                     mid-prompt chunk), True / 1 (the last token is sampled), or 1 + k for a
                     speculative verification (the last known token and its k drafts)
    """
    input_ids: list[int] = []
    positions: list[int] = []
    slot_mapping: list[int] = []
    qsl = [0]
    seq_lens: list[int] = []
    logits_indices: list[int] = []
    prefills: list[SequenceKV] = []
    decode_rows: list[int] = []
    decode_contexts: list[list[int]] = []
    for chunk, start, slots, sample in zip(token_chunks, starts, slot_tables, sample_flags):
        n, row = len(chunk), qsl[-1]
        seq_len = start + n
        input_ids.extend(chunk)
        positions.extend(range(start, seq_len))
        slot_mapping.extend(slots[start:seq_len])
        qsl.append(row + n)
        seq_lens.append(seq_len)
        if sample:
            logits_indices.extend(range(row + n - int(sample), row + n))
        if n == 1:
            decode_rows.append(row)
            decode_contexts.append(slots[:seq_len])
        else:
            prefills.append(_prefill_kv(row, n, seq_len, slots))
    groups = group_decodes([len(c) for c in decode_contexts], group_overhead)
    return ForwardBatch(
        input_ids=torch.tensor(input_ids, dtype=torch.long),
        positions=torch.tensor(positions, dtype=torch.long),
        slot_mapping=torch.tensor(slot_mapping, dtype=torch.long),
        query_start_loc=tuple(qsl),
        seq_lens=tuple(seq_lens),
        logits_indices=torch.tensor(logits_indices, dtype=torch.long),
        prefills=tuple(prefills),
        decode_rows=torch.tensor(decode_rows, dtype=torch.long),
        decode_groups=tuple(_decode_group([decode_rows[i] for i in g], [decode_contexts[i] for i in g])
                            for g in groups),
        logits_all_rows=logits_indices == list(range(len(input_ids))),
    )
