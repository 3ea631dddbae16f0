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

``QBENCH_QUICK=1`` (or ``python -m tests.bench.bench_quant --quick``) runs every path with a
few steps and tokens only: a smoke run, not figures to report.
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine import LLMEngine, SamplingParams, perplexity
from engine.engine import SharedModel, get_shared_model
from engine.models.llama import LlamaModel
from engine.quantization import QuantizedLinear, Weight
from tests.bench.bench_engine import MODEL, NUM_REQUESTS, _decode_ready_engine, _timed, read_bandwidth, workload
from tests.parity import PROMPTS

TEXT = Path(__file__).resolve().parents[2] / "presets" / "texts" / "sqlite3_h_comments.txt"
PPL_WINDOW, PPL_STRIDE = 512, 256


@dataclass(frozen=True)
class Mode:
    """One row group: a label, the engine knobs that make it, whether it is slow (fewer steps)."""

    label: str
    knobs: tuple[tuple[str, Any], ...]
    calculator_format: str | None  # engine.sizing weight format of the same scheme
    slow: bool = False

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.knobs)


MODES = (
    Mode("fp32", (("dtype", "float32"),), "fp32"),
    Mode("bf16", (("dtype", "bfloat16"),), "bf16"),
    Mode("int8", (("dtype", "bfloat16"), ("quantization", "int8")), "int8"),
    Mode("int4 g32", (("dtype", "bfloat16"), ("quantization", "int4"), ("quantization_group_size", 32)), "int4"),
    Mode("int4 g64", (("dtype", "bfloat16"), ("quantization", "int4"), ("quantization_group_size", 64)), "int4"),
    Mode("fp8", (("dtype", "bfloat16"), ("quantization", "fp8")), "fp8", slow=True),
    Mode("w8a8", (("dtype", "bfloat16"), ("quantization", "w8a8")), "w8a8"),
)


@dataclass(frozen=True)
class Settings:
    """How much of each measurement to run (full, or the quick smoke run)."""

    warmup: int
    decode_steps: int
    slow_decode_steps: int
    prompt_cap: int  # throughput workload: prompt tokens kept per request
    output_cap: int  # throughput workload: output tokens per request at most
    slow_output_cap: int
    ppl_tokens: int
    agree_tokens: int
    slow_agree_tokens: int


FULL = Settings(warmup=3, decode_steps=12, slow_decode_steps=3, prompt_cap=32, output_cap=16, slow_output_cap=4,
                ppl_tokens=768, agree_tokens=32, slow_agree_tokens=16)
QUICK = Settings(warmup=1, decode_steps=3, slow_decode_steps=1, prompt_cap=16, output_cap=4, slow_output_cap=2,
                 ppl_tokens=300, agree_tokens=4, slow_agree_tokens=2)


def _nbytes(t: Weight) -> int:
    return t.nbytes if isinstance(t, QuantizedLinear) else t.numel() * t.element_size()


def decode_read_bytes(model: LlamaModel) -> int:
    """Weight bytes one decode step reads: every decoder layer's tensors, the final norm and the
    LM head, as stored. The embedding table is read one row per token, so it counts only as
    the LM head (once when tied)."""
    layers = sum(_nbytes(t) for layer in model.layers for t in layer.tensors())
    return layers + _nbytes(model.norm) + _nbytes(model.lm_head)


def _engine(shared: SharedModel, mode: Mode, **knobs: Any) -> LLMEngine:
    return LLMEngine(shared, **mode.kwargs, **knobs)


def _step_round_robin(engines: dict[str, LLMEngine]) -> dict[str, float]:
    """Step every unfinished engine once per round until all are done -> seconds in step() each."""
    spent = {k: 0.0 for k in engines}
    while True:
        live = [k for k, e in engines.items() if e.has_unfinished_requests()]
        if not live:
            return spent
        for k in live:
            spent[k] += _timed(engines[k].step)


def batch1_decode(models: dict[str, SharedModel], prompt: list[int], s: Settings) -> dict[str, float]:
    """Median batch-1 decode step (s) per mode; modes stepped round-robin, slow ones fewer times."""
    engines = {m.label: _decode_ready_engine([prompt], s.warmup + s.decode_steps + 4, models[m.label], **m.kwargs)
               for m in MODES}
    for _ in range(s.warmup):
        for m in MODES:
            if not m.slow:
                engines[m.label].step()
    times: dict[str, list[float]] = {m.label: [] for m in MODES}
    for i in range(s.decode_steps):
        for m in MODES:
            if not m.slow or i < s.slow_decode_steps:
                times[m.label].append(_timed(engines[m.label].step))
    return {k: statistics.median(v) for k, v in times.items()}


def throughput(models: dict[str, SharedModel], prompts: list[list[int]], output_lens: list[int],
               s: Settings) -> dict[str, tuple[float, int]]:
    """-> (output tok/s inside step(), output cap) per mode, over the capped workload."""
    engines, caps = {}, {}
    for m in MODES:
        cap = s.slow_output_cap if m.slow else s.output_cap
        e = _engine(models[m.label], m, max_num_seqs=NUM_REQUESTS, max_num_batched_tokens=512, num_blocks=1024)
        for p, n in zip(prompts, output_lens):
            e.add_request(p[:s.prompt_cap], SamplingParams(temperature=0, max_tokens=min(n, cap), ignore_eos=True))
        engines[m.label], caps[m.label] = e, cap
    spent = _step_round_robin(engines)
    return {k: (sum(min(n, caps[k]) for n in output_lens) / spent[k], caps[k]) for k in engines}


def greedy_outputs(models: dict[str, SharedModel], s: Settings) -> dict[str, list[tuple[int, ...]]]:
    """Greedy tokens per parity prompt per mode (EOS ignored), the engines stepped round-robin."""
    engines, ids = {}, {}
    for m in MODES:
        n = s.slow_agree_tokens if m.slow else s.agree_tokens
        e = _engine(models[m.label], m, max_num_seqs=len(PROMPTS))
        ids[m.label] = [e.add_request(p, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
                        for p in PROMPTS]
        engines[m.label] = e
    _step_round_robin(engines)
    return {k: [engines[k].get_output(i).outputs[0].token_ids for i in ids[k]] for k in engines}


def tokens_until_divergence(ref: tuple[int, ...], got: tuple[int, ...]) -> int:
    """Length of the common prefix of two greedy outputs (both capped at the shorter)."""
    n = min(len(ref), len(got))
    return next((i for i in range(n) if ref[i] != got[i]), n)


def calculator(bandwidth_note: list[str]) -> dict[str, tuple[float, float] | None]:
    """(expected, roofline) decode tok/s at batch 1 from engine.sizing for this machine's measured
    preset, per mode; None where the calculator has no such format."""
    from engine.sizing import Settings as SizingSettings, Workload, estimate
    from engine.sizing.hardware import this_machine

    hw = this_machine()
    bandwidth_note.append(f"calculator: this machine measured, copy bandwidth {hw.bandwidth / 1e9:.1f} GB/s, "
                          f"eta_memory {hw.eta_memory}")
    out: dict[str, tuple[float, float] | None] = {}
    for m in MODES:
        if m.calculator_format is None:
            out[m.label] = None
            continue
        e = estimate(MODEL, hw, Workload(batch=1), SizingSettings(weights=m.calculator_format), detail=False)
        out[m.label] = (e.decode_tokens_per_s, e.decode_tokens_per_s_roofline)
    return out


def _settings(argv: list[str] | None = None) -> Settings:
    quick = os.environ.get("QBENCH_QUICK", "") not in ("", "0") or "--quick" in (argv or [])
    return QUICK if quick else FULL


def run(argv: list[str] | None = None) -> dict[str, Any]:
    s = _settings(argv)
    torch.manual_seed(0)
    load_before = os.getloadavg()
    t_load = {}
    models: dict[str, SharedModel] = {}
    for m in MODES:  # held here: get_shared_model's cache keeps only 4
        kw = m.kwargs
        t_load[m.label] = _timed(lambda: models.__setitem__(m.label, get_shared_model(
            MODEL, kw["dtype"], kw.get("quantization"), kw.get("quantization_group_size", 32))))
    tok = models["fp32"].tokenizer
    prompts, output_lens = workload(tok)
    text = TEXT.read_text()

    bw = read_bandwidth()
    decode_s = batch1_decode(models, prompts[0][:32], s)
    tput = throughput(models, prompts, output_lens, s)
    outs = greedy_outputs(models, s)
    ppl = {m.label: perplexity(_engine(models[m.label], m, max_num_seqs=1), text, window=PPL_WINDOW,
                               stride=PPL_STRIDE, max_tokens=s.ppl_tokens).ppl for m in MODES}
    bw = max(bw, read_bandwidth())  # again at the end: the better of the two bounds the steps
    notes: list[str] = []
    calc = calculator(notes)
    load_after = os.getloadavg()

    rows: list[dict[str, Any]] = [
        {"metric": "read bandwidth (sum, 512 MiB, 2 threads)", "value": bw / 1e9, "unit": "GB/s"},
        {"metric": "load average (1 min) before / after", "value": load_before[0], "unit": "",
         "note": f"after {load_after[0]:.2f}"},
    ]
    by: dict[str, dict[str, float]] = {}
    for m in MODES:
        wb = decode_read_bytes(models[m.label].model)
        tps = 1 / decode_s[m.label]
        bound = bw / wb
        steps = s.slow_decode_steps if m.slow else s.decode_steps
        by[m.label] = {"tps": tps, "bound": bound, "ppl": ppl[m.label]}
        tp, cap = tput[m.label]
        rows += [
            {"metric": f"{m.label}: quantize/load time", "value": t_load[m.label], "unit": "s"},
            {"metric": f"{m.label}: weight bytes read per decode step", "value": wb / 1e6, "unit": "MB",
             "note": "layers + final norm + LM head as stored; the embedding gather (one row) not counted"},
            {"metric": f"{m.label}: batch-1 decode (median of {steps})", "value": tps, "unit": "tok/s"},
            {"metric": f"{m.label}: batch-1 bandwidth bound", "value": bound, "unit": "tok/s"},
            {"metric": f"{m.label}: batch-1 / its bound", "value": tps / bound, "unit": "share"},
        ]
        c = calc[m.label]
        if c is None:
            rows.append({"metric": f"{m.label}: calculator decode", "value": float("nan"), "unit": "tok/s",
                         "note": "no calculator format for this scheme"})
        else:
            note = "calculator int4 is g128 with 16-bit embeddings/LM head" if m.calculator_format == "int4" else ""
            rows += [{"metric": f"{m.label}: calculator decode (expected)", "value": c[0], "unit": "tok/s",
                      "note": note},
                     {"metric": f"{m.label}: calculator decode (roofline)", "value": c[1], "unit": "tok/s"}]
        rows += [
            {"metric": f"{m.label}: 16 req, prompts<={s.prompt_cap}, out<={cap}", "value": tp, "unit": "tok/s"},
            {"metric": f"{m.label}: perplexity ({s.ppl_tokens} tok, w{PPL_WINDOW}/s{PPL_STRIDE})",
             "value": ppl[m.label], "unit": "ppl"},
        ]
        if m.label != "fp32":
            n = s.slow_agree_tokens if m.slow else s.agree_tokens
            agree = statistics.mean(tokens_until_divergence(r, g) for r, g in zip(outs["fp32"], outs[m.label]))
            rows += [{"metric": f"{m.label}: ppl / fp32 ppl", "value": ppl[m.label] / ppl["fp32"], "unit": "x"},
                     {"metric": f"{m.label}: greedy tokens = fp32 until divergence", "value": agree,
                      "unit": f"of {n}"}]
    r_speed = by["int4 g32"]["tps"] / by["fp32"]["tps"]
    r_bound = by["int4 g32"]["tps"] / by["int4 g32"]["bound"]
    r_int8 = by["int8"]["ppl"] / by["fp32"]["ppl"]
    r_int4 = by["int4 g32"]["ppl"] / by["fp32"]["ppl"]
    rows += [
        {"metric": "int4 g32 batch-1 / fp32", "value": r_speed, "unit": "x", "target": ">= 2.5", "met": r_speed >= 2.5},
        {"metric": "int4 g32 batch-1 / its bound", "value": r_bound, "unit": "share", "target": ">= 0.7",
         "met": r_bound >= 0.7},
        {"metric": "int8 ppl / fp32 ppl", "value": r_int8, "unit": "x", "target": "<= 1.01", "met": r_int8 <= 1.01},
        {"metric": "int4 g32 ppl / fp32 ppl", "value": r_int4, "unit": "x", "target": "<= 1.05", "met": r_int4 <= 1.05},
    ]
    return {"name": "quant", "model": MODEL, "threads": torch.get_num_threads(), "quick": s is QUICK,
            "settings": s.__dict__, "notes": notes, "load_average": [load_before, load_after], "rows": rows}


if __name__ == "__main__":
    for row in run(sys.argv[1:])["rows"]:
        print(f"  {row['metric']:<52} {row['value']:>12.3f} {row.get('unit', ''):<10} {row.get('target', ''):<10} "
              f"{ {True: 'met', False: 'MISSED', None: ''}[row.get('met')] } {row.get('note', '')}")
