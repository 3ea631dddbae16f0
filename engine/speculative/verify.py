"""Speculative decoding in the step loop: propose drafts before scheduling, verify them against
the target's logits after the forward.

    propose   for each running request in decode: up to k drafts (drafter.py / draft_runner.py)
              into its ``spec_token_ids``; the scheduler then schedules 1 + k tokens for it
    verify    the target's k + 1 rows -> rejection sampling (spec_decode.py) -> the emitted tokens
              and a ``SpecVerification`` record for the trace; the drafter rewinds to what was kept

``build_speculator`` turns ``speculative_config`` into a Speculator (checked against the target);
with none, the Speculator proposes nothing.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.core.checkpoint import StepCheckpoint
from engine.core.config import EngineConfig, SpeculativeConfig
from engine.core.request import Request
from engine.core.scheduler import ScheduledRequest
from engine.core.trace import DraftToken, ResidualToken, SpecVerification
from engine.model.llama import LlamaModel
from engine.model.runner import kv_cache_bytes_per_token
from engine.model.shared import SharedModel, get_shared_model
from engine.speculative.draft_runner import ModelDrafter
from engine.speculative.drafter import Draft, Drafter, NgramDrafter
from engine.speculative.spec_decode import probs_from_logits, rejection_sample

TOP_ALTERNATIVES = 3  # the target's top entries kept per draft position (StepTrace.spec)


@dataclass(frozen=True)
class Verified:
    """One request's verification: the tokens it emits (accepted drafts, then the bonus or
    recovered token), how many drafts were accepted, and the record for the trace."""

    request: Request
    token_ids: tuple[int, ...]
    num_accepted: int
    record: SpecVerification


@dataclass(frozen=True)
class VerifyFailed:
    """Verification failed for this request only (e.g. non-finite logits): it finishes with "error"."""

    request: Request
    reason: str


class Speculator:
    """The drafter of an engine (None: no speculation) and the two stages it takes part in."""

    def __init__(self, drafter: Drafter | None, num_speculative_tokens: int, max_model_len: int,
                 tokenizer: Any) -> None:
        self.drafter = drafter
        self.k_max = num_speculative_tokens
        self.max_model_len = max_model_len
        self.tokenizer = tokenizer

    def propose(self, running: Iterable[Request], cp: StepCheckpoint) -> Mapping[str, Draft]:
        """Before scheduling: up to k drafts for each running request in decode, into its
        ``spec_token_ids``. Rule: k is capped so that the request can emit all of them plus one
        token within max_tokens and the context (num_tokens + k < max_model_len). The
        generators of the drafted requests are saved first (a sampled draft draws from them)."""
        if self.drafter is None:
            return {}
        todo: list[tuple[Request, int]] = []
        for r in running:
            if r.spec_token_ids or r.num_computed_tokens != r.num_tokens - 1 or not r.output_token_ids:
                continue
            k = min(self.k_max, r.sampling_params.max_tokens - len(r.output_token_ids) - 1,
                    self.max_model_len - r.num_tokens - 1)
            if k > 0:
                todo.append((r, k))
        if not todo:
            return {}
        cp.save_generators(r for r, _ in todo)
        drafts = self.drafter.propose(todo)
        for r, _ in todo:
            draft = drafts.get(r.request_id)
            if draft is not None:
                r.spec_token_ids = list(draft.token_ids)
        return drafts

    def verify(self, s: ScheduledRequest, r: Request, rows: torch.Tensor, drafts: Mapping[str, Draft],
               cp: StepCheckpoint) -> Verified | VerifyFailed:
        """Verify one request's k drafts against the target's rows [k + 1, V] (the logits at its
        last token and at each draft). Greedy: accept while the draft is the argmax. Sampled:
        rejection sampling with p = the request's transform of the rows and q from the drafter
        (None: one-hot, n-gram), drawing from the request's generator. An error here (non-finite
        logits) fails only this request, as in plain sampling."""
        assert self.drafter is not None
        k = s.num_spec_tokens
        ids = r.spec_token_ids[:k]
        params = r.sampling_params
        cp.save_generators([r])
        try:
            if not bool(torch.isfinite(rows).all()):
                raise ValueError("the model produced non-finite logits (NaN or inf)")
            p = probs_from_logits(rows, params.temperature, params.top_k, params.top_p)  # [k+1, V]
            draft = drafts.get(r.request_id)
            q = None if params.greedy or draft is None or draft.probs is None else draft.probs[:k]
            result = rejection_sample(p, q, ids, r.generator, greedy=params.greedy)
        except Exception as e:  # noqa: BLE001 - attributed to this request, as sample_rows does
            return VerifyFailed(r, f"verification failed: {e}")
        r.num_draft_tokens += k
        r.num_accepted_tokens += result.num_accepted
        r.num_verify_steps += 1
        self.drafter.rewind(r, s.start + 1 + result.num_accepted)
        pieces = self.tokenizer.convert_ids_to_tokens(list(ids) + [t for t, _ in result.residual_top])
        top_p, top_ids = p[:k].topk(min(TOP_ALTERNATIVES, p.shape[-1]), dim=-1)  # [k, 3]: what the target wanted
        alternatives = [tuple(ResidualToken(int(t), text, _prob(float(v)))
                              for t, v, text in zip(row_ids.tolist(), row_p.tolist(),
                                                    self.tokenizer.convert_ids_to_tokens(row_ids.tolist())) if v > 0)
                        for row_ids, row_p in zip(top_ids, top_p)]
        record = SpecVerification(
            request_id=r.request_id, method=self.drafter.method,  # type: ignore[arg-type]
            drafts=tuple(DraftToken(t, text, _prob(pv), _prob(qv), outcome, alt)
                         for t, text, pv, qv, outcome, alt in
                         zip(ids, pieces, result.draft_p, result.draft_q, result.outcomes, alternatives)),
            emitted=result.token_ids, final_kind=result.final_kind,
            residual_top=tuple(ResidualToken(t, text, _prob(v))
                               for (t, v), text in zip(result.residual_top, pieces[k:])))
        return Verified(r, tuple(result.token_ids), result.num_accepted, record)

    def release(self, request_ids: Iterable[str]) -> None:
        """Drop the draft state of requests that finished or were preempted."""
        if self.drafter is not None:
            for rid in request_ids:
                self.drafter.release(rid)

    def checkpoint(self) -> object:
        return None if self.drafter is None else self.drafter.checkpoint()

    def restore(self, state: object) -> None:
        if self.drafter is not None:
            self.drafter.restore(state)

    def check_integrity(self, running: Sequence[Request], idle: bool) -> None:
        """The drafter's own invariants; with no request left (``idle``) it holds no block."""
        if self.drafter is None:
            return
        self.drafter.check_integrity(running)
        if idle and self.drafter.num_used_blocks:
            raise AssertionError("all requests finished but draft blocks are still in use")


def _prob(x: float) -> float:
    """A probability for a record: float rounding can put p a hair outside [0, 1]."""
    return min(1.0, max(0.0, float(x)))


def draft_target(spec: SpeculativeConfig, target: SharedModel) -> tuple[LlamaModel, int]:
    """The model a model drafter runs and how many of its layers: the target's first
    num_layers (early_exit) or the whole draft model (draft_model, shared process-wide)."""
    if spec.method == "early_exit":
        assert spec.num_layers is not None
        return target.model, spec.num_layers
    assert spec.model is not None
    try:
        model = get_shared_model(spec.model, quantization=spec.quantization).model
    except ValueError as e:  # "model: unknown model ..." is about the draft, not the target
        raise ValueError(f"speculative_config.{e}") from None
    return model, model.config.num_hidden_layers


def draft_kv_bytes_per_token(spec: SpeculativeConfig | None, target: SharedModel) -> int:
    """KV bytes per token of a model drafter's own pool (same num_blocks x block_size as the
    target's, in the draft model's compute dtype), counted in the memory check: 0 for none and
    ngram; else its layers' share of ``kv_cache_bytes_per_token`` (linear in the layers)."""
    if spec is None or spec.method == "ngram":
        return 0
    model, layers = draft_target(spec, target)
    return kv_cache_bytes_per_token(model.config, model.dtype) * layers // model.config.num_hidden_layers


def build_speculator(config: EngineConfig, target: SharedModel, max_model_len: int) -> Speculator:
    """The Speculator of ``config.speculative_config`` (engine/speculative/drafter.py,
    draft_runner.py), checked against the target: early_exit's num_layers below its layer count;
    a draft model's vocabulary equal to the target's (ValueError naming speculative_config.model
    otherwise). A model drafter's own KV pool has the target's num_blocks x block_size geometry
    (for its own layer count), counted by the memory check (``draft_kv_bytes_per_token``)."""
    spec = config.speculative_config
    if spec is None:
        return Speculator(None, 0, max_model_len, target.tokenizer)
    mc = target.model.config
    spec.check_against_model(mc.num_hidden_layers)
    drafter: Drafter
    if spec.method == "ngram":
        assert spec.prompt_lookup_min is not None and spec.prompt_lookup_max is not None
        drafter = NgramDrafter(spec.prompt_lookup_min, spec.prompt_lookup_max)
    else:
        model, layers = draft_target(spec, target)
        if model.config.vocab_size != mc.vocab_size:
            raise ValueError(f"speculative_config.model: the draft model {spec.model!r} has a vocabulary of "
                             f"{model.config.vocab_size} tokens, the target {target.name!r} has "
                             f"{mc.vocab_size}; a draft model must share the target's tokenizer")
        drafter = ModelDrafter(spec.method, model, layers, config.cache_config.num_blocks, config.cache_config.block_size)
    return Speculator(drafter, spec.num_speculative_tokens, max_model_len, target.tokenizer)
