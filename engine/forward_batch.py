"""One flattened batch per step: every scheduled token of every request, in one row.

    requests    r0 (decode)   r1 (prefill chunk of 3)   r2 (decode)
    input_ids   [ a  |  b  c  d  |  e ]               T = 5 tokens
    query_start_loc  [0, 1, 4, 5]
    seq_lens         [17, 9, 30]       context length after this step, per request
    slot_mapping     where each token's K/V is written in the paged pool
    logits_indices   rows whose logits are sampled (the last token of requests that reached
                     the end of their known tokens; mid-prompt chunks sample nothing)

Built once per step by the model runner and passed explicitly to every layer (no globals),
so two engines can live in one process.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SequenceKV:
    """Per-request attention inputs: its query rows and where its whole context lives."""

    q_start: int
    q_len: int
    seq_len: int
    kv_slots: torch.Tensor  # [seq_len] flat slot index of every cached position


@dataclass(frozen=True)
class ForwardBatch:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    slot_mapping: torch.Tensor  # [T] int64, flat index into [num_blocks * block_size]
    query_start_loc: tuple[int, ...]  # [B + 1]
    seq_lens: tuple[int, ...]  # [B]
    logits_indices: torch.Tensor  # [S] int64 rows to sample from
    prefills: tuple[SequenceKV, ...]  # requests with more than one query token
    # Decode requests (one query token each), batched: padded slots and a validity mask.
    decode_rows: torch.Tensor  # [D] row in the flat batch
    decode_slots: torch.Tensor  # [D, Lmax] int64 (padding points at slot 0)
    decode_mask: torch.Tensor  # [D, 1, 1, Lmax] bool, True = attend

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])


def build_forward_batch(
    token_chunks: list[list[int]],
    starts: list[int],
    slot_tables: list[list[int]],
    sample_flags: list[bool],
) -> ForwardBatch:
    """Flatten per-request chunks into a ForwardBatch.

    token_chunks[i]  the tokens request i computes this step
    starts[i]        its first position (num_computed_tokens before the step)
    slot_tables[i]   flat slots of positions 0 .. starts[i] + len(chunk) - 1
    sample_flags[i]  whether the last token of the chunk is sampled
    """
    input_ids: list[int] = []
    positions: list[int] = []
    slot_mapping: list[int] = []
    qsl = [0]
    seq_lens = []
    logits_indices = []
    prefills = []
    decode_rows, decode_slot_lists = [], []
    for chunk, start, slots, sample in zip(token_chunks, starts, slot_tables, sample_flags):
        n, row = len(chunk), qsl[-1]
        seq_len = start + n
        input_ids.extend(chunk)
        positions.extend(range(start, seq_len))
        slot_mapping.extend(slots[start:seq_len])
        qsl.append(row + n)
        seq_lens.append(seq_len)
        if sample:
            logits_indices.append(row + n - 1)
        if n == 1:
            decode_rows.append(row)
            decode_slot_lists.append(slots[:seq_len])
        else:
            prefills.append(SequenceKV(row, n, seq_len, torch.tensor(slots[:seq_len], dtype=torch.long)))
    lmax = max((len(s) for s in decode_slot_lists), default=0)
    decode_slots = torch.zeros((len(decode_slot_lists), lmax), dtype=torch.long)
    decode_mask = torch.zeros((len(decode_slot_lists), 1, 1, lmax), dtype=torch.bool)
    for i, s in enumerate(decode_slot_lists):
        decode_slots[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        decode_mask[i, 0, 0, : len(s)] = True
    return ForwardBatch(
        input_ids=torch.tensor(input_ids, dtype=torch.long),
        positions=torch.tensor(positions, dtype=torch.long),
        slot_mapping=torch.tensor(slot_mapping, dtype=torch.long),
        query_start_loc=tuple(qsl),
        seq_lens=tuple(seq_lens),
        logits_indices=torch.tensor(logits_indices, dtype=torch.long),
        prefills=tuple(prefills),
        decode_rows=torch.tensor(decode_rows, dtype=torch.long),
        decode_slots=decode_slots,
        decode_mask=decode_mask,
    )
