"""The pure core of speculative decoding (issue #10): exact rejection sampling, the n-gram
(prompt-lookup) proposer, the sampling transform applied to draft and target alike, and the
cost model of the page. Functions of tensors and token lists only; no engine state.

Rejection sampling (Leviathan et al. 2023; Chen et al. 2023; reference/engine.md 6.5): given
draft tokens x_1..x_k with the draft's distributions q_1..q_k and the target's p_1..p_{k+1}
from ONE target forward over [last token, x_1..x_k]:

    for i in 1..k:  accept x_i with probability min(1, p_i(x_i) / q_i(x_i))
                    (never when q_i(x_i) == 0: the drafter could not have sampled x_i)
                    at the first rejection emit one "recovered" token from
                    normalize(max(0, p_i - q_i)) and stop
    all k accepted: emit a "bonus" token from p_{k+1}

Every emitted token then has exactly the target's distribution, so sampled speculative
decoding is distributed as plain sampling from the target (it is not the same random stream:
a seeded request draws different numbers with and without speculation).

The speculative config itself (SpeculativeConfig, parse_speculative_config) is in
engine/core/config.py, which stays torch-free.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from engine.core.config import MAX_SPECULATIVE_TOKENS, SamplingParams
from engine.core.sampling import sampling_probs

DraftOutcome = Literal["accepted", "rejected", "unverified"]
FinalKind = Literal["bonus", "recovered"]
RESIDUAL_TOP = 5  # entries of the residual distribution kept at a rejection (the page's hover)
_PROB_TOLERANCE = 1e-3  # |row sum - 1| allowed in target_probs / draft_probs (float rounding)


@dataclass(frozen=True)
class RejectionResult:
    """What one verification of k draft tokens emitted, and why.

    token_ids     1..k+1 emitted tokens: the accepted drafts, then one final token
    num_accepted  drafts accepted (0..k); len(token_ids) == num_accepted + 1
    outcomes      per draft (k): "accepted", "rejected" (the first rejection only) or
                  "unverified" (drafts after the rejection: their p is conditioned on a rejected
                  prefix, so they are discarded untested)
    final_kind    "bonus" (all k accepted; drawn from p_{k+1}) or "recovered" (drawn from the
                  residual at the rejected position; in greedy mode the target's argmax there)
    draft_p       p_i(x_i) per draft (k), after the sampling transform
    draft_q       q_i(x_i) per draft (k); 1.0 for drafts without probabilities (n-gram)
    accept_prob   min(1, p_i(x_i) / q_i(x_i)) per draft (k), 0 where q_i(x_i) == 0; in greedy
                  mode 1.0 where x_i is the argmax of p_i, else 0.0
    residual_top  at a sampled rejection: the normalised residual's top RESIDUAL_TOP entries as
                  (token, prob), largest first, lower id first among equals (fewer when its
                  support is smaller); else ()
    """

    token_ids: tuple[int, ...]
    num_accepted: int
    outcomes: tuple[DraftOutcome, ...]
    final_kind: FinalKind
    draft_p: tuple[float, ...]
    draft_q: tuple[float, ...]
    accept_prob: tuple[float, ...]
    residual_top: tuple[tuple[int, float], ...]

    @property
    def num_draft_tokens(self) -> int:
        return len(self.outcomes)

    @property
    def rejected_at(self) -> int | None:
        """Index of the rejected draft, None when all were accepted."""
        return None if self.final_kind == "bonus" else self.num_accepted

    @property
    def token_kinds(self) -> tuple[str, ...]:
        """Per emitted token: "accepted" ... then "bonus" or "recovered"."""
        return ("accepted",) * self.num_accepted + (self.final_kind,)


def _check_probs(name: str, probs: torch.Tensor, rows: int, vocab: int | None) -> None:
    """probs [rows, V]: floating, finite, >= 0, rows summing to 1; ValueError naming ``name``."""
    if not isinstance(probs, torch.Tensor):
        raise ValueError(f"{name}: must be a torch.Tensor, got {type(probs).__name__}")
    if probs.dim() != 2 or probs.shape[0] != rows or (vocab is not None and probs.shape[1] != vocab):
        want = f"[{rows}, {'V' if vocab is None else vocab}]"
        raise ValueError(f"{name}: must have shape {want}, got {list(probs.shape)}")
    if probs.shape[1] == 0:
        raise ValueError(f"{name}: the vocabulary dimension is empty")
    if not probs.is_floating_point():
        raise ValueError(f"{name}: must be a floating-point tensor, got {probs.dtype}")
    if rows == 0:
        return
    # two passes: min() is NaN when any entry is; with every entry >= 0, a row sum is finite
    # exactly when the row is (a NaN or +inf entry makes it NaN or inf)
    if not bool(probs.min() >= 0):
        raise ValueError(f"{name}: must be finite and >= 0")
    sums = probs.sum(-1, dtype=torch.float64)  # [rows]
    if not bool(torch.isfinite(sums).all()):
        raise ValueError(f"{name}: must be finite and >= 0")
    if bool(((sums - 1).abs() > _PROB_TOLERANCE).any()):
        raise ValueError(f"{name}: every row must sum to 1 (probabilities, not logits)")


def _validate(target_probs: torch.Tensor, draft_probs: torch.Tensor | None,
              draft_token_ids: torch.Tensor | Sequence[int]) -> tuple[torch.Tensor, int, int]:
    """-> (draft ids [k] int64, k, V); every bad shape or value a ValueError naming the argument."""
    if isinstance(draft_token_ids, torch.Tensor):
        if draft_token_ids.dim() != 1 or draft_token_ids.is_floating_point() or draft_token_ids.is_complex():
            raise ValueError(f"draft_token_ids: must be a 1-D integer tensor [k], got "
                             f"{draft_token_ids.dtype} {list(draft_token_ids.shape)}")
        ids = draft_token_ids.to(torch.int64)
    else:
        if isinstance(draft_token_ids, (str, bytes)) or any(
                isinstance(t, bool) or not isinstance(t, int) for t in draft_token_ids):
            raise ValueError("draft_token_ids: must be a sequence of ints or a 1-D integer tensor")
        ids = torch.tensor(list(draft_token_ids), dtype=torch.int64)
    k = int(ids.shape[0])
    if k > MAX_SPECULATIVE_TOKENS:
        raise ValueError(f"draft_token_ids: at most {MAX_SPECULATIVE_TOKENS} drafts, got {k}")
    if not isinstance(target_probs, torch.Tensor) or target_probs.dim() != 2:
        got = list(target_probs.shape) if isinstance(target_probs, torch.Tensor) else type(target_probs).__name__
        raise ValueError(f"target_probs: must have shape [k + 1, V] = [{k + 1}, V], got {got}")
    _check_probs("target_probs", target_probs, k + 1, None)
    vocab = int(target_probs.shape[1])
    if draft_probs is not None:
        _check_probs("draft_probs", draft_probs, k, vocab)
    if k and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise ValueError(f"draft_token_ids: every id must be in 0 .. {vocab - 1}, got {ids.tolist()}")
    return ids, k, vocab


def _draw(k: int, vocab: int, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The random numbers of one verification, always the same count for (k, V) so a seeded
    request's stream does not depend on the outcome: u [k] ~ U[0, 1) for the accept tests and
    e [V] ~ Exp(1) for the final token's race; both float64 (an exponential of exactly 0, which
    would let its token win regardless of probability, has chance 2^-53 per draw)."""
    u = torch.rand(k, generator=generator, dtype=torch.float64)
    e = torch.empty(vocab, dtype=torch.float64).exponential_(generator=generator)
    return u, e


def _rejection_core(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_token_ids: torch.Tensor,
                    u: torch.Tensor, e: torch.Tensor, greedy: bool
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rule, vectorised over B independent verifications (rejection_sample calls it with B = 1).

    target_probs [B, k+1, V], draft_probs [B, k, V] (one-hot rows for n-gram drafts),
    draft_token_ids [B, k] int64, u [B, k] float64, e [B, V] float64 (unused when greedy)
    -> tokens [B, k+1] int64 (-1 after the final token), num_accepted [B] int64,
       final distribution [B, V] (the normalised residual or p_{k+1}; p_j itself when greedy),
       accept_prob [B, k] float64.

    Accept: u < p/q, tested as u * q < p in float64 with q > 0, so p == 0 never accepts and
    p >= q always does (u < 1). Sampling from the unnormalised final vector r: the exponential
    race argmax_v r_v / e_v, e_v ~ Exp(1) i.i.d. (e_v / r_v ~ Exp(r_v); the smallest is v with
    probability r_v / sum r), with r_v == 0 excluded. Residual all zeros: max(0, p - q) == 0
    means p <= q everywhere and, both summing to 1, p == q; then a rejection happens only for a
    draft with q(x) == p(x) == 0 or by rounding, and the residual's weight in the output law,
    1 - sum_v min(p_v, q_v) = sum_v max(0, p_v - q_v), is 0, so any fallback keeps the output
    exact: we draw from p_j (what the target alone would do).
    """
    batch, k1, vocab = target_probs.shape
    k = k1 - 1
    rows = torch.arange(batch)
    index = draft_token_ids.unsqueeze(-1)  # [B, k, 1]
    p_x = target_probs[:, :k].gather(2, index).squeeze(-1).double()  # [B, k]
    q_x = draft_probs.gather(2, index).squeeze(-1).double()  # [B, k]
    if greedy:
        accepted = draft_token_ids == target_probs[:, :k].argmax(-1)  # [B, k]
        accept_prob = accepted.double()
    else:
        accepted = (q_x > 0) & (u * q_x < p_x)
        accept_prob = torch.where(q_x > 0, (p_x / q_x.clamp_min(1e-300)).clamp(max=1.0), torch.zeros_like(p_x))
    num_accepted = accepted.long().cumprod(-1).sum(-1)  # [B]: drafts before the first rejection
    p_j = target_probs[rows, num_accepted].double()  # [B, V]: p at the final position
    if greedy:
        final = p_j.argmax(-1)  # lowest index among ties, as torch.argmax and engine/core/sampling.py
        dist = p_j
    else:
        if k:  # q at the final position; q_{k+1} = 0 (all accepted: the bonus comes from p)
            q_j = draft_probs[rows, num_accepted.clamp(max=k - 1)].double()
            q_j = q_j * (num_accepted < k).double()[:, None]
            dist = (p_j - q_j).clamp_min(0.0)  # the residual
        else:
            dist = p_j
        empty = dist.sum(-1, keepdim=True) == 0
        dist = torch.where(empty, p_j, dist)
        dist = dist / dist.sum(-1, keepdim=True)
        score = torch.where(dist > 0, dist / e, torch.full_like(dist, -1.0))
        final = score.argmax(-1)  # [B]
    pos = torch.arange(k + 1).expand(batch, k + 1)
    drafts = torch.cat([draft_token_ids, draft_token_ids.new_full((batch, 1), -1)], dim=1)
    tokens = torch.where(pos < num_accepted[:, None], drafts,
                         torch.where(pos == num_accepted[:, None], final[:, None], torch.full_like(drafts, -1)))
    return tokens, num_accepted, dist, accept_prob


def one_hot_draft_probs(draft_token_ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """draft_token_ids [..., k] -> q [..., k, V] one-hot on each draft (n-gram drafts, as vLLM)."""
    q = torch.zeros(*draft_token_ids.shape, vocab, dtype=torch.float32)
    return q.scatter_(-1, draft_token_ids.unsqueeze(-1).to(torch.int64), 1.0)


def rejection_sample(target_probs: torch.Tensor, draft_probs: torch.Tensor | None,
                     draft_token_ids: torch.Tensor | Sequence[int], generator: torch.Generator | None,
                     greedy: bool = False) -> RejectionResult:
    """Verify k draft tokens against the target; exact rejection sampling.

    target_probs [k+1, V]: the target's p_1..p_{k+1}; draft_probs [k, V] the draft's q_1..q_k,
    both after the SAME transform (probs_from_logits); draft_token_ids [k].

    Rule (sampled): accept x_i with probability min(1, p_i(x_i) / q_i(x_i)); q_i(x_i) == 0
    rejects. At the first rejection emit a "recovered" token from normalize(max(0, p_i - q_i))
    and stop; if all k pass, emit a "bonus" token from p_{k+1}. k == 0: one token from p_1.
    draft_probs None (n-gram drafts): q_i is one-hot at x_i, so x_i is accepted with
    probability p_i(x_i) and the residual is p_i with x_i zeroed (vLLM's rule).
    Rule (greedy=True): accept while x_i == argmax p_i (lowest index among ties, as
    torch.argmax and the engine's greedy sampler); the first mismatch emits argmax p_i; all
    match -> argmax p_{k+1}. q is ignored and nothing is drawn.

    Randomness: every draw comes from ``generator`` (None: torch's global one), a fixed count
    per call (k uniforms, V exponentials), so a seeded call replays exactly. The final token is
    drawn by the exponential race argmax(r / E), E ~ Exp(1) (vLLM's kernel, reference 6.5),
    not torch.multinomial: the same few tensor ops serve one call and the vectorised core.
    Residual all zeros (p == q): measure zero, drawn from p; see _rejection_core for why exact.

    Bad shapes, non-probability rows or out-of-range ids: ValueError naming the argument.
    """
    ids, k, vocab = _validate(target_probs, draft_probs, draft_token_ids)
    q = one_hot_draft_probs(ids, vocab) if draft_probs is None else draft_probs
    if greedy:
        u, e = torch.zeros(k, dtype=torch.float64), torch.ones(vocab, dtype=torch.float64)
    else:
        u, e = _draw(k, vocab, generator)
    tokens, num_acc, dist, accept_prob = _rejection_core(
        target_probs[None], q[None], ids[None], u[None], e[None], greedy)
    n = int(num_acc[0])
    rejected = n < k
    outcomes: tuple[DraftOutcome, ...] = tuple(
        "accepted" if i < n else "rejected" if i == n else "unverified" for i in range(k))
    top: tuple[tuple[int, float], ...] = ()
    if rejected and not greedy:
        res = dist[0]
        values, order = torch.topk(res, min(RESIDUAL_TOP, vocab))
        top = tuple(sorted(((int(t), float(v)) for t, v in zip(order.tolist(), values.tolist()) if v > 0),
                           key=lambda tv: (-tv[1], tv[0])))
    p_x = target_probs[:k].gather(1, ids[:, None]).squeeze(1).double() if k else torch.zeros(0)
    q_x = q.gather(1, ids[:, None]).squeeze(1).double() if k else torch.zeros(0)
    return RejectionResult(
        token_ids=tuple(int(t) for t in tokens[0, :n + 1].tolist()),
        num_accepted=n,
        outcomes=outcomes,
        final_kind="recovered" if rejected else "bonus",
        draft_p=tuple(float(v) for v in p_x.tolist()),
        draft_q=tuple(float(v) for v in q_x.tolist()),
        accept_prob=tuple(float(v) for v in accept_prob[0].tolist()),
        residual_top=top,
    )


def probs_from_logits(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """logits [n, V] -> probs [n, V] float32: the engine sampler's own transform, row by row.

    temperature >= SAMPLING_EPS: softmax(apply_top_k_top_p(logits / T)) exactly as
    engine/core/sampling.py samples (sampling_probs). Greedy (T < SAMPLING_EPS): one-hot at
    argmax(logits), the T -> 0 limit with the greedy sampler's tie rule (lowest index); taken on
    the logits, not on a softmax that could round two close logits to one probability.
    The knobs are validated by SamplingParams (ValueError naming temperature / top_k / top_p).
    """
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.shape[1] == 0:
        got = list(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"logits: must have shape [n, V] with V >= 1, got {got}")
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    logits = logits.float()
    if params.greedy:
        return one_hot_draft_probs(logits.argmax(-1), logits.shape[1])
    if logits.shape[0] == 0:
        return logits.clone()
    return torch.stack([sampling_probs(row, params) for row in logits])


def ngram_propose(token_ids: Sequence[int], k: int, prompt_lookup_min: int = 2,
                  prompt_lookup_max: int = 4) -> list[int]:
    """Prompt-lookup drafts (vLLM's NgramProposer rule): up to k tokens that followed an earlier
    occurrence of the context's suffix.

    Rule: let N be the largest n in [prompt_lookup_min, prompt_lookup_max] such that the last n
    tokens also occur as a window token_ids[s:s+n] with s + n <= len - 1 (at least one token
    follows it; the window may overlap the suffix but is never the suffix itself). Among the
    occurrences of that N-gram take the EARLIEST (smallest s), as vLLM's
    ``_find_longest_matched_ngram_and_propose_tokens`` does, and propose token_ids[s+N : s+N+k]
    (fewer when the context ends first). No such n: []. k == 0: [].

    Complexity: O(len + c * n_max) per call, c = earlier occurrences of the last token: the
    candidate end positions are found with list.index (a C scan), each is extended backwards
    up to n_max, and the scan stops at the first occurrence of full length n_max.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k: must be an integer >= 0, got {k!r}")
    for name, value in (("prompt_lookup_min", prompt_lookup_min), ("prompt_lookup_max", prompt_lookup_max)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
    if prompt_lookup_min > prompt_lookup_max:
        raise ValueError(f"prompt_lookup_min: must be <= prompt_lookup_max ({prompt_lookup_max}), "
                         f"got {prompt_lookup_min}")
    tokens = list(token_ids)
    length = len(tokens)
    if k == 0 or length < prompt_lookup_min + 1:
        return []
    last = tokens[-1]
    best_n, best_end = 0, -1
    end = -1
    while True:  # every end position j <= length - 2 holding the last token, ascending
        try:
            end = tokens.index(last, end + 1, length - 1)
        except ValueError:
            break
        limit = min(prompt_lookup_max, end + 1)
        n = 1
        while n < limit and tokens[end - n] == tokens[length - 1 - n]:
            n += 1
        if n > best_n:  # strictly longer: ties keep the earliest occurrence
            best_n, best_end = n, end
            if n == prompt_lookup_max:
                break
    if best_n < prompt_lookup_min:
        return []
    return tokens[best_end + 1:best_end + 1 + k]
