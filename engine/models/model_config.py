"""The one parse of a Hugging Face ``config.json`` into the engine's frozen ``ModelConfig``.

Rule: a config either becomes a ``ModelConfig`` every field of which the decoder can run, or
raises one ``ValueError`` that names the source file and the field, e.g.

    model: /m/config.json: num_key_value_heads must be a positive integer, got 0

Checked here, before any weight is read: each field's type (ints are ints, not floats, bools or
strings; null only where Hugging Face reads it as "absent"), its range, the relations between
fields (heads divide hidden, kv heads divide heads, even head_dim, token ids inside the vocab),
and that the fp32 weights the config implies fit in this machine's memory. The expected tensor
names and shapes (``weight_shapes``) come from the same parsed config, so the loaders check the
files against exactly what the decoder will index.
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
SUPPORTED_ACTIVATIONS = ("silu", "swish")
MAX_DIM = 2**31 - 1  # any single size; the memory rule below is the real bound
_MISSING = object()


def _fail(source: str, key: str, rule: str, value: object = _MISSING) -> ValueError:
    got = "" if value is _MISSING else f", got {_short(value)}"
    return ValueError(f"model: {source}: {key} {rule}{got}")


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def _int(d: dict[str, Any], source: str, key: str, default: object = _MISSING, *,
         lo: int = 1, hi: int = MAX_DIM, null_is_absent: bool = False) -> int:
    """An integer field in ``[lo, hi]``: bools, floats (even 64.0) and strings are refused."""
    value = d.get(key, _MISSING)
    if value is _MISSING or (value is None and null_is_absent):
        if default is _MISSING:
            raise _fail(source, key, "is missing (an integer is required)")
        return default  # type: ignore[return-value]
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(source, key, f"must be an integer in [{lo}, {hi}]", value)
    if not lo <= value <= hi:
        raise _fail(source, key, f"must be an integer in [{lo}, {hi}]", value)
    return value


def _positive_float(d: dict[str, Any], source: str, key: str, default: float, *,
                    below: float = math.inf) -> float:
    """A finite number in (0, below): ints allowed, bools, strings and null refused."""
    value = d.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(source, key, "must be a positive number", value)
    number = float(value)
    if not (math.isfinite(number) and 0 < number < below):
        bound = "" if below == math.inf else f" below {below}"
        raise _fail(source, key, f"must be a finite number above 0{bound}", value)
    return number


def _bool(d: dict[str, Any], source: str, key: str, default: bool) -> bool:
    """A JSON true/false; 0/1, "false" and null are refused (they read as the wrong thing)."""
    value = d.get(key, default)
    if not isinstance(value, bool):
        raise _fail(source, key, "must be true or false", value)
    return value


def _architecture(d: dict[str, Any], source: str) -> str:
    archs = d.get("architectures")
    if archs is None:
        return "LlamaForCausalLM"
    if not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs):
        raise _fail(source, "architectures", "must be a non-empty list of names", archs)
    if archs[0] not in SUPPORTED_ARCHITECTURES:
        raise _fail(source, "architectures", f"must name one of {', '.join(SUPPORTED_ARCHITECTURES)}",
                    archs[0])
    return archs[0]


def _check_rope_scaling(d: dict[str, Any], source: str) -> None:
    for key in ("rope_scaling", "rope_parameters"):
        value = d.get(key)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise _fail(source, key, "must be an object or null", value)
        kind = value.get("rope_type", value.get("type", "default"))
        if kind not in ("default", None):
            raise _fail(source, key, "is not supported (only default RoPE)", kind)


def _rope_theta(d: dict[str, Any], source: str) -> float:
    if "rope_theta" not in d and isinstance(d.get("rope_parameters"), dict):
        return _positive_float(d["rope_parameters"], source, "rope_parameters.rope_theta", 10000.0)
    return _positive_float(d, source, "rope_theta", 10000.0)


def _token_id(value: object, source: str, key: str, vocab: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab:
        raise _fail(source, key, f"must be a token id in [0, {vocab}) (vocab_size)", value)
    return value


def _eos_ids(d: dict[str, Any], source: str, vocab: int) -> tuple[int, ...]:
    eos = d.get("eos_token_id")
    if eos is None:
        return ()
    items = eos if isinstance(eos, list) else [eos]
    return tuple(_token_id(e, source, "eos_token_id", vocab) for e in items)


def _activation(d: dict[str, Any], source: str) -> None:
    act = d.get("hidden_act", "silu")
    if act not in SUPPORTED_ACTIVATIONS:
        raise _fail(source, "hidden_act", f"must be one of {', '.join(SUPPORTED_ACTIVATIONS)}", act)
    if d.get("mlp_bias", False) is not False:
        raise _fail(source, "mlp_bias", "is not supported (must be false or absent)", d.get("mlp_bias"))


def physical_memory_bytes() -> int:
    """This machine's physical memory (the bound for a model's fp32 weights); 1 TiB if unknown."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 2**40


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    architecture: str = "LlamaForCausalLM"
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @classmethod
    def from_hf(cls, d: object, source: str = "config.json") -> "ModelConfig":
        """Parse a Hugging Face config dict; ``ValueError`` naming ``source`` and the field."""
        if not isinstance(d, dict):
            raise ValueError(f"model: {source}: must be a JSON object, got {type(d).__name__}")
        arch = _architecture(d, source)
        _check_rope_scaling(d, source)
        _activation(d, source)
        vocab = _int(d, source, "vocab_size")
        hidden = _int(d, source, "hidden_size")
        heads = _int(d, source, "num_attention_heads", hi=hidden)
        kv = _int(d, source, "num_key_value_heads", heads, hi=heads, null_is_absent=True)
        config = cls(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=_int(d, source, "intermediate_size"),
            num_hidden_layers=_int(d, source, "num_hidden_layers", hi=4096),
            num_attention_heads=heads,
            num_key_value_heads=kv,
            head_dim=_int(d, source, "head_dim", hidden // heads, null_is_absent=True),
            max_position_embeddings=_int(d, source, "max_position_embeddings", 2048),
            rms_norm_eps=_positive_float(d, source, "rms_norm_eps", 1e-5, below=1.0),
            rope_theta=_rope_theta(d, source),
            tie_word_embeddings=_bool(d, source, "tie_word_embeddings", False),
            attention_bias=_bool(d, source, "attention_bias", arch == "Qwen2ForCausalLM"),
            bos_token_id=(None if d.get("bos_token_id") is None
                          else _token_id(d["bos_token_id"], source, "bos_token_id", vocab)),
            eos_token_ids=_eos_ids(d, source, vocab),
            architecture=arch,
        )
        config.check(source)
        return config

    def check(self, source: str = "config") -> None:
        """The relations between fields, and that the fp32 weights fit in memory."""
        if self.hidden_size % self.num_attention_heads:
            raise _fail(source, "num_attention_heads", f"must divide hidden_size={self.hidden_size}",
                        self.num_attention_heads)
        if self.num_attention_heads % self.num_key_value_heads:
            raise _fail(source, "num_key_value_heads",
                        f"must divide num_attention_heads={self.num_attention_heads}",
                        self.num_key_value_heads)
        if self.head_dim % 2:
            raise _fail(source, "head_dim", "must be even (RoPE rotates pairs)", self.head_dim)
        self._check_memory(source)

    def _check_memory(self, source: str) -> None:
        parts = {
            f"vocab_size={self.vocab_size} x hidden_size={self.hidden_size}":
                self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2),
            f"num_hidden_layers={self.num_hidden_layers} x layer size":
                self.num_hidden_layers * self._layer_parameters(),
        }
        need = 4 * sum(parts.values())
        have = physical_memory_bytes()
        if need > have:
            culprit = max(parts, key=lambda k: parts[k])
            raise ValueError(f"model: {source}: {culprit} needs {need / 2**30:,.1f} GiB of fp32 "
                             f"weights, more than this machine's {have / 2**30:,.1f} GiB of memory")

    def _layer_parameters(self) -> int:
        return sum(math.prod(s) for s in self._layer_shapes(0).values())

    def _layer_shapes(self, i: int) -> dict[str, tuple[int, ...]]:
        h, inter, d = self.hidden_size, self.intermediate_size, self.head_dim
        q, kv = self.num_attention_heads * d, self.num_key_value_heads * d
        p = f"model.layers.{i}."
        shapes: dict[str, tuple[int, ...]] = {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (inter, h),
            p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
        }
        if self.attention_bias:
            shapes.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                           p + "self_attn.v_proj.bias": (kv,)})
        return shapes

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor the decoder needs, by Hugging Face name, with its exact shape."""
        shapes = {"model.embed_tokens.weight": (self.vocab_size, self.hidden_size),
                  "model.norm.weight": (self.hidden_size,)}
        if not self.tie_word_embeddings:
            shapes["lm_head.weight"] = (self.vocab_size, self.hidden_size)
        for i in range(self.num_hidden_layers):
            shapes.update(self._layer_shapes(i))
        return shapes

    def optional_shapes(self) -> dict[str, tuple[int, ...]]:
        """Tensors a checkpoint may hold beside ``weight_shapes``: o_proj's bias when attention
        has biases (Llama's attention_bias; Qwen2 has none), and a tied lm_head (ignored)."""
        shapes: dict[str, tuple[int, ...]] = {}
        if self.tie_word_embeddings:
            shapes["lm_head.weight"] = (self.vocab_size, self.hidden_size)
        if self.attention_bias:
            for i in range(self.num_hidden_layers):
                shapes[f"model.layers.{i}.self_attn.o_proj.bias"] = (self.hidden_size,)
        return shapes

    def to_hf(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("extra")
        d.pop("architecture")
        eos = d.pop("eos_token_ids")
        d["eos_token_id"] = list(eos) if len(eos) != 1 else eos[0]
        d["architectures"] = [self.architecture]
        d["model_type"] = {"MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2"}.get(
            self.architecture, "llama")
        d["hidden_act"] = "silu"
        return d
