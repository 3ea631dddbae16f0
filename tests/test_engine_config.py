"""EngineConfig grouped as vLLM's VllmConfig (cache / scheduler / parallel / quant / speculative), with
the flat knobs users pass (``LLM(model, **knobs)``, scenarios, replay files) going in through
``from_knobs`` and out through ``to_knobs``."""
from __future__ import annotations

import pytest

from engine.core.config import (KNOB_NAMES, KNOB_PLACES, CacheConfig, EngineConfig, ParallelConfig, QuantConfig,
                                SchedulerConfig, SpeculativeConfig)

NON_DEFAULT = {  # one value per flat knob, none of them its default, all valid together
    "block_size": 8, "num_blocks": 64, "max_num_batched_tokens": 128, "max_num_seqs": 4,
    "enable_chunked_prefill": False, "policy": "static", "max_model_len": 512, "dtype": "bfloat16",
    "kv_cache_dtype": "int8", "seed": 7, "enable_prefix_caching": False, "quantization": "int4",
    "quantization_group_size": 64, "quantization_outlier_threshold": 4.0, "sparsity": "2:4",
    "quantization_smoothing_strength": None, "speculative_config": None, "pipeline_parallel_size": 2,
    "tensor_parallel_size": 1, "pipeline_schedule": "batch_queue", "num_microbatches": 1,
    "pipeline_layer_split": (1, 1), "worker_timeout_s": 30.0, "runner": "workers", "attention_backend": "torch",
    "scheduling_policy": "priority", "prefill_schedule": "prefill_first", "decode_grouping": False,
    "device": "cpu",  # its default: "cuda" runs neither a quantization nor worker processes (test below)
}


def test_every_flat_knob_has_one_place_and_round_trips() -> None:
    assert set(NON_DEFAULT) == set(KNOB_NAMES)
    config = EngineConfig.from_knobs(**NON_DEFAULT)
    assert config.to_knobs() == NON_DEFAULT
    for knob, (section, name) in KNOB_PLACES.items():
        owner = getattr(config, section) if section else config
        expected = "int8" if knob == "kv_cache_dtype" else NON_DEFAULT[knob]
        assert getattr(owner, name) == expected, knob


def test_the_groups() -> None:
    config = EngineConfig.from_knobs(block_size=8, max_num_seqs=3, pipeline_parallel_size=2, quantization="int8",
                                     speculative_config=None)
    assert config.cache_config == CacheConfig(block_size=8)
    assert config.scheduler_config == SchedulerConfig(max_num_seqs=3)
    assert config.parallel_config == ParallelConfig(pipeline_parallel_size=2) and config.parallel_config.world_size == 2
    assert config.quant_config == QuantConfig("int8") and config.quantization == "int8" and config.dtype == "bfloat16"
    assert EngineConfig().quant_config is None and EngineConfig().to_knobs() == EngineConfig.from_knobs().to_knobs()


def test_sub_configs_given_whole_or_as_dicts() -> None:
    direct = EngineConfig(cache_config=CacheConfig(block_size=4), scheduler_config={"policy": "static"},
                          speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    assert direct == EngineConfig.from_knobs(block_size=4, policy="static",
                                             speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    assert isinstance(direct.speculative_config, SpeculativeConfig)
    with pytest.raises(ValueError, match=r"^cache_config\.blok: unknown field"):
        EngineConfig(cache_config={"blok": 4})
    with pytest.raises(ValueError, match=r"^parallel_config: must be a ParallelConfig"):
        EngineConfig(parallel_config=2)  # type: ignore[arg-type]


def test_kv_cache_dtype_auto_is_the_weights_dtype() -> None:
    assert EngineConfig.from_knobs(kv_cache_dtype=None).cache_config.cache_dtype == "auto"
    assert EngineConfig.from_knobs(kv_cache_dtype="auto") == EngineConfig.from_knobs()
    assert EngineConfig.from_knobs(dtype="bfloat16").kv_cache_dtype == "bfloat16"
    assert EngineConfig.from_knobs(kv_cache_dtype="fp8").kv_cache_dtype == "fp8"
    assert EngineConfig.from_knobs().to_knobs()["kv_cache_dtype"] is None


@pytest.mark.parametrize("knobs, field", [
    ({"blok_size": 16}, r"blok_size: unknown engine option \(did you mean 'block_size'\?\)"),
    ({"block_size": 0}, "block_size: must be"),
    ({"kv_cache_dtype": "int4"}, "kv_cache_dtype: must be"),
    ({"quantization_group_size": 48}, "quantization_group_size: must be"),  # checked with no scheme too
    ({"quantization_smoothing_strength": 0.5}, "quantization_smoothing_strength: applies to"),
    ({"quantization": "int8", "dtype": "float32"}, "dtype: quantization='int8' computes in 'bfloat16'"),
    ({"pipeline_parallel_size": 2, "speculative_config": {"method": "ngram", "num_speculative_tokens": 2}},
     "speculative_config: speculative decoding runs in a single process"),
    ({"tensor_parallel_size": 2, "quantization": "int8"}, "quantization: tensor_parallel_size > 1"),
])
def test_a_bad_flat_knob_is_named(knobs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match="^" + field):
        EngineConfig.from_knobs(**knobs)


def test_replace_changes_flat_knobs() -> None:
    config = EngineConfig.from_knobs(quantization="int4", block_size=8)
    again = config.replace(quantization=None, dtype="auto")
    assert again.quant_config is None and again.dtype == "float32" and again.cache_config.block_size == 8
    assert config.replace() == config


def test_device_rules_and_the_backend_it_defaults_to() -> None:
    assert EngineConfig().device == "cpu" and EngineConfig().attention_backend == "torch"  # "auto" resolved
    cuda = EngineConfig.from_knobs(device="cuda")  # a config, not a start: no GPU is needed to build it
    assert cuda.attention_backend == "triton" and cuda.to_knobs()["attention_backend"] == "triton"
    assert EngineConfig.from_knobs(device="cuda", attention_backend="torch").attention_backend == "torch"
    with pytest.raises(ValueError, match=r"^device: must be one of \('cpu', 'cuda'\), got 'tpu'"):
        EngineConfig.from_knobs(device="tpu")
    for knobs in ({"quantization": "int8"}, {"pipeline_parallel_size": 2},
                  {"speculative_config": {"method": "ngram", "num_speculative_tokens": 2}}):
        with pytest.raises(ValueError, match=r"^device: 'cuda' "):
            EngineConfig.from_knobs(device="cuda", **knobs)
