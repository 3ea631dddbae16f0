"""Small model files written by tests: a Hugging Face folder and a llama GGUF of the tiny-random
model (2 layers, hidden 64, byte tokenizer), built in a temp dir in about a second.

Both hold exactly ``tiny_random_weights(TINY_RANDOM_CONFIG, seed)``, so a test can check that
what loads back is what was written (the GGUF stores q/k rows in llama.cpp's permuted order,
the way llama.cpp's converter writes them, and the loader must undo it).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.model.loader import TINY_RANDOM_CONFIG, _bytes_to_unicode, byte_tokenizer, tiny_random_weights

_GGUF_LAYER = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_GGUF_GLOBAL = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def write_folder(folder: Path, config: dict[str, Any] | None = None, seed: int = 0,
                 weights: dict[str, torch.Tensor] | None = None) -> Path:
    """A loadable Hugging Face folder: config.json, model.safetensors, tokenizer files."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    cfg = dict(TINY_RANDOM_CONFIG if config is None else config)
    (folder / "config.json").write_text(json.dumps(cfg))
    w = tiny_random_weights(TINY_RANDOM_CONFIG, seed) if weights is None else weights
    save_file({k: v.contiguous() for k, v in w.items()}, str(folder / "model.safetensors"))
    byte_tokenizer().save_pretrained(str(folder))
    return folder


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row permutation (the inverse of the loader's ``_unpermute``)."""
    s = w.shape
    return w.reshape(n_head, 2, s[0] // n_head // 2, *s[1:]).swapaxes(1, 2).reshape(s)


def _gguf_name(hf: str) -> str:
    if hf in _GGUF_GLOBAL:
        return _GGUF_GLOBAL[hf]
    parts = hf.split(".")  # model.layers.{i}.{kind...}.weight
    return f"blk.{parts[2]}.{_GGUF_LAYER['.'.join(parts[3:-1])]}.{parts[-1]}"


def write_gguf(path: Path, seed: int = 0, metadata: dict[str, Any] | None = None,
               skip_tensors: tuple[str, ...] = (), token_scores: bool = True,
               arch: str = "llama") -> Path:
    """A llama GGUF of the tiny model; ``metadata`` overrides llama.* keys (None drops one).
    ``token_scores=False`` leaves out tokenizer metadata that transformers needs, so the
    conversion fails late (after the weights are written), the way a crash mid-write would."""
    from gguf import GGUFWriter

    c = TINY_RANDOM_CONFIG
    meta: dict[str, Any] = {
        "block_count": c["num_hidden_layers"], "context_length": c["max_position_embeddings"],
        "embedding_length": c["hidden_size"], "feed_forward_length": c["intermediate_size"],
        "attention.head_count": c["num_attention_heads"],
        "attention.head_count_kv": c["num_key_value_heads"],
        "rope.dimension_count": c["head_dim"], "attention.layer_norm_rms_epsilon": c["rms_norm_eps"],
        "rope.freq_base": c["rope_theta"], "vocab_size": c["vocab_size"],
    }
    meta.update(metadata or {})
    path.parent.mkdir(parents=True, exist_ok=True)
    g = GGUFWriter(str(path), arch)
    for key, value in meta.items():
        if value is None:
            continue
        full = f"llama.{key}"
        if isinstance(value, bool) or isinstance(value, str):
            (g.add_bool if isinstance(value, bool) else g.add_string)(full, value)
        elif isinstance(value, float):
            g.add_float32(full, value)
        else:
            g.add_uint32(full, value) if 0 <= value < 2**32 else g.add_int64(full, value)
    vocab = c["vocab_size"]
    tokens = [ch for _, ch in sorted(_bytes_to_unicode().items())] + ["<s>", "</s>"]
    tokens += [f"<pad{i}>" for i in range(vocab - len(tokens) - 1)]
    tokens.append("<|endoftext|>")  # transformers' GPT-2 converter adds it when it is missing
    g.add_tokenizer_model("gpt2")
    g.add_tokenizer_pre("default")
    g.add_token_list(tokens)
    g.add_token_types([1] * 256 + [3, 3] + [4] * (vocab - 258))
    if token_scores:
        g.add_token_scores([0.0] * vocab)
    g.add_token_merges([])
    g.add_bos_token_id(c["bos_token_id"])
    g.add_eos_token_id(c["eos_token_id"])
    for name, t in tiny_random_weights(c, seed).items():
        a = t.numpy().astype(np.float32)
        if ".q_proj." in name:
            a = _permute(a, c["num_attention_heads"])
        elif ".k_proj." in name:
            a = _permute(a, c["num_key_value_heads"])
        if _gguf_name(name) not in skip_tensors:
            g.add_tensor(_gguf_name(name), a)
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()
    return path
