"""The shared Hugging Face config readers (engine/core/hf_config.py): one set of rules, each caller's
own error. The engine's ModelConfig and the calculator's model_from_config refuse the same bad
values, the engine with ``model: <file>: <field> ...``, the calculator with SizingError."""
from __future__ import annotations

import math
from typing import Any

import pytest

from engine.core.hf_config import MISSING, Fields, config_dtype, dtype_key
from engine.model.model_config import ModelConfig
from engine.sizing.arch import model_from_config
from engine.sizing.formats import SizingError

BASE: dict[str, Any] = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 32,
                        "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
                        "num_attention_heads": 2, "num_key_value_heads": 1}


def _fields(cfg: dict[str, Any], **kw: Any) -> Fields:
    def fail(label: str, rule: str, value: Any) -> ValueError:
        return ValueError(f"{label}: {rule}" + ("" if value is MISSING else f" [{value!r}]"))
    return Fields(cfg, fail, **kw)


@pytest.mark.parametrize("bad", [True, 16.0, "16", 0, -1, math.nan, [16]])
def test_both_parsers_refuse_the_same_bad_integer_naming_the_field(bad: Any) -> None:
    cfg = {**BASE, "hidden_size": bad}
    with pytest.raises(ValueError, match=r"^model: /m/config\.json: hidden_size "):
        ModelConfig.from_hf(cfg, "/m/config.json")
    with pytest.raises(SizingError, match=r"config field 'hidden_size' must be"):
        model_from_config(cfg)


def test_both_parsers_accept_the_same_good_config() -> None:
    engine, calc = ModelConfig.from_hf(BASE), model_from_config(BASE)
    assert (engine.hidden_size, engine.num_key_value_heads) == (calc.hidden, calc.num_kv_heads) == (16, 1)


def test_aliases_bounds_and_null() -> None:
    f = _fields({"n_embd": 64, "zero": 0, "nul": None})
    assert f.req_int("hidden_size", "n_embd") == 64
    assert f.opt_int("absent") is None and f.req_int("absent", default=3) == 3
    assert f.req_int("nul", default=5) == 5  # null reads as absent by default
    with pytest.raises(ValueError, match=r"^nul: must be an integer \[None\]"):
        _fields({"nul": None}, null_is_absent=False).req_int("nul", default=5)
    with pytest.raises(ValueError, match=r"^zero: must be >= 1 \[0\]"):
        f.req_int("zero")
    with pytest.raises(ValueError, match=r"^n_embd: must be <= 8"):
        f.req_int("hidden_size", "n_embd", maximum=8)
    with pytest.raises(ValueError, match=r"^hidden_size: is missing \(needed for width\)$"):
        f.req_int("hidden_size", what="width")
    assert f.at({"depth": 2}, "vision_config").label("depth") == "vision_config.depth"


def test_numbers_flags_and_lists() -> None:
    f = _fields({"eps": 1e-6, "one": 1.0, "inf": math.inf, "t": True, "i": 1, "xs": [0, 3], "bad": [1, -2]})
    assert f.number("eps", 0.1, high=1.0, high_open=True) == 1e-6
    with pytest.raises(ValueError, match=r"^one: must be in \(0, 1\)"):
        f.number("one", 0.1, high=1.0, high_open=True)
    with pytest.raises(ValueError, match=r"^inf: must be a finite number"):
        f.number("inf", 1.0)
    assert f.flag("t", False) is True
    with pytest.raises(ValueError, match=r"^i: must be true or false"):
        f.flag("i", False)
    assert _fields({"i": 1}, bool_ints=True).flag("i", False) is True
    assert f.int_list("xs") == [0, 3]
    with pytest.raises(ValueError, match=r"^bad\[1\]: must be >= 0"):
        f.int_list("bad")


def test_one_dtype_vocabulary() -> None:
    assert dtype_key("torch.bfloat16") == dtype_key("BF16") == "bf16"
    assert config_dtype(_fields({"dtype": "float16"}), None) == "fp16"
    assert config_dtype(_fields({}), "bf16") == "bf16"
    with pytest.raises(ValueError, match=r"^torch_dtype: names an unknown dtype 'int3'"):
        config_dtype(_fields({"torch_dtype": "int3"}), None)
