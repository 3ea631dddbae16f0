"""Issue #22 item 4: the scheduling policies (``scheduling_policy``) and the prefill/decode balance
(``prefill_schedule``) in the real scheduler, on the real engine.

Each policy's property against FCFS on a workload built to show it (TTFT in steps: first_token_step
- arrival_step), greedy outputs equal to Hugging Face's under every policy and both schedules, bad
knobs and priorities refused naming the field, and a failed step leaving the policy's state as it
was. Every run checks every manager's integrity after every step.
"""
from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

import pytest

from engine.core.config import MAX_PRIORITY, MIN_PRIORITY, PREFILL_SCHEDULES, SCHEDULING_POLICIES, SamplingParams
from engine.core.policies import POLICIES
from engine.core.policies import mlfq
from engine.core.request import Request
from engine.serving.engine import LLMEngine
from engine.serving.llm import LLM
from tests.parity import PROMPTS, assert_matches_hf, run_engine

pytestmark = pytest.mark.usefixtures("torch_single_thread")


@dataclass(frozen=True)
class Run:
    ttft: tuple[int, ...]  # steps from arrival to first token, in the order the requests were added
    finished: tuple[int, ...]  # the step each finished at
    preemptions: int
    hit_rate: float  # prompt tokens served from the prefix cache / prompt tokens
    outputs: tuple[tuple[int, ...], ...]


def run(tiny, policy: str, prompts: list[list[int]], arrivals: list[int] | None = None,
        priorities: list[int] | None = None, max_tokens: int = 4, **knobs: object) -> Run:
    engine = LLMEngine(tiny, scheduling_policy=policy, **knobs)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    ids = [engine.add_request(p, params, arrival_step=None if arrivals is None else arrivals[i],
                              priority=0 if priorities is None else priorities[i]) for i, p in enumerate(prompts)]
    preemptions = 0
    for _ in range(2_000):
        if not engine.has_unfinished_requests():
            break
        preemptions += len(engine.step().preempted)
        engine.check_integrity()
    assert not engine.has_unfinished_requests()
    rs = [engine.requests[i] for i in ids]
    assert all(r.first_token_step is not None and r.finished_step is not None for r in rs)
    return Run(tuple(r.first_token_step - r.arrival_step for r in rs),  # type: ignore[operator]
               tuple(r.finished_step for r in rs), preemptions,  # type: ignore[misc]
               sum(r.num_cached_tokens or 0 for r in rs) / sum(r.num_prompt_tokens for r in rs),
               tuple(engine.get_output(i).outputs[0].token_ids for i in ids))


def tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 250) for _ in range(n)]


# -- the registry -------------------------------------------------------------------------------


def test_every_policy_is_a_module_stating_its_rule_source_and_invariant() -> None:
    assert tuple(POLICIES) == SCHEDULING_POLICIES
    for name, cls in POLICIES.items():
        doc = __import__(cls.__module__, fromlist=["_"]).__doc__ or ""
        assert cls.name == name and "Rule" in doc and "Source" in doc and "Invariant" in doc, name


def test_mlfq_skip_join_and_demotion() -> None:
    """Skip-join: the first level whose quantum (8 x 2^i tokens) covers the prompt; one level down
    per quantum of generated tokens; the last level keeps it."""
    assert [mlfq.join_level(n) for n in (1, 8, 9, 16, 17, 100, 10_000)] == [0, 0, 1, 1, 2, 4, mlfq.LEVELS - 1]
    r = Request("r", None, [1] * 4, SamplingParams())
    levels = []
    for _ in range(8 + 16 + 32):
        levels.append(mlfq.level(r))
        r.output_token_ids.append(1)
    assert levels == [0] * 8 + [1] * 16 + [2] * 32 and mlfq.level(r) == 3
    r.output_token_ids.extend([1] * 10_000)
    assert mlfq.level(r) == mlfq.LEVELS - 1


# -- each policy's property against FCFS ---------------------------------------------------------


def test_sjf_lowers_mean_ttft_on_a_bimodal_workload(tiny) -> None:
    """Long (60-token) and short (4-token) prompts alternate, all arriving at once, budget 16: FCFS
    makes every short prompt wait behind the long one before it; SJF admits the short ones first."""
    prompts = [tokens(i, 60 if i % 2 == 0 else 4) for i in range(8)]
    knobs = {"max_num_batched_tokens": 16, "block_size": 4, "num_blocks": 256}
    fcfs, sjf = (run(tiny, p, prompts, **knobs) for p in ("fcfs", "sjf"))
    assert statistics.mean(sjf.ttft) < statistics.mean(fcfs.ttft)
    shorts = slice(1, None, 2)
    assert max(sjf.ttft[shorts]) < min(fcfs.ttft[shorts][1:])  # every short prompt after the first gains
    assert sjf.outputs == fcfs.outputs


@pytest.mark.parametrize(("max_num_seqs", "num_blocks"), [(2, 256), (4, 32)], ids=["seats", "blocks"])
def test_priority_serves_a_late_high_priority_request_first_preempting(tiny, max_num_seqs, num_blocks) -> None:
    """Four priority-0 requests fill the seats (or the pool); a priority -1 request arrives at
    step 3. FCFS makes it wait for a running one to finish; "priority" preempts the worst running
    request (the latest-arrived priority 0) and finishes it earlier."""
    prompts = [tokens(i, 24) for i in range(4)] + [[9] * 10]
    args = {"arrivals": [0, 0, 0, 0, 3], "priorities": [0, 0, 0, 0, -1], "max_tokens": 16,
            "max_num_batched_tokens": 64, "block_size": 4, "num_blocks": num_blocks, "max_num_seqs": max_num_seqs}
    fcfs, prio = run(tiny, "fcfs", prompts, **args), run(tiny, "priority", prompts, **args)
    assert prio.finished[4] < fcfs.finished[4]
    assert prio.ttft[4] <= 1 < fcfs.ttft[4]  # preempt at arrival, admitted the next step
    assert prio.preemptions >= 1
    assert prio.outputs == fcfs.outputs  # recompute preemption changes no greedy token


def test_a_non_zero_priority_is_ignored_by_the_other_policies(tiny) -> None:
    """Documented choice (vLLM refuses it): one workload with priorities runs under every policy."""
    prompts = [tokens(i, 24) for i in range(4)] + [[9] * 10]
    args = {"arrivals": [0, 0, 0, 0, 3], "max_tokens": 8, "max_num_seqs": 2}
    for policy in ("fcfs", "sjf", "lpm", "mlfq"):
        assert run(tiny, policy, prompts, priorities=[3, -2, 0, 7, -1], **args) == run(tiny, policy, prompts, **args)


def test_lpm_raises_the_prefix_hit_rate_on_interleaved_groups(tiny) -> None:
    """Three 32-token prefixes, prompts A B C A B C ..., two at a time, a pool too small to keep
    all three prefixes: FCFS evicts each prefix before its group comes back (no hits); LPM runs a
    group's requests while its prefix is cached."""
    groups = [tokens(100 + g, 32) for g in range(3)]
    prompts = [groups[i % 3] + tokens(200 + i, 4) for i in range(12)]
    knobs = {"max_tokens": 2, "max_num_batched_tokens": 64, "block_size": 4, "num_blocks": 24, "max_num_seqs": 2}
    fcfs, lpm = run(tiny, "fcfs", prompts, **knobs), run(tiny, "lpm", prompts, **knobs)
    assert lpm.hit_rate > fcfs.hit_rate + 0.3
    assert lpm.outputs == fcfs.outputs
    # Without prefix caching LPM is FCFS, step for step.
    off = {**knobs, "enable_prefix_caching": False}
    assert run(tiny, "lpm", prompts, **off) == run(tiny, "fcfs", prompts, **off)


def test_mlfq_gives_a_short_late_request_its_first_token_earlier(tiny) -> None:
    """Four 48-token prompts at step 0, a 4-token one at step 2, budget 16: FCFS queues it behind
    the long ones still waiting; MLFQ's skip-join puts it in level 0, ahead of them."""
    prompts = [tokens(i, 48) for i in range(4)] + [[5, 6, 7, 8]]
    args = {"arrivals": [0, 0, 0, 0, 2], "max_tokens": 8, "max_num_batched_tokens": 16, "block_size": 4,
            "num_blocks": 256}
    fcfs, m = run(tiny, "fcfs", prompts, **args), run(tiny, "mlfq", prompts, **args)
    assert m.ttft[4] < fcfs.ttft[4] and m.finished[4] < fcfs.finished[4]
    assert m.outputs == fcfs.outputs


# -- the prefill/decode balance ------------------------------------------------------------------


def test_prefill_first_stalls_decodes_while_prompts_run(tiny) -> None:
    """"prefill_first": no step mixes prompt chunks and decodes; "mixed" does (stall-free)."""
    prompts = [tokens(i, 20) for i in range(6)]
    traces = {}
    for schedule in PREFILL_SCHEDULES:
        engine = LLMEngine(tiny, prefill_schedule=schedule, max_num_batched_tokens=24, block_size=4)
        params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
        for i, p in enumerate(prompts):
            engine.add_request(p, params, arrival_step=2 * i)
        steps = []
        while engine.has_unfinished_requests():
            steps.append(engine.step())
            engine.check_integrity()
        traces[schedule] = steps
    assert any(t.num_prefill_tokens and t.num_decode_tokens for t in traces["mixed"])
    assert not any(t.num_prefill_tokens and t.num_decode_tokens for t in traces["prefill_first"])
    # Decodes stalled: the last request's first token comes sooner, the first's last token later.
    assert max(t.step for t in traces["prefill_first"]) >= max(t.step for t in traces["mixed"])


def test_prefill_first_cannot_livelock_on_a_recompute(tiny) -> None:
    """Regression (found by a randomized run): a pool of 8 one-token blocks, budget 1. Request "1"
    is admitted while "0" decodes; prompt-only steps stall "0" while "1" prefills, "1" runs out of
    blocks and preempts itself, and was admitted again the next step, prompt-only: "0" never got
    another token. A recompute now goes the mixed way, after the running requests."""
    engine = LLMEngine(tiny, block_size=1, num_blocks=8, max_num_batched_tokens=1, max_num_seqs=2,
                       enable_prefix_caching=False, prefill_schedule="prefill_first")
    for length, max_tokens, arrival in ((5, 9, 1), (7, 12, 2), (7, 11, 0)):
        engine.add_request(tokens(length, length), SamplingParams(temperature=0, max_tokens=max_tokens),
                           arrival_step=arrival)
    for _ in range(400):
        if not engine.has_unfinished_requests():
            break
        trace = engine.step()
        engine.check_integrity()
        assert engine.no_progress_reason(trace) is None
    assert not engine.has_unfinished_requests()


# -- greedy outputs ------------------------------------------------------------------------------

CASES = [("tiny-random", p, s) for p in SCHEDULING_POLICIES for s in PREFILL_SCHEDULES] + [
    ("smollm2-135m", "priority", "prefill_first")]


@pytest.mark.parametrize(("name", "policy", "schedule"), CASES)
def test_greedy_outputs_equal_hf_under_every_policy(name: str, policy: str, schedule: str) -> None:
    """A pool small enough to preempt, mixed priorities and arrivals: the tokens are Hugging Face's."""
    tiny = name == "tiny-random"
    prompts = (PROMPTS[:4] + PROMPTS[5:7])[:6 if tiny else 3]  # PROMPTS[4] is the long one
    max_tokens = 12 if tiny else 8  # SmolLM2 once, short: its HF reference is most of this file's time
    # SmolLM2's tokens are ~4 characters (tiny-random's one byte): a smaller pool to preempt.
    engine = LLMEngine(name, scheduling_policy=policy, prefill_schedule=schedule, block_size=4,
                       num_blocks=24 if tiny else 6, max_num_batched_tokens=32, max_num_seqs=4)
    outputs, traces = run_engine(engine, prompts, max_tokens, arrival_steps=[0, 0, 1, 2, 3, 3][:len(prompts)],
                                 priorities=[2, 1, 0, -1, 3, -2][:len(prompts)])
    assert sum(len(t.preempted) for t in traces) > 0, "the small pool never forced a preemption"
    assert_matches_hf(name, prompts, outputs, max_tokens)


# -- bad input and rollback ----------------------------------------------------------------------


@pytest.mark.parametrize(("knob", "value"), [("scheduling_policy", "lifo"), ("scheduling_policy", None),
                                             ("scheduling_policy", "FCFS"), ("prefill_schedule", "decode_first"),
                                             ("prefill_schedule", 1)])
def test_bad_knobs_name_the_field(tiny, knob, value) -> None:
    with pytest.raises(ValueError, match=rf"^{knob}: must be one of"):
        LLMEngine(tiny, **{knob: value})


@pytest.mark.parametrize("priority", ["1", 1.0, True, None, MAX_PRIORITY + 1, MIN_PRIORITY - 1, 10 ** 30])
def test_a_bad_priority_is_refused_naming_it_and_adds_nothing(priority) -> None:
    llm = LLM("tiny-random", scheduling_policy="priority")
    engine = llm.llm_engine
    with pytest.raises(ValueError, match=r"^priority: must be an integer"):
        engine.add_request("hello", priority=priority)
    assert not engine.requests
    with pytest.raises(ValueError, match=r"^priority: "):
        llm.generate(["a", "b"], priority=[0, priority])
    with pytest.raises(ValueError, match=r"^priority: one per prompt"):
        llm.generate(["a", "b"], priority=[0])
    assert not engine.requests
    for good in (MIN_PRIORITY, MAX_PRIORITY):
        engine.add_request("hello", SamplingParams(max_tokens=1), priority=good)


@pytest.mark.parametrize("policy", SCHEDULING_POLICIES)
def test_a_failed_step_leaves_the_policy_state_as_it_was(tiny, monkeypatch, policy) -> None:
    """A step that raises mid-way (in the forward, after scheduling) puts back the queues, their
    order, every request's arrival order and rank, and the scheduler's arrival count; the run then
    finishes exactly as one that never failed."""
    prompts = [tokens(i, 20 + 8 * (i % 3)) for i in range(6)]
    knobs = {"scheduling_policy": policy, "block_size": 4, "num_blocks": 24, "max_num_batched_tokens": 16,
             "max_num_seqs": 3}
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)

    def fresh() -> LLMEngine:
        engine = LLMEngine(tiny, **knobs)
        for i, p in enumerate(prompts):
            engine.add_request(p, params, request_id=f"r{i}", arrival_step=i // 2, priority=-(i % 3))
        return engine

    clean = fresh()
    while clean.has_unfinished_requests():
        clean.step()
    expected = {rid: clean.get_output(rid).outputs[0].token_ids for rid in clean.requests}

    def state(engine: LLMEngine) -> tuple:
        s = engine.scheduler
        rank = getattr(s.policy, "rank", lambda r: ())
        return ([r.request_id for r in s.waiting], [r.request_id for r in s.running], s._arrivals,
                {rid: (r.arrival_seq, r.priority, rank(r), mlfq.level(r), r.num_computed_tokens,
                       len(r.output_token_ids)) for rid, r in engine.requests.items()},
                [r.request_id for r in s.policy.admission_order(s.waiting, engine.kv)],
                [r.request_id for r in s.policy.running_order(s.running)])

    engine = fresh()
    failed = 0
    while engine.has_unfinished_requests():
        if engine.step_count in (3, 9):  # an arrival step and a step deep in the preemptions
            before = state(engine)
            original = engine.runner.execute

            def fail_once(*args, **kwargs):
                monkeypatch.setattr(engine.runner, "execute", original)
                raise RuntimeError("boom")

            monkeypatch.setattr(engine.runner, "execute", fail_once)
            with pytest.raises(RuntimeError, match="boom"):
                engine.step()
            failed += 1
            assert state(engine) == before
            engine.check_integrity()
        engine.step()
        engine.check_integrity()
    assert failed == 2
    assert {rid: engine.get_output(rid).outputs[0].token_ids for rid in engine.requests} == expected
