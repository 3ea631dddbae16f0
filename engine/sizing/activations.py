"""Activation memory: the peak of vLLM's profiling forward pass, from the model's shapes.

vLLM sizes its KV pool as ``util x total - weights - non-torch memory - activation peak``, where the
activation peak is *measured* by a profiling run (``profile_run``) before the pool is allocated.
This module predicts that measurement. It models the profiling of vLLM 0.6.4 - 0.7.x (V0 engine,
``worker.determine_num_available_blocks`` + ``utils.memory_profiling``): one forward over
``max_num_batched_tokens`` tokens split into ``max_num_seqs`` dummy sequences, then the sampler on
the last token of each sequence (``max_num_seqs`` rows of logits) with top-p / top-k switched on.
(V0 without chunked prefill sets ``max_num_batched_tokens = max(max_model_len, 2048)``; vLLM V1 and
chunked prefill use the configured value. The formula takes the value, whatever set it.)

The peak is the larger of two moments, because the forward's intermediates are freed before the
sampler runs:

1. **Forward peak** (inside the MLP of one layer, at the down projection). Live per token:
   the residual stream ``h``, the normalised MLP input ``h``, the MLP's intermediates and the
   down projection's output ``h``. A gated MLP (SwiGLU) holds ``gate_up`` (``2 I``) and the
   activation output (``I``): ``3 I``; a plain GELU MLP ``fc1`` output and GELU output: ``2 I``. Both
   equal the MLP's matmul parameters divided by ``h`` (``3 h I / h`` and ``2 h I / h``), which is how
   they are computed here. MoE layers (vLLM fused_moe) hold ``top_k x (2 I_e + I_e + h)``.
   Attention holds ``qkv`` (``(nh + 2 nkv) d``), the attention output (``nh d``) and ``o_proj``'s output
   (``h``); the larger of attention and MLP counts. Under tensor parallelism the MLP and attention
   widths split over ``tp``; ``h`` does not::

       forward = T x b_a x (2 h + max(mlp_width / tp + h, attn_width / tp))
       mlp_width = MLP matmul params per token / h   (dense: 3 I gated, 2 I plain)

   Llama-3-8B (h 4096, I 14336, b_a 2): 110,592 B per token. vLLM issue #10517 logs 2.07 GiB at
   20,000 tokens (111,132 B/token) and 2.99 GiB at 29,000 (110,706 B/token).

2. **Sampler peak**: the final hidden states ``T x h x b_a`` plus ``S x V x c`` for ``S`` sequences
   (``max_num_seqs``) of ``V`` logits. ``c = 38.8 B`` per logit: fp32 logits, their sorted copy and
   int64 sort indices, the int64 inverse permutation, the re-gathered logits, softmax probs and
   cumulative sum, probs and logprobs (about ten 4-byte copies, some freed before the peak);
   fitted to two logs where the sampler dominates: Llama-3-8B at 8,192 tokens on an H100, 1.26 GiB
   (https://github.com/vllm-project/vllm/pull/10511, c = 39.2) and Qwen2.5-7B at 4,096 tokens,
   1.42 GiB (https://github.com/vllm-project/vllm/issues/13882, c = 38.4).

The result is one typed ``Activations`` record (tokens, llm, logits, vision, rope_cache) whose
``total`` the budget reserves; ``formula_text`` prints the formula with its numbers.

Plain runtimes (``framework="none"``: transformers, llama.cpp) keep ``batch`` rows of fp32 logits
(``4 B`` per logit) and no sort copies. The vision encoder keeps its earlier estimate
(aiconfigurator's coefficient 11 per hidden element). vLLM also counts the RoPE cos/sin cache
(``max_position x head_dim x b_a``; 32 MiB for Llama-3.1's 131,072 positions) with the weights; it is
returned here as ``rope_cache`` so the pool comes out right.

No torch import: pure arithmetic on the ModelSpec.
"""
from __future__ import annotations

from dataclasses import dataclass

from .arch import LayerSpec, ModelSpec

ACT_COEFF = 11  # aiconfigurator's LLAMA activation coefficient at TP1 (sizing.md §3.4); vision encoder only
SAMPLER_BYTES_PER_LOGIT = 38.8  # vLLM V0 sampler with top-p/top-k, fitted (module docstring)
PLAIN_BYTES_PER_LOGIT = 4  # fp32 logits of the last token per sequence
VLLM_FAMILY = ("vllm", "vllm-ascend")  # profile with the sort-based top-p/top-k sampler
V1_RULES = ("v1-early", "v1", "v1-graphs")  # budget.VLLM_RULES after V0: no sampler in the profiled peak
ROPE_CACHE_FRAMEWORKS = ("vllm", "vllm-ascend", "sglang")


@dataclass(frozen=True)
class ActivationPeak:
    """The two candidate peaks and what the profiler would report (their maximum)."""

    tokens: int  # tokens in the profiling forward (max_num_batched_tokens)
    forward: int  # bytes live at the forward's peak
    sampler: int  # bytes live at the sampler's peak
    vision: int = 0  # vision encoder (counted on top)

    @property
    def peak(self) -> int:
        """max(forward, sampler) + vision: what vLLM logs as the activation peak."""
        return max(self.forward, self.sampler) + self.vision


def attention_linear_params(model: ModelSpec) -> int:
    """q, k, v and o projections of one standard attention layer: h d (nh + 2 nkv) + nh d h."""
    h, d = model.hidden, model.head_dim
    return h * d * (model.num_heads + 2 * model.num_kv_heads) + model.num_heads * d * h


def mlp_width(model: ModelSpec, layer: LayerSpec) -> int:
    """Elements per token the layer's MLP keeps live at its down projection (module docstring).

    Dense: (active params - attention - norms) / h = 3 I (gated) or 2 I (plain GELU).
    MoE (vLLM fused_moe): top_k x (one expert's params / h + h) = top_k x (3 I_e + h); shared experts
    are not counted.
    """
    h = model.hidden
    if layer.num_experts and layer.top_k:
        return layer.top_k * (layer.expert_params // h + h)
    mlp_params = layer.active_params - attention_linear_params(model) - 2 * h
    return max(0, mlp_params // h)


def attention_width(model: ModelSpec) -> int:
    """Elements per token live around attention: qkv (nh + 2 nkv) d + output nh d + o_proj h."""
    d = model.head_dim
    return (model.num_heads + 2 * model.num_kv_heads) * d + model.num_heads * d + model.hidden


def forward_bytes_per_token(model: ModelSpec, act_bytes: int, tp: int = 1) -> int:
    """b_a x (2 h + max(mlp_width / tp + h, attn_width / tp)), the widest layer deciding."""
    h = model.hidden
    widest = max((mlp_width(model, layer) for layer in model.layers), default=0)
    per_token = 2 * h + max(widest // tp + h, attention_width(model) // tp)
    return act_bytes * per_token


def forward_peak(model: ModelSpec, tokens: int, act_bytes: int, tp: int = 1) -> int:
    """Forward peak = T x forward_bytes_per_token."""
    return tokens * forward_bytes_per_token(model, act_bytes, tp)


def sampler_peak(model: ModelSpec, tokens: int, seqs: int, act_bytes: int, framework: str, rule: str = "") -> int:
    """T x h x b_a (final hidden states) + S x V x c (c = 38.8 B in vLLM V0, 4 B plain); 0 under vLLM V1,
    which samples only after the KV pool is allocated (its profiled peak is the forward)."""
    if rule in V1_RULES:
        return 0
    per_logit = SAMPLER_BYTES_PER_LOGIT if framework in VLLM_FAMILY else PLAIN_BYTES_PER_LOGIT
    return int(tokens * model.hidden * act_bytes + seqs * model.vocab * per_logit)


def vision_bytes(model: ModelSpec, images: int, tiles: int, act_bytes: int) -> int:
    """ViT activations for all tiles at once: images x tiles x patch tokens x hidden x b_a x 11."""
    if not model.vision or not images:
        return 0
    return images * tiles * model.vision.patch_tokens * model.vision.hidden * act_bytes * ACT_COEFF


def rope_cache_bytes(model: ModelSpec, act_bytes: int, framework: str) -> int:
    """vLLM/SGLang's precomputed cos/sin cache: max_position x head_dim x b_a (counted as weights)."""
    if framework not in ROPE_CACHE_FRAMEWORKS or not model.max_position:
        return 0
    return model.max_position * model.head_dim * act_bytes


def profile_peak(model: ModelSpec, *, tokens: int, seqs: int, act_bytes: int = 2, tp: int = 1,
                 framework: str = "vllm", images: int = 0, tiles: int = 0, rule: str = "v0") -> ActivationPeak:
    """The activation peak vLLM's profiling run would log for these settings (``rule``: budget.VLLM_RULES)."""
    return ActivationPeak(tokens=tokens, forward=forward_peak(model, tokens, act_bytes, tp),
                          sampler=sampler_peak(model, tokens, seqs, act_bytes, framework, rule),
                          vision=vision_bytes(model, images, tiles, act_bytes))


def profiled_tokens(framework: str, batch: int, prompt_tokens: int | None, batched_tokens: int) -> int:
    """Tokens in the peak forward: max_num_batched_tokens for serving engines; the prompt (capped by
    the batch budget) for a plain runtime, 1 when there is no prompt."""
    if framework in ("none", "inferscope"):
        return min(batch * prompt_tokens, batched_tokens) if prompt_tokens else 1
    return batched_tokens


@dataclass(frozen=True)
class Activations:
    """The activation memory the budget reserves per device, in additive parts (bytes).

    ``llm`` = forward peak; ``logits`` = how far the sampler's peak exceeds it (0 when the forward
    dominates), so ``llm + logits = max(forward, sampler)``; ``vision`` = the vision tower;
    ``rope_cache`` = vLLM/SGLang's cos/sin cache. ``tokens`` is the profiled token count (not bytes).
    """

    tokens: int
    llm: int
    logits: int
    vision: int
    rope_cache: int = 0

    @property
    def total(self) -> int:
        """Bytes reserved: llm + logits + vision + rope_cache."""
        return self.llm + self.logits + self.vision + self.rope_cache


def activation_parts(model: ModelSpec, framework: str, *, batch: int, prompt_tokens: int | None,
                     batched_tokens: int, act_bytes: int, images: int | None = 0, tiles: int | None = 0,
                     tp: int = 1, rule: str = "") -> Activations:
    """The activation memory per device for these settings (see ``Activations``; ``rule``: the budget's)."""
    tokens = profiled_tokens(framework, batch, prompt_tokens, batched_tokens)
    peak = profile_peak(model, tokens=tokens, seqs=batch, act_bytes=act_bytes, tp=tp, framework=framework,
                        images=images or 0, tiles=tiles or 0, rule=rule)
    return Activations(tokens=tokens, llm=peak.forward, logits=max(0, peak.sampler - peak.forward),
                       vision=peak.vision, rope_cache=rope_cache_bytes(model, act_bytes, framework))


def formula_text(model: ModelSpec, act: Activations, *, act_bytes: int, batch: int, framework: str,
                 tp: int = 1, images: int = 0, tiles: int = 0, rule: str = "") -> str:
    """The activation formula with its numbers (``--formula``, the page's expander): the larger of the
    forward and sampler peaks (vLLM V1: the forward alone), + the vision tower, + the RoPE cache, =
    ``act.total`` bytes."""
    h = model.hidden
    widest = max((mlp_width(model, layer) for layer in model.layers), default=0)
    forward = (f"T x b x (2h + max(mlp/tp + h, attn/tp)) = {act.tokens:,} x {act_bytes} x (2 x {h:,} + max({widest:,}/{tp}"
               f" + {h:,}, {attention_width(model):,}/{tp})) = {act.llm:,} B")
    if rule in V1_RULES:
        text = f"activations = forward (vLLM V1 samples only after allocating the KV pool): {forward}"
    else:
        per_logit = SAMPLER_BYTES_PER_LOGIT if framework in VLLM_FAMILY else PLAIN_BYTES_PER_LOGIT
        sampler = act.llm + act.logits if act.logits else sampler_peak(model, act.tokens, batch, act_bytes, framework)
        text = (f"activations = max(forward, sampler): forward {forward};"
                f" sampler T x h x b + S x V x {per_logit:g} = {act.tokens:,} x {h:,} x {act_bytes}"
                f" + {batch:,} x {model.vocab:,} x {per_logit:g} = {sampler:,} B"
                f" -> {'sampler' if act.logits else 'forward'} {act.llm + act.logits:,} B")
    if act.vision and model.vision:
        text += (f" + vision images x tiles x patch tokens x hidden x b x {ACT_COEFF} = {images} x {tiles} x"
                 f" {model.vision.patch_tokens} x {model.vision.hidden} x {act_bytes} x {ACT_COEFF} = {act.vision:,} B")
    if act.rope_cache:
        text += (f" + RoPE cos/sin cache max_position x head_dim x b = {model.max_position:,} x {model.head_dim}"
                 f" x {act_bytes} = {act.rope_cache:,} B")
    return text + (f" = {act.total:,} B" if act.vision or act.rope_cache else "")
