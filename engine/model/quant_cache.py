"""The disk cache of quantized weights: quantizing SmolLM2 takes 3-15 s per scheme, loading the
cached tensors about one (measured on the shared 2-core machine at load average ~7: int8 cold
12.7 s / warm 1.2 s, fp8 cold 14.6 s / warm 0.6 s; the weights' sha256 is 0.5 s of that).

Rules (the same as the converted-model cache, engine/model/cache.py, whose root, temp dirs and
``publish`` it uses):
- an entry is ``<root>/quantized/q-<key>/``, the key a sha256 of (a format version, torch's
  version (the int4pack layout is torch's own), the source weights' content: sha256 over every
  tensor's name, dtype, shape and bytes, the scheme, and the parameters that matter for it:
  the group size for int4, the outlier threshold for w8a8); names never pick a path;
- the tensors are one safetensors file (no pickle); the marker, written last before the
  publishing rename, holds the file's own sha256 and the non-tensor fields (errors, shapes);
- a load checks the marker, the file's sha256 and every field; any mismatch (a truncated or
  corrupted file, an odd marker) is a miss: the entry is rebuilt and replaces that entry only.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from engine.model import cache
from engine.core.config import QuantConfig
from engine.model.quantization import QuantError, QuantizedLinear

FORMAT_VERSION = 1
TENSORS = "quantized.safetensors"
_DISABLE_ENV = "INFERSCOPE_NO_QUANT_CACHE"  # "1": quantize in memory only (nothing read or written)

#: name -> quantized weight ("layers.<i>.qkv" / ".o" / ".gate_up" / ".down", "embed_tokens",
#: and "lm_head" when it is not tied).
Quantized = dict[str, QuantizedLinear]


def weights_digest(weights: Mapping[str, torch.Tensor]) -> str:
    """sha256 over every tensor (sorted by name): name, dtype, shape, then its bytes."""
    h = hashlib.sha256()
    for name in sorted(weights):
        t = weights[name].detach().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}\n".encode())
        if t.numel():
            h.update(t.view(torch.uint8).reshape(-1).numpy().data)  # a memoryview, no copy
    return h.hexdigest()


def entry_key(model_digest: str, config: QuantConfig) -> str:
    """The entry's sha256 key; group size only for int4, outlier threshold only for w8a8."""
    parts = {"format": FORMAT_VERSION, "torch": torch.__version__, "model": model_digest,
             "scheme": config.scheme,
             "group_size": config.group_size if config.scheme == "int4" else None,
             "outlier_threshold": repr(float(config.outlier_threshold)) if config.scheme == "w8a8" else None}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def entry_path(key: str) -> Path:
    return cache.cache_root() / "quantized" / f"q-{key}"


def _file_sha256(path: Path) -> str:
    return cache.file_digest(path)


def _marker(key: str, file_sha: str, quantized: Quantized) -> dict[str, Any]:
    return {"sha256": key, "version": cache.CACHE_VERSION, "format": FORMAT_VERSION, "file_sha256": file_sha,
            "weights": {name: {"scheme": q.scheme, "out_features": q.out_features, "in_features": q.in_features,
                               "group_size": q.group_size, "outlier_threshold": q.outlier_threshold,
                               "error": [q.error.relative_frobenius, q.error.max_abs]}
                        for name, q in quantized.items()}}


def save(entry: Path, key: str, quantized: Quantized) -> None:
    """Write the entry in a private temp dir and publish it by one rename (cache.publish)."""
    tmp = cache.staging_dir("quantized")
    try:
        tensors = {}
        for name, q in quantized.items():
            tensors[f"{name}.weight"] = q.weight.contiguous()
            tensors[f"{name}.scales"] = q.scales.contiguous()
        save_file(tensors, str(tmp / TENSORS))
        marker = _marker(key, _file_sha256(tmp / TENSORS), quantized)
        (tmp / cache.MARKER).write_text(json.dumps(marker))  # last: marks the entry complete
        cache.publish(tmp, entry, key)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # our own temp dir only (gone once published)


def load(entry: Path, key: str) -> Quantized | None:
    """The cached weights, or None when the entry is missing, incomplete or corrupt (marker,
    file sha256, tensor names, dtypes and shapes are all checked)."""
    if not cache.entry_ok(entry, key):
        return None
    try:
        marker = json.loads((entry / cache.MARKER).read_text(encoding="utf-8"))
        if marker.get("format") != FORMAT_VERSION or _file_sha256(entry / TENSORS) != marker.get("file_sha256"):
            return None
        # Copies, not views of the file: the int8/int4 CPU kernels read with SIMD loads and crashed
        # (SIGSEGV) on tensors at the file's unaligned offsets.
        tensors = {k: v.clone() for k, v in load_file(str(entry / TENSORS)).items()}
        out: Quantized = {}
        for name, info in marker["weights"].items():
            rel, max_abs = info["error"]
            out[name] = QuantizedLinear(str(info["scheme"]), int(info["out_features"]), int(info["in_features"]),
                                        tensors.pop(f"{name}.weight"), tensors.pop(f"{name}.scales"),
                                        QuantError(float(rel), float(max_abs)),
                                        None if info["group_size"] is None else int(info["group_size"]),
                                        float(info["outlier_threshold"]))
        return None if tensors else out  # an extra tensor: not the file this marker describes
    except Exception:  # safetensors raises its own error type on a truncated header or body
        return None


def _discard(entry: Path) -> None:
    """Move a broken entry (this key's only) aside into our temp dir and remove it."""
    if not entry.exists():
        return
    tmp_root = cache.cache_root() / "tmp"
    tmp_root.mkdir(parents=True, exist_ok=True)
    aside = Path(tempfile.mkdtemp(prefix="stale-q-", dir=str(tmp_root)))
    try:
        os.rename(entry, aside / "entry")
    except OSError:
        pass  # another process replaced it meanwhile
    shutil.rmtree(aside, ignore_errors=True)


def cached_quantize(weights: Mapping[str, torch.Tensor], config: QuantConfig,
                    build: Callable[[], Quantized]) -> tuple[Quantized, str]:
    """``build()``'s result, from the cache when a valid entry exists, else built and stored.
    Returns (weights, "hit" | "miss" | "rebuilt" | "off"); a cache that cannot be written
    (read-only, full) still returns the built weights."""
    if os.environ.get(_DISABLE_ENV) == "1":
        return build(), "off"
    key = entry_key(weights_digest(weights), config)
    entry = entry_path(key)
    found = load(entry, key)
    if found is not None:
        return found, "hit"
    status = "rebuilt" if entry.exists() else "miss"
    if status == "rebuilt":
        _discard(entry)
    quantized = build()
    try:
        save(entry, key, quantized)
    except OSError:
        pass
    return quantized, status
