"""The decoder layers of a CPU fp32 decode step in one C call (engine/model/decode_avx2.c): no
Python and no torch dispatch between the operations of a step.

Why: a batch-1 decode step of SmolLM2 is ~2,000 small torch ops (30 layers x norms, RoPE, K/V
writes, gathers, SDPA, adds); at a few µs of Python and dispatch each they cost ~10 ms, as much as
a third of the step, whatever the GEMV kernel. The C function runs every layer's arithmetic
(the same as ``LlamaModel.run_layers``: RMSNorm, fused qkv / gate_up GEMVs, RoPE, paged K/V
write, GQA attention over each row's own context slots, SwiGLU, residuals) over the step's rows;
Python calls it once per step.

Where it applies (``applies``): a float32 model with plain (unquantized) weights, on CPU, the
whole layer range in this process (no pipeline stage, no tensor parallel), the torch attention
backend, a float32 KV cache, no activation observer, and a decode-only batch of 1..MAX_ROWS rows
(one new token per request). Everything else runs ``run_layers``' torch code, which stays the
reference: ``enabled(False)`` turns the fused step off (the tests' and the benchmark's
side-by-side baseline). The outputs differ from the torch path in summation order only (GEMVs,
attention scores, softmax sums: ~1e-6 relative); the parity suite runs through it against
Hugging Face.
"""
from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from engine.model import cpu_gemv
from engine.model.forward_batch import ForwardBatch
from engine.model.kv_quant import KVCache
from engine.model.model_config import ModelConfig
from engine.model.quantization import Weight

MAX_ROWS = cpu_gemv.MAX_ROWS
MAX_HEAD_DIM = 512  # the C RoPE's stack buffer

_enabled = True


class DecoderLayer(Protocol):
    """One layer's weights as ``llama.FusedLayer`` holds them (q|k|v and gate|up fused)."""

    @property
    def input_layernorm(self) -> torch.Tensor: ...
    @property
    def post_attention_layernorm(self) -> torch.Tensor: ...
    @property
    def qkv(self) -> Weight: ...
    @property
    def qkv_bias(self) -> torch.Tensor | None: ...
    @property
    def o(self) -> Weight: ...
    @property
    def o_bias(self) -> torch.Tensor | None: ...
    @property
    def gate_up(self) -> Weight: ...
    @property
    def down(self) -> Weight: ...
    def tensors(self) -> list[Weight]: ...


class _Layer(ctypes.Structure):
    """decode_avx2.c's ``Layer``: one layer's tensors as pointers (bias pointers may be NULL)."""

    _fields_ = [(name, ctypes.c_void_p) for name in
                ("input_norm", "post_norm", "qkv", "qkv_bias", "o", "o_bias", "gate_up", "down", "k_cache",
                 "v_cache")]


class _Shape(ctypes.Structure):
    _fields_ = [("hidden", ctypes.c_long), ("heads", ctypes.c_long), ("kv_heads", ctypes.c_long),
                ("head_dim", ctypes.c_long), ("intermediate", ctypes.c_long), ("eps", ctypes.c_float),
                ("scale", ctypes.c_float)]


def _functions() -> tuple[Any, Any] | None:
    """(decode_layers, scratch_floats) of the library, typed once; None where it is not built."""
    lib = cpu_gemv.library()
    if lib is None:
        return None
    run, size = lib.decode_layers, lib.scratch_floats
    if run.argtypes is None:
        p, n = ctypes.c_void_p, ctypes.c_long
        run.argtypes = [ctypes.POINTER(_Layer), n, ctypes.POINTER(_Shape), n, p, p, p, p, p, p, n, p, ctypes.c_int]
        run.restype = None
        size.argtypes = [n] * 7
        size.restype = n
    return run, size


@contextmanager
def enabled(on: bool) -> Iterator[None]:
    """Turn the fused step on or off for the block (process-wide; the baseline of tests and benchmark)."""
    global _enabled
    before, _enabled = _enabled, on
    try:
        yield
    finally:
        _enabled = before


def _plain(t: object) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous()


def applies(config: ModelConfig, layers: Sequence[DecoderLayer], hidden: torch.Tensor, batch: ForwardBatch,
            kv_caches: list[tuple[KVCache, KVCache]], whole: bool, attention_name: str) -> bool:
    """The step and model the fused C step runs (module doc). ``whole``: the caller runs every layer
    of the model in this process, with no activation observer."""
    rows = hidden.shape[0]
    return (_enabled and whole and not batch.prefills and 1 <= rows <= MAX_ROWS
            and int(batch.decode_rows.shape[0]) == rows and attention_name == "torch"
            and len(layers) == config.num_hidden_layers and hidden.dtype == torch.float32
            and hidden.device.type == "cpu" and config.head_dim % 2 == 0 and config.head_dim <= MAX_HEAD_DIM
            and all(_plain(t) for layer in layers for t in layer.tensors())
            and all(_plain(k) and _plain(v) for k, v in kv_caches) and _functions() is not None)


def _context(batch: ForwardBatch, rows: int) -> tuple[torch.Tensor, int]:
    """Every row's context slots, [rows, width] int64 padded to the longest (row r's first
    seq_lens[r] entries are its own slots, as the decode groups hold them)."""
    groups = batch.decode_groups
    if len(groups) == 1:
        return groups[0].slots, groups[0].width  # [rows * width], rows 0..rows-1 in order
    width = max(g.width for g in groups)
    ctx = torch.zeros(rows, width, dtype=torch.long)
    for g in groups:
        ctx[g.rows, : g.width] = g.slots.view(g.num_rows, g.width)
    return ctx, width


def run_layers(config: ModelConfig, layers: Sequence[DecoderLayer], hidden: torch.Tensor, cos: torch.Tensor,
               sin: torch.Tensor, batch: ForwardBatch, kv_caches: list[tuple[KVCache, KVCache]]) -> torch.Tensor:
    """Every layer over the decode rows (``applies`` said yes): hidden [M, h] -> [M, h], with the
    rows' RoPE cos / sin [M, 1, d]; this step's K/V written into the caches, as
    ``LlamaModel.run_layers`` does."""
    functions = _functions()
    assert functions is not None
    run, size = functions
    c = config
    rows = hidden.shape[0]
    out = hidden.clone(memory_format=torch.contiguous_format)  # [M, h], updated in place by C
    cos, sin = cos.contiguous(), sin.contiguous()
    ctx, width = _context(batch, rows)
    lens = torch.tensor(batch.seq_lens, dtype=torch.long)  # [M] (one row per request)
    scratch = torch.empty(size(rows, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                               c.intermediate_size, width), dtype=torch.float32)
    table = (_Layer * len(layers))()
    for entry, layer, (k, v) in zip(table, layers, kv_caches):
        entry.input_norm, entry.post_norm = layer.input_layernorm.data_ptr(), layer.post_attention_layernorm.data_ptr()
        entry.qkv, entry.o = _ptr(layer.qkv), _ptr(layer.o)
        entry.gate_up, entry.down = _ptr(layer.gate_up), _ptr(layer.down)
        entry.qkv_bias, entry.o_bias = _ptr(layer.qkv_bias), _ptr(layer.o_bias)
        entry.k_cache, entry.v_cache = _ptr(k), _ptr(v)
    shape = _Shape(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.intermediate_size,
                   c.rms_norm_eps, c.head_dim ** -0.5)
    run(table, len(table), ctypes.byref(shape), rows, out.data_ptr(), cos.data_ptr(), sin.data_ptr(),
        batch.slot_mapping.data_ptr(), ctx.data_ptr(), lens.data_ptr(), width, scratch.data_ptr(),
        torch.get_num_threads())
    return out


def _ptr(t: object) -> int | None:
    return t.data_ptr() if isinstance(t, torch.Tensor) else None
