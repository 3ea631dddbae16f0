"""The one parse of a Hugging Face ``config.json`` into the engine's frozen ``ModelConfig``.

Rule: a config either becomes a ``ModelConfig`` every field of which the decoder can run, or
raises one ``ValueError`` that names the source file and the field, e.g.

    model: /m/config.json: num_key_value_heads must be >= 1, got 0

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
from functools import partial
from typing import Any, NamedTuple

from engine.core.hf_config import MISSING, Fields, got

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
SUPPORTED_ACTIVATIONS = ("silu", "swish")


def _fail(source: str, key: str, rule: str, value: object = MISSING) -> ValueError:
    """The engine's error for a bad field: ``model: <file>: <field> <rule>, got <value>``."""
    return ValueError(f"model: {source}: {key} {rule}{got(value)}")


def _fields(d: dict[str, Any], source: str) -> Fields:
    """The shared readers (engine/core/hf_config.py) over ``d`` with the engine's error: null is
    refused unless a call says it reads as absent, and 0 / 1 are not booleans. Sizes are bounded
    only by hf_config's default (2**31 - 1); the memory rule below is the real bound."""
    return Fields(d, partial(_fail, source), null_is_absent=False)


def _architecture(f: Fields) -> str:
    archs = f.cfg.get("architectures")
    if archs is None:
        return "LlamaForCausalLM"
    if not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs):
        raise f.fail("architectures", "must be a non-empty list of names", archs)
    if archs[0] not in SUPPORTED_ARCHITECTURES:
        raise f.fail("architectures", f"must name one of {', '.join(SUPPORTED_ARCHITECTURES)}", archs[0])
    return str(archs[0])


def _check_rope_scaling(f: Fields) -> None:
    for key in ("rope_scaling", "rope_parameters"):
        value = f.obj(key)
        if value is None:
            continue
        kind = value.get("rope_type", value.get("type", "default"))
        if kind not in ("default", None):
            raise f.fail(key, "is not supported (only default RoPE)", kind)


def _rope_theta(f: Fields) -> float:
    params = f.cfg.get("rope_parameters")
    if "rope_theta" not in f.cfg and isinstance(params, dict):
        return f.at(params, "rope_parameters").number("rope_theta", 10000.0)
    return f.number("rope_theta", 10000.0)


def _token_id(f: Fields, key: str, value: object, vocab: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab:
        raise f.fail(key, f"must be a token id in [0, {vocab}) (vocab_size)", value)
    return value


def _eos_ids(f: Fields, vocab: int) -> tuple[int, ...]:
    eos = f.cfg.get("eos_token_id")
    if eos is None:
        return ()
    items = eos if isinstance(eos, list) else [eos]
    return tuple(_token_id(f, "eos_token_id", e, vocab) for e in items)


def _activation(f: Fields) -> None:
    act = f.cfg.get("hidden_act", "silu")
    if act not in SUPPORTED_ACTIVATIONS:
        raise f.fail("hidden_act", f"must be one of {', '.join(SUPPORTED_ACTIVATIONS)}", act)
    if f.cfg.get("mlp_bias", False) is not False:
        raise f.fail("mlp_bias", "is not supported (must be false or absent)", f.cfg.get("mlp_bias"))


def physical_memory_bytes() -> int:
    """This machine's physical memory (the bound for a model's fp32 weights); 1 TiB if unknown."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 2**40


class ModelFacts(NamedTuple):
    """What the engine loop needs of a model besides running it (a simulated model has only these)."""

    num_hidden_layers: int
    max_position_embeddings: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]


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

    @property
    def facts(self) -> ModelFacts:
        return ModelFacts(self.num_hidden_layers, self.max_position_embeddings, self.vocab_size, self.eos_token_ids)

    @classmethod
    def from_hf(cls, d: object, source: str = "config.json") -> "ModelConfig":
        """Parse a Hugging Face config dict; ``ValueError`` naming ``source`` and the field."""
        if not isinstance(d, dict):
            raise ValueError(f"model: {source}: must be a JSON object, got {type(d).__name__}")
        f = _fields(d, source)
        arch = _architecture(f)
        _check_rope_scaling(f)
        _activation(f)
        vocab = f.req_int("vocab_size")
        hidden = f.req_int("hidden_size")
        heads = f.req_int("num_attention_heads", maximum=hidden)
        kv = f.req_int("num_key_value_heads", default=heads, maximum=heads, null_is_absent=True)
        bos = f.cfg.get("bos_token_id")
        config = cls(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=f.req_int("intermediate_size"),
            num_hidden_layers=f.req_int("num_hidden_layers", maximum=4096),
            num_attention_heads=heads,
            num_key_value_heads=kv,
            head_dim=f.req_int("head_dim", default=hidden // heads, null_is_absent=True),
            max_position_embeddings=f.req_int("max_position_embeddings", default=2048),
            rms_norm_eps=f.number("rms_norm_eps", 1e-5, high=1.0, high_open=True),
            rope_theta=_rope_theta(f),
            tie_word_embeddings=f.flag("tie_word_embeddings", False),
            attention_bias=f.flag("attention_bias", arch == "Qwen2ForCausalLM"),
            bos_token_id=None if bos is None else _token_id(f, "bos_token_id", bos, vocab),
            eos_token_ids=_eos_ids(f, vocab),
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
