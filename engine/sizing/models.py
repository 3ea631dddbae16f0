"""Where a model comes from: a preset, a config.json path, pasted JSON, or a local folder.

A local folder gives exact weight bytes from its safetensors headers (8-byte little-endian
header length, then a JSON header of ``name -> {dtype, shape, data_offsets}``), read without
torch or the safetensors package, as hf-mem does.
"""
from __future__ import annotations

import functools
import json
import math
from typing import Any
from pathlib import Path

from .arch import Checkpoint, ModelSpec, model_from_config
from .formats import FLOAT_SAFETENSORS, SAFETENSORS_DTYPE_BYTES, SizingError
from .hardware import PRESETS_DIR, norm_name

MAX_HEADER = 100 * 1024 * 1024
MAX_CONFIG_BYTES = 16 * 1024 * 1024  # real config.json files are under 1 MB
MAX_NAME_CHARS = 4096  # PATH_MAX on Linux


@functools.lru_cache(maxsize=1)
def _preset_files() -> dict[str, Path]:
    folder = PRESETS_DIR / "models"
    return {p.stem: p for p in sorted(folder.glob("*.json"))} if folder.is_dir() else {}


@functools.lru_cache(maxsize=64)
def _preset_dict(key: str) -> dict[str, Any]:
    preset: dict[str, Any] = json.loads(_preset_files()[key].read_text())
    return preset


def model_presets() -> list[str]:
    return list(_preset_files())


def model_preset_config(key: str) -> dict[str, Any]:
    return _preset_dict(key)


def _load_json(text: str) -> object:
    """``json.loads`` with every failure as one SizingError line: syntax errors (with line and
    column), integers longer than Python's 4,300-digit limit, nesting deep enough to exhaust the
    recursion limit."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SizingError(f"malformed config JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise SizingError("malformed config JSON: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer literal of more than 4,300 digits
        raise SizingError(f"malformed config JSON: {str(exc).split(';')[0]}") from None


def parse_config_text(text: str | bytes, key: str = "pasted") -> ModelSpec:
    """Pasted or uploaded config.json text (at most MAX_CONFIG_BYTES)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise SizingError("the uploaded config is not UTF-8 text") from None
    if not isinstance(text, str):
        raise SizingError(f"config text must be a string, got {type(text).__name__}")
    if not text.strip():
        raise SizingError("the config text is empty")
    if len(text) > MAX_CONFIG_BYTES:
        raise SizingError(f"the config text is {len(text):,} characters; a config.json is at most"
                          f" {MAX_CONFIG_BYTES:,}")
    return model_from_config(_load_json(text), key)


def read_safetensors_header(path: str | Path) -> dict[str, Any]:
    """The JSON header of one .safetensors file (tensor name -> dtype, shape, data_offsets)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise SizingError(f"{path.name}: too short to be a safetensors file")
            n = int.from_bytes(head, "little")
            if n <= 0 or n > MAX_HEADER or n > size - 8:
                raise SizingError(f"{path.name}: bad safetensors header length {n}")
            header = json.loads(fh.read(n))
    except OSError as exc:
        raise SizingError(f"cannot read {path}: {exc.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise SizingError(f"{path.name}: safetensors header is not valid JSON") from None
    if not isinstance(header, dict):
        raise SizingError(f"{path.name}: safetensors header is not a JSON object")
    return header


def checkpoint_from_folder(folder: str | Path) -> Checkpoint | None:
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    files: list[Path]
    if index.is_file():
        try:
            data = _load_json(index.read_text())
        except (OSError, UnicodeDecodeError, SizingError):
            raise SizingError(f"{index.name} is not valid JSON") from None
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise SizingError(f"{index.name}: 'weight_map' must be an object of tensor name -> file name")
        files = [folder / name for name in sorted(set(weight_map.values()))]
    else:
        files = sorted(folder.glob("*.safetensors"))
        if len(files) > 1:  # Mistral-style repos ship both layouts
            files = [f for f in files if f.name != "consolidated.safetensors"] or files
    if not files:
        return None
    stored = numel = tensors = 0
    dtypes: set[str] = set()
    for f in files:
        if not f.is_file():
            raise SizingError(f"the index lists {f.name} but the file is missing")
        for name, info in read_safetensors_header(f).items():
            if name == "__metadata__":
                continue
            try:
                dtype = str(info["dtype"])
                shape = [int(x) for x in info["shape"]]
                start, end = (int(x) for x in info["data_offsets"])
            except (KeyError, TypeError, ValueError):
                raise SizingError(f"{f.name}: tensor {name!r} has a malformed header entry") from None
            if dtype not in SAFETENSORS_DTYPE_BYTES:
                raise SizingError(f"{f.name}: tensor {name!r} has unknown dtype {dtype!r}")
            count = math.prod(shape)
            if end - start != count * SAFETENSORS_DTYPE_BYTES[dtype]:
                raise SizingError(f"{f.name}: tensor {name!r} byte range does not match its shape and dtype")
            stored += end - start
            numel += count
            tensors += 1
            dtypes.add(dtype)
    return Checkpoint(str(folder), len(files), tensors, stored, numel, tuple(sorted(dtypes)),
                      all(d in FLOAT_SAFETENSORS for d in dtypes))


def model_from_folder(folder: str | Path) -> ModelSpec:
    folder = Path(folder)
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise SizingError(f"no config.json in {folder}")
    spec = model_from_path(cfg_path, key=folder.name)
    ckpt = checkpoint_from_folder(folder)
    if ckpt is None:
        return spec
    from dataclasses import replace

    source = dict(spec.source)
    source.setdefault("hf_id", str(folder))
    return replace(spec, checkpoint=ckpt, source=source, hf_id=spec.hf_id or str(folder),
                   display_name=spec.display_name if spec.display_name != folder.name else folder.name)


def model_from_path(path: str | Path, key: str | None = None) -> ModelSpec:
    path = Path(path)
    if path.is_dir():
        return model_from_folder(path)
    if not path.is_file():
        raise SizingError(f"config file not found: {path}")
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise SizingError(f"{path} is {path.stat().st_size:,} bytes; a config.json is at most {MAX_CONFIG_BYTES:,}")
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise SizingError(f"cannot read {path}: {exc}") from None
    return parse_config_text(text, key or config_file_name(path))


def config_file_name(path: Path) -> str:
    """A config file's model name when the config names none (``_name_or_path`` wins, in
    ``model_from_config``): the file's own name (``llama-3-8b.json`` -> ``llama-3-8b``); for a file
    called ``config.json``, its folder's (a model folder). Never an arbitrary folder such as
    ``configs/`` for a named file (issue #21: ``vllm serve configs``)."""
    return path.parent.resolve().name if path.stem == "config" else path.stem


def get_model(name: str) -> ModelSpec:
    """A preset key (case and punctuation ignored), a display name, a config.json path or a folder."""
    if isinstance(name, ModelSpec):
        return name
    text = str(name or "").strip()
    if not text:
        raise SizingError("no model given; see --list-models")
    files = _preset_files()
    if text in files:
        return model_from_config(_preset_dict(text), text)
    wanted = norm_name(text)
    for key in files:
        source = _preset_dict(key).get("_source", {})
        if wanted in (norm_name(key), norm_name(source.get("display_name", "")), norm_name(source.get("hf_id", ""))):
            return model_from_config(_preset_dict(key), key)
    shown = text if len(text) <= 200 else text[:200] + "..."
    if len(text) > MAX_NAME_CHARS:
        raise SizingError(f"model name or path is {len(text):,} characters (at most {MAX_NAME_CHARS:,}): {shown!r}")
    path = Path(text)
    try:
        exists = path.exists()
    except (OSError, ValueError) as exc:  # name too long for the file system, NUL byte, ...
        raise SizingError(f"cannot use {shown!r} as a config path: {getattr(exc, 'strerror', None) or exc}") from None
    if exists:
        return model_from_path(path)
    if text.endswith(".json") or "/" in text:
        raise SizingError(f"config file or folder not found: {shown}")
    raise SizingError(f"unknown model {shown!r}; see --list-models, or pass a config.json path or a model folder")
