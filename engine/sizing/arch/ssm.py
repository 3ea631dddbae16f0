"""State-space layers (Mamba v1, Mamba2): a constant state per sequence instead of a per-token KV cache."""
from __future__ import annotations

import math
from typing import Any

from ..formats import SizingError
from ..units import tokens as _n  # a count with thousands separators
from .fields import get_bool, get_int, opt_int, req_int
from .records import LayerSpec



def time_step_rank(cfg: dict[str, Any], name: str, h: int) -> int:
    """The dt rank R: ``name`` as an integer, or "auto" / absent = ceil(h / 16) (MambaConfig, JambaConfig)."""
    return math.ceil(h / 16) if cfg.get(name) in (None, "auto") else int(get_int(cfg, name))


def mamba_mixer(h: int, d_inner: int, n_state: int, k_conv: int, rank: int, proj_bias: bool, conv_bias: bool,
                inner_norms: bool = False) -> tuple[int, int, int]:
    """(params, matmul weights, state elements per sequence) of one Mamba v1 mixer: in_proj h*2*Di
    (+ 2*Di bias) + conv Di*K (+ Di) + x_proj Di*(R+2N) + dt_proj R*Di + Di + A_log Di*N + D Di +
    out_proj Di*h (+ h) [+ Jamba's dt/B/C RMSNorms R + 2N]; state = Di*(K-1) + Di*N."""
    linear = h * 2 * d_inner + d_inner * (rank + 2 * n_state) + rank * d_inner + d_inner * h
    params = (linear + (2 * d_inner + h if proj_bias else 0) + d_inner * k_conv + (d_inner if conv_bias else 0)
              + d_inner + d_inner * n_state + d_inner + (rank + 2 * n_state if inner_norms else 0))
    return params, linear, d_inner * (k_conv - 1) + d_inner * n_state


def mamba(cfg: dict[str, Any], model_type: str) -> dict[str, Any]:
    """Mamba v1: in_proj h*2*Di + conv Di*K (+Di) + x_proj Di*(R+2N) + dt_proj R*Di+Di + A, D
    Di*N+Di + out_proj Di*h + norm h; no per-token KV, a state of L*(Di*(K-1) + Di*N) per sequence."""
    if model_type == "mamba2":
        return mamba2(cfg, model_type)
    h = get_int(cfg, "hidden_size", "d_model", what="every layer's width")
    n_layers = get_int(cfg, "num_hidden_layers", "n_layer", what="the layer count")
    vocab = get_int(cfg, "vocab_size", what="the embedding table")
    n_state = get_int(cfg, "state_size", "d_state", default=16)
    expand = get_int(cfg, "expand", default=2)
    d_inner = get_int(cfg, "intermediate_size", default=expand * h)
    k_conv = get_int(cfg, "conv_kernel", "d_conv", default=4)
    dt_rank = time_step_rank(cfg, "time_step_rank", h)
    mixer, linear, state = mamba_mixer(h, d_inner, n_state, k_conv, dt_rank, get_bool(cfg, "use_bias", False),
                                       get_bool(cfg, "use_conv_bias", True))
    params = mixer + h  # + the layer's RMSNorm
    layer = LayerSpec("mamba", params, linear, params, state_elems=state)
    tied = get_bool(cfg, "tie_word_embeddings", True)
    formula = (
        f"mamba/layer = in_proj h*2*Di + conv Di*K (+bias) + x_proj Di*(R+2N) + dt_proj R*Di+Di + A,D Di*N+Di"
        f" + out_proj Di*h + norm h, with h={h}, Di={d_inner}, K={k_conv}, R={dt_rank}, N={n_state} = {_n(params)}",
    )
    return _ssm_parts(h, n_layers, vocab, tied, layer, "Mamba", formula,
                      f"no per-token KV; state/sequence = L x (Di x (K-1) + Di x N) = {n_layers} x ({d_inner} x"
                      f" {k_conv - 1} + {d_inner} x {n_state}) = {_n(n_layers * state)} elements")


def mamba2(cfg: dict[str, Any], model_type: str) -> dict[str, Any]:
    """Mamba2 (``Mamba2ForCausalLM``): Di = expand*h = nheads*head_dim, conv channels
    C = Di + 2*ngroups*N; in_proj h*(Di + C + nheads) (+ bias), depthwise conv C*K (+ C),
    dt_bias / A_log / D 3*nheads, gated RMSNorm Di, out_proj Di*h (+ h), pre-norm h; no per-token KV,
    a state of L*(C*(K-1) + nheads*head_dim*N) per sequence."""
    h = req_int(cfg, "hidden_size", "d_model", what="every layer's width")
    n_layers = req_int(cfg, "num_hidden_layers", "n_layer", what="the layer count")
    vocab = req_int(cfg, "vocab_size", what="the embedding table")
    n_state = opt_int(cfg, "state_size", "d_state", default=128)
    expand = opt_int(cfg, "expand", default=2)
    n_heads = opt_int(cfg, "num_heads", default=128)
    head_dim = opt_int(cfg, "head_dim", default=64)
    groups = opt_int(cfg, "n_groups", "ngroups", default=8)
    k_conv = opt_int(cfg, "conv_kernel", "d_conv", default=4)
    d_inner = expand * h
    if n_heads * head_dim != d_inner:
        raise SizingError(f"config fields 'num_heads' x 'head_dim' ({n_heads} x {head_dim}) must equal expand x"
                          f" hidden_size ({expand} x {h})")
    if n_heads % groups:
        raise SizingError(f"config field 'n_groups': num_heads {n_heads} is not a multiple of {groups}")
    use_bias = get_bool(cfg, "use_bias", False)
    conv_bias = get_bool(cfg, "use_conv_bias", True)
    conv_dim = d_inner + 2 * groups * n_state
    in_linear = h * (d_inner + conv_dim + n_heads)
    in_proj = in_linear + ((d_inner + conv_dim + n_heads) if use_bias else 0)
    conv = conv_dim * k_conv + (conv_dim if conv_bias else 0)
    out_proj = d_inner * h + (h if use_bias else 0)
    params = in_proj + conv + 3 * n_heads + d_inner + out_proj + h
    linear = in_linear + d_inner * h
    state = conv_dim * (k_conv - 1) + n_heads * head_dim * n_state
    layer = LayerSpec("mamba", params, linear, params, state_elems=state)
    tied = get_bool(cfg, "tie_word_embeddings", False)
    formula = (
        f"mamba2/layer = in_proj h*(Di + C + nheads) + conv C*K (+bias) + dt_bias,A_log,D 3*nheads + gated norm Di"
        f" + out_proj Di*h + norm h, with h={h}, Di={d_inner}, C = Di + 2*ngroups*N = {conv_dim},"
        f" nheads={n_heads}, K={k_conv}, N={n_state} = {_n(params)}",
    )
    return _ssm_parts(h, n_layers, vocab, tied, layer, "Mamba2", formula,
                      f"no per-token KV; state/sequence = L x (C x (K-1) + nheads x head_dim x N) = {n_layers} x"
                      f" ({conv_dim} x {k_conv - 1} + {n_heads} x {head_dim} x {n_state})"
                      f" = {_n(n_layers * state)} elements")


def _ssm_parts(h: int, n_layers: int, vocab: int, tied: bool, layer: LayerSpec, label: str,
               formula: tuple[str, ...], kv_formula: str) -> dict[str, Any]:
    """ModelSpec fields of a pure state-space model: every layer alike, no attention heads."""
    return dict(
        hidden=h, num_layers=n_layers, num_heads=0, num_kv_heads=0, head_dim=0, vocab=vocab, tied=tied,
        embed_params=vocab * h, lm_head_params=0 if tied else vocab * h, final_norm_params=h,
        layers=(layer,) * n_layers, family=f"SSM ({label}): constant state per sequence, no per-token KV",
        param_formula=formula, kv_formula=kv_formula,
    )
