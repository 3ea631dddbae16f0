"""Checked weight files: safetensors read only after their header proves them whole, and any
set of tensors compared with what the parsed ``ModelConfig`` says the decoder will index.

Rules (each breach is one ``ValueError`` naming the file and the tensor or field):
- a safetensors file is an 8-byte little-endian header length, a JSON header of
  ``name -> {dtype, shape, data_offsets}``, then the data; every tensor's byte range must match
  its dtype and shape and lie inside the file (so a truncated file is caught before reading);
- weights are floating point (F32, F16, BF16, F64), every value finite;
- the tensor names are exactly ``config.weight_shapes()`` (plus ``optional_shapes()``), each
  with the shape given there; a name in two files is refused.
"""
from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.model.model_config import ModelConfig

_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
                "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")
MAX_HEADER_BYTES = 100 * 2**20  # the safetensors format's own limit


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's entry in a safetensors header."""

    dtype: str
    shape: tuple[int, ...]
    start: int  # byte offsets into the data section
    end: int


def _bad(path: Path, rule: str) -> ValueError:
    return ValueError(f"model: {path}: {rule}")


def _header_bytes(path: Path) -> tuple[bytes, int]:
    """The raw JSON header and the data section's length; refuses what cannot hold one."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise _bad(path, f"truncated: {size} bytes, too short for a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER_BYTES or n > size - 8:
            raise _bad(path, f"header length {n} does not fit in the file ({size} bytes); "
                             "truncated or not a safetensors file")
        return f.read(n), size - 8 - n


def _tensor_info(path: Path, name: str, entry: object, data_len: int) -> TensorInfo:
    """One header entry, checked: known dtype, a shape of sizes >= 0, a byte range that
    matches dtype x shape and lies inside the data section."""
    if not isinstance(entry, dict):
        raise _bad(path, f"header entry for {name!r} is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in _DTYPE_BYTES:
        raise _bad(path, f"tensor {name!r} has unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape):
        raise _bad(path, f"tensor {name!r} has a bad shape {shape!r}")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(type(o) is int for o in offsets) or not 0 <= offsets[0] <= offsets[1]):
        raise _bad(path, f"tensor {name!r} has bad data_offsets {offsets!r}")
    if offsets[1] - offsets[0] != math.prod(shape) * _DTYPE_BYTES[dtype]:
        raise _bad(path, f"tensor {name!r}: data_offsets {offsets} do not match {dtype} x {shape}")
    if offsets[1] > data_len:
        raise _bad(path, f"truncated: tensor {name!r} ends at byte {offsets[1]} of the data, "
                         f"which holds only {data_len}")
    return TensorInfo(dtype, tuple(shape), offsets[0], offsets[1])


def read_header(path: Path) -> dict[str, TensorInfo]:
    """The tensors a safetensors file declares, each proven to lie inside the file."""
    try:
        raw, data_len = _header_bytes(path)
    except OSError as e:
        raise _bad(path, f"cannot be read ({e.strerror})") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _bad(path, f"header is not JSON ({type(e).__name__}); not a safetensors file") from None
    if not isinstance(header, dict):
        raise _bad(path, "header is not a JSON object; not a safetensors file")
    return {name: _tensor_info(path, name, entry, data_len)
            for name, entry in header.items() if name != "__metadata__"}


def check_tensors(config: ModelConfig, shapes: Mapping[str, Sequence[int]], source: str,
                  dtypes: Mapping[str, str] | None = None,
                  files: Mapping[str, str] | None = None) -> None:
    """``shapes`` (name -> shape) must be exactly what ``config`` needs, shape for shape, and
    floating point where ``dtypes`` are given; ``files`` names the file of each tensor."""
    need, may = config.weight_shapes(), config.optional_shapes()
    missing = [n for n in need if n not in shapes]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ValueError(f"model: {source}: tensor {missing[0]} is missing{more}")
    for name, shape in shapes.items():
        expected = need.get(name, may.get(name))
        where = files.get(name, source) if files else source
        if expected is None:
            raise ValueError(f"model: {where}: unexpected tensor {name[:120]!r} "
                             f"(not part of a {config.architecture})")
        if tuple(shape) != expected:
            raise ValueError(f"model: {where}: tensor {name} has shape {tuple(shape)}, but the "
                             f"config ({_fields_of(name)}) gives {expected}")
        if dtypes is not None and dtypes[name] not in FLOAT_DTYPES:
            raise ValueError(f"model: {where}: tensor {name} has dtype {dtypes[name]}; weights "
                             f"must be floating point ({', '.join(FLOAT_DTYPES)})")


def _fields_of(name: str) -> str:
    """The config fields that set a tensor's shape (named in the mismatch message)."""
    if "embed" in name or "lm_head" in name:
        return "vocab_size, hidden_size"
    if "mlp" in name:
        return "intermediate_size, hidden_size"
    if "self_attn" in name:
        return "num_attention_heads, num_key_value_heads, head_dim, hidden_size"
    return "hidden_size"


def headers_of(files: Sequence[Path]) -> tuple[dict[str, TensorInfo], dict[str, Path]]:
    """All tensors declared across ``files``; a name declared twice is refused."""
    infos: dict[str, TensorInfo] = {}
    where: dict[str, Path] = {}
    for path in files:
        for name, info in read_header(path).items():
            if name in infos:
                raise _bad(path, f"tensor {name!r} is also in {where[name].name}")
            infos[name], where[name] = info, path
    return infos, where


def _read_file(path: Path, names: Sequence[str], check_finite: bool) -> dict[str, torch.Tensor]:
    """``names`` from one safetensors file (opened once), as fp32, checked finite if asked."""
    from safetensors import safe_open

    out: dict[str, torch.Tensor] = {}
    try:
        with safe_open(str(path), framework="pt") as f:
            for name in names:
                out[name] = f.get_tensor(name).float()
    except Exception as e:  # noqa: BLE001 - the safetensors library raises its own error types
        raise _bad(path, f"cannot be read ({type(e).__name__}: {str(e)[:120]})") from None
    if check_finite:
        for name, t in out.items():
            require_finite(t, name, str(path))
    return out


def require_finite(t: torch.Tensor, name: str, source: str) -> None:
    """NaN or infinite weights would make every logit garbage: refuse them at load time.
    One float64 sum decides it: a sum of finite fp32/bf16 values cannot overflow float64, and
    any NaN or inf makes it non-finite (cheaper than an elementwise isfinite mask)."""
    if t.numel() and not math.isfinite(float(t.sum(dtype=torch.float64))):
        raise ValueError(f"model: {source}: tensor {name} holds values that are not finite (NaN or inf)")


def load_checked(files: Sequence[Path], config: ModelConfig,
                 check_finite: bool = True) -> dict[str, torch.Tensor]:
    """fp32 weights from ``files`` after every header and shape check; a tied lm_head is
    dropped (the decoder uses the embedding, as Hugging Face does). ``check_finite=False`` only
    for the cache's own entries, whose values were checked when they were converted."""
    infos, where = headers_of(files)
    source = str(files[0]) if len(files) == 1 else f"{files[0].parent}/*.safetensors"
    check_tensors(config, {n: i.shape for n, i in infos.items()}, source,
                  {n: i.dtype for n, i in infos.items()}, {n: str(p) for n, p in where.items()})
    weights: dict[str, torch.Tensor] = {}
    for path in files:
        names = [n for n, p in where.items() if p == path
                 and not (config.tie_word_embeddings and n == "lm_head.weight")]
        weights.update(_read_file(path, names, check_finite))
    return weights
