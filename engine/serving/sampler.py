"""The "sample and verify" stage of a step: the retired batch's logits -> the tokens each
request emits.

    plain request      one row -> one token (engine/core/sampling.py sample_rows); a
                       parallel-sampling request forks its n sequences at its first sample,
                       and each samples from the same row
    verifying request  1 + k rows -> rejection sampling of its k drafts
                       (engine/speculative/verify.py) -> accepted drafts + one token

An error attributable to one request (its sampling, non-finite logits in its rows) fails that
request only: it is reported in ``failed`` and the step goes on.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from engine.core.batch import logits_rows
from engine.core.checkpoint import StepCheckpoint
from engine.core.request import Request
from engine.core.sampling import SamplingError, sample_rows
from engine.core.scheduler import Scheduler, SchedulerOutput
from engine.core.trace import SpecVerification
from engine.model import cpu_decode
from engine.serving.intake import RequestIntake
from engine.speculative.drafter import Draft
from engine.speculative.verify import Speculator, VerifyFailed


@dataclass(frozen=True)
class Samples:
    """What a step's batch emitted: tokens per request in order (a verifying request's accepted
    drafts, then its last token), the requests that failed (with why), the verifications, the
    drafts each verifying request accepted, and the sequences forked this step."""

    sampled: tuple[tuple[Request, int], ...] = ()
    failed: tuple[tuple[Request, str], ...] = ()
    spec: tuple[SpecVerification, ...] = ()
    num_accepted: Mapping[str, int] = field(default_factory=dict)
    forked: tuple[Request, ...] = ()


def sample_and_verify(output: SchedulerOutput, logits: torch.Tensor, intake: RequestIntake, scheduler: Scheduler,
                      speculator: Speculator, drafts: Mapping[str, Draft], cp: StepCheckpoint) -> Samples:
    """Plain sampling first (in scheduled order), then each verification (in scheduled order).
    Generators are saved in ``cp`` just before they are drawn from."""
    row_of = logits_rows(output)
    to_sample, rows, forked = _sampling_targets(output, row_of, intake, scheduler)
    cp.save_generators(to_sample)
    picked = logits if rows == list(range(logits.shape[0])) else logits[torch.tensor(rows, dtype=torch.long)]
    results = sample_rows(picked, [r.sampling_params for r in to_sample], [r.generator for r in to_sample],
                          cpu_decode.greedy_tokens)
    sampled: list[tuple[Request, int]] = []
    failed: list[tuple[Request, str]] = []
    for r, result in zip(to_sample, results):
        if isinstance(result, SamplingError):
            failed.append((r, str(result)))
        else:
            sampled.append((r, result))
    spec: list[SpecVerification] = []
    num_accepted: dict[str, int] = {}
    for s in output.scheduled:
        if s.num_spec_tokens:
            r, row = intake.requests[s.request_id], row_of[s.request_id]
            verdict = speculator.verify(s, r, logits[row:row + s.num_spec_tokens + 1], drafts, cp)
            if isinstance(verdict, VerifyFailed):
                failed.append((r, verdict.reason))
                continue
            sampled.extend((r, t) for t in verdict.token_ids)
            num_accepted[r.request_id] = verdict.num_accepted
            spec.append(verdict.record)
    return Samples(tuple(sampled), tuple(failed), tuple(spec), num_accepted, tuple(forked))


def _sampling_targets(output: SchedulerOutput, row_of: dict[str, int], intake: RequestIntake,
                      scheduler: Scheduler) -> tuple[list[Request], list[int], list[Request]]:
    """The sequences that sample one token this step (not the speculative verifications), the
    logits row each samples from, and the sequences forked here (a parallel-sampling request at
    its first sample forks, and its new sequences sample from its row)."""
    to_sample: list[Request] = []
    rows: list[int] = []
    forked: list[Request] = []
    for s in (s for s in output.scheduled if not s.is_prefill and not s.num_spec_tokens):
        r = intake.requests[s.request_id]
        group = [r]
        if r.needs_fork:
            children = scheduler.fork(r)
            intake.register_forks(children)
            forked += children
            group += children
        to_sample += group
        rows += [row_of[s.request_id]] * len(group)
    return to_sample, rows, forked
