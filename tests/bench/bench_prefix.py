"""Prefix caching on vs off (issue #8, must-show 4): prefill tokens computed and end-to-end
throughput for 16 requests behind one shared system prompt, both sides measured in this process.

Workload (exactly):
  * model smollm2-135m, fp32 weights and KV, greedy (temperature 0), ``ignore_eos`` so both
    sides generate exactly the same number of tokens;
  * a 400-token system prompt: the first 400 token ids of ``tests.parity.LONG`` repeated
    (``(LONG + " ") * 6``, tokenized once, cut to exactly 400 ids);
  * 16 distinct 20-token questions: 20-token windows cut from 16 different places of a
    different text (``QUESTION_SOURCE`` below, a paragraph about telescopes), each exactly 20
    ids; their first tokens are pairwise different, so no two questions share a leading part
    and nothing past the system prompt can be served from the cache;
  * prompt = system + question = 420 token ids, submitted as token ids; all 16 arrive at
    step 0; ``max_tokens = 16`` (short answers: the regime prefix caching is about) and, as an
    informational second case with no target, ``max_tokens = 64`` (decode weighs more there).
Engine knobs: the engine's defaults (block_size 16, num_blocks 512, max_num_batched_tokens
512, max_num_seqs 16, chunked prefill on, continuous policy), except ``enable_prefix_caching``
True vs False; 16 seats and 512 x 16 = 8,192 pool tokens hold all 16 requests at once (no
preemption; checked). The knobs used are printed and recorded in the JSON.

Method: a fresh engine per run (an empty cache each time); a warm-up first (one whole ON run,
and a short OFF run: 4 of the prompts, 2 tokens each); then ``ROUNDS`` rounds, each running ON
and OFF back to back with the order alternating per round; figures are medians over rounds
(every run's wall time, the per-round OFF / ON wall ratios and the load average before and
after are in the JSON; an informational row gives the ratio of the fastest run of each side,
the least disturbed when other processes share the CPU, which with 2 torch threads on 2 cores
can slow a step tenfold and hits the long OFF runs hardest). Wall time = from the first
``add_request`` to the end of the step after which no request is unfinished. Both sides must
produce identical token ids for every request, every round (asserted: a faster run that
computes something else proves nothing).

Prefill tokens computed = the sum over every step's trace of the scheduled prompt-chunk tokens
(``ScheduledChunk`` of kind "prefill"; cross-checked against the prompt positions each chunk
covers). Floor of this workload: the first request must compute all 420 tokens (nothing is
cached yet) and every other request at least its own 20 question tokens, so ON >= 420 + 15 x
20 = 720 of OFF's 16 x 420 = 6,720 tokens, i.e. ON / OFF >= 10.7 %: the "<= 10 %" target of
the issue cannot be met by this workload by construction. The row reports the figure
against the unchanged target (so it reads MISSED) with that reason in its ``note``.

    .venv/bin/python -m tests.bench bench_prefix

(``-m tests.bench prefix`` selects only this module; the Prefix cache page's browser benchmark is bench_ui_pages.)
Wall time about 2 minutes on an idle 2-core CPU.
"""
from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch

from engine import LLMEngine, SamplingParams
from engine.core.config import EngineConfig
from engine.model.shared import get_shared_model
from engine.core.trace import StepTrace
from tests.parity import LONG

MODEL = "smollm2-135m"
NUM_REQUESTS = 16
SYSTEM_TOKENS = 400
QUESTION_TOKENS = 20
MAX_TOKENS = 16  # the measured case
MAX_TOKENS_LONG = 64  # informational: decode weighs more
ROUNDS = 3
ROUNDS_LONG = 2
KNOBS: dict[str, Any] = {}  # the engine's defaults, except enable_prefix_caching (set per side)
PREFILL_TARGET = 0.10
THROUGHPUT_TARGET = 3.0

QUESTION_SOURCE = (
    "Galileo did not invent the telescope, but in 1609 he built one that magnified about twenty "
    "times and turned it to the night sky. He saw mountains and craters on the Moon, four small "
    "moons circling Jupiter, countless faint stars in the Milky Way and the changing phases of "
    "Venus, which fitted a Sun-centred system far better than the old Earth-centred one. Kepler "
    "soon proposed a design with two convex lenses that gave a wider field of view. Refracting "
    "telescopes grew longer and longer to reduce the coloured fringes that a single lens produces, "
    "until some instruments were more than forty metres long and almost impossible to point. "
    "Newton avoided the problem altogether in 1668 by using a curved mirror instead of a lens, and "
    "mirrors remained the basis of large telescopes ever since. In the nineteenth century William "
    "Herschel discovered Uranus with a reflector he had ground himself, while photography let "
    "astronomers record objects far too faint for the eye. Modern observatories sit on high "
    "mountains or in orbit above the atmosphere, and some combine the light of several mirrors "
    "spread across a continent so that they work together like one enormous instrument.")


def workload(tokenizer: Any) -> tuple[list[int], list[list[int]]]:
    """(the 400-token system prompt, 16 questions of exactly 20 tokens each)."""
    system = tokenizer((LONG + " ") * 6, add_special_tokens=False).input_ids[:SYSTEM_TOKENS]
    source = tokenizer(QUESTION_SOURCE, add_special_tokens=False).input_ids
    stride = (len(source) - QUESTION_TOKENS) // (NUM_REQUESTS - 1)
    questions = [source[i * stride: i * stride + QUESTION_TOKENS] for i in range(NUM_REQUESTS)]
    if len(system) != SYSTEM_TOKENS or any(len(q) != QUESTION_TOKENS for q in questions):
        raise RuntimeError("the system prompt or a question does not have its exact token count")
    if len({q[0] for q in questions}) != NUM_REQUESTS:
        raise RuntimeError("two questions start with the same token: they would share a cached prefix")
    return system, questions


def prompt_tokens_computed(traces: Sequence[StepTrace], prompt_len: dict[str, int]) -> int:
    """Prompt positions covered by the scheduled chunks of every step (the cross-check)."""
    return sum(max(0, min(c.start + c.num_tokens, prompt_len[c.request_id]) - c.start)
               for t in traces for c in t.scheduled)


def _known(value: float | None) -> float:
    """A metric every finished request has."""
    if value is None:
        raise RuntimeError("a finished request has no time to first token")
    return value


def engine_run(prompts: list[list[int]], max_tokens: int, caching: bool) -> dict[str, Any]:
    """One run to the end on a fresh engine: wall time, outputs and what the traces say."""
    engine = LLMEngine(MODEL, **KNOBS, enable_prefix_caching=caching)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    traces: list[StepTrace] = []
    t0 = time.perf_counter()
    ids = [engine.add_request(p, params) for p in prompts]
    while engine.has_unfinished_requests():
        traces.append(engine.step())
    wall = time.perf_counter() - t0
    outs = [engine.get_output(i) for i in ids]
    prompt_len = {i: len(p) for i, p in zip(ids, prompts)}
    prefill = sum(t.num_prefill_tokens for t in traces)
    if prefill != prompt_tokens_computed(traces, prompt_len):
        raise RuntimeError(f"prefill chunks ({prefill}) != prompt positions computed; a recompute?")
    if any(t.preempted for t in traces):
        raise RuntimeError("a request was preempted: the pool is too small for this workload")
    generated = sum(len(o.outputs[0].token_ids) for o in outs)
    if generated != max_tokens * len(prompts):
        raise RuntimeError("a request stopped before max_tokens")
    decode_only = [t for t in traces if not t.num_prefill_tokens]
    return {
        "wall_s": wall,
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "generated": generated,
        "prompt_tokens": sum(len(p) for p in prompts),
        "prefill_tokens": prefill,
        "cached_tokens": sum(o.metrics.num_cached_tokens for o in outs),
        "lookup_cached_tokens": sum(t.prefix.num_cached_tokens for t in traces),
        "steps": len(traces),
        "ttft_steps": statistics.mean(_known(o.metrics.ttft_steps) for o in outs),
        "ttft_ms": statistics.mean(_known(o.metrics.ttft_ms) for o in outs),
        "schedule_s": sum(t.schedule_ms for t in traces) / 1e3,
        "forward_s": sum(t.forward_ms for t in traces) / 1e3,
        "sample_s": sum(t.sample_ms for t in traces) / 1e3,
        "trace_s": engine.trace_seconds,
        "prefill_steps": len(traces) - len(decode_only),
        "prefill_steps_forward_s": sum(t.forward_ms for t in traces if t.num_prefill_tokens) / 1e3,
        "decode_steps_forward_s": sum(t.forward_ms for t in decode_only) / 1e3,
        "per_step": [{"step": t.step, "prefill": t.num_prefill_tokens, "decode": t.num_decode_tokens,
                      "cached": t.prefix.num_cached_tokens, "schedule_ms": round(t.schedule_ms, 2),
                      "forward_ms": round(t.forward_ms, 2), "sample_ms": round(t.sample_ms, 2)}
                     for t in traces],
        "knobs": engine.config.to_knobs(),
    }


def compare(prompts: list[list[int]], max_tokens: int, rounds: int) -> dict[str, list[dict[str, Any]]]:
    """``rounds`` rounds of ON and OFF back to back (order alternating); outputs must agree."""
    runs: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
    for k in range(rounds):
        for side in (("on", "off") if k % 2 == 0 else ("off", "on")):
            runs[side].append(engine_run(prompts, max_tokens, side == "on"))
            print(f"  max_tokens={max_tokens} round {k + 1}/{rounds} caching {side:<3}: "
                  f"{runs[side][-1]['wall_s']:6.2f} s, {runs[side][-1]['steps']} steps", flush=True)
        if runs["on"][-1]["tokens"] != runs["off"][-1]["tokens"]:
            differ = sum(a != b for a, b in zip(runs["on"][-1]["tokens"], runs["off"][-1]["tokens"]))
            raise AssertionError(f"caching on and off generated different tokens for {differ} of "
                                 f"{len(prompts)} requests")
    return runs


def med(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median figures over the rounds of one side (per_step/tokens of the median-wall run)."""
    keys = ("wall_s", "ttft_ms", "schedule_s", "forward_s", "sample_s", "trace_s",
            "prefill_steps_forward_s", "decode_steps_forward_s")
    out: dict[str, Any] = {k: med(runs, k) for k in keys}
    first = runs[0]
    for k in ("generated", "prompt_tokens", "prefill_tokens", "cached_tokens", "lookup_cached_tokens", "steps",
              "ttft_steps", "prefill_steps"):
        if any(r[k] != first[k] for r in runs):
            raise AssertionError(f"{k} differs between rounds of a deterministic run")
        out[k] = first[k]
    out["throughput"] = out["generated"] / out["wall_s"]
    out["throughput_all"] = (out["generated"] + out["prompt_tokens"]) / out["wall_s"]
    out["walls_s"] = [round(r["wall_s"], 3) for r in runs]
    out["per_step"] = sorted(runs, key=lambda r: r["wall_s"])[len(runs) // 2]["per_step"]
    return out


def run() -> dict[str, Any]:
    torch.manual_seed(0)
    shared = get_shared_model(MODEL)
    system, questions = workload(shared.tokenizer)
    prompts = [system + q for q in questions]
    knobs = {k: v for k, v in EngineConfig.from_knobs(**KNOBS).to_knobs().items() if k != "enable_prefix_caching"}
    print(f"  workload: {NUM_REQUESTS} x ({SYSTEM_TOKENS} system + {QUESTION_TOKENS} question) tokens, "
          f"greedy, ignore_eos, max_tokens {MAX_TOKENS} (and {MAX_TOKENS_LONG}); threads {torch.get_num_threads()}")
    print(f"  knobs (enable_prefix_caching on vs off): {knobs}", flush=True)
    load_before = os.getloadavg()

    # Warm-up (allocator, kernels, lazy imports): a whole ON run, and an OFF run of 4 requests
    # (512-token prefill chunks) with 2 tokens each, so it costs seconds, not a full OFF run.
    engine_run(prompts, MAX_TOKENS, True)
    engine_run(prompts[:4], 2, False)
    runs = compare(prompts, MAX_TOKENS, ROUNDS)
    runs_long = compare(prompts, MAX_TOKENS_LONG, ROUNDS_LONG)
    on, off = summary(runs["on"]), summary(runs["off"])
    on_l, off_l = summary(runs_long["on"]), summary(runs_long["off"])
    # Rounds pair an ON and an OFF run back to back: the per-round ratio is recorded too.
    round_ratios = [b["wall_s"] / a["wall_s"] for a, b in zip(runs["on"], runs["off"])]
    # The fastest run of each side: the least disturbed by other processes on a shared machine.
    best_ratio = min(r["wall_s"] for r in runs["off"]) / min(r["wall_s"] for r in runs["on"])
    load_after = os.getloadavg()
    print(f"  load average (1, 5, 15 min) before {load_before}, after {load_after}; OFF / ON wall per round "
          f"{[round(x, 2) for x in round_ratios]}")

    prefill_ratio = on["prefill_tokens"] / off["prefill_tokens"]
    floor = (len(prompts[0]) + (NUM_REQUESTS - 1) * QUESTION_TOKENS) / off["prefill_tokens"]
    tput_ratio = on["throughput"] / off["throughput"]
    tput_all_ratio = on["throughput_all"] / off["throughput_all"]
    tput_long_ratio = on_l["throughput"] / off_l["throughput"]
    rows = [
        {"metric": "prefill tokens computed, caching on", "value": on["prefill_tokens"], "unit": "tokens"},
        {"metric": "prefill tokens computed, caching off", "value": off["prefill_tokens"], "unit": "tokens"},
        {"metric": "prefill tokens computed, on / off", "value": prefill_ratio, "unit": "share",
         "target": f"<= {PREFILL_TARGET:.2f}", "met": prefill_ratio <= PREFILL_TARGET,
         "note": f"unreachable by this workload: the floor is (420 + 15 x 20) / (16 x 420) = {floor:.4f} "
                 f"(the first request computes all 420 tokens, every other its 20 distinct ones); "
                 f"caching on computes exactly that floor" if on["prefill_tokens"] == round(floor * off["prefill_tokens"])
                 else f"the floor of this workload is {floor:.4f}"},
        {"metric": "cache hit rate (cached / prompt tokens), on", "value": on["cached_tokens"] / on["prompt_tokens"],
         "unit": "share"},
        {"metric": "cache hit rate, off", "value": off["cached_tokens"] / off["prompt_tokens"], "unit": "share"},
        {"metric": f"wall time, caching on (median of {ROUNDS})", "value": on["wall_s"], "unit": "s"},
        {"metric": f"wall time, caching off (median of {ROUNDS})", "value": off["wall_s"], "unit": "s"},
        {"metric": "throughput (generated tok / wall), on", "value": on["throughput"], "unit": "tok/s"},
        {"metric": "throughput (generated tok / wall), off", "value": off["throughput"], "unit": "tok/s"},
        {"metric": "throughput on / off", "value": tput_ratio, "unit": "x",
         "target": f">= {THROUGHPUT_TARGET:.0f}", "met": tput_ratio >= THROUGHPUT_TARGET},
        {"metric": "throughput on / off, fastest run of each side", "value": best_ratio, "unit": "x",
         "note": "informational: the least disturbed runs when other processes share the CPU"},
        {"metric": "prompt+generated tok / wall, on", "value": on["throughput_all"], "unit": "tok/s"},
        {"metric": "prompt+generated tok / wall, off", "value": off["throughput_all"], "unit": "tok/s"},
        {"metric": "prompt+generated tok / wall, on / off", "value": tput_all_ratio, "unit": "x"},
        {"metric": "time to first token (ms), mean, on", "value": on["ttft_ms"], "unit": "ms"},
        {"metric": "time to first token (ms), mean, off", "value": off["ttft_ms"], "unit": "ms"},
        {"metric": "time to first token (steps), mean, on", "value": on["ttft_steps"], "unit": "steps"},
        {"metric": "time to first token (steps), mean, off", "value": off["ttft_steps"], "unit": "steps"},
        {"metric": "engine steps, on", "value": on["steps"], "unit": "steps"},
        {"metric": "engine steps, off", "value": off["steps"], "unit": "steps"},
        {"metric": "forward time in steps, on / off", "value": on["forward_s"] / off["forward_s"], "unit": "x"},
        {"metric": "on: forward time in steps with prefill", "value": on["prefill_steps_forward_s"], "unit": "s"},
        {"metric": "on: forward time in decode-only steps", "value": on["decode_steps_forward_s"], "unit": "s",
         "note": "informational: decode steps are as many on as off (one per output token) and caching does "
                 "not shorten them; they bound the throughput gain"},
        {"metric": "off: forward time in steps with prefill", "value": off["prefill_steps_forward_s"], "unit": "s"},
        {"metric": "off: forward time in decode-only steps", "value": off["decode_steps_forward_s"], "unit": "s"},
        {"metric": f"throughput on / off, max_tokens {MAX_TOKENS_LONG} (median of {ROUNDS_LONG})",
         "value": tput_long_ratio, "unit": "x",
         "note": "informational: with longer answers decode steps, which caching does not shorten, weigh more"},
        {"metric": f"throughput, max_tokens {MAX_TOKENS_LONG}, on", "value": on_l["throughput"], "unit": "tok/s"},
        {"metric": f"throughput, max_tokens {MAX_TOKENS_LONG}, off", "value": off_l["throughput"], "unit": "tok/s"},
        {"metric": "requests token-identical on vs off (every round)", "value": NUM_REQUESTS,
         "unit": f"of {NUM_REQUESTS}", "target": f"= {NUM_REQUESTS}", "met": True},
    ]
    for row in rows:
        if "note" in row:
            print(f"  note on '{row['metric']}': {row['note']}")
    return {"name": "prefix", "model": MODEL, "threads": torch.get_num_threads(), "knobs": knobs,
            "workload": {"requests": NUM_REQUESTS, "system_tokens": SYSTEM_TOKENS, "question_tokens": QUESTION_TOKENS,
                         "prompt_tokens": len(prompts[0]), "max_tokens": MAX_TOKENS,
                         "max_tokens_informational": MAX_TOKENS_LONG, "arrival_step": 0, "greedy": True,
                         "ignore_eos": True, "rounds": ROUNDS, "rounds_informational": ROUNDS_LONG,
                         "question_first_tokens": [q[0] for q in questions]},
            "throughput_ratio_per_round": [round(x, 3) for x in round_ratios],
            "load_average_before": load_before, "load_average_after": load_after,
            "on": on, "off": off, f"on_max_tokens_{MAX_TOKENS_LONG}": on_l, f"off_max_tokens_{MAX_TOKENS_LONG}": off_l,
            "rows": rows}


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=1))
