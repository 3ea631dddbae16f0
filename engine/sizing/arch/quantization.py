"""A quantized checkpoint's own storage format, read from ``quantization_config``.

Rule: a quantized checkpoint is sized at the bytes it stores, not at its ``torch_dtype``. Per
quantized ``Linear`` of N outputs and K inputs (b = bits, g = group size, per-channel: g = K),
what each method writes (AutoAWQ / AutoGPTQ / bitsandbytes / compressed-tensors / transformers'
MXFP4 integration; research notes in tests/data/quantized_checkpoints.json):

    awq                  qweight i32 [K, N·b/32] + qzeros i32 [K/g, N·b/32] + scales f16 [K/g, N]
                         = b/8 + b/(8g) + 2/g bytes per weight              (g128: 0.5195)
    gptq                 qweight i32 [K·b/32, N] + qzeros i32 [K/g, N·b/32] + scales f16 [K/g, N]
                         + g_idx i32 [K] (stored with or without act-order) = ... + 4/N
    bitsandbytes 4-bit   u8 (2 per byte) + absmax f32 per 64 = 0.5 + 1/16;
                         double quant: u8 absmax per 64 + f32 per 256 blocks = 0.5 + 1/64 + 1/4096
    bitsandbytes 8-bit   i8 + SCB f32 [N] = 1 + 4/K
    fp8                  f8 + f32 scales (per tensor ~0; per 128x128 block 4/16384)
    mxfp4                experts only: fp4 (2 per byte) + one E8M0 scale per 32 = 0.5 + 1/32
    compressed-tensors   the "Linear" config group: int4 pack-quantized (0.5 + 2/g, + 0.5/g zero
                         points when asymmetric), int8 per channel (1 + 2/K), float8 as fp8

Embeddings, the LM head, norms and biases stay 16-bit (``modules_to_not_convert`` / ``ignore``
name the LM head; a quantized LM head is rare and noted). Per-row terms (g_idx, channel scales,
per-channel groups) are charged with K = N = the hidden size: they are below 0.3% of the bytes.
Any other ``quant_method`` is refused by name, never sized as 16-bit.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction as F
from typing import Any, Literal

from ..formats import SizingError, WeightFormat
from .fields import get_bool, get_obj, get_str, get_str_list

Method = Literal["awq", "gptq", "bitsandbytes", "fp8", "mxfp4", "compressed-tensors"]
METHODS: tuple[Method, ...] = ("awq", "gptq", "bitsandbytes", "fp8", "mxfp4", "compressed-tensors")
_LABELS = {"awq": "AWQ", "gptq": "GPTQ", "bitsandbytes": "bitsandbytes", "fp8": "FP8", "mxfp4": "MXFP4",
           "compressed-tensors": "compressed-tensors"}


@dataclass(frozen=True)
class QuantScheme:
    """What a checkpoint's ``quantization_config`` says about its stored weights."""

    method: Method
    bits: int
    weight_type: Literal["int", "float", "nf4", "fp4"]
    group_size: int | None  # None: one scale per output channel (GPTQ group_size -1, channel strategy)
    symmetric: bool = True
    act_order: bool = False  # GPTQ desc_act
    double_quant: bool = False  # bitsandbytes 4-bit
    activations: Literal["16bit", "int8", "fp8"] = "16bit"  # W8A8 checkpoints quantize activations too
    block_scales: bool = False  # fp8 weight_block_size [128, 128]
    lm_head_quantized: bool = False
    experts_only: bool = False  # MXFP4 (gpt-oss): only the routed experts are quantized

    @property
    def is_fp8(self) -> bool:
        """Float 8-bit weights (``quant_method: fp8`` or a compressed-tensors float8 group)."""
        return self.weight_type == "float" and self.bits == 8

    @property
    def label(self) -> str:
        kind = {"int": "INT", "float": "FP", "nf4": "NF", "fp4": "FP"}[self.weight_type]
        parts = [f"{_LABELS[self.method]} {kind}{self.bits}"]
        if self.method == "mxfp4":
            parts = ["MXFP4 (experts)"]
        if self.activations != "16bit":
            parts[0] = f"{_LABELS[self.method]} W{self.bits}A8 ({self.activations.upper()})"
        if self.group_size and self.method != "mxfp4":  # MXFP4's 32-value blocks are part of the format
            parts.append(f"g{self.group_size}")
        elif self.method in ("gptq", "compressed-tensors") and self.weight_type == "int":
            parts.append("per channel")
        if self.act_order:
            parts.append("act-order")
        if self.double_quant:
            parts.append("double quant")
        return " ".join(parts) + " (checkpoint)"

    def bytes_per_weight(self, hidden: int) -> F:
        """Stored bytes per quantized weight (module doc); per-row terms with K = N = ``hidden``."""
        b, k = F(self.bits), hidden
        g = self.group_size or k
        if self.method == "awq":
            return b / 8 + b / (8 * g) + F(2, g)
        if self.method == "gptq":
            return b / 8 + b / (8 * g) + F(2, g) + F(4, k)
        if self.method == "bitsandbytes":
            if self.bits == 8:
                return 1 + F(4, k)
            return F(1, 2) + (F(1, 64) + F(4, 64 * 256) if self.double_quant else F(4, 64))
        if self.method == "mxfp4":
            return F(1, 2) + F(1, 32)
        if self.is_fp8:
            return 1 + (F(4, 128 * 128) if self.block_scales else F(0))
        if self.bits == 8:  # compressed-tensors int8, per channel bf16 scales
            return 1 + F(2, k)
        zero_points = F(0) if self.symmetric else b / (8 * g)
        return b / 8 + F(2, g) + zero_points

    def weight_format(self, hidden: int) -> WeightFormat:
        """The checkpoint's format as the calculator's ``WeightFormat`` (kernels: ``engine.sizing.kernels``)."""
        bpw = self.bytes_per_weight(hidden)
        compute = "fp8" if self.is_fp8 else "int8" if self.activations == "int8" else "fp16"
        vllm = {"awq": "awq_marlin", "gptq": "gptq_marlin"}.get(self.method, self.method)
        note = f"{float(bpw):.4f} B per quantized weight as stored" + (
            "; only the routed experts are quantized, the rest is 16-bit" if self.experts_only
            else "; embeddings/LM head and norms 16-bit")
        return WeightFormat(
            key=self.key, label=self.label, bytes_per_param=bpw, quantizes_embeddings=False, compute=compute,
            family="quant", vllm_quantization=vllm, sglang_quantization=vllm, note=note,
            eta_factor=0.72 if self.bits <= 4 else 0.9, experts_only=self.experts_only)

    @property
    def key(self) -> str:
        """A short name for the format: ``gptq-w4-g128``, ``awq-w4-g128``, ``mxfp4``, ``bnb-nf4``."""
        if self.method == "mxfp4":
            return "mxfp4"
        if self.method == "bitsandbytes":
            return "bnb-int8" if self.bits == 8 else f"bnb-{self.weight_type}"
        method = "ct" if self.method == "compressed-tensors" else self.method
        act = "a8" if self.activations != "16bit" else ""
        group = f"-g{self.group_size}" if self.group_size else ""
        return f"{method}-w{self.bits}{act}{group}"


# --------------------------------------------------------------------------------------
# reading quantization_config


def _refuse(field: str, rule: str, value: Any) -> SizingError:
    return SizingError(f"config field 'quantization_config.{field}' {rule}, got {str(value)[:60]!r}")


def _bits(q: dict[str, Any], allowed: tuple[int, ...], *names: str) -> int:
    value = next((q[n] for n in names if q.get(n) is not None), None)
    if value is None:
        raise SizingError(f"config field 'quantization_config.{names[0]}' is missing: the stored bits decide the bytes")
    if isinstance(value, bool) or not isinstance(value, int) or value not in allowed:
        raise _refuse(names[0], f"must be one of {', '.join(map(str, allowed))}", value)
    return value


def _group(q: dict[str, Any], *names: str, default: int | None = 128) -> int | None:
    """A group size: a positive integer, or -1 / null / absent-without-default for per channel."""
    value = next((q[n] for n in names if n in q), default)
    if value is None or value == -1:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _refuse(names[0], "must be a positive integer or -1 (per channel)", value)
    return value


def _awq(q: dict[str, Any]) -> QuantScheme:
    bits = _bits(q, (4,), "bits", "w_bit")
    return QuantScheme("awq", bits, "int", _group(q, "group_size", "q_group_size"),
                       symmetric=not get_bool(q, "zero_point", True, where="quantization_config"))


def _gptq(q: dict[str, Any]) -> QuantScheme:
    bits = _bits(q, (2, 3, 4, 8), "bits")
    where = "quantization_config"
    return QuantScheme("gptq", bits, "int", _group(q, "group_size"), symmetric=get_bool(q, "sym", True, where=where),
                       act_order=get_bool(q, "desc_act", False, where=where),
                       lm_head_quantized=get_bool(q, "lm_head", False, where=where))


def _bitsandbytes(q: dict[str, Any]) -> QuantScheme:
    where = "quantization_config"
    four, eight = get_bool(q, "load_in_4bit", False, where=where), get_bool(q, "load_in_8bit", False, where=where)
    if four == eight:
        raise SizingError("config field 'quantization_config': bitsandbytes needs exactly one of load_in_4bit /"
                          " load_in_8bit set to true")
    if eight:
        return QuantScheme("bitsandbytes", 8, "int", None)
    kind = get_str(q, "bnb_4bit_quant_type", "fp4", where=where).lower()
    if kind not in ("nf4", "fp4"):
        raise _refuse("bnb_4bit_quant_type", "must be 'nf4' or 'fp4'", kind)
    return QuantScheme("bitsandbytes", 4, "nf4" if kind == "nf4" else "fp4", 64,
                       double_quant=get_bool(q, "bnb_4bit_use_double_quant", False, where=where))


def _fp8(q: dict[str, Any]) -> QuantScheme:
    block = q.get("weight_block_size")
    if block is not None and not (isinstance(block, list) and len(block) == 2
                                  and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in block)):
        raise _refuse("weight_block_size", "must be two positive integers", block)
    act = get_str(q, "activation_scheme", "dynamic", where="quantization_config").lower()
    if act not in ("dynamic", "static"):
        raise _refuse("activation_scheme", "must be 'dynamic' or 'static'", act)
    return QuantScheme("fp8", 8, "float", None, activations="fp8", block_scales=block is not None)


def _mxfp4(q: dict[str, Any]) -> QuantScheme:
    get_str_list(q, "modules_to_not_convert", where="quantization_config")
    return QuantScheme("mxfp4", 4, "fp4", 32, experts_only=True)


def _linear_group(q: dict[str, Any]) -> dict[str, Any]:
    """The compressed-tensors config group whose targets include "Linear"."""
    groups = get_obj(q, "config_groups")
    if not groups:
        raise SizingError("config field 'quantization_config.config_groups' is missing: compressed-tensors names"
                          " its weight scheme there")
    for name, group in groups.items():
        if not isinstance(group, dict):
            raise _refuse(f"config_groups.{name}", "must be an object", group)
        targets = group.get("targets") or []
        if isinstance(targets, list) and "Linear" in targets:
            return group
    raise SizingError("config field 'quantization_config.config_groups': no group targets 'Linear'; the"
                      " calculator sizes Linear-layer schemes only")


def _compressed_tensors(q: dict[str, Any]) -> QuantScheme:
    group = _linear_group(q)
    where = "quantization_config.config_groups"
    weights = group.get("weights")
    if not isinstance(weights, dict):
        raise _refuse("config_groups.weights", "must be an object", weights)
    kind = get_str(weights, "type", "int", where=where + ".weights").lower()
    if kind not in ("int", "float"):
        raise _refuse("config_groups.weights.type", "must be 'int' or 'float'", kind)
    bits = _bits(weights, (4, 8), "num_bits")
    strategy = get_str(weights, "strategy", "tensor", where=where + ".weights").lower()
    size = _group(weights, "group_size", default=None) if strategy == "group" else None
    if strategy == "group" and size is None:
        raise SizingError("config field 'quantization_config.config_groups.weights.group_size' is missing for"
                          " strategy 'group'")
    acts = group.get("input_activations")
    activations: Literal["16bit", "int8", "fp8"] = "16bit"
    if isinstance(acts, dict):
        activations = "fp8" if str(acts.get("type", "int")).lower() == "float" else "int8"
    if kind == "float" and bits != 8:
        raise _refuse("config_groups.weights.num_bits", "must be 8 for float weights", bits)
    return QuantScheme("compressed-tensors", bits, kind, size,  # type: ignore[arg-type]
                       symmetric=get_bool(weights, "symmetric", True, where=where + ".weights"),
                       activations=activations if bits == 8 else "16bit",
                       block_scales=strategy == "block")


_READERS = {"awq": _awq, "gptq": _gptq, "bitsandbytes": _bitsandbytes, "fp8": _fp8, "mxfp4": _mxfp4,
            "compressed-tensors": _compressed_tensors}


def quant_scheme(cfg: dict[str, Any]) -> QuantScheme | None:
    """The checkpoint's ``QuantScheme`` from ``quantization_config`` (None when it has none).
    A method the calculator does not size is refused by name."""
    q = get_obj(cfg, "quantization_config")
    if q is None:
        return None
    method = get_str(q, "quant_method", where="quantization_config").lower()
    if not method and (q.get("load_in_4bit") or q.get("load_in_8bit")):
        method = "bitsandbytes"  # older bitsandbytes configs name no method
    if method not in _READERS:
        raise SizingError(
            f"quantization_config.quant_method {method[:40]!r} is not a format the calculator sizes"
            f" (its bytes per weight are unknown here, and 16-bit would be wrong); supported: {', '.join(METHODS)}"
            if method else
            f"config field 'quantization_config.quant_method' is missing; supported: {', '.join(METHODS)}")
    return _READERS[method](q)

