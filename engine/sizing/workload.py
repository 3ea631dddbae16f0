"""The workload concern: batch, context, prompt, output, images, resolved to token counts.

Rule: context = prompt text + image tokens + output, per sequence. Give any two of context /
prompt / output (the third follows); with none, context = min(4096, the model's limit) and
output = min(512, context / 8).

Documented maxima (refused above them, one line, exit 2 on the CLI):
  context, prompt, output       <= 2**24 = 16,777,216 tokens per sequence (the longest context
                                   any served model offers today is 10M; beyond the model's own
                                   limit, ModelSpec.max_model_len, it is a warning,
                                   not a refusal; the serve command is capped there)
  batch (concurrent sequences)  <= 2**20 = 1,048,576
  images per sequence           <= 64;  tiles per image <= 40 (InternViT's tested maximum)
"""
from __future__ import annotations

from dataclasses import dataclass

from .arch import ModelSpec
from .checks import Remarks, whole_number
from .formats import SizingError

DEFAULT_CONTEXT = 4096
DEFAULT_OUTPUT = 512
MAX_CONTEXT = 1 << 24
MAX_BATCH = 1 << 20
MAX_IMAGES = 64
MAX_TILES = 40


@dataclass(frozen=True)
class Workload:
    """What the caller asked for (None = derive it)."""

    batch: int = 1  # concurrent sequences
    context: int | None = None  # total tokens per sequence (text + image tokens + output)
    prompt: int | None = None  # text tokens of the prompt
    output: int | None = None  # generated tokens
    images: int | None = None  # images per sequence (vision-language models)
    tiles: int | None = None  # tiles per image (InternVL: up to 12 + thumbnail)


@dataclass(frozen=True)
class ResolvedWorkload:
    """Token counts per sequence, all consistent: context = prompt_text + image_tokens + output."""

    batch: int
    context: int
    output: int
    prompt_text: int
    images: int
    tiles: int  # 0 when there is no image
    image_tokens: int

    @property
    def prompt_total(self) -> int:
        """Prompt tokens the model prefills: text + image tokens."""
        return self.prompt_text + self.image_tokens


def _optional(name: str, value: int | None, minimum: int, maximum: int) -> int | None:
    return None if value is None else whole_number(name, value, minimum, maximum)


def _default_context(model: ModelSpec) -> int:
    """4096, or the model's own limit (``ModelSpec.max_model_len``) when that is shorter."""
    return DEFAULT_CONTEXT if not model.max_model_len else min(DEFAULT_CONTEXT, model.max_model_len)


def resolve_workload(model: ModelSpec, w: Workload, remarks: Remarks) -> ResolvedWorkload:
    """Check every count against its documented range, then derive the missing ones (module doc)."""
    batch = whole_number("batch (concurrent sequences)", w.batch, 1, MAX_BATCH)
    vision = model.vision
    tiles = vision.max_tiles if vision else 0
    if w.tiles is not None:
        tiles = whole_number("tiles per image", w.tiles, 1, MAX_TILES)
    images = _optional("images per sequence", w.images, 0, MAX_IMAGES)
    if images and vision is None:
        raise SizingError(f"{model.display_name} has no vision tower; images must be 0")
    per_image = tiles * vision.tokens_per_tile if vision else 0
    out = _optional("output tokens", w.output, 1, MAX_CONTEXT)
    prompt = _optional("prompt tokens", w.prompt, 1, MAX_CONTEXT)
    context = _optional("context (tokens per sequence)", w.context, 2, MAX_CONTEXT)
    if context is None and prompt is None:
        context = _default_context(model)
    if context is None:
        assert prompt is not None
        out = DEFAULT_OUTPUT if out is None else out
        images = images or 0
        context = prompt + images * per_image + out
        if context > MAX_CONTEXT:
            raise SizingError(f"prompt + image tokens + output = {context:,} tokens; the context must be"
                              f" <= {MAX_CONTEXT:,}")
        text = prompt
    else:
        if prompt is not None and prompt >= context:
            raise SizingError(f"prompt tokens ({prompt:,}) must be fewer than the context ({context:,}):"
                              " the context holds the prompt and the output")
        if out is None:
            out = min(DEFAULT_OUTPUT, max(1, context // 8)) if prompt is None else context - prompt
        if out >= context:
            raise SizingError(f"output tokens ({out:,}) must be fewer than the context ({context:,})")
        if images is None:
            images = 1 if vision and per_image + out < context else 0
            if vision and not images:
                remarks.note(f"no image assumed: a {tiles}-tile image ({per_image:,} tokens) does not fit"
                             f" in {context:,} tokens of context")
        text = context - out - images * per_image
        if prompt is not None and prompt != text:
            raise SizingError(f"prompt ({prompt:,}) + images ({images * per_image:,}) + output ({out:,})"
                              f" != context ({context:,}); give two of them")
        if text < 0:
            raise SizingError(f"{images} image(s) x {tiles} tiles = {images * per_image:,} tokens do not fit in"
                              f" {context:,} tokens of context with {out:,} output tokens")
    if model.max_model_len and context > model.max_model_len:
        remarks.warn(f"context {context:,} is beyond the model's {model.positions_text}; vLLM refuses it"
                     f" unless forced, so the serve command below is capped at {model.max_model_len:,}")
    return ResolvedWorkload(batch=batch, context=context, output=out, prompt_text=text, images=images,
                            tiles=tiles if images else 0, image_tokens=images * per_image)
