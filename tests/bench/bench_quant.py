"""Quantization, measured (issue #9, must-show 2): for fp32, bf16, int8, int4 g32, int4 g64
(informational), fp8 and w8a8 on smollm2-135m, side by side in one process —

    weight bytes read per decode step   every decoder layer's tensors + the final norm + the LM
                                        head, as stored (codes + scales). The embedding lookup
                                        gathers one row per token, so the table counts only as
                                        the LM head (tied in SmolLM2: counted once).
    batch-1 decode tok/s                median of N decode steps after warm-up, one request with a
                                        32-token prompt; the modes are stepped round-robin so
                                        machine noise lands on all of them alike
    bandwidth bound                     read bandwidth (bench_engine.read_bandwidth: a sum over a
                                        512 MiB fp32 tensor, not a copy) / weight bytes per step
    16-request throughput               bench_engine's workload with the prompts cut to their first
                                        PROMPT_CAP tokens and the outputs to OUTPUT_CAP (fewer for
                                        the slow modes; each row says so), the engines stepped
                                        round-robin; tok/s = output tokens / seconds inside step()
    perplexity                          engine.perplexity on presets/texts/sqlite3_h_comments.txt,
                                        window 512 / stride 256, over the text's first PPL_TOKENS
                                        tokens (the same prefix for every mode)
    greedy agreement with fp32          tokens until the first divergence from the fp32 engine,
                                        mean over tests.parity.PROMPTS, AGREE_TOKENS tokens, EOS
                                        ignored
    calculator                          engine.sizing.estimate for this machine (measured preset):
                                        its roofline and its expected decode tok/s for the format

Every measurement but the 16-request throughput is engine/studies/quant_tradeoff.py's (the page's
"Measure on this machine" runs the same code with its PAGE settings); this module adds the
throughput and the targets.

``QBENCH_QUICK=1`` (or ``python -m tests.bench.bench_quant --quick``) runs every path with a
few steps and tokens only: a smoke run, not figures to report.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

import torch

from engine import LLMEngine, SamplingParams
from engine.studies.quant_tradeoff import (FULL, MODES, PPL_STRIDE, PPL_WINDOW, QUICK, LoadedMode, Settings, load_modes,
                                   measure_tradeoffs, step_round_robin)
from tests.bench.bench_engine import MODEL, NUM_REQUESTS, workload


@dataclass(frozen=True)
class Caps:
    """The throughput workload's caps (full run or quick smoke run)."""

    prompt_cap: int  # prompt tokens kept per request
    output_cap: int  # output tokens per request at most
    slow_output_cap: int


FULL_CAPS = Caps(prompt_cap=32, output_cap=16, slow_output_cap=4)
QUICK_CAPS = Caps(prompt_cap=16, output_cap=4, slow_output_cap=2)


def throughput(loaded: dict[str, LoadedMode], prompts: list[list[int]], output_lens: list[int],
               c: Caps) -> dict[str, tuple[float, int]]:
    """-> (output tok/s inside step(), output cap) per mode, over the capped workload."""
    engines, caps = {}, {}
    for label, lm in loaded.items():
        cap = c.slow_output_cap if lm.mode.slow else c.output_cap
        e = LLMEngine(lm.shared, **lm.mode.kwargs, max_num_seqs=NUM_REQUESTS, max_num_batched_tokens=512,
                      num_blocks=1024)
        for p, n in zip(prompts, output_lens):
            e.add_request(p[:c.prompt_cap], SamplingParams(temperature=0, max_tokens=min(n, cap), ignore_eos=True))
        engines[label], caps[label] = e, cap
    spent = step_round_robin(engines)
    return {k: (sum(min(n, caps[k]) for n in output_lens) / spent[k], caps[k]) for k in engines}


def _quick(argv: list[str] | None = None) -> bool:
    return os.environ.get("QBENCH_QUICK", "") not in ("", "0") or "--quick" in (argv or [])


def run(argv: list[str] | None = None) -> dict[str, Any]:
    quick = _quick(argv)
    s: Settings = QUICK if quick else FULL
    c = QUICK_CAPS if quick else FULL_CAPS
    torch.manual_seed(0)
    load_before = os.getloadavg()
    loaded = load_modes(MODEL, MODES)  # held here: get_shared_model's cache keeps only 4
    result = measure_tradeoffs(MODEL, s, MODES, loaded=loaded)
    prompts, output_lens = workload(loaded["fp32"].shared.tokenizer)
    tput = throughput(loaded, prompts, output_lens, c)
    load_after = os.getloadavg()

    rows: list[dict[str, Any]] = [
        {"metric": f"read bandwidth (sum, {s.bandwidth_mib} MiB, 2 threads)", "value": result.read_bandwidth_gbs,
         "unit": "GB/s"},
        {"metric": "load average (1 min) before / after", "value": load_before[0], "unit": "",
         "note": f"after {load_after[0]:.2f}"},
    ]
    for r in result.rows:
        rows += [
            {"metric": f"{r.label}: quantize/load time", "value": r.load_s, "unit": "s"},
            {"metric": f"{r.label}: weight bytes read per decode step", "value": r.weight_bytes / 1e6, "unit": "MB",
             "note": "layers + final norm + LM head as stored; the embedding gather (one row) not counted"},
            {"metric": f"{r.label}: batch-1 decode (median of {r.decode_steps})", "value": r.batch1_tok_s,
             "unit": "tok/s"},
            {"metric": f"{r.label}: batch-1 bandwidth bound", "value": r.bound_tok_s, "unit": "tok/s"},
            {"metric": f"{r.label}: batch-1 / its bound", "value": r.share_of_bound, "unit": "share"},
        ]
        if r.calculator_expected_tok_s is None or r.calculator_roofline_tok_s is None:
            rows.append({"metric": f"{r.label}: calculator decode", "value": float("nan"), "unit": "tok/s",
                         "note": "no calculator format for this scheme"})
        else:
            note = "calculator int4 is g128 with 16-bit embeddings/LM head" if r.calculator_format == "int4" else ""
            rows += [{"metric": f"{r.label}: calculator decode (expected)", "value": r.calculator_expected_tok_s,
                      "unit": "tok/s", "note": note},
                     {"metric": f"{r.label}: calculator decode (roofline)", "value": r.calculator_roofline_tok_s,
                      "unit": "tok/s"}]
        tp, cap = tput[r.label]
        rows += [
            {"metric": f"{r.label}: 16 req, prompts<={c.prompt_cap}, out<={cap}", "value": tp, "unit": "tok/s"},
            {"metric": f"{r.label}: perplexity ({s.ppl_tokens} tok, w{PPL_WINDOW}/s{PPL_STRIDE})",
             "value": r.ppl, "unit": "ppl"},
        ]
        if r.label != "fp32":
            rows += [{"metric": f"{r.label}: ppl / fp32 ppl", "value": r.ppl_ratio, "unit": "x"},
                     {"metric": f"{r.label}: greedy tokens = fp32 until divergence", "value": r.agreement,
                      "unit": f"of {r.agreement_of}"}]
    g32, fp32, int8 = result.row("int4 g32"), result.row("fp32"), result.row("int8")
    r_speed = g32.batch1_tok_s / fp32.batch1_tok_s
    r_bound = g32.share_of_bound
    r_int8 = int8.ppl_ratio
    r_int4 = g32.ppl_ratio
    rows += [
        {"metric": "int4 g32 batch-1 / fp32", "value": r_speed, "unit": "x", "target": ">= 2.5", "met": r_speed >= 2.5},
        {"metric": "int4 g32 batch-1 / its bound", "value": r_bound, "unit": "share", "target": ">= 0.7",
         "met": r_bound >= 0.7},
        {"metric": "int8 ppl / fp32 ppl", "value": r_int8, "unit": "x", "target": "<= 1.01", "met": r_int8 <= 1.01},
        {"metric": "int4 g32 ppl / fp32 ppl", "value": r_int4, "unit": "x", "target": "<= 1.05", "met": r_int4 <= 1.05},
    ]
    return {"name": "quant", "model": MODEL, "threads": result.threads, "quick": quick,
            "settings": {**s.__dict__, **c.__dict__}, "notes": list(result.notes),
            "load_average": [load_before, load_after], "rows": rows}


if __name__ == "__main__":
    for row in run(sys.argv[1:])["rows"]:
        print(f"  {row['metric']:<52} {row['value']:>12.3f} {row.get('unit', ''):<10} {row.get('target', ''):<10} "
              f"{ {True: 'met', False: 'MISSED', None: ''}[row.get('met')] } {row.get('note', '')}")
