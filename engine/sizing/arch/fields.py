"""Reading config fields with clear errors.

Every reader below either returns a value of the promised type, inside its bounds, or raises
SizingError with one line naming the field ("config field 'vision_config.patch_size' ...").
Bounds are generous (no published model comes near them) but keep a hostile config from
building 10^12 layers or overflowing into absurd answers.
"""
from __future__ import annotations

import math
from typing import Any

from ...core.hf_config import MISSING, MISSING_RULE, Fields, config_dtype, got
from ..formats import SizingError

MAX_LAYERS = 10_000  # decoder / vision-tower depth (largest published: 126, Llama-3.1-405B)
MAX_VOCAB = 2 ** 24  # 16,777,216 (largest published: 262,144, Gemma 3)
MAX_POSITIONS = 2 ** 31 - 1  # context length fields
MAX_DIM = 2 ** 24  # any other width, head count or expert count
_LAYER_FIELDS = {"num_hidden_layers", "n_layer", "num_layers", "depth"}
_VOCAB_FIELDS = {"vocab_size"}
_POSITION_FIELDS = {"max_position_embeddings", "n_positions", "n_ctx", "sliding_window", "max_window_layers"}


def refuse(label: str, rule: str, value: Any) -> SizingError:
    """The calculator's error for a bad field: ``config field 'vision_config.depth' must be >= 1, got 0``,
    ``config is missing 'hidden_size' (needed for every layer's width)``."""
    if rule.startswith(MISSING_RULE):
        return SizingError(f"config is missing {label!r}{rule.removeprefix(MISSING_RULE)}")
    return SizingError(f"config field {label!r} {rule}{got(value)}")


def _default_max(name: str) -> int:
    if name in _LAYER_FIELDS:
        return MAX_LAYERS
    if name in _VOCAB_FIELDS:
        return MAX_VOCAB
    if name in _POSITION_FIELDS:
        return MAX_POSITIONS
    return MAX_DIM


def fields_of(cfg: dict[str, Any], where: str = "") -> Fields:
    """The shared readers (engine/core/hf_config.py) over ``cfg``, with the calculator's error and
    bounds; null reads as absent and 0 / 1 as false / true, as transformers reads them."""
    return Fields(cfg, refuse, where, _default_max, null_is_absent=True, bool_ints=True)


def find_field(cfg: dict[str, Any], names: tuple[str, ...]) -> tuple[str, Any]:
    """The first of ``names`` present with a non-null value, as (name, value); (names[0], None) if none."""
    name, value = fields_of(cfg).find(names)
    return name, None if value is MISSING else value


def get_int(cfg: dict[str, Any], *names: str, default: Any = MISSING, minimum: int = 1, maximum: int | None = None,
         what: str = "", where: str = "") -> Any:
    """An integer field (the first of ``names`` present); ``default`` (may be None) when absent or null."""
    fields = fields_of(cfg, where)
    if default is MISSING:
        return fields.req_int(*names, minimum=minimum, maximum=maximum, what=what)
    return fields.opt_int(*names, default=default, minimum=minimum, maximum=maximum)


def req_int(cfg: dict[str, Any], *names: str, minimum: int = 1, what: str = "", where: str = "") -> int:
    """A required integer field."""
    return fields_of(cfg, where).req_int(*names, minimum=minimum, what=what)


def opt_int(cfg: dict[str, Any], *names: str, default: int, minimum: int = 1, where: str = "") -> int:
    """An optional integer field with an integer default."""
    return fields_of(cfg, where).req_int(*names, default=default, minimum=minimum)


def get_float(cfg: dict[str, Any], name: str, default: float, *, low: float = 0.0, high: float = math.inf,
           low_open: bool = True, where: str = "") -> float:
    """A finite real number in (low, high] (``low_open``) or [low, high]; ``default`` when absent or null."""
    return fields_of(cfg, where).number(name, default, low=low, high=high, low_open=low_open)


def get_bool(cfg: dict[str, Any], name: str, default: bool, where: str = "") -> bool:
    """true / false (0 / 1 accepted, as transformers does); ``default`` when absent or null."""
    return fields_of(cfg, where).flag(name, default)


def get_int_list(cfg: dict[str, Any], name: str, where: str = "") -> list[int]:
    """A list of non-negative integers (layer indices); [] when absent or null."""
    return fields_of(cfg, where).int_list(name, 0, MAX_DIM)


def get_str_list(cfg: dict[str, Any], name: str, where: str = "") -> list[str] | None:
    """A list of strings; None when absent or null."""
    return fields_of(cfg, where).str_list(name)


def get_str(cfg: dict[str, Any], name: str, default: str = "", where: str = "") -> str:
    """A string field; ``default`` when absent or null."""
    return fields_of(cfg, where).text(name, default)


def get_obj(cfg: dict[str, Any], name: str) -> dict[str, Any] | None:
    """A nested object (``vision_config``, ``text_config`` ...); None when absent or null."""
    return fields_of(cfg).obj(name)


def get_side(cfg: dict[str, Any], name: str, default: int, where: str = "") -> int:
    """An image/patch side that may be written as ``14`` or ``[14, 14]`` (square only)."""
    fields = fields_of(cfg, where)
    value = cfg.get(name)
    label = fields.label(name)
    if isinstance(value, list):
        if len(value) != 2 or value[0] != value[1]:
            raise refuse(label, "must be one integer or a square [n, n] pair", value)
        value = value[0]
    if value is None:
        return default
    return fields.check_int(label, value, 1, MAX_DIM)


def float_dtype(cfg: dict[str, Any], default: str = "bf16") -> str:
    """``torch_dtype`` (transformers 4) or ``dtype`` (transformers 5) read through the one dtype
    vocabulary (``engine.core.hf_config.config_dtype``); ``default`` when neither is given. An
    unknown spelling is an error naming the field."""
    return config_dtype(fields_of(cfg), default) or default
