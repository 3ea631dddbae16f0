"""Triton kernels of the engine (Triton and torch only; compiled on a GPU, or run on CPU tensors
by Triton's interpreter when ``TRITON_INTERPRET=1`` is set before this package is imported).

    paged_attention.py   FlashAttention over the paged cache for a mixed prefill + decode batch,
                         split-KV decode (FlashDecoding) and its log-sum-exp merge, per-tile trace
    kv_write.py          this step's K/V into the paged cache through the slot mapping (float
                         caches; int8 / fp8 caches: values quantized by the caller, and scales)
    reference.py         the float64 torch reference of paged_attention (the tests' oracle)
    validation.py        the checks before a launch (ValueError naming the argument)

``INTERPRETED``: whether these kernels were built for the interpreter (Triton reads
TRITON_INTERPRET when a kernel is defined, i.e. when this package is first imported).
"""
from __future__ import annotations

from engine.kernels.kv_write import write_kv, write_kv_quantized
from engine.kernels.paged_attention import (
    BLOCK_N, INTERPRETED, MAX_SEGMENTS, TRACE_MAX_CONTEXT, AttentionTrace, paged_attention,
)
from engine.kernels.reference import paged_attention_reference

__all__ = ["AttentionTrace", "BLOCK_N", "INTERPRETED", "MAX_SEGMENTS", "TRACE_MAX_CONTEXT", "paged_attention",
           "paged_attention_reference", "write_kv", "write_kv_quantized"]
