"""Typed readers for the fields of a Hugging Face ``config.json``, shared by the engine's parser
(``engine/model/model_config.py``) and the hardware-fit calculator's (``engine/sizing/arch/``),
and the one dtype vocabulary both use. Pure Python: no torch, no streamlit.

A ``Fields`` reader either returns a value of the promised type inside its bounds or raises the
caller's error, built by the caller's ``fail(label, rule, value)``: the engine's says
``model: <file>: <field> <rule>, got <value>`` (a ``ValueError``), the calculator's
``config field '<field>' <rule>, got <value>`` (a ``SizingError``). The rules are worded here,
once: ``must be an integer``, ``must be >= 1``, ``must be in (0, 1)``, ``must be true or false``...

Refused everywhere: bools read as integers or numbers, floats (even 64.0) as integers, NaN and
infinities, strings for numbers. ``null`` reads as "absent" (Hugging Face's reading) unless the
reader or the call says otherwise.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

#: A value not given (distinct from ``None``, which a config may hold).
MISSING: Final[Any] = object()

#: ``fail(label, rule, value)`` -> the error to raise; ``value`` is ``MISSING`` when there is none.
Fail = Callable[[str, str, Any], ValueError]
#: How every "absent and required" rule begins (``is missing (needed for the MLP)``), so a caller
#: can word that case its own way.
MISSING_RULE: Final = "is missing"


def short(value: object, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters (a hostile config's value can be megabytes)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def got(value: object) -> str:
    """``", got <value>"`` for a message, or "" when there is no value (``MISSING``)."""
    return "" if value is MISSING else f", got {short(value)}"


def _max_dim(name: str) -> int:
    return 2**31 - 1


@dataclass(frozen=True)
class Fields:
    """Typed access to one config object (``cfg``), raising ``fail``'s error naming the field.

    ``where`` is the dotted prefix of a nested object (``vision_config``); ``max_for(name)`` is the
    default upper bound of an integer field; ``null_is_absent`` whether ``null`` reads as absent
    (else it is refused as the wrong type); ``bool_ints`` whether 0 / 1 read as false / true (as
    transformers does) or are refused."""

    cfg: Mapping[str, Any]
    fail: Fail
    where: str = ""
    max_for: Callable[[str], int] = _max_dim
    null_is_absent: bool = True
    bool_ints: bool = False

    def at(self, cfg: Mapping[str, Any], where: str) -> "Fields":
        """The same reader over a nested object."""
        return Fields(cfg, self.fail, where, self.max_for, self.null_is_absent, self.bool_ints)

    def label(self, name: str) -> str:
        """The dotted name a person sees: ``vision_config.patch_size``."""
        return f"{self.where}.{name}" if self.where else name

    def find(self, names: tuple[str, ...], null_is_absent: bool | None = None) -> tuple[str, Any]:
        """The first of ``names`` present (non-null, when null reads as absent), as (name, value);
        (names[0], MISSING) if none."""
        absent = self.null_is_absent if null_is_absent is None else null_is_absent
        for name in names:
            value = self.cfg.get(name, MISSING)
            if value is not MISSING and not (absent and value is None):
                return name, value
        return names[0], MISSING

    def missing(self, name: str, what: str = "") -> ValueError:
        need = f" (needed for {what})" if what else ""
        return self.fail(self.label(name), f"{MISSING_RULE}{need}", MISSING)

    def check_int(self, label: str, value: Any, minimum: int, maximum: int) -> int:
        """``value`` must be a JSON integer (not a bool, not 4096.0) in [minimum, maximum]."""
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(label, "must be an integer", value)
        if value < minimum:
            raise self.fail(label, f"must be >= {minimum:,}", value)
        if value > maximum:
            raise self.fail(label, f"must be <= {maximum:,}", value)
        return value

    def opt_int(self, *names: str, default: int | None = None, minimum: int = 1, maximum: int | None = None,
                null_is_absent: bool | None = None) -> int | None:
        """An integer field (the first of ``names`` present); ``default`` when absent."""
        name, value = self.find(names, null_is_absent)
        if value is MISSING:
            return default
        return self.check_int(self.label(name), value, minimum,
                              self.max_for(name) if maximum is None else maximum)

    def req_int(self, *names: str, default: int | None = None, minimum: int = 1, maximum: int | None = None,
            what: str = "", null_is_absent: bool | None = None) -> int:
        """An integer field; ``default`` when absent, an error naming ``names[0]`` when no default."""
        value = self.opt_int(*names, default=default, minimum=minimum, maximum=maximum,
                             null_is_absent=null_is_absent)
        if value is None:
            raise self.missing(names[0], what)
        return value

    def number(self, name: str, default: float, *, low: float = 0.0, high: float = math.inf,
              low_open: bool = True, high_open: bool = False) -> float:
        """A finite real number between ``low`` and ``high`` (each end open or closed);
        ``default`` when absent. Integers are accepted (``1`` for ``1.0``)."""
        value = self.cfg.get(name, MISSING)
        if value is MISSING or (value is None and self.null_is_absent):
            return default
        label = self.label(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.fail(label, "must be a finite number", value)
        if value < low or (low_open and value == low) or value > high or (high_open and value == high):
            closed = not high_open and high != math.inf
            bounds = f"{'(' if low_open else '['}{low:g}, {high:g}{']' if closed else ')'}"
            raise self.fail(label, f"must be in {bounds}", value)
        return float(value)

    def flag(self, name: str, default: bool) -> bool:
        """JSON true / false (0 / 1 too where ``bool_ints``); ``default`` when absent."""
        value = self.cfg.get(name, MISSING)
        if value is MISSING or (value is None and self.null_is_absent):
            return default
        if isinstance(value, bool):
            return value
        if self.bool_ints and isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise self.fail(self.label(name), "must be true or false", value)

    def text(self, name: str, default: str = "") -> str:
        """A string field; ``default`` when absent."""
        value = self.cfg.get(name, MISSING)
        if value is MISSING or (value is None and self.null_is_absent):
            return default
        if not isinstance(value, str):
            raise self.fail(self.label(name), "must be a string", value)
        return value

    def str_list(self, name: str) -> list[str] | None:
        """A list of strings; None when absent."""
        value = self.cfg.get(name, MISSING)
        if value is MISSING or (value is None and self.null_is_absent):
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(self.label(name), "must be a list of strings", value)
        return value

    def int_list(self, name: str, minimum: int = 0, maximum: int | None = None) -> list[int]:
        """A list of integers in [minimum, maximum] (layer indices); [] when absent."""
        value = self.cfg.get(name, MISSING)
        if value is MISSING or (value is None and self.null_is_absent):
            return []
        label = self.label(name)
        if not isinstance(value, list):
            raise self.fail(label, "must be a list of integers", value)
        top = self.max_for(name) if maximum is None else maximum
        return [self.check_int(f"{label}[{i}]", v, minimum, top) for i, v in enumerate(value)]

    def obj(self, name: str) -> dict[str, Any] | None:
        """A nested object (``vision_config``, ``rope_scaling`` ...); None when absent."""
        value = self.cfg.get(name, MISSING)
        if value is MISSING or value is None:
            return None
        if not isinstance(value, dict):
            raise self.fail(self.label(name), "must be an object", value)
        return value


# --------------------------------------------------------------------------------------
# the one dtype vocabulary

#: Our short keys <-> the names torch / vLLM / HF configs use (``--dtype`` in vLLM and SGLang
#: takes the long names; so do configs' ``torch_dtype`` and the engine's ``dtype``).
FLOAT_DTYPE_NAMES: dict[str, str] = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
DTYPE_ALIASES: dict[str, str] = {
    **{long: key for key, long in FLOAT_DTYPE_NAMES.items()},
    "float": "fp32", "f32": "fp32", "f16": "fp16", "half": "fp16",
    "float8_e4m3fn": "fp8", "float8_e4m3": "fp8",  # FP8 checkpoints' torch_dtype
}
#: Storage dtypes a checkpoint's config may name (``torch_dtype`` / ``dtype``), as our keys.
CHECKPOINT_DTYPES: tuple[str, ...] = ("fp32", "bf16", "fp16", "fp8")
#: The dtypes the engine computes in, by their long (torch) names.
ENGINE_DTYPES: tuple[str, ...] = tuple(FLOAT_DTYPE_NAMES.values())


def dtype_key(name: str) -> str:
    """Our key for a dtype name ("bfloat16", "torch.bfloat16", "BF16" -> "bf16"); unknown names are
    returned as given (lower case, without "torch.")."""
    key = str(name).strip().lower().removeprefix("torch.")
    return DTYPE_ALIASES.get(key, key)


def dtype_spellings(keys: tuple[str, ...]) -> list[str]:
    """Every accepted spelling of these keys (the keys and their aliases), sorted, for messages."""
    return sorted({*keys, *(alias for alias, key in DTYPE_ALIASES.items() if key in keys)})


def config_dtype(fields: Fields, default: str | None) -> str | None:
    """The checkpoint dtype a config names (``torch_dtype``, transformers 4, or ``dtype``,
    transformers 5) as one of ``CHECKPOINT_DTYPES``; ``default`` when neither is given. A
    non-string or an unknown spelling is ``fields``' error naming the field."""
    name, raw = fields.find(("torch_dtype", "dtype"), null_is_absent=True)
    if raw is MISSING:
        return default
    if not isinstance(raw, str):
        raise fields.fail(fields.label(name), 'must be a dtype name such as "bfloat16"', raw)
    key = dtype_key(raw)
    if key not in CHECKPOINT_DTYPES:
        raise fields.fail(fields.label(name), f"names an unknown dtype {short(raw)} (known: "
                          f"{', '.join(dtype_spellings(CHECKPOINT_DTYPES))})", MISSING)
    return key
