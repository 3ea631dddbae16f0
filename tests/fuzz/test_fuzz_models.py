"""Fuzz: bad model folders, safetensors files, GGUF files and model names.

Documented outcome for every case: ``load_model`` raises a ValueError whose message names the
file and the field (or tensor / GGUF key / name problem), within the time limit. Cases are
generated: each config field x each bad value, safetensors cut at several offsets or with a
broken header / dtype / shape, GGUF files cut at several offsets, garbage, or with bad
metadata, and odd names. The cache is a private tmp dir per test.
"""
from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.model.loader import TINY_RANDOM_CONFIG, load_model, tiny_random_weights
from tests.fuzz.harness import expect_rejected
from tests.model_files import write_folder, write_gguf

SECONDS = 10.0


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("INFERSCOPE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def good_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_folder(tmp_path_factory.mktemp("good") / "m")


@pytest.fixture(scope="module")
def good_gguf(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return write_gguf(tmp_path_factory.mktemp("good") / "m.gguf").read_bytes()


def _copy_folder(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def _reject_load(model: object, *parts: str) -> None:
    """``load_model(model)`` is a ValueError naming each of ``parts`` (in order)."""
    pattern = ".*".join(re.escape(p) for p in parts) if parts else None
    expect_rejected(lambda: load_model(model), pattern, seconds=SECONDS)  # type: ignore[arg-type]


# -- config.json: each field x each bad value ----------------------------------------------
INT_FIELDS = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings"]
BAD_INTS: list[Any] = [0, -1, "8", 8.5, 64.0, True, [], {}, 10**12]
FLOAT_FIELDS = ["rms_norm_eps", "rope_theta"]
BAD_FLOATS: list[Any] = [0, -1.0, "1e4", None, True, float("nan"), float("inf"), []]
BOOL_FIELDS = ["tie_word_embeddings", "attention_bias"]
BAD_BOOLS: list[Any] = ["true", 1, None, 0.0]
OTHER_FIELDS: list[tuple[str, Any]] = [
    ("architectures", ["GPT2LMHeadModel"]), ("architectures", "LlamaForCausalLM"),
    ("architectures", []), ("architectures", [1]), ("rope_scaling", {"type": "linear", "factor": 2.0}),
    ("rope_scaling", "yes"), ("hidden_act", "gelu"), ("mlp_bias", True), ("bos_token_id", -1),
    ("bos_token_id", 320), ("eos_token_id", [257, "x"]), ("eos_token_id", 1.5),
]
REQUIRED = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"}
CONFIG_CASES: list[tuple[str, Any]] = (
    [(f, v) for f in INT_FIELDS for v in BAD_INTS]
    + [(f, None) for f in sorted(REQUIRED)]
    + [(f, v) for f in FLOAT_FIELDS for v in BAD_FLOATS]
    + [(f, v) for f in BOOL_FIELDS for v in BAD_BOOLS]
    + OTHER_FIELDS
)


@pytest.mark.parametrize("field,value", CONFIG_CASES,
                         ids=[f"{f}={str(v)[:12]}" for f, v in CONFIG_CASES])
def test_config_field(tmp_path: Path, good_folder: Path, field: str, value: Any) -> None:
    folder = _copy_folder(good_folder, tmp_path / "m")
    (folder / "config.json").write_text(json.dumps({**TINY_RANDOM_CONFIG, field: value}))
    _reject_load(str(folder), "config.json", field)


RELATIONS: list[tuple[dict[str, Any], str]] = [
    ({"num_attention_heads": 3, "num_key_value_heads": 1}, "num_attention_heads"),
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"head_dim": 15}, "head_dim"),
    ({"vocab_size": 10**9}, "vocab_size"),  # fits an int, not the memory
    ({"num_hidden_layers": 4000, "hidden_size": 8192, "num_attention_heads": 64,
      "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 28672}, "num_hidden_layers"),
]


@pytest.mark.parametrize("changes,field", RELATIONS, ids=[r[1] for r in RELATIONS])
def test_config_relation(tmp_path: Path, good_folder: Path, changes: dict[str, Any], field: str) -> None:
    folder = _copy_folder(good_folder, tmp_path / "m")
    (folder / "config.json").write_text(json.dumps({**TINY_RANDOM_CONFIG, **changes}))
    _reject_load(str(folder), "config.json", field)


WHOLE_CONFIGS: list[tuple[str, bytes, str]] = [
    ("empty object", b"{}", "vocab_size"), ("a list", b"[]", "object"), ("null", b"null", "object"),
    ("a number", b"42", "object"), ("a string", b'"llama"', "object"), ("empty file", b"", "JSON"),
    ("garbage", b"\x00\xff\xfe garbage", "JSON"), ("deep nesting", b"[" * 100_000, "JSON"),
    ("truncated", json.dumps(TINY_RANDOM_CONFIG).encode()[:40], "JSON"),
]


@pytest.mark.parametrize("label,text,part", WHOLE_CONFIGS, ids=[w[0] for w in WHOLE_CONFIGS])
def test_whole_config(tmp_path: Path, good_folder: Path, label: str, text: bytes, part: str) -> None:
    folder = _copy_folder(good_folder, tmp_path / "m")
    (folder / "config.json").write_bytes(text)
    _reject_load(str(folder), "config.json", part)


# -- safetensors ---------------------------------------------------------------------------
@pytest.mark.parametrize("cut", [0, 4, 8, 64, 0.25, 0.5, 0.9, -1])
def test_safetensors_cut(tmp_path: Path, good_folder: Path, cut: float) -> None:
    folder = _copy_folder(good_folder, tmp_path / "m")
    st = folder / "model.safetensors"
    data = st.read_bytes()
    at = int(cut * len(data)) if isinstance(cut, float) else (cut if cut >= 0 else len(data) + cut)
    st.write_bytes(data[:at])
    _reject_load(str(folder), "model.safetensors")


def _header(entries: Any) -> bytes:
    raw = json.dumps(entries).encode()
    return struct.pack("<Q", len(raw)) + raw


HEADERS: list[tuple[str, bytes]] = [
    ("length beyond file", struct.pack("<Q", 10**9) + b"{}"),
    ("not json", struct.pack("<Q", 5) + b"nope!"),
    ("json list", _header([1, 2])),
    ("entry not object", _header({"model.norm.weight": 5})),
    ("unknown dtype", _header({"model.norm.weight": {"dtype": "Q4", "shape": [64], "data_offsets": [0, 256]}})),
    ("negative shape", _header({"model.norm.weight": {"dtype": "F32", "shape": [-64], "data_offsets": [0, 256]}})),
    ("offsets mismatch", _header({"model.norm.weight": {"dtype": "F32", "shape": [64], "data_offsets": [0, 8]}})),
    ("offsets beyond data", _header({"model.norm.weight": {"dtype": "F32", "shape": [64], "data_offsets": [0, 256]}})),
    ("non-utf8 header", struct.pack("<Q", 4) + b"\xff\xfe\xfd\xfc"),
]


@pytest.mark.parametrize("label,data", HEADERS, ids=[h[0] for h in HEADERS])
def test_safetensors_header(tmp_path: Path, good_folder: Path, label: str, data: bytes) -> None:
    folder = _copy_folder(good_folder, tmp_path / "m")
    (folder / "model.safetensors").write_bytes(data)
    _reject_load(str(folder), "model.safetensors")


def _weights_case(name: str) -> tuple[dict[str, torch.Tensor], str]:
    w = tiny_random_weights(TINY_RANDOM_CONFIG)
    cases: dict[str, tuple[str, torch.Tensor | None]] = {
        "int dtype": ("model.norm.weight", torch.ones(64, dtype=torch.int32)),
        "uint8 dtype": ("model.layers.0.input_layernorm.weight", torch.ones(64, dtype=torch.uint8)),
        "bool dtype": ("model.layers.1.input_layernorm.weight", torch.ones(64, dtype=torch.bool)),
        "q rows": ("model.layers.0.self_attn.q_proj.weight", torch.zeros(32, 64)),
        "k cols": ("model.layers.1.self_attn.k_proj.weight", torch.zeros(32, 65)),
        "embed vocab": ("model.embed_tokens.weight", torch.zeros(300, 64)),
        "lm_head 3d": ("lm_head.weight", torch.zeros(320, 64, 1)),
        "down transposed": ("model.layers.0.mlp.down_proj.weight", torch.zeros(128, 64)),
        "missing v": ("model.layers.1.self_attn.v_proj.weight", None),
        "missing norm": ("model.norm.weight", None),
        "extra layer": ("model.layers.2.mlp.up_proj.weight", torch.zeros(128, 64)),
        "extra bias": ("model.layers.0.mlp.up_proj.bias", torch.zeros(128)),
        "inf weight": ("model.layers.0.mlp.gate_proj.weight",
                       torch.full((128, 64), float("inf"))),
    }
    tensor_name, value = cases[name]
    if value is None:
        del w[tensor_name]
    else:
        w[tensor_name] = value
    return w, tensor_name


WEIGHT_CASES = ["int dtype", "uint8 dtype", "bool dtype", "q rows", "k cols", "embed vocab", "lm_head 3d",
                "down transposed", "missing v", "missing norm", "extra layer", "extra bias", "inf weight"]


@pytest.mark.parametrize("case", WEIGHT_CASES)
def test_safetensors_tensors(tmp_path: Path, good_folder: Path, case: str) -> None:
    from safetensors.torch import save_file

    folder = _copy_folder(good_folder, tmp_path / "m")
    weights, tensor_name = _weights_case(case)
    save_file(weights, str(folder / "model.safetensors"))
    _reject_load(str(folder), tensor_name)


def test_safetensors_path_is_a_directory(tmp_path: Path, good_folder: Path) -> None:
    folder = _copy_folder(good_folder, tmp_path / "m")
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").mkdir()
    _reject_load(str(folder), "model.safetensors")


def test_config_json_is_a_directory(tmp_path: Path, good_folder: Path) -> None:
    folder = _copy_folder(good_folder, tmp_path / "m")
    (folder / "config.json").unlink()
    (folder / "config.json").mkdir()
    _reject_load(str(folder), "config.json")


def test_config_json_too_big(tmp_path: Path, good_folder: Path) -> None:
    folder = _copy_folder(good_folder, tmp_path / "m")
    (folder / "config.json").write_text(json.dumps({**TINY_RANDOM_CONFIG, "pad": "x" * 17 * 2**20}))
    _reject_load(str(folder), "config.json", "bytes")


def test_safetensors_name_in_two_files(tmp_path: Path, good_folder: Path) -> None:
    from safetensors.torch import save_file

    folder = _copy_folder(good_folder, tmp_path / "m")
    save_file({"model.norm.weight": torch.ones(64)}, str(folder / "extra.safetensors"))
    _reject_load(str(folder), "model.norm.weight")


# -- GGUF ------------------------------------------------------------------------------------
@pytest.mark.parametrize("fraction", [0.0, 0.00001, 0.0001, 0.001, 0.01, 0.1, 0.3, 0.6, 0.9, 0.9999])
def test_gguf_cut(tmp_path: Path, good_gguf: bytes, fraction: float) -> None:
    path = tmp_path / "cut.gguf"
    path.write_bytes(good_gguf[: int(len(good_gguf) * fraction)])
    _reject_load(str(path), "cut.gguf")


GARBAGE: list[tuple[str, bytes]] = [
    ("zeros", bytes(4096)), ("text", b"hello, I am not a model\n" * 50),
    ("magic then garbage", b"GGUF" + bytes(range(256)) * 8),
    ("magic, version 3, huge counts", b"GGUF" + struct.pack("<IQQ", 3, 2**60, 2**60)),
    ("safetensors bytes", _header({})),
]


@pytest.mark.parametrize("label,data", GARBAGE, ids=[g[0] for g in GARBAGE])
def test_gguf_garbage(tmp_path: Path, label: str, data: bytes) -> None:
    path = tmp_path / "junk.gguf"
    path.write_bytes(data)
    _reject_load(str(path), "junk.gguf")


GGUF_META: list[tuple[str, Any]] = [
    ("attention.head_count", 0), ("attention.head_count", None), ("attention.head_count", "4"),
    ("block_count", 0), ("block_count", None), ("embedding_length", 63),
    ("embedding_length", 1.5), ("feed_forward_length", None), ("attention.head_count_kv", 3),
    ("attention.head_count_kv", 0), ("rope.freq_base", 0.0), ("rope.freq_base", -5.0),
    ("attention.layer_norm_rms_epsilon", 0.0), ("vocab_size", 10**12), ("vocab_size", 100),
    ("rope.dimension_count", 15), ("context_length", 0), ("block_count", 3),
]


@pytest.mark.parametrize("key,value", GGUF_META, ids=[f"{k}={v}" for k, v in GGUF_META])
def test_gguf_metadata(tmp_path: Path, key: str, value: Any) -> None:
    path = write_gguf(tmp_path / "meta.gguf", metadata={key: value})
    expected = {"vocab_size=100": "tokenizer.ggml.bos_token_id", "block_count=3": "model.layers.2",
                "embedding_length=63": "llama.attention.head_count"}.get(f"{key}={value}", f"llama.{key}")
    _reject_load(str(path), "meta.gguf", expected)


@pytest.mark.parametrize("arch", ["gpt2", "qwen2", ""])
def test_gguf_architecture(tmp_path: Path, arch: str) -> None:
    path = write_gguf(tmp_path / "arch.gguf", arch=arch)
    _reject_load(str(path), "arch.gguf", "general.architecture")


@pytest.mark.parametrize("tensor", ["blk.0.attn_q.weight", "token_embd.weight", "blk.1.ffn_norm.weight"])
def test_gguf_missing_tensor(tmp_path: Path, tensor: str) -> None:
    path = write_gguf(tmp_path / "part.gguf", skip_tensors=(tensor,))
    _reject_load(str(path), "part.gguf", "missing")


# -- names and paths -------------------------------------------------------------------------
def _names(tmp: Path) -> list[tuple[str, object, str]]:
    (tmp / "empty-dir").mkdir()
    (tmp / "dir.gguf").mkdir()
    (tmp / "notes.txt").write_text("hi")
    return [
        ("empty", "", "empty"), ("blank", "   ", "empty"), ("None", None, "NoneType"),
        ("int", 0, "int"), ("float", 1.5, "float"), ("list", ["tiny-random"], "list"),
        ("dict", {}, "dict"), ("bytes", b"tiny-random", "bytes"),
        ("5000 chars", "m" * 5000, "5000 characters"), ("4097 chars", "/" * 4097, "4097"),
        ("NUL", "\0", "NUL"), ("NUL inside", "tiny-\0random", "NUL"),
        ("lone surrogate", "\udcff.gguf", "UTF-8"),
        ("missing path", str(tmp / "nope"), "unknown model"),
        ("missing gguf", str(tmp / "nope.gguf"), "unknown model"),
        ("dir without config", str(tmp / "empty-dir"), "config.json"),
        ("dir named .gguf", str(tmp / "dir.gguf"), "config.json"),
        ("a text file", str(tmp / "notes.txt"), "unknown model"),
        ("long component", str(tmp / ("z" * 300)), "too long"),
        ("unknown user home", "~no_such_user_xyz/model", "home"),
    ]


NAME_IDS = [  # the labels of _names(), in order
    "empty", "blank", "None", "int", "float", "list", "dict", "bytes", "5000 chars", "4097 chars",
    "NUL", "NUL inside", "lone surrogate", "missing path", "missing gguf", "dir without config",
    "dir named .gguf", "a text file", "long component", "unknown user home"]


@pytest.mark.parametrize("index", range(len(NAME_IDS)), ids=NAME_IDS)
def test_model_name(tmp_path: Path, index: int) -> None:
    label, name, part = _names(tmp_path)[index]
    _reject_load(name, "model", part)
    from engine.model.shared import get_shared_model

    expect_rejected(lambda: get_shared_model(name), "model", seconds=SECONDS)  # type: ignore[arg-type]
