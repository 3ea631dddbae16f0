"""The formats concern: which weight, KV-cache and vision formats a plan uses on this hardware,
and the weight bytes per group of parameters that follow from them.

Rules (sizing.md §3.2):
  weights "auto"  a quantized checkpoint's own format (``arch.quantization``; refused where no
                  kernel runs it: ``kernels``); else the checkpoint's dtype: FP32 checkpoints are
                  served in 16 bit, FP8 ones in 16 bit where the device has no FP8 path, BF16
                  becomes FP16 without BF16 units.
  bytes           layers' matmul params x format bytes + norms/biases x 2 B (x 4 B in GGUF and
                  FP32) + embeddings/LM head x format bytes if the format quantises them (GGUF),
                  else x 2 B + vision tower x its own format's bytes; an experts-only format
                  (MXFP4) stores the routed experts in it and every other weight in 16 bit.
  exact bytes     with a local checkpoint and "auto", the groups are scaled so that they add up to
                  the safetensors headers' stored bytes.
  KV "auto"       the activation dtype (FP32 with FP32 weights).
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction as F

from .arch import LayerSpec, ModelSpec
from .checks import Remarks
from .formats import KV_ALIASES, KVDtype, SizingError, WeightFormat, kv_dtype, weight_format
from .hardware import Hardware
from .kernels import checkpoint_kernel


@dataclass(frozen=True)
class WeightGroups:
    """Exact weight bytes per group (whole model, before any parallel split)."""

    layers: tuple[F, ...]  # per decoder layer, experts included
    experts: tuple[F, ...]  # one routed expert of each layer (0 for dense layers)
    embed: F
    lm_head: F
    final_norm: F
    vision: F

    @property
    def rest(self) -> F:
        """Everything outside the decoder layers."""
        return self.embed + self.lm_head + self.final_norm + self.vision

    @property
    def total(self) -> F:
        return sum(self.layers, F(0)) + self.rest

    def scaled(self, k: F) -> WeightGroups:
        """Every group times ``k`` (exact checkpoint bytes spread in proportion)."""
        return WeightGroups(tuple(b * k for b in self.layers), tuple(b * k for b in self.experts), self.embed * k,
                            self.lm_head * k, self.final_norm * k, self.vision * k)


def small_bytes(fmt: WeightFormat) -> F:
    """Bytes per norm/bias/unquantised-embedding parameter: 4 in FP32, else 2."""
    return F(4) if fmt.key == "fp32" else F(2)


def small_layer_bytes(fmt: WeightFormat) -> F:
    """Bytes per norm/bias parameter inside layers: GGUF keeps them in F32."""
    return F(4) if fmt.family == "gguf" else small_bytes(fmt)


def group_bytes(model: ModelSpec, fmt: WeightFormat, vision_fmt: WeightFormat) -> WeightGroups:
    """Weight bytes per group for ``fmt`` (module doc: the bytes rule)."""
    bpp = fmt.bytes_per_param
    small_layers = small_layer_bytes(fmt)
    emb_bpp = bpp if fmt.quantizes_embeddings else small_bytes(fmt)

    def stored(lay: LayerSpec) -> int:  # what the format stores: MXFP4 only the routed experts
        return lay.routed_params if fmt.experts_only else lay.linear_params

    return WeightGroups(
        layers=tuple(stored(lay) * bpp + (lay.params - stored(lay)) * small_layers for lay in model.layers),
        experts=tuple(lay.expert_params * bpp for lay in model.layers),
        embed=model.embed_params * emb_bpp, lm_head=model.lm_head_params * emb_bpp,
        final_norm=model.final_norm_params * small_layers,
        vision=(model.vision.total_params * vision_fmt.bytes_per_param) if model.vision else F(0))


@dataclass(frozen=True)
class Precision:
    """The formats a plan uses and the weight bytes they give."""

    fmt: WeightFormat
    kv: KVDtype
    vision_fmt: WeightFormat
    act_dtype: str  # "fp32" | "bf16" | "fp16": activations and the --dtype flag
    act_bytes: int
    small_bytes: F  # norms, biases, unquantised embeddings
    small_for_layers: F  # norms/biases inside layers (F32 in GGUF)
    exact_scale: F | None  # checkpoint bytes / formula bytes, when scaled to a local checkpoint
    weights: WeightGroups


def sixteen_bit(hw: Hardware, ckpt: str) -> str:
    """The 16-bit dtype to serve in: BF16 unless the checkpoint is FP16 or the device lacks BF16."""
    return "fp16" if ckpt == "fp16" or not hw.supports_bf16 else "bf16"


def checkpoint_format(model: ModelSpec) -> WeightFormat:
    """The format the checkpoint stores its weights in: a quantized checkpoint's own (``quantization``,
    FP8 excepted: the calculator's fp8), else its float dtype's."""
    scheme = model.quantization
    if scheme is not None and not scheme.is_fp8:
        return scheme.weight_format(model.hidden)
    return weight_format(model.checkpoint_dtype)


def _auto_weights(model: ModelSpec, hw: Hardware, remarks: Remarks) -> WeightFormat:
    scheme = model.quantization
    if scheme is not None and not scheme.is_fp8:
        fmt = checkpoint_kernel(scheme, checkpoint_format(model), hw)
        remarks.note(f"weights: the checkpoint's {fmt.label.removesuffix(' (checkpoint)')},"
                     f" {fmt.bits_per_param:.2f} bits per quantized weight ({fmt.note})")
        if scheme.lm_head_quantized:
            remarks.note("the checkpoint quantizes its LM head too; sized at 16 bit (a small overestimate)")
        return fmt
    ckpt = model.checkpoint_dtype
    if ckpt == "fp8" and (hw.is_ascend or hw.device_class in ("apple", "cpu")):
        fmt = weight_format(sixteen_bit(hw, "bf16"))
        remarks.warn(f"the checkpoint is FP8; {hw.name} has no FP8 path, so it is sized as {fmt.label}"
                     " (twice the bytes)")
        return fmt
    if ckpt == "fp8":
        return weight_format("fp8")
    if ckpt == "fp32":
        fmt = weight_format(sixteen_bit(hw, "bf16"))
        remarks.note(f"FP32 checkpoint served in {fmt.label} (choose --weights fp32 to keep 4 B/param)")
        return fmt
    return weight_format(sixteen_bit(hw, ckpt))


def _requested_weights(requested: str, hw: Hardware, remarks: Remarks) -> WeightFormat:
    fmt = weight_format(requested)
    if fmt.key == "bf16" and not hw.supports_bf16:
        remarks.warn(f"{hw.name} has no BF16: BF16 weights would run as FP16 (--dtype float16);"
                     " sized as FP16 (same bytes)")
        return weight_format("fp16")
    return fmt


def _compute_remarks(fmt: WeightFormat, hw: Hardware, remarks: Remarks) -> None:
    """Say where the matmuls cannot run in the format's own precision."""
    if fmt.compute == "fp8" and not hw.supports_fp8:
        if hw.is_ascend or hw.device_class in ("apple", "cpu"):
            remarks.warn(f"{hw.name} has no FP8 support in the usual runtimes; FP8 weights are"
                         " sized for comparison only")
        else:
            remarks.note(f"{hw.name} has no FP8 tensor cores: FP8 weights run weight-only"
                         " (dequantised to 16 bit, Marlin kernels); speed at the FP16 peak")
    if fmt.compute == "int8" and not hw.int8_ops:
        remarks.note(f"{hw.name} has no INT8 matrix units in this runtime: W8A8 runs at the 16-bit peak")


#: InferScope's engine (engine/model/kv_quant.py): the calculator's KV format for each of the engine's
#: kv_cache_dtype names. Its fp8 keeps an fp32 scale per token and KV head, as its int8 does;
#: tests/test_memory_engine_kv.py checks the bytes against LLMEngine.
INFERSCOPE_KV = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "int8": "int8", "fp8": "fp8_token"}


def _kv(requested: str, fmt: WeightFormat, act_dtype: str, hw: Hardware, framework: str,
        remarks: Remarks) -> KVDtype:
    if framework == "inferscope" and KV_ALIASES.get(requested, requested) == "fp8":
        requested = INFERSCOPE_KV["fp8"]  # the engine's fp8 (per-token-head scales), not vLLM's
    kv = kv_dtype("fp32" if fmt.key == "fp32" else act_dtype) if requested == "auto" else kv_dtype(requested)
    if kv.key == "bf16" and not hw.supports_bf16:
        remarks.warn(f"{hw.name} has no BF16: a BF16 KV cache would be FP16 (same bytes)")
        kv = kv_dtype("fp16")
    if framework == "inferscope" and kv.key not in INFERSCOPE_KV.values():
        raise SizingError(f"kv_dtype {requested!r}: InferScope's engine stores its KV cache as float32, bfloat16,"
                          " float16, int8 or fp8 (each 8-bit one with per-token-head scales)")
    if kv.key in ("q8_0", "q4_0") and framework != "none":
        remarks.warn(f"KV type {kv.key} is a llama.cpp cache type; {framework} does not offer it")
    if kv.key == "int4" and framework in ("vllm", "sglang", "vllm-ascend"):
        remarks.warn(f"an INT4 KV cache is not offered by {framework}")
    if kv.key == "fp8" and (hw.is_ascend or hw.device_class in ("apple",)):
        remarks.warn(f"an FP8 KV cache is not available on {hw.name}")
    return kv


def _vision(requested: str, fmt: WeightFormat, act_dtype: str, model: ModelSpec, hw: Hardware,
            remarks: Remarks) -> WeightFormat:
    if requested == "auto":
        return weight_format("fp32" if fmt.key == "fp32" else act_dtype)
    if model.vision is None:
        remarks.note("--vision-dtype ignored: the model has no vision tower")
    vis = weight_format(requested)
    return weight_format("fp16") if vis.key == "bf16" and not hw.supports_bf16 else vis


def _weights(model: ModelSpec, fmt: WeightFormat, vision_fmt: WeightFormat, auto: bool,
             remarks: Remarks) -> tuple[WeightGroups, F | None]:
    """Formula bytes, scaled to the exact checkpoint bytes when sizing a local checkpoint as stored."""
    groups = group_bytes(model, fmt, vision_fmt)
    ck = model.checkpoint
    if ck is None:
        return groups, None
    if not auto:
        remarks.note(f"checkpoint on disk: {ck.stored_bytes:,} B ({', '.join(ck.dtypes)});"
                     f" sized as {fmt.label} instead")
        return groups, None
    stored_fmt = checkpoint_format(model)
    formula_total = group_bytes(model, stored_fmt, stored_fmt).total
    if not formula_total:
        return groups, None
    scale = F(ck.stored_bytes) / formula_total
    remarks.note(f"weights: exact {ck.stored_bytes:,} B from {ck.tensors} tensors in {ck.files} safetensors file(s)"
                 f" ({', '.join(ck.dtypes)})")
    return groups.scaled(scale), scale


def _choice(value: str | None) -> str:
    """A format name as given, normalised; None means "auto" (an empty string is not a format)."""
    return "auto" if value is None else str(value).strip().lower()


def resolve_precision(model: ModelSpec, hw: Hardware, weights: str | None, kv: str | None, vision: str | None,
                      framework: str, remarks: Remarks) -> Precision:
    """Every format choice for this model on this hardware (module doc)."""
    requested = _choice(weights)
    auto = requested in ("auto", "checkpoint")
    fmt = _auto_weights(model, hw, remarks) if auto else _requested_weights(requested, hw, remarks)
    _compute_remarks(fmt, hw, remarks)
    ckpt = model.checkpoint_dtype
    act_dtype = "fp32" if fmt.key == "fp32" else sixteen_bit(hw, ckpt if ckpt in ("bf16", "fp16") else "bf16")
    kv_fmt = _kv(_choice(kv), fmt, act_dtype, hw, framework, remarks)
    vision_fmt = _vision(_choice(vision), fmt, act_dtype, model, hw, remarks)
    groups, scale = _weights(model, fmt, vision_fmt, auto, remarks)
    return Precision(fmt=fmt, kv=kv_fmt, vision_fmt=vision_fmt, act_dtype=act_dtype,
                     act_bytes=4 if fmt.key == "fp32" else 2, small_bytes=small_bytes(fmt),
                     small_for_layers=small_layer_bytes(fmt), exact_scale=scale, weights=groups)
