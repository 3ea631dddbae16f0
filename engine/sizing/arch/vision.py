"""Vision towers of vision-language models: Qwen2-VL / Qwen2.5-VL, InternViT, SigLIP (Gemma-3),
Llama-4, CLIP-style."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..formats import SizingError
from ..units import tokens as _n  # a count with thousands separators
from .fields import get_bool, get_float, get_side, get_str, opt_int, req_int
from .records import VisionSpec

QWEN_VL_TILE_SIDE = 448  # pixels: one "tile" of a Qwen2-VL image = a 448x448 region = 1,024 patches
QWEN_VL_DEFAULT_TILES = 5  # ~1 megapixel: 1,280 tokens, Qwen's suggested max_pixels = 1280*28*28


@dataclass(frozen=True)
class _QwenVit:
    """Qwen2-VL / Qwen2.5-VL vision transformer (native resolution, no tiling of its own)."""

    version: str  # "qwen2-vl" | "qwen2.5-vl"
    width: int  # e: embed_dim (Qwen2-VL) / hidden_size (Qwen2.5-VL)
    depth: int
    heads: int
    inter: int  # MLP width: e*mlp_ratio (Qwen2-VL) / intermediate_size (Qwen2.5-VL)
    out: int  # merger output = the LLM's hidden size
    channels: int
    patch: int
    temporal: int
    merge: int

    @property
    def gated(self) -> bool:
        return self.version == "qwen2.5-vl"

    def patch_embed(self) -> int:
        """Conv3d without bias: channels x temporal_patch x patch x patch x e."""
        return self.channels * self.temporal * self.patch * self.patch * self.width

    def block(self) -> tuple[int, int]:
        """(params, matmul weights) of one block: qkv 3e^2 + 3e, proj e^2 + e, MLP (gated SiLU
        3*e*I + 2I + e for Qwen2.5-VL, GELU fc1/fc2 2*e*I + I + e for Qwen2-VL), two norms
        (RMSNorm e each for Qwen2.5-VL, LayerNorm 2e each for Qwen2-VL)."""
        e, i = self.width, self.inter
        mlp_linear = (3 if self.gated else 2) * e * i
        mlp_bias = (2 * i if self.gated else i) + e
        norms = 2 * e if self.gated else 4 * e
        linear = 4 * e * e + mlp_linear
        return linear + 3 * e + e + mlp_bias + norms, linear

    def merger(self) -> int:
        """PatchMerger: norm over e (RMSNorm e / LayerNorm 2e), then Linear(e*m^2 -> e*m^2) + bias,
        GELU, Linear(e*m^2 -> out) + bias."""
        wide = self.width * self.merge * self.merge
        return (self.width if self.gated else 2 * self.width) + wide * wide + wide + wide * self.out + self.out


def _qwen_vit_fields(vc: dict[str, Any], version: str, llm_hidden: int) -> _QwenVit:
    """Read a Qwen2-VL (``embed_dim``, ``mlp_ratio``, ``hidden_size`` = merger output) or Qwen2.5-VL
    (``hidden_size`` = width, ``intermediate_size``, ``out_hidden_size``) vision_config."""
    w = "vision_config"
    if version == "qwen2-vl":
        width = opt_int(vc, "embed_dim", default=1280, where=w)
        ratio = get_float(vc, "mlp_ratio", 4.0, high=1024.0, where=w)
        inter = int(width * ratio)
        out = opt_int(vc, "hidden_size", default=llm_hidden, where=w)
        out_name = "hidden_size"
    else:
        width = opt_int(vc, "hidden_size", default=1280, where=w)
        inter = req_int(vc, "intermediate_size", what="the vision MLP", where=w)
        out = opt_int(vc, "out_hidden_size", default=llm_hidden, where=w)
        out_name = "out_hidden_size"
    if out != llm_hidden:
        raise SizingError(f"config field 'vision_config.{out_name}' ({out}) must equal the language model's"
                          f" hidden size ({llm_hidden})")
    heads = opt_int(vc, "num_heads", default=16, where=w)
    if width % heads:
        raise SizingError(f"config field 'vision_config.num_heads': width {width} is not divisible by {heads} heads")
    return _QwenVit(version, width, opt_int(vc, "depth", default=32, where=w), heads, max(1, inter), out,
                    opt_int(vc, "in_channels", "in_chans", default=3, where=w),
                    opt_int(vc, "patch_size", "spatial_patch_size", default=14, where=w),
                    opt_int(vc, "temporal_patch_size", default=2, where=w),
                    opt_int(vc, "spatial_merge_size", default=2, where=w))


def qwen_vl_vision(vc: dict[str, Any], version: str, llm_hidden: int) -> VisionSpec:
    """Qwen2-VL / Qwen2.5-VL vision tower: patch embed + depth x block (+ merger as the projector).
    Images run at native resolution; the calculator counts them in 448x448 "tiles": (448/patch)^2
    patch tokens each, merged m x m into (448/patch)^2 / m^2 LLM tokens (256 for patch 14, m 2)."""
    v = _qwen_vit_fields(vc, version, llm_hidden)
    if QWEN_VL_TILE_SIDE % (v.patch * v.merge):
        raise SizingError(f"config fields 'vision_config.patch_size' ({v.patch}) x 'spatial_merge_size' ({v.merge})"
                          f" must divide {QWEN_VL_TILE_SIDE}")
    block, block_linear = v.block()
    tower = v.patch_embed() + v.depth * block
    projector = v.merger()
    patches = (QWEN_VL_TILE_SIDE // v.patch) ** 2
    tokens = patches // (v.merge * v.merge)
    mlp = ("gated SiLU MLP 3*e*I" if v.gated else "GELU MLP 2*e*I") + f", I = {v.inter}"
    attention = ("window attention (full attention on the blocks in fullatt_block_indexes), RMSNorm" if v.gated
                 else "full attention over the image, LayerNorm")
    formula = (
        f"vision ({v.version}) = patch embed Conv3d {v.channels}*{v.temporal}*{v.patch}*{v.patch}*{v.width}"
        f" = {_n(v.patch_embed())} + {v.depth} blocks x {_n(block)} (qkv + proj + {mlp}; {attention}) = {_n(tower)}",
        f"projector (patch merger) = norm + {v.width * v.merge ** 2}*{v.width * v.merge ** 2}"
        f" + {v.width * v.merge ** 2}*{v.out} (+ biases) = {_n(projector)}",
        f"tokens per {QWEN_VL_TILE_SIDE}x{QWEN_VL_TILE_SIDE} region = ({QWEN_VL_TILE_SIDE}/{v.patch})^2 /"
        f" {v.merge}^2 = {tokens}; default {QWEN_VL_DEFAULT_TILES} regions = {QWEN_VL_DEFAULT_TILES * tokens}"
        " tokens (~1 MP; the processor's own max_pixels allows up to 16,384 tokens per image)",
    )
    return VisionSpec(v.version, tower, v.depth * block_linear + v.patch_embed(), projector, v.depth, v.width,
                      v.heads, v.inter, patches, tokens, QWEN_VL_DEFAULT_TILES, formula)


# --------------------------------------------------------------------------------------
# vision towers


def internvit(vc: dict[str, Any], llm_hidden: int, downsample: float, hf_native: bool, max_tiles: int) -> VisionSpec:
    """InternViT (InternVL): embeddings (class token + Conv2d patch embed with bias + positions),
    layers of qkv 3e^2 (+ bias) + proj e^2 + e + MLP 2*e*I + I + e + two norms + layer scales 2e
    [+ q/k-norm]; projector mlp1 = LN(e*r^2) + Linear(e*r^2 -> h) + Linear(h -> h) with biases,
    r = 1/downsample_ratio; tokens/tile = (image/patch)^2 x downsample^2."""
    w = "vision_config"
    vh = req_int(vc, "hidden_size", what="the vision tower", where=w)
    vl = req_int(vc, "num_hidden_layers", what="the vision tower", where=w)
    vi = req_int(vc, "intermediate_size", what="the vision tower", where=w)
    heads = opt_int(vc, "num_attention_heads", default=16, where=w)
    patch = get_side(vc, "patch_size", 14, where=w)
    image = get_side(vc, "image_size", 448, where=w)
    if image < patch:
        raise SizingError(f"config field 'vision_config.image_size' ({image}) is smaller than its patch_size ({patch})")
    channels = opt_int(vc, "num_channels", default=3, where=w)
    qkv_bias = get_bool(vc, "attention_bias" if hf_native else "qkv_bias", True, where=w)
    qk_norm = get_bool(vc, "use_qk_norm" if hf_native else "qk_normalization", False, where=w)
    norm_each = 2 * vh if get_str(vc, "norm_type", "layer_norm", where=w) == "layer_norm" else vh
    n_patches = (image // patch) ** 2
    emb = vh + channels * patch * patch * vh + vh + (n_patches + 1) * vh
    linear = 3 * vh * vh + vh * vh + vh * vi + vi * vh
    layer = linear + (3 * vh if qkv_bias else 0) + vh + 2 * norm_each + 2 * vh + vi + vh + (2 * vh if qk_norm else 0)
    tower = emb + vl * layer + (2 * vh if hf_native else 0)
    ratio = round(1 / downsample)
    proj_in = vh * ratio * ratio
    projector = 2 * proj_in + proj_in * llm_hidden + llm_hidden + llm_hidden * llm_hidden + llm_hidden
    tokens = max(1, int(n_patches * downsample * downsample))
    formula = (
        f"vision (InternViT) = embeddings {_n(emb)} + {vl} layers x {_n(layer)} = {_n(tower)}",
        f"projector (mlp1) = LN 2*{proj_in} + {proj_in}*{llm_hidden} + {llm_hidden}*{llm_hidden} (+ biases) = {_n(projector)}",
        f"tokens/tile = (image/patch)^2 * downsample^2 = ({image}/{patch})^2 * {downsample}^2 = {tokens}",
    )
    return VisionSpec("internvit", tower, vl * linear + channels * patch * patch * vh, projector, vl, vh, heads, vi,
                      n_patches + 1, tokens, max_tiles, formula)


def clip_vit(vc: dict[str, Any], llm_hidden: int) -> VisionSpec:
    """Generic CLIP-style ViT (approximate, for llava-style configs): patch + position embeddings,
    layers of 4e^2 + 2*e*I with biases and two LayerNorms, pre/post LayerNorms; 2-layer MLP projector."""
    w = "vision_config"
    vh = req_int(vc, "hidden_size", what="the vision tower", where=w)
    vl = req_int(vc, "num_hidden_layers", "depth", what="the vision tower", where=w)
    vi = opt_int(vc, "intermediate_size", default=4 * vh, where=w)
    heads = opt_int(vc, "num_attention_heads", "num_heads", default=max(1, vh // 64), where=w)
    patch = get_side(vc, "patch_size", 14, where=w)
    image = get_side(vc, "image_size", 336, where=w)
    n_patches = max(1, (image // patch) ** 2)
    emb = vh + 3 * patch * patch * vh + (n_patches + 1) * vh
    linear = 4 * vh * vh + 2 * vh * vi
    layer = linear + 4 * vh + 4 * vh + vi + vh
    tower = emb + 2 * vh + vl * layer + 2 * vh
    projector = vh * llm_hidden + llm_hidden + llm_hidden * llm_hidden + llm_hidden
    formula = (f"vision (generic CLIP formula, approximate) = {_n(tower)}; projector 2-layer MLP = {_n(projector)}",
               f"tokens/image = (image/patch)^2 = ({image}/{patch})^2 = {n_patches}")
    return VisionSpec("clip (approximate)", tower, vl * linear, projector, vl, vh, heads, vi, n_patches + 1,
                      n_patches, 1, formula)


class _Vit(NamedTuple):
    """A ViT config class's defaults: width, depth, MLP width, heads, patch side, image side."""

    hidden: int
    layers: int
    inter: int
    heads: int
    patch: int
    image: int


def _vit_dims(vc: dict[str, Any], d: _Vit) -> tuple[int, int, int, int, int, int, int]:
    """(e, depth, I, heads, channels, patch, image) of a vision_config, ``d`` where a field is absent;
    an image smaller than its patch is refused naming both."""
    w = "vision_config"
    patch, image = get_side(vc, "patch_size", d.patch, where=w), get_side(vc, "image_size", d.image, where=w)
    if image < patch:
        raise SizingError(f"config field 'vision_config.image_size' ({image}) is smaller than its patch_size ({patch})")
    return (opt_int(vc, "hidden_size", default=d.hidden, where=w), opt_int(vc, "num_hidden_layers", default=d.layers, where=w),
            opt_int(vc, "intermediate_size", default=d.inter, where=w),
            opt_int(vc, "num_attention_heads", default=d.heads, where=w), opt_int(vc, "num_channels", default=3, where=w),
            patch, image)


def siglip_gemma3(vc: dict[str, Any], llm_hidden: int, mm_tokens: int) -> VisionSpec:
    """Gemma-3's SigLIP vision tower (``SiglipVisionModel``) + its projector: patch embed Conv2d
    C*p*p*e + e, positions (image/patch)^2 x e (no class token), layers of q/k/v/out 4e^2 + 4e,
    fc1/fc2 2*e*I + I + e and two LayerNorms 4e, post LayerNorm 2e [+ the attention-pooling head
    when ``vision_use_head``]; projector = RMSNorm e + e*h (mm_input_projection). Each image is
    average-pooled to ``mm_tokens_per_image`` (256) LLM tokens."""
    w = "vision_config"
    e, depth, inter, n_heads, channels, patch, image = _vit_dims(vc, _Vit(768, 12, 3072, 12, 16, 224))
    side = image // patch
    if mm_tokens < 1 or math.isqrt(mm_tokens) ** 2 != mm_tokens or side % math.isqrt(mm_tokens):
        raise SizingError(f"config field 'mm_tokens_per_image' ({mm_tokens}) must be a square whose side divides"
                          f" image_size / patch_size ({side})")
    n_patches = side * side
    embed = channels * patch * patch * e + e + n_patches * e
    layer_linear = 4 * e * e + 2 * e * inter
    layer = layer_linear + 4 * e + inter + e + 4 * e
    head = 0
    if get_bool(vc, "vision_use_head", True, where=w):
        head = e + 4 * e * e + 4 * e + 2 * e + 2 * e * inter + inter + e  # probe, MHA, LayerNorm, MLP
    tower = embed + depth * layer + 2 * e + head
    projector = e + e * llm_hidden
    formula = (
        f"vision (SigLIP) = patch embed {channels}*{patch}*{patch}*{e} + {e} + positions {n_patches}*{e}"
        f" + {depth} layers x {_n(layer)} (q/k/v/out 4e^2 + MLP 2*e*I, I = {inter}, biases, 2 LayerNorms)"
        f" + post LayerNorm" + (f" + pooling head {_n(head)}" if head else "") + f" = {_n(tower)}",
        f"projector = RMSNorm e + e*h = {e} + {e}*{llm_hidden} = {_n(projector)}",
        f"tokens/image = mm_tokens_per_image = {mm_tokens} ({n_patches} patches average-pooled)",
    )
    return VisionSpec("siglip (gemma3)", tower, depth * layer_linear + channels * patch * patch * e, projector, depth,
                      e, n_heads, inter, n_patches, mm_tokens, 1, formula)


LLAMA4_DEFAULT_TILES = 17  # the image processor's max_patches (16) + the global thumbnail tile


def llama4_vision(vc: dict[str, Any], llm_hidden: int) -> VisionSpec:
    """Llama-4's vision tower (``Llama4VisionModel``) + projector: patch embed (unfold + Linear
    C*p*p*e, no bias), class embedding e, positions ((image/patch)^2 + 1)*e, pre/post LayerNorms 4e,
    layers of q/k/v/o 4e^2 + 4e, fc1/fc2 2*e*I + I + e, two LayerNorms 4e; pixel-shuffle adapter
    I*P_in + P_out^2 (no bias); projector vision_output_dim*h (no bias). Tokens per tile =
    (image/patch)^2 x pixel_shuffle_ratio^2 (144 for 336 px, patch 14, ratio 0.5)."""
    w = "vision_config"
    e, depth, inter, n_heads, channels, patch, image = _vit_dims(vc, _Vit(768, 34, 5632, 16, 14, 448))
    p_in = opt_int(vc, "projector_input_dim", default=4096, where=w)
    p_out = opt_int(vc, "projector_output_dim", default=4096, where=w)
    out_dim = opt_int(vc, "vision_output_dim", default=7680, where=w)
    ratio = get_float(vc, "pixel_shuffle_ratio", 0.5, high=1.0, where=w)
    n_patches = (image // patch) ** 2
    embed = channels * patch * patch * e + e + (n_patches + 1) * e
    layer_linear = 4 * e * e + 2 * e * inter
    layer = layer_linear + 4 * e + inter + e + 4 * e
    adapter = inter * p_in + p_out * p_out
    tower = embed + 4 * e + depth * layer + adapter
    projector = out_dim * llm_hidden
    tokens = max(1, int(n_patches * ratio * ratio))
    formula = (
        f"vision (Llama-4 ViT) = patch embed {channels}*{patch}*{patch}*{e} + class + positions {n_patches + 1}*{e}"
        f" + {depth} layers x {_n(layer)} (q/k/v/o 4e^2 + MLP 2*e*I, I = {inter}, biases, 2 LayerNorms)"
        f" + pre/post LayerNorms + pixel-shuffle adapter {inter}*{p_in} + {p_out}*{p_out} = {_n(tower)}",
        f"projector = vision_output_dim*h = {out_dim}*{llm_hidden} = {_n(projector)}",
        f"tokens/tile = (image/patch)^2 * ratio^2 = ({image}/{patch})^2 * {ratio}^2 = {tokens};"
        f" default {LLAMA4_DEFAULT_TILES} tiles (16 + global)",
    )
    return VisionSpec("llama4-vit", tower, depth * layer_linear + channels * patch * patch * e + adapter, projector,
                      depth, e, n_heads, inter, n_patches + 1, tokens, LLAMA4_DEFAULT_TILES, formula)
