"""Weight-quantization inspection (issue #9's "Quantization" page): what a scheme does to one
weight matrix, and how far every matrix of a model lands from its original.

Records only (frozen dataclasses of plain Python numbers and tuples), so a page draws them
without torch. The quantizers are engine.quantization's own (``quantize_tensor``, its dispatch to
``quantize_int8`` / ``quantize_int4`` / ``quantize_fp8``, and ``quantize_table``): nothing here
re-implements one; this module reads their codes and scales back out.

* ``inspect_weight``: one matrix of one layer under one scheme: whole-matrix histograms of the
  original and the dequantized weight over the same bin edges, one row (int8, fp8) or one group
  (int4) in detail with its grid of representable values, the scale distribution, the error.
* ``error_grid``: the relative Frobenius error of every layer x ``MATRICES`` matrix, plus the
  embedding / LM-head table(s) as the engine quantizes them.

"w8a8" inspects as its int8 weights (its activations are quantized per token at run time,
not here).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Mapping

import torch

from engine.core.config import INT4_GROUP_SIZES, SCHEMES
from engine.core.config import QuantConfig
from engine.model.quantization import FP8_MAX, FP8_TO_BF16_TABLE, QuantError, QuantizedTensor, dequantize, int4_codes, is_table, quantize_table, quantize_tensor

MATRICES: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_MODULE = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
           "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
BITS = {"int8": 8, "int4": 4, "fp8": 8}
MAX_BINS = 10_000
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


@dataclass(frozen=True)
class Histogram:
    """Counts of values in ``len(counts)`` bins; bin i is [edges[i], edges[i+1]) (the last bin
    closed). Every value lies inside [edges[0], edges[-1]], so sum(counts) is the value count."""

    edges: tuple[float, ...]
    counts: tuple[int, ...]

    @property
    def total(self) -> int:
        return sum(self.counts)


@dataclass(frozen=True)
class Detail:
    """One row (int8, fp8) or one group (int4) of a matrix: its values before and after, and
    the grid of values its codes can stand for, in weight units.

    Invariant: every dequantized value is one of ``grid`` (exactly: the grid is computed with
    the same fp32 operations as ``engine.model.quantization.dequantize``).
    """

    kind: str  # "row" | "group"
    index: int  # the row (int8/fp8) or the group counted row-major over the matrix (int4)
    row: int
    columns: tuple[int, int]  # [start, end) along K
    scale: float
    zero: float | None  # int4: the value at code 8
    original: tuple[float, ...]  # [end - start]
    dequantized: tuple[float, ...]  # [end - start]
    grid: tuple[float, ...]  # ascending, distinct
    num_clipped: int
    max_abs_error: float


@dataclass(frozen=True)
class WeightInspection:
    """One weight matrix under one scheme.

    ``scheme`` is the weight format ("int8" | "int4" | "fp8"); ``mode`` the scheme asked for
    ("w8a8" inspects as its int8 weights). ``num_clipped``: values the quantizer's clamp moves,
    i.e. more than half a step outside the grid's range (int8: round(W/s) outside [-127, 127];
    int4: round((W - base)/scale) outside [0, 15] with base = zero - 8 scale; fp8: |W/s| > 448).
    With absmax scaling (scales rounded UP to bf16) this is 0 by construction for int8 and fp8;
    for int4 only a group whose zero point's bf16 rounding exceeds half a step can clip (e.g. a
    constant group whose value bf16 cannot hold). It is counted from the codes and scales,
    not assumed. ``error_bound_ratio``: max over elements of |W - deq| / the scheme's bound
    (int8: s/2; int4: scale/2 + 2^-9 |zero|; fp8: 2^-4 |W| in e4m3's normal range, 2^-10 s
    below it) - at most 1 (up to fp32 rounding) unless something clipped.
    """

    layer: int
    matrix: str
    mode: str  # "int8" | "int4" | "fp8" | "w8a8"
    scheme: str  # "int8" | "int4" | "fp8"
    group_size: int | None
    shape: tuple[int, int]  # (N, K)
    original: Histogram
    dequantized: Histogram  # same edges as ``original``
    detail: Detail
    num_clipped: int
    scales: Histogram  # per output channel (int8, fp8) or per group (int4)
    scale_range: tuple[float, float]
    error: QuantError
    error_bound_ratio: float

    @property
    def bits(self) -> int:
        return BITS[self.scheme]


@dataclass(frozen=True)
class ErrorGrid:
    """Relative Frobenius error ||W - deq(W)||_F / ||W||_F of every layer x matrix (``relative``
    and ``max_abs`` are [L][M]), and of the embedding / LM-head table(s) (int8 per row, fp8 in
    the fp8 mode, as the engine quantizes them: ``quantize_table``)."""

    mode: str
    scheme: str  # the weight format ("int8" for w8a8)
    group_size: int | None
    layers: tuple[int, ...]
    matrices: tuple[str, ...]
    relative: tuple[tuple[float, ...], ...]  # [L][M]
    max_abs: tuple[tuple[float, ...], ...]  # [L][M]
    table_scheme: str  # "int8" | "fp8"
    tables: tuple[str, ...]  # Hugging Face names: the embedding, and an untied LM head
    table_relative: tuple[float, ...]

    @property
    def table_error(self) -> float | None:
        """The embedding table's relative error (the tied LM head's too), None without one."""
        return self.table_relative[0] if self.table_relative else None


# -- checks -----------------------------------------------------------------------------------

def _check_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: must be an integer, got {str(value)[:40]!r}")
    return value


def _check_mode(scheme: object) -> str:
    if not isinstance(scheme, str) or scheme not in SCHEMES:
        raise ValueError(f"scheme: must be one of {SCHEMES}, got {str(scheme)[:40]!r}")
    return "int8" if scheme == "w8a8" else scheme


def _check_group_size(scheme: str, group_size: object) -> int | None:
    g = _check_int("group_size", group_size)
    if scheme != "int4":
        return None
    if g not in INT4_GROUP_SIZES:
        raise ValueError(f"group_size: must be one of {INT4_GROUP_SIZES} (the int4 kernel's group sizes), got {g}")
    return g


def num_layers(weights: Mapping[str, torch.Tensor]) -> int:
    """Decoder layers in Hugging Face-named weights (1 + the largest ``model.layers.{i}``)."""
    found = [int(m.group(1)) for name in weights if (m := _LAYER.match(name))]
    return max(found) + 1 if found else 0


def weight_name(layer: int, matrix: str) -> str:
    """``model.layers.{layer}.{self_attn|mlp}.{matrix}.weight``."""
    return f"model.layers.{layer}.{_MODULE[matrix]}.{matrix}.weight"


def _matrix(weights: Mapping[str, torch.Tensor], layer: object, matrix: object) -> torch.Tensor:
    n_layers = num_layers(weights)
    i = _check_int("layer", layer)
    if not 0 <= i < n_layers:
        raise ValueError(f"layer: must be in 0..{n_layers - 1}, got {i}")
    if not isinstance(matrix, str) or matrix not in MATRICES:
        raise ValueError(f"matrix: must be one of {MATRICES}, got {str(matrix)[:40]!r}")
    name = weight_name(i, matrix)
    if name not in weights:
        raise ValueError(f"matrix: the weights have no {name}")
    w = weights[name]
    if w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"matrix: {name} is not a floating-point matrix ({w.dtype}, shape {tuple(w.shape)})")
    return w


def _quantize(w: torch.Tensor, scheme: str, group_size: int | None) -> QuantizedTensor:
    """engine.model.quantization's ``quantize_tensor``; ``group_size`` (int4 only, else None) must
    divide K, checked here so the ValueError names this module's field."""
    if group_size is None:
        return quantize_tensor(w, scheme)
    k = w.shape[1]
    if k % group_size:
        raise ValueError(f"group_size: {group_size} does not divide the input dimension {k}; choose one of "
                         f"{[g for g in INT4_GROUP_SIZES if k % g == 0]}")
    return quantize_tensor(w, scheme, group_size)


# -- pieces -----------------------------------------------------------------------------------

def histogram(values: torch.Tensor, bins: int, lo: float, hi: float) -> Histogram:
    """``bins`` equal bins over [lo, hi] (widened to a unit-wide range around lo when lo == hi)."""
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    counts = torch.histc(values.float().reshape(-1), bins=bins, min=lo, max=hi)  # [bins]
    edges = torch.linspace(lo, hi, bins + 1, dtype=torch.float64)
    return Histogram(tuple(edges.tolist()), tuple(int(c) for c in counts.tolist()))


def fp8_grid() -> torch.Tensor:
    """Every finite float8_e4m3fn value (-448..448, +0 and -0 as one), ascending, fp32 [253]."""
    table = FP8_TO_BF16_TABLE.float()  # [256]
    grid: torch.Tensor = torch.unique(table[torch.isfinite(table)])  # sorted
    return grid


def _int4_parts(q: QuantizedTensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int4 scale and zero per group, fp32 [N, G] each."""
    return q.scales[..., 0].float().t(), q.scales[..., 1].float().t()


def _clipped(w: torch.Tensor, q: QuantizedTensor) -> torch.Tensor:
    """bool [N, K]: the quantizer's clamp moves this value (see WeightInspection)."""
    n, k = q.shape
    if q.scheme == "int8":
        return torch.round(w / q.scales.float()[:, None]).abs() > 127
    if q.scheme == "fp8":
        return (w / q.scales.float()[:, None]).abs() > FP8_MAX
    assert q.group_size is not None
    scale, zero = _int4_parts(q)  # [N, G]
    base = zero - 8 * scale
    wg = w.view(n, k // q.group_size, q.group_size)  # [N, G, g]
    codes = torch.round((wg - base[..., None]) / scale[..., None])
    return ((codes < 0) | (codes > 15)).view(n, k)


def _bound(w: torch.Tensor, q: QuantizedTensor) -> torch.Tensor:
    """The scheme's bound on |W - deq| per element, fp32 [N, K] (engine.model.quantization's docstrings)."""
    n, k = q.shape
    if q.scheme == "int8":
        return (q.scales.float() / 2)[:, None].expand(n, k)
    if q.scheme == "fp8":
        s = q.scales.float()[:, None]
        return torch.where((w / s).abs() >= 2.0 ** -6, w.abs() * 2.0 ** -4, s * 2.0 ** -10)
    assert q.group_size is not None
    scale, zero = _int4_parts(q)
    per_group = scale / 2 + zero.abs() * 2.0 ** -9  # [N, G]
    return per_group.repeat_interleave(q.group_size, dim=1)


def _scale_values(q: QuantizedTensor) -> torch.Tensor:
    return _int4_parts(q)[0].reshape(-1) if q.scheme == "int4" else q.scales.float()


def _detail(w: torch.Tensor, q: QuantizedTensor, deq: torch.Tensor, clipped: torch.Tensor,
            index: int | None) -> Detail:
    n, k = q.shape
    scales = _scale_values(q)  # [N] or [N*G] row-major
    count = scales.numel()
    if index is None:
        index = int(torch.argmax(scales))
    elif not 0 <= index < count:
        what = "group (row-major over the matrix)" if q.scheme == "int4" else "row"
        raise ValueError(f"row: the {what} must be in 0..{count - 1}, got {index}")
    zero: float | None = None
    if q.scheme == "int4":
        assert q.group_size is not None
        g = q.group_size
        row, start = divmod(index, k // g)
        start *= g
        end = start + g
        scale_t, zero_t = _int4_parts(q)
        s, z = scale_t[row, start // g], zero_t[row, start // g]
        grid = (torch.arange(16, dtype=torch.float32) - 8) * s + z  # dequantize's own arithmetic
        zero = float(z)
    else:
        row, start, end = index, 0, k
        s = q.scales.float()[row]
        levels = torch.arange(-127, 128, dtype=torch.float32) if q.scheme == "int8" else fp8_grid()
        grid = levels * s
    grid = torch.unique(grid)  # ascending, distinct (an all-zero row's scale floor collapses nothing)
    orig, dq = w[row, start:end], deq[row, start:end]
    return Detail("group" if q.scheme == "int4" else "row", index, row, (start, end), float(s), zero,
                  tuple(orig.tolist()), tuple(dq.tolist()), tuple(grid.tolist()),
                  int(clipped[row, start:end].sum()), float((orig - dq).abs().max()))


# -- the records ------------------------------------------------------------------------------

def inspect_weight(weights: Mapping[str, torch.Tensor], scheme: str, layer: int, matrix: str,
                   group_size: int = 32, row: int | None = None, bins: int = 80) -> WeightInspection:
    """Quantize ``model.layers.{layer}.*.{matrix}.weight`` with engine.quantization's quantizer
    for ``scheme`` and dequantize it. ``row``: the row (int8/fp8) or the group, counted
    row-major over the matrix (int4), shown in detail; default the one with the largest scale.
    Both whole-matrix histograms share one set of ``bins`` edges spanning both, so each sums
    to N*K. About 0.1 s for a SmolLM2 MLP matrix (1536 x 576)."""
    fmt = _check_mode(scheme)
    g = _check_group_size(fmt, group_size)
    n_bins = _check_int("bins", bins)
    if not 1 <= n_bins <= MAX_BINS:
        raise ValueError(f"bins: must be in 1..{MAX_BINS}, got {n_bins}")
    if row is not None:
        _check_int("row", row)
    w = _matrix(weights, layer, matrix).float()  # [N, K]
    q = _quantize(w, fmt, g)
    deq = dequantize(q)  # [N, K]
    lo = min(float(w.min()), float(deq.min())) if w.numel() else 0.0
    hi = max(float(w.max()), float(deq.max())) if w.numel() else 0.0
    clipped = _clipped(w, q)
    scales = _scale_values(q)
    s_lo, s_hi = float(scales.min()), float(scales.max())
    err = (w - deq).abs()
    ratio = float((err / _bound(w, q).clamp(min=1e-30)).max()) if w.numel() else 0.0
    return WeightInspection(
        layer=int(layer), matrix=matrix, mode=scheme, scheme=fmt, group_size=g, shape=(q.shape[0], q.shape[1]),
        original=histogram(w, n_bins, lo, hi), dequantized=histogram(deq, n_bins, lo, hi),
        detail=_detail(w, q, deq, clipped, row), num_clipped=int(clipped.sum()),
        scales=histogram(scales, n_bins, s_lo, s_hi), scale_range=(s_lo, s_hi), error=q.error,
        error_bound_ratio=ratio)


def error_grid(weights: Mapping[str, torch.Tensor], scheme: str, group_size: int = 32,
               progress: Callable[[int, int], None] | None = None) -> ErrorGrid:
    """Every layer x MATRICES matrix quantized with engine.quantization's quantizer, and its
    ``QuantError`` read off (the quantizer computes it); then the table(s) by ``quantize_table``.
    ``progress(done, total)`` after each matrix and table.

    One matrix at a time: stacking a matrix kind's 30 layers into one quantize call measured
    slower (big temporaries). Measured on the shared 2-core machine for SmolLM2 (30 x 7 = 210
    matrices + the 49152 x 576 table): int8 ~0.4 s + 1.5 s table, int4 g32 ~2.6 s + 1.5 s,
    fp8 ~2.4 s + 0.9 s when the machine is quiet (4-18 s for int4 measured beside other
    loads). The bundled SmolLM2 is converted from a Q4_1 GGUF (groups of 32 along K, scale and
    minimum), so int4 g32 nearly re-finds its grid: its error there (~0.7%) is below int8's."""
    fmt = _check_mode(scheme)
    g = _check_group_size(fmt, group_size)
    layers = tuple(range(num_layers(weights)))
    tables = tuple(name for name in ("model.embed_tokens.weight", "lm_head.weight") if name in weights and is_table(name))
    total = len(layers) * len(MATRICES) + len(tables)
    done = 0
    relative: list[tuple[float, ...]] = []
    max_abs: list[tuple[float, ...]] = []
    for i in layers:
        rel_row: list[float] = []
        abs_row: list[float] = []
        for m in MATRICES:
            e = _quantize(_matrix(weights, i, m).float(), fmt, g).error
            rel_row.append(e.relative_frobenius)
            abs_row.append(e.max_abs)
            done += 1
            if progress is not None:
                progress(done, total)
        relative.append(tuple(rel_row))
        max_abs.append(tuple(abs_row))
    config = QuantConfig(scheme, g if g is not None else 32)
    table_rel = []
    for name in tables:
        table_rel.append(quantize_table(weights[name].float(), config).error.relative_frobenius)
        done += 1
        if progress is not None:
            progress(done, total)
    return ErrorGrid(scheme, fmt, g, layers, MATRICES, tuple(relative), tuple(max_abs),
                     "fp8" if fmt == "fp8" else "int8", tables, tuple(table_rel))


__all__ = ["BITS", "MATRICES", "Detail", "ErrorGrid", "Histogram", "WeightInspection", "error_grid", "fp8_grid",
           "histogram", "inspect_weight", "num_layers", "weight_name"]
