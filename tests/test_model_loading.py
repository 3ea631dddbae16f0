"""Issue #7, model loading: every bad model folder, GGUF file or model name is a ValueError at
load time naming the file and the field; the GGUF cache is keyed by content, written
atomically, and never deletes outside the entry it writes.

Every test points INFERSCOPE_CACHE at its own tmp_path: the shared cache is never touched.
"""
from __future__ import annotations

import json
import os
import struct
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.model import cache, convert
from engine.model.loader import TINY_RANDOM_CONFIG, load_model, tiny_random_weights
from tests.model_files import write_folder, write_gguf


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("INFERSCOPE_CACHE", str(root))
    return root


def _rejected(model: object, *parts: str) -> str:
    """``load_model(model)`` raises ValueError whose message names every one of ``parts``."""
    with pytest.raises(ValueError) as info:
        load_model(model)  # type: ignore[arg-type]
    message = str(info.value)
    for part in parts:
        assert part.lower() in message.lower(), f"{part!r} not named in {message!r}"
    assert len(message) < 600, f"message too long ({len(message)} chars)"
    return message


def _with(**changes: Any) -> dict[str, Any]:
    cfg = dict(TINY_RANDOM_CONFIG)
    for key, value in changes.items():
        if value is ...:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    return cfg


# -- config.json -------------------------------------------------------------------------
BAD_CONFIGS = [
    ("empty object", "{}", "vocab_size"),
    ("a list", "[]", "object"),
    ("not JSON", "{nope", "JSON"),
    ("zero heads", json.dumps(_with(num_attention_heads=0)), "num_attention_heads"),
    ("zero layers", json.dumps(_with(num_hidden_layers=0)), "num_hidden_layers"),
    ("zero kv heads", json.dumps(_with(num_key_value_heads=0)), "num_key_value_heads"),
    ("heads do not divide hidden", json.dumps(_with(num_attention_heads=3, num_key_value_heads=1)),
     "num_attention_heads"),
    ("kv heads do not divide heads", json.dumps(_with(num_key_value_heads=3)), "num_key_value_heads"),
    ("rope_theta zero", json.dumps(_with(rope_theta=0)), "rope_theta"),
    ("vocab a string", json.dumps(_with(vocab_size="320")), "vocab_size"),
    ("hidden a float", json.dumps(_with(hidden_size=64.0)), "hidden_size"),
    ("layers a bool", json.dumps(_with(num_hidden_layers=True)), "num_hidden_layers"),
    ("hidden null", json.dumps(_with(hidden_size=None)), "hidden_size"),
    ("vocab 10^12", json.dumps(_with(vocab_size=10**12)), "vocab_size"),
    ("eps negative", json.dumps(_with(rms_norm_eps=-1.0)), "rms_norm_eps"),
    ("tie a string", json.dumps(_with(tie_word_embeddings="no")), "tie_word_embeddings"),
    ("eos out of vocab", json.dumps(_with(eos_token_id=10**6)), "eos_token_id"),
    ("odd head_dim", json.dumps(_with(head_dim=15)), "head_dim"),
]


@pytest.mark.parametrize("label,text,field", BAD_CONFIGS, ids=[c[0] for c in BAD_CONFIGS])
def test_bad_config_json_names_file_and_field(tmp_path: Path, label: str, text: str, field: str) -> None:
    folder = write_folder(tmp_path / "m")
    (folder / "config.json").write_text(text)
    _rejected(str(folder), "config.json", field)


def test_good_folder_loads_the_weights_it_holds(tmp_path: Path) -> None:
    loaded = load_model(str(write_folder(tmp_path / "m", seed=3)))
    expected = tiny_random_weights(TINY_RANDOM_CONFIG, 3)
    assert set(loaded.weights) == set(expected)
    assert all(torch.equal(loaded.weights[k], expected[k]) for k in expected)


# -- safetensors -------------------------------------------------------------------------
def _st(folder: Path) -> Path:
    return folder / "model.safetensors"


def test_truncated_safetensors(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "m")
    data = _st(folder).read_bytes()
    _st(folder).write_bytes(data[: len(data) // 2])
    _rejected(str(folder), "model.safetensors", "truncated")


def test_safetensors_header_garbage(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "m")
    _st(folder).write_bytes(struct.pack("<Q", 12) + b"not json at all" + b"\0" * 64)
    _rejected(str(folder), "model.safetensors", "header")


def test_safetensors_shape_disagrees_with_config(tmp_path: Path) -> None:
    w = tiny_random_weights(TINY_RANDOM_CONFIG)
    w["model.layers.1.mlp.up_proj.weight"] = torch.zeros(64, 64)
    folder = write_folder(tmp_path / "m", weights=w)
    _rejected(str(folder), "model.safetensors", "model.layers.1.mlp.up_proj.weight", "intermediate_size")


def test_safetensors_missing_tensor(tmp_path: Path) -> None:
    w = tiny_random_weights(TINY_RANDOM_CONFIG)
    del w["model.layers.0.self_attn.k_proj.weight"]
    folder = write_folder(tmp_path / "m", weights=w)
    _rejected(str(folder), "model.layers.0.self_attn.k_proj.weight", "missing")


def test_safetensors_integer_dtype(tmp_path: Path) -> None:
    w = tiny_random_weights(TINY_RANDOM_CONFIG)
    w["model.norm.weight"] = torch.ones(64, dtype=torch.int32)
    folder = write_folder(tmp_path / "m", weights=w)
    _rejected(str(folder), "model.safetensors", "model.norm.weight", "I32")


def test_safetensors_nan_weights(tmp_path: Path) -> None:
    w = tiny_random_weights(TINY_RANDOM_CONFIG)
    w["model.layers.0.mlp.down_proj.weight"][3, 5] = float("nan")
    folder = write_folder(tmp_path / "m", weights=w)
    _rejected(str(folder), "model.safetensors", "model.layers.0.mlp.down_proj.weight", "finite")


def test_tokenizer_larger_than_vocab(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "m", config=_with(vocab_size=200, bos_token_id=1, eos_token_id=2),
                          weights={k: (v[:200] if "embed" in k or "lm_head" in k else v)
                                   for k, v in tiny_random_weights(TINY_RANDOM_CONFIG).items()})
    _rejected(str(folder), "tokenizer", "vocab_size")


def test_folder_without_tokenizer(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "m")
    for f in folder.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            f.unlink()
    _rejected(str(folder), "tokenizer")


# -- GGUF files --------------------------------------------------------------------------
def test_gguf_round_trip_gives_the_written_weights(tmp_path: Path) -> None:
    loaded = load_model(str(write_gguf(tmp_path / "m.gguf", seed=5)))
    expected = tiny_random_weights(TINY_RANDOM_CONFIG, 5)
    assert set(loaded.weights) == set(expected)
    assert all(torch.equal(loaded.weights[k], expected[k]) for k in expected)
    assert loaded.tokenizer("Hi").input_ids == [72, 105]


@pytest.mark.parametrize("fraction", [0.0, 0.001, 0.05, 0.5, 0.999])
def test_gguf_cut_short(tmp_path: Path, private_cache: Path, fraction: float) -> None:
    path = write_gguf(tmp_path / "m.gguf")
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * fraction)])
    _rejected(str(path), "m.gguf")
    assert _entries(private_cache) == []


@pytest.mark.parametrize("key,value", [
    ("attention.head_count", 0), ("block_count", None), ("embedding_length", "64"),
    ("attention.head_count_kv", 3), ("rope.freq_base", 0.0), ("vocab_size", 10**12),
])
def test_gguf_wrong_metadata(tmp_path: Path, key: str, value: Any) -> None:
    path = write_gguf(tmp_path / "m.gguf", metadata={key: value})
    _rejected(str(path), "m.gguf", key)


def test_gguf_missing_tensor(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", skip_tensors=("blk.1.ffn_up.weight",))
    _rejected(str(path), "m.gguf", "model.layers.1.mlp.up_proj.weight")


# -- the GGUF cache ----------------------------------------------------------------------
def _entries(root: Path) -> list[str]:
    models = root / "models"
    return sorted(p.name for p in models.iterdir()) if models.is_dir() else []


def test_same_name_same_size_different_weights(tmp_path: Path) -> None:
    a = write_gguf(tmp_path / "a" / "m.gguf", seed=1)
    b = write_gguf(tmp_path / "b" / "m.gguf", seed=2)
    assert a.stat().st_size == b.stat().st_size and a.read_bytes() != b.read_bytes()
    wa, wb = load_model(str(a)).weights, load_model(str(b)).weights
    key = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(wa[key], tiny_random_weights(TINY_RANDOM_CONFIG, 1)[key])
    assert torch.equal(wb[key], tiny_random_weights(TINY_RANDOM_CONFIG, 2)[key])


def test_dotdot_gguf_deletes_nothing_else(tmp_path: Path, private_cache: Path) -> None:
    unrelated = private_cache / "models" / "someone-else"
    unrelated.mkdir(parents=True)
    (unrelated / "keep.txt").write_text("mine")
    (private_cache / "notes.txt").write_text("also mine")
    path = write_gguf(tmp_path / "src" / "..gguf")
    load_model(str(path))
    assert (unrelated / "keep.txt").read_text() == "mine"
    assert (private_cache / "notes.txt").read_text() == "also mine"
    assert all(".." not in name and name.strip(".") for name in _entries(private_cache))


def test_failure_mid_conversion_leaves_no_entry(tmp_path: Path, private_cache: Path) -> None:
    bad = write_gguf(tmp_path / "m.gguf", token_scores=False)  # fails after the weights are written
    _rejected(str(bad), "m.gguf", "tokenizer")
    leftovers = [p for p in private_cache.rglob("*") if p.is_file() and p.suffix != ".json"]
    assert _entries(private_cache) == [] and leftovers == [], leftovers
    good = write_gguf(tmp_path / "m.gguf")  # the same path, now fine: converts afresh
    assert load_model(str(good)).config.num_hidden_layers == 2


def test_index_remembers_the_hash_and_second_load_does_not_convert(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_gguf(tmp_path / "m.gguf")
    calls = {"hash": 0, "convert": 0}
    real_hash, real_convert = cache.file_digest, convert.convert_gguf

    def counting_hash(p: Path) -> str:
        calls["hash"] += 1
        return real_hash(p)

    def counting_convert(*args: Any, **kwargs: Any) -> Path:
        calls["convert"] += 1
        return real_convert(*args, **kwargs)

    monkeypatch.setattr(cache, "file_digest", counting_hash)
    monkeypatch.setattr(convert, "convert_gguf", counting_convert)
    first = convert.cached_folder(path, "m")
    second = convert.cached_folder(path, "m")
    assert first == second and calls == {"hash": 1, "convert": 1}
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))  # touched
    assert convert.cached_folder(path, "m") == first
    assert calls == {"hash": 2, "convert": 1}, "a touched file is re-hashed but not re-converted"


def test_cached_entry_is_keyed_by_content(tmp_path: Path) -> None:
    a = write_gguf(tmp_path / "x" / "one.gguf", seed=4)
    b = tmp_path / "y" / "two.gguf"
    b.parent.mkdir()
    b.write_bytes(a.read_bytes())
    assert convert.cached_folder(a, "one") == convert.cached_folder(b, "two")


# -- model names -------------------------------------------------------------------------
BAD_NAMES: list[tuple[str, object, str]] = [
    ("5000 characters", "x" * 5000, "5000"),
    ("empty", "", "empty"),
    ("None", None, "NoneType"),
    ("an int", 123, "int"),
    ("a list", ["tiny-random"], "list"),
    ("non-existent path", "/no/such/model/here", "/no/such/model/here"),
    ("NUL", "tiny\0random", "NUL"),
    ("lone surrogate", "model-\ud800", "UTF-8"),
    ("long path component", "/tmp/" + "y" * 300 + ".gguf", "gguf"),
]


@pytest.mark.parametrize("label,name,part", BAD_NAMES, ids=[b[0] for b in BAD_NAMES])
def test_bad_model_names(label: str, name: object, part: str) -> None:
    _rejected(name, "model", part)


def test_directory_without_config(tmp_path: Path) -> None:
    _rejected(str(tmp_path), "config.json")


@pytest.mark.parametrize("label,name,part", BAD_NAMES, ids=[b[0] for b in BAD_NAMES])
def test_get_shared_model_bad_names(label: str, name: object, part: str) -> None:
    from engine.model.shared import get_shared_model

    with pytest.raises(ValueError, match="model") as info:
        get_shared_model(name)  # type: ignore[arg-type]
    assert len(str(info.value)) < 600


def test_get_shared_model_bad_dtype() -> None:
    from engine.model.shared import get_shared_model

    with pytest.raises(ValueError, match="dtype"):
        get_shared_model("tiny-random", ["float32"])  # type: ignore[arg-type]


def test_engine_and_llm_bad_model_names() -> None:
    from engine import LLM, LLMEngine

    for make in (LLMEngine, LLM):
        with pytest.raises(ValueError, match="5000 characters"):
            make("q" * 5000)
        with pytest.raises(ValueError, match="NoneType"):
            make(None)  # type: ignore[arg-type]


def test_publish_keeps_a_complete_entry_and_replaces_only_a_broken_one(private_cache: Path) -> None:
    digest = "ab" * 32
    entry = cache.entry_path(digest)
    tmp_root = private_cache / "tmp"

    def staged(text: str) -> Path:
        tmp_root.mkdir(parents=True, exist_ok=True)
        d = Path(tempfile.mkdtemp(dir=tmp_root))
        (d / "payload").write_text(text)
        (d / "inferscope-source.json").write_text(json.dumps({"sha256": digest, "version": cache.CACHE_VERSION}))
        return d

    assert cache.publish(staged("first"), entry, digest) == entry
    second = staged("second")  # another process converted the same bytes: theirs is kept
    assert cache.publish(second, entry, digest) == entry
    assert (entry / "payload").read_text() == "first"
    (entry / "inferscope-source.json").unlink()  # a broken entry of this digest is replaced
    assert cache.publish(staged("third"), entry, digest) == entry
    assert (entry / "payload").read_text() == "third"
    assert sorted(p.name for p in (private_cache / "models").iterdir()) == [entry.name]


@pytest.mark.parametrize("name", ["..", ".", "../../etc/passwd", "a/b\\c", "", "x" * 500, "ok-name_1.2", "\0\n"])
def test_safe_name_is_one_harmless_path_component(name: str) -> None:
    safe = cache.safe_name(name)
    assert safe and len(safe) <= 40 and not safe.startswith(".")
    assert all(ch.isalnum() or ch in "._-" for ch in safe)


def test_process_killed_mid_conversion_leaves_no_entry(tmp_path: Path, private_cache: Path) -> None:
    """A real crash: the converting process is SIGKILLed after the weights are written."""
    import subprocess
    import sys

    path = write_gguf(tmp_path / "m.gguf")
    script = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from engine.model import convert\n"
        "convert._write_tokenizer = lambda *a: os.kill(os.getpid(), signal.SIGKILL)\n"
        "convert.cached_folder(Path(sys.argv[1]), 'm')\n")
    done = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, timeout=120,
                          env={**os.environ, "INFERSCOPE_CACHE": str(private_cache)})
    assert done.returncode == -9, done.stderr[-2000:]
    staged = [p for p in (private_cache / "tmp").rglob("model.safetensors")]
    assert staged, "the kill did not happen after the weights were written"
    assert _entries(private_cache) == []  # the half-written dir never became an entry
    loaded = load_model(str(path))  # converts afresh into a complete entry
    assert torch.equal(loaded.weights["model.norm.weight"],
                       tiny_random_weights(TINY_RANDOM_CONFIG)["model.norm.weight"])
    assert len(_entries(private_cache)) == 1
