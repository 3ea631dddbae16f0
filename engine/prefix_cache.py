"""The prefix-cache seam: consulted at admission, told when blocks become full.

A prefix cache maps token prefixes to physical blocks that already hold their KV, so a new
request can share them instead of recomputing. This module defines the interface the KV
cache manager calls and the disabled implementation; the radix-tree cache plugs in here
with the same interface.
"""
from __future__ import annotations

from typing import Protocol, Sequence

from engine.block_pool import BlockPool


class PrefixCache(Protocol):
    def match(self, token_ids: Sequence[int]) -> list[int]:
        """Physical block ids holding the longest cached prefix of ``token_ids``.

        Only whole blocks, and never the last token (its logits must be computed).
        """

    def on_blocks_computed(self, token_ids: Sequence[int], block_table: Sequence[int],
                           num_computed_tokens: int) -> None:
        """Called after a forward: blocks that became full may now be cached."""

    def check_integrity(self, pool: BlockPool) -> None: ...


class NoPrefixCache:
    """Prefix caching disabled: every request computes its whole prompt."""

    def match(self, token_ids: Sequence[int]) -> list[int]:
        return []

    def on_blocks_computed(self, token_ids: Sequence[int], block_table: Sequence[int],
                           num_computed_tokens: int) -> None:
        return None

    def check_integrity(self, pool: BlockPool) -> None:
        return None
