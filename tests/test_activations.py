"""Activation statistics (engine/model/activations.py) and the observer seam of LlamaModel.run_layers."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine import LLM
from engine.model.activations import LINEARS, calibration_prompts
from engine.studies.evaluation import activation_stats
from engine.model.shared import get_shared_model
from engine.model.forward_batch import build_forward_batch
from engine.model.runner import ModelRunner
from engine.model.loader import load_model
from tests.parity import PROMPTS

TINY = "tiny-random"


def manual_linear_inputs(name: str, prompts: list[str]) -> dict[tuple[int, str], torch.Tensor]:
    """A second forward written out by hand from the Hugging Face weights (no paged KV, one
    prompt at a time, plain causal softmax attention): the input of every linear, [T, K]."""
    loaded = load_model(name)
    c, w = loaded.config, loaded.weights
    tok = get_shared_model(name).tokenizer
    nq, nkv, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim

    def norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c.rms_norm_eps))

    def rot(x: torch.Tensor) -> torch.Tensor:
        return torch.cat((-x[..., d // 2:], x[..., :d // 2]), dim=-1)

    out: dict[tuple[int, str], list[torch.Tensor]] = {}
    for prompt in prompts:
        ids = torch.tensor(tok(prompt, add_special_tokens=False).input_ids)
        T = len(ids)
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, d, 2).float() / d))
        ang = torch.arange(T).float()[:, None] * inv[None]  # [T, d/2]
        cos, sin = torch.cat((ang, ang), -1).cos()[:, None], torch.cat((ang, ang), -1).sin()[:, None]
        h = w["model.embed_tokens.weight"][ids]
        for i in range(c.num_hidden_layers):
            p = f"model.layers.{i}."
            x = norm(h, w[p + "input_layernorm.weight"])
            out.setdefault((i, "qkv"), []).append(x)
            q, k, v = (F.linear(x, w[p + f"self_attn.{n}_proj.weight"], w.get(p + f"self_attn.{n}_proj.bias"))
                       for n in "qkv")
            q, k, v = q.view(T, nq, d), k.view(T, nkv, d), v.view(T, nkv, d)
            q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
            k, v = k.repeat_interleave(nq // nkv, dim=1), v.repeat_interleave(nq // nkv, dim=1)
            scores = torch.einsum("qhd,khd->hqk", q, k) * d ** -0.5
            scores = scores.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf"))
            attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(T, nq * d)
            out.setdefault((i, "o"), []).append(attn)
            h = h + F.linear(attn, w[p + "self_attn.o_proj.weight"], w.get(p + "self_attn.o_proj.bias"))
            x = norm(h, w[p + "post_attention_layernorm.weight"])
            out.setdefault((i, "gate_up"), []).append(x)
            a = F.silu(F.linear(x, w[p + "mlp.gate_proj.weight"])) * F.linear(x, w[p + "mlp.up_proj.weight"])
            out.setdefault((i, "down"), []).append(a)
            h = h + F.linear(a, w[p + "mlp.down_proj.weight"])
    return {key: torch.cat(xs) for key, xs in out.items()}


def test_absmax_equals_a_manual_forward() -> None:
    prompts = PROMPTS[:6]
    stats = activation_stats(LLM(TINY), prompts)
    manual = manual_linear_inputs(TINY, prompts)
    layers = load_model(TINY).config.num_hidden_layers
    assert stats.num_tokens == manual[(0, "qkv")].shape[0]
    for linear in LINEARS:
        got = torch.tensor(stats.absmax_of(linear))  # [L, K]
        want = torch.stack([manual[(i, linear)].abs().amax(0) for i in range(layers)])
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", [TINY, "smollm2-135m"])
def test_observer_leaves_logits_bit_identical(name: str) -> None:
    model = get_shared_model(name).model
    tok = get_shared_model(name).tokenizer
    chunks = [tok(p, add_special_tokens=False).input_ids for p in PROMPTS[:3]]
    starts = [sum(len(c) for c in chunks[:i]) for i in range(len(chunks))]
    slots = [list(range(s, s + len(c))) for s, c in zip(starts, chunks)]
    batch = build_forward_batch(chunks, [0] * 3, slots, [True] * 3)
    total = sum(len(c) for c in chunks)
    seen: list[tuple[int, str, tuple[int, ...]]] = []
    with torch.inference_mode():
        plain = model.forward(batch, ModelRunner(model, total, 1, torch.float32).kv_caches)
        kv = ModelRunner(model, total, 1, torch.float32).kv_caches
        hidden = model.run_layers(model.embed(batch), batch, kv,
                                  observer=lambda i, lin, x: seen.append((i, lin, tuple(x.shape))))
        observed = model.compute_logits(hidden, batch)
    assert torch.equal(plain, observed)
    c = model.config
    assert len(seen) == 4 * c.num_hidden_layers
    assert seen[:4] == [(0, "qkv", (total, c.hidden_size)), (0, "o", (total, c.num_attention_heads * c.head_dim)),
                        (0, "gate_up", (total, c.hidden_size)), (0, "down", (total, c.intermediate_size))]


@pytest.mark.parametrize("value_range", [None, 0.05])
@pytest.mark.parametrize(("layer", "linear"), [(0, "qkv"), (1, "down"), (None, "o")])
def test_histogram_counts_every_value(value_range: float | None, layer: int | None, linear: str) -> None:
    stats = activation_stats(LLM(TINY), PROMPTS[:4], histogram_layer=layer, histogram_linear=linear,
                             bins=17, histogram_range=value_range)
    h = stats.histogram
    k = len(stats.absmax_of(linear)[0])
    assert h.num_values == stats.num_tokens * k == sum(h.counts)
    assert len(h.counts) == 17 and len(h.edges) == 18 and h.linear == linear
    if layer is None:  # the layer holding the largest magnitude of that linear's input
        maxima = [max(row) for row in stats.absmax_of(linear)]
        assert maxima[h.layer] == max(maxima)
    if value_range is None:
        assert h.num_clamped == 0 and h.edges[-1] == pytest.approx(max(stats.absmax_of(linear)[h.layer]))
    else:
        assert (h.edges[0], h.edges[-1]) == (-0.05, 0.05) and h.num_clamped > 0  # tails folded into end bins


@pytest.mark.parametrize("threshold", [6.0, 1.0, 0.3])
def test_outliers_are_exactly_the_channels_above_threshold(threshold: float) -> None:
    stats = activation_stats(LLM(TINY), threshold=threshold)
    want = {(layer, entry.linear, k) for entry in stats.absmax
            for layer, row in enumerate(entry.absmax) for k, v in enumerate(row) if v > threshold}
    got = [(o.layer, o.linear, o.channel) for o in stats.outliers]
    assert len(got) == len(set(got)) and set(got) == want
    assert all(stats.absmax_of(o.linear)[o.layer][o.channel] == o.absmax for o in stats.outliers)
    assert [o.absmax for o in stats.outliers] == sorted((o.absmax for o in stats.outliers), reverse=True)
    if threshold < 1.0:
        assert stats.outliers  # the check above is not vacuous


def test_calibration_prompts_are_the_default() -> None:
    prompts = calibration_prompts()
    assert len(prompts) == 12 and len(set(prompts)) == 12
    stats = activation_stats(LLM(TINY))
    assert stats.prompts == prompts


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"prompts": []}, "prompts"), ({"prompts": "one string"}, "prompts"), ({"prompts": ["ok", ""]}, "prompts"),
    ({"prompts": [3]}, "prompts"), ({"threshold": 0}, "threshold"), ({"threshold": float("nan")}, "threshold"),
    ({"threshold": True}, "threshold"), ({"histogram_layer": 2}, "histogram_layer"),
    ({"histogram_layer": -1}, "histogram_layer"), ({"histogram_linear": "q"}, "histogram_linear"),
    ({"bins": 0}, "bins"), ({"bins": 2.5}, "bins"), ({"histogram_range": -1.0}, "histogram_range"),
    ({"llm": None}, "llm"),
])
def test_bad_input_names_the_field(kwargs: dict[str, object], field: str) -> None:
    args: dict[str, object] = {"llm": LLM(TINY), "prompts": PROMPTS[:2]}
    args.update(kwargs)
    with pytest.raises(ValueError, match=f"^{field}:"):
        activation_stats(**args)  # type: ignore[arg-type]


def test_token_id_prompts_equal_their_text() -> None:
    """A live run passes its requests' own token ids: the same tokens as text give the same stats."""
    llm = LLM(TINY)
    tok = llm.llm_engine.tokenizer
    ids = [list(tok(p, add_special_tokens=False).input_ids) for p in PROMPTS[:3]]
    by_text = activation_stats(llm, PROMPTS[:3])
    by_ids = activation_stats(llm, ids)
    assert by_ids.absmax == by_text.absmax and by_ids.num_tokens == by_text.num_tokens
    assert by_ids.prompts == tuple(tuple(i) for i in ids)
    with pytest.raises(ValueError, match="prompts: prompt 0 holds a token id"):
        activation_stats(llm, [[10 ** 9]])
