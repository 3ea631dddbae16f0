"""The calculator's verdict says what it means (issue #19, item 8).

A configuration that does not fit is never worded as a fit ("Does not fit on 2 x H100 SXM 80GB —
needs 4", over by how much); speed is quoted for the devices asked for only when it fits there,
with the smallest count that fits beside it, labelled; the serve command never asks for more
positions than the model has; the Llama-3.1 presets load and size.
"""
import pytest

from engine.memory import get_model

PUBLISHED_PARAMS = {"llama-3.1-8b": 8.03e9, "llama-3.1-70b": 70.6e9, "llama-3.1-405b": 405.9e9}


@pytest.mark.parametrize("key, published", PUBLISHED_PARAMS.items())
def test_llama31_presets_load_and_size(key, published):
    spec = get_model(key)
    assert spec.params_total == pytest.approx(published, rel=0.002)
    assert spec.max_position == 131072 and spec.num_kv_heads == 8 and spec.vocab == 128256
    assert spec.source["hf_id"] == f"meta-llama/Llama-3.1-{key.split('-')[-1].upper()}"
