"""The decoder layers of a CPU decode step in one C call (engine/model/decode_avx2.c): no Python
and no torch dispatch between the operations of a step.

Why: a batch-1 decode step of SmolLM2 is ~2,000 small torch ops (30 layers x norms, RoPE, K/V
writes, gathers, SDPA, adds); at a few µs of Python and dispatch each they cost ~10 ms, as much as
a third of an fp32 step and half an int4 one, whatever the GEMV kernel. The C function runs every
layer's arithmetic (the same as ``LlamaModel.run_layers``: RMSNorm, fused qkv / gate_up GEMVs,
RoPE, paged K/V write, GQA attention over each row's own context slots, SwiGLU, residuals) over
the step's rows; Python calls it once per step.

Two formats: fp32 (plain fp32 weights, activations and KV cache), and int4 (the int4 weight
scheme: torch's int4pack projections read by ``cpu_gemv``'s int4 kernel, bf16 activations, norms
and biases, every result rounded to bf16 where torch's bf16 ops round it; the KV cache bf16, or
fp32 holding the bf16 values as the torch layers store them).

Where it applies (``applies``): one of those formats on CPU, the whole layer range in this process
(no pipeline stage, no tensor parallel), the torch attention backend, a float KV cache (fp32, or
bf16 in the int4 format; not int8 / fp8), no activation observer, and a decode-only batch of
1..MAX_ROWS rows (one new token per request). Everything else runs ``run_layers``' torch code,
which stays the reference: ``enabled(False)`` turns the fused step off (the tests' and the
benchmark's side-by-side baseline). The outputs differ from the torch path in summation order only
(GEMVs, attention scores, softmax sums); the parity suite runs through it against Hugging Face.
"""
from __future__ import annotations

import ctypes
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

import torch

from engine.core.sampling import torch_greedy
from engine.model import cpu_gemv
from engine.model.forward_batch import ForwardBatch
from engine.model.kv_quant import KVCache
from engine.model.model_config import ModelConfig
from engine.model.quantization import QuantizedLinear, Weight

MAX_ROWS = cpu_gemv.MAX_ROWS
MAX_HEAD_DIM = 512  # the C RoPE's stack buffer

_switch = cpu_gemv.Switch()
#: ``with enabled(False):`` turns the fused layers off for the block (process-wide; the torch layers run)
enabled = _switch.enabled


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


class _Proj(ctypes.Structure):
    """decode_avx2.c's ``Proj``: a fp32 weight, or an int4pack weight and its scales and zeros."""

    _fields_ = [("weight", ctypes.c_void_p), ("scales_zeros", ctypes.c_void_p)]


class _Layer(ctypes.Structure):
    """decode_avx2.c's ``Layer``: one layer's tensors as pointers (bias pointers may be NULL)."""

    _fields_ = [("input_norm", ctypes.c_void_p), ("post_norm", ctypes.c_void_p), ("qkv", _Proj),
                ("qkv_bias", ctypes.c_void_p), ("o", _Proj), ("o_bias", ctypes.c_void_p), ("gate_up", _Proj),
                ("down", _Proj), ("k_cache", ctypes.c_void_p), ("v_cache", ctypes.c_void_p)]


class _Shape(ctypes.Structure):
    _fields_ = [("hidden", ctypes.c_long), ("heads", ctypes.c_long), ("kv_heads", ctypes.c_long),
                ("head_dim", ctypes.c_long), ("intermediate", ctypes.c_long), ("eps", ctypes.c_float),
                ("scale", ctypes.c_float), ("int4_group", ctypes.c_long), ("kv_bf16", ctypes.c_long)]


class _Functions(NamedTuple):
    decode_layers: Any
    scratch_floats: Any
    rms_norm_rows: Any
    argmax_rows: Any


#: (the library, its functions typed): ``_functions`` runs several times a step
_typed: tuple[Any, _Functions] | None = None


def _functions() -> _Functions | None:
    """The library's functions, typed once per library; None where it is not built (or is still
    being built in the background: ``cpu_gemv.build_in_background``)."""
    global _typed
    lib = cpu_gemv.ready_library()
    if lib is None:
        return None
    typed = _typed
    if typed is None or typed[0] is not lib:
        typed = _typed = (lib, _type(lib))
    return typed[1]


def _type(lib: Any) -> _Functions:
    found = _Functions(lib.decode_layers, lib.scratch_floats, lib.rms_norm_rows, lib.argmax_rows)
    p, n = ctypes.c_void_p, ctypes.c_long
    found.decode_layers.argtypes = [ctypes.POINTER(_Layer), n, ctypes.POINTER(_Shape), n, p, p, p, p, p, p, n, p,
                                    ctypes.c_int]
    found.decode_layers.restype = ctypes.c_int
    found.scratch_floats.argtypes = [n] * 7
    found.scratch_floats.restype = n
    found.rms_norm_rows.argtypes = [p, p, p, n, n, ctypes.c_float, ctypes.c_int]
    found.rms_norm_rows.restype = None
    found.argmax_rows.argtypes = [p, n, n, p]
    found.argmax_rows.restype = None
    return found


def _plain(t: object, dtype: torch.dtype) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype == dtype and t.device.type == "cpu" and t.is_contiguous()


def _int4(w: Weight) -> int:
    """The group size of an int4 projection the C kernel reads (64-row blocks), else 0."""
    if not isinstance(w, QuantizedLinear) or w.scheme != "int4" or w.group_size is None:
        return 0
    ok = cpu_gemv.int4_readable(w.weight, w.out_features) and _plain(w.scales, torch.bfloat16)
    return w.group_size if ok else 0


def _format(layers: Sequence[DecoderLayer], dtype: torch.dtype) -> int | None:
    """0 for the fp32 format, the group size for the int4 one (module doc), None for neither, with
    rows of ``dtype``."""
    if dtype == torch.float32:
        return 0 if all(_plain(t, torch.float32) for layer in layers for t in layer.tensors()) else None
    if dtype != torch.bfloat16 or not layers:
        return None
    groups = {_int4(w) for layer in layers for w in (layer.qkv, layer.o, layer.gate_up, layer.down)}
    small = [t for layer in layers for t in (layer.input_layernorm, layer.post_attention_layernorm,
                                             layer.qkv_bias, layer.o_bias) if t is not None]
    if len(groups) != 1 or 0 in groups or not all(_plain(t, torch.bfloat16) for t in small):
        return None
    return groups.pop()


class _StepTable(NamedTuple):
    """A model's layers and an engine's K/V caches as the C step reads them: the format (0: fp32,
    else the int4 group size), whether the caches are bf16, and the ``Layer`` table with every
    weight and K/V cache pointer (the C code only reads it)."""

    format: int
    kv_bf16: bool
    table: ctypes.Array[_Layer]


_CACHE_SIZE = 8
#: (id of the layer list, id of the K/V cache list, row dtype) -> (weak references to the first layer
#: and the first K cache, what ``_step_table`` found)
_TableKey = tuple[int, int, torch.dtype]
_tables: OrderedDict[_TableKey, tuple[tuple[weakref.ref[Any], weakref.ref[Any]], _StepTable | None]] = OrderedDict()
_tables_lock = threading.Lock()


def _step_table(layers: Sequence[DecoderLayer], kv_caches: list[tuple[KVCache, KVCache]],
                dtype: torch.dtype) -> _StepTable | None:
    """The step table of ``layers`` and ``kv_caches`` with ``dtype`` rows, or None where the C step
    does not take them (module doc); worked out once per pair of lists (neither ever changes its
    tensors): checking ~460 tensors and filling the table every step cost ~0.7 ms of Python. An
    entry keeps nothing alive: it is found by the lists' ids and proven by weak references to the
    first layer and the first K cache (a new list at a reused id holds other objects). Engines
    that share weights have their own caches, hence their own tables, and can step in parallel."""
    if not layers or len(kv_caches) != len(layers):
        return None
    key, anchors = (id(layers), id(kv_caches), dtype), (layers[0], kv_caches[0][0])
    with _tables_lock:
        hit = _tables.get(key)
        if hit is not None and all(ref() is a for ref, a in zip(hit[0], anchors)):
            _tables.move_to_end(key)
            return hit[1]
    found = _find_table(layers, kv_caches, dtype)
    with _tables_lock:
        _tables[key] = ((weakref.ref(anchors[0]), weakref.ref(anchors[1])), found)
        while len(_tables) > _CACHE_SIZE:
            _tables.popitem(last=False)
    return found


def _find_table(layers: Sequence[DecoderLayer], kv_caches: list[tuple[KVCache, KVCache]],
                dtype: torch.dtype) -> _StepTable | None:
    fmt = _format(layers, dtype)
    if fmt is None:
        return None
    # fp32 caches only with fp32 weights; the int4 format takes bf16, or fp32 holding bf16 values exactly
    for kv_dtype in (torch.float32,) if fmt == 0 else (torch.bfloat16, torch.float32):
        if all(_plain(k, kv_dtype) and _plain(v, kv_dtype) for k, v in kv_caches):
            table = _table(layers)
            for entry, (k, v) in zip(table, kv_caches):
                entry.k_cache, entry.v_cache = _ptr(k), _ptr(v)
            return _StepTable(fmt, kv_dtype == torch.bfloat16, table)
    return None


def _table(layers: Sequence[DecoderLayer]) -> ctypes.Array[_Layer]:
    table = (_Layer * len(layers))()
    for entry, layer in zip(table, layers):
        entry.input_norm, entry.post_norm = layer.input_layernorm.data_ptr(), layer.post_attention_layernorm.data_ptr()
        entry.qkv, entry.o = _proj(layer.qkv), _proj(layer.o)
        entry.gate_up, entry.down = _proj(layer.gate_up), _proj(layer.down)
        entry.qkv_bias, entry.o_bias = _ptr(layer.qkv_bias), _ptr(layer.o_bias)
    return table


def applies(config: ModelConfig, layers: Sequence[DecoderLayer], hidden: torch.Tensor, batch: ForwardBatch,
            kv_caches: list[tuple[KVCache, KVCache]], whole: bool, attention_name: str) -> bool:
    """The step and model the fused C step runs (module doc). ``whole``: the caller runs every layer
    of the model in this process, with no activation observer."""
    rows = hidden.shape[0]
    if not (_switch.on and whole and not batch.prefills and 1 <= rows <= MAX_ROWS
            and int(batch.decode_rows.shape[0]) == rows and attention_name == "torch"
            and len(layers) == config.num_hidden_layers and hidden.device.type == "cpu"
            and config.head_dim % 2 == 0 and config.head_dim <= MAX_HEAD_DIM):
        return False
    return _functions() is not None and _step_table(layers, kv_caches, hidden.dtype) is not None


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
    run, size = functions.decode_layers, functions.scratch_floats
    c = config
    rows = hidden.shape[0]
    # [M, h] fp32 (bf16 values in the int4 format), a copy the C code updates in place
    out = hidden.to(torch.float32, memory_format=torch.contiguous_format, copy=True)
    cos, sin = cos.float().contiguous(), sin.float().contiguous()
    ctx, width = _context(batch, rows)
    lens = (ctypes.c_int64 * rows)(*batch.seq_lens)  # [M] (one row per request)
    scratch = torch.empty(size(rows, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                               c.intermediate_size, width), dtype=torch.float32)
    step = _step_table(layers, kv_caches, hidden.dtype)
    assert step is not None
    shape = _Shape(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.intermediate_size,
                   c.rms_norm_eps, c.head_dim ** -0.5, step.format, step.kv_bf16)
    if run(step.table, len(step.table), ctypes.byref(shape), rows, out.data_ptr(), cos.data_ptr(), sin.data_ptr(),
           batch.slot_mapping.data_ptr(), ctx.data_ptr(), lens, width, scratch.data_ptr(),
           torch.get_num_threads()):
        raise MemoryError("the fused decode layers: out of memory for a GEMV's temporaries")
    return out.to(hidden.dtype)  # exact: bf16 values in the int4 format


def norm_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """``final_norm`` takes x: 1..MAX_ROWS rows [M, h] of fp32 or bf16 on CPU, a weight [h] of the
    same dtype, the fused step on and the library ready."""
    return (_switch.on and x.dim() == 2 and 1 <= x.shape[0] <= MAX_ROWS and x.dtype in (torch.float32, torch.bfloat16)
            and x.device.type == "cpu" and _plain(weight, x.dtype) and weight.shape == x.shape[1:]
            and _functions() is not None)


def final_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The model's final RMSNorm of x [M, h] in C (``norm_applies`` said yes): the arithmetic of
    ``llama.rms_norm`` (fp32 mean of squares; in bf16 every result rounded as torch's ops round it),
    up to the order of the sum of squares. One call instead of seven torch ops, each of which costs
    tens of µs right after a step's weights have streamed through the caches."""
    functions = _functions()
    assert functions is not None
    x = x.contiguous()
    out = torch.empty_like(x)
    functions.rms_norm_rows(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], eps,
                            x.dtype == torch.bfloat16)
    return out


def greedy_tokens(logits: torch.Tensor) -> list[int] | None:
    """Greedy sampling's pick (``engine.core.sampling.GreedyPick``) in C: logits [S, V] -> the
    first argmax of every row, as ``torch.argmax``; None where any row is not finite. One call
    instead of the five torch ops of ``torch_greedy``, which runs where the C pick does not apply
    (not fp32 rows on CPU, the fused step off or the library not ready)."""
    functions = _functions()
    if (functions is None or not _switch.on or logits.dim() != 2 or logits.shape[1] == 0
            or not _plain(logits, torch.float32)):
        return torch_greedy(logits)
    rows = logits.shape[0]
    out = (ctypes.c_int64 * rows)()
    functions.argmax_rows(logits.data_ptr(), rows, logits.shape[1], out)
    tokens = list(out)
    return None if -1 in tokens else tokens


def _proj(w: Weight) -> _Proj:
    if isinstance(w, QuantizedLinear):
        return _Proj(w.weight.data_ptr(), w.block_scales.data_ptr())
    return _Proj(w.data_ptr(), None)


def _ptr(t: object) -> int | None:
    return t.data_ptr() if isinstance(t, torch.Tensor) else None
