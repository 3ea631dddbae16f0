"""Shared pieces of the Hugging Face parity tests: prompts, the HF reference, an engine driver."""
from __future__ import annotations

from functools import lru_cache

import torch

from engine import LLMEngine, SamplingParams
from engine.model.shared import get_shared_model
from engine.model.loader import load_model
from engine.studies.quant_tradeoff import AGREEMENT_LONG_INDEX, agreement_prompts
from engine.core.trace import StepTrace

# The prompts live in presets/parity_prompts.json (one list for these tests and the engine's
# quantization trade-off, engine/studies/quant_tradeoff.py); LONG is the long one among them.
PROMPTS = list(agreement_prompts())
LONG = PROMPTS[AGREEMENT_LONG_INDEX]


def hf_from_weights(name: str, weights: dict[str, torch.Tensor]):
    """A Hugging Face ``LlamaForCausalLM`` with ``name``'s config and the given (HF-named) weights:
    the reference for every path, and for quantized, smoothed or pruned weights alike."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = load_model(name).config
    hf = LlamaForCausalLM(LlamaConfig(**config.to_hf()))
    hf.load_state_dict(weights, strict=not config.tie_word_embeddings)
    if config.tie_word_embeddings:
        hf.tie_weights()
    return hf.eval()


@lru_cache(maxsize=4)
def hf_model(name: str):
    """The Hugging Face reference model built from the very same weights as the engine."""
    return hf_from_weights(name, load_model(name).weights)


def hf_generate(hf, tokenizer, eos: list[int], prompt: str, max_tokens: int) -> tuple[int, ...]:
    """``hf.generate`` greedy, batch 1, no padding, an explicit attention mask: the new tokens."""
    ids = torch.tensor([tokenizer(prompt, add_special_tokens=False).input_ids])
    with torch.inference_mode():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                          do_sample=False, eos_token_id=eos, pad_token_id=eos[0])
    return tuple(out[0, ids.shape[1]:].tolist())


def hf_outputs(hf, shared, prompts: list[str], max_tokens: int) -> list[tuple[int, ...]]:
    """``hf_generate`` for each prompt, stopping at the engine's EOS ids (the model's and the
    tokenizer's): the reference of a run over ``shared``'s weights as ``hf`` holds them."""
    tok = shared.tokenizer
    eos = sorted(set(shared.model.config.eos_token_ids) | {tok.eos_token_id})
    return [hf_generate(hf, tok, eos, prompt, max_tokens) for prompt in prompts]


@lru_cache(maxsize=256)
def hf_greedy(name: str, prompt: str, max_tokens: int) -> tuple[int, ...]:
    """Hugging Face ``generate`` (greedy, batch 1, no padding): the oracle for every path."""
    shared = get_shared_model(name)
    eos = sorted(set(shared.model.config.eos_token_ids) | {shared.tokenizer.eos_token_id})
    return hf_generate(hf_model(name), shared.tokenizer, eos, prompt, max_tokens)


def run_engine(engine: LLMEngine, prompts: list[str], max_tokens: int,
               arrival_steps: list[int] | None = None,
               priorities: list[int] | None = None) -> tuple[list[tuple[int, ...]], list[StepTrace]]:
    """Greedy run to completion, checking every manager's integrity after every step."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    arrivals = arrival_steps or [None] * len(prompts)
    ranks = priorities or [0] * len(prompts)
    ids = [engine.add_request(p, params, arrival_step=a, priority=r) for p, a, r in zip(prompts, arrivals, ranks)]
    traces = []
    for _ in range(10_000):
        if not engine.has_unfinished_requests():
            break
        traces.append(engine.step())
        engine.check_integrity()
    assert not engine.has_unfinished_requests(), "engine did not finish"
    return [engine.get_output(i).outputs[0].token_ids for i in ids], traces


def assert_matches_hf(name: str, prompts: list[str], outputs: list[tuple[int, ...]], max_tokens: int) -> None:
    for prompt, got in zip(prompts, outputs):
        want = hf_greedy(name, prompt, max_tokens)
        assert got == want, f"prompt {prompt[:40]!r}: engine {got} != HF {want}"
