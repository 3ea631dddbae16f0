"""Engine throughput against Hugging Face, batch-1 decode against the read-bandwidth bound,
decode steps with and without one long context, and the cost of recording traces — all
measured side by side in this one process.

Workload: 16 requests on smollm2-135m (fp32), prompts 16..512 tokens, outputs 16..128 tokens,
greedy, EOS ignored so every side produces exactly the same number of tokens.

``python -m tests.bench.bench_engine --profile`` profiles one batch-1 decode step instead
(torch.profiler: top ops, and the share of the step spent outside aten kernels).
"""
from __future__ import annotations

import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from engine import LLMEngine, SamplingParams
from engine.model import cpu_decode, cpu_gemv
from engine.model.shared import SharedModel, get_shared_model
from engine.studies.quant_tradeoff import decode_ready_engine, read_bandwidth
from tests.parity import LONG, hf_model

MODEL = "smollm2-135m"
NUM_REQUESTS = 16


def workload(tokenizer) -> tuple[list[list[int]], list[int]]:
    """Deterministic prompts of 16..512 tokens and output lengths of 16..128."""
    source = tokenizer((LONG + " ") * 12, add_special_tokens=False).input_ids
    rng = random.Random(0)
    prompt_lens = [16 + round(i * (512 - 16) / (NUM_REQUESTS - 1)) for i in range(NUM_REQUESTS)]
    output_lens = [16 + round(i * (128 - 16) / (NUM_REQUESTS - 1)) for i in range(NUM_REQUESTS)]
    rng.shuffle(prompt_lens)
    rng.shuffle(output_lens)
    prompts = [source[(7 * i) % 50:][:n] for i, n in enumerate(prompt_lens)]
    return prompts, output_lens


SHORT_PROMPT, LONG_PROMPT, DECODE_BATCH = 32, 900, 8


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _no_eos(n: int):
    """Greedy for exactly n tokens. (min_new_tokens would mask EOS logits and change argmax.)"""
    from transformers import GenerationConfig

    return GenerationConfig(max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)


def hf_without_eos():
    """The HF reference with EOS unset in its generation config too: ``generate`` fills an unset
    ``eos_token_id`` of the config it is given from the model's own, and would stop early."""
    model = hf_model(MODEL)
    model.generation_config.eos_token_id = None
    return model


def hf_request_by_request(prompts, output_lens) -> tuple[float, list[list[int]]]:
    model = hf_without_eos()
    outs = []
    t0 = time.perf_counter()
    with torch.inference_mode():
        for p, n in zip(prompts, output_lens):
            ids = torch.tensor([p])
            g = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=_no_eos(n))
            outs.append(g[0, len(p):].tolist())
    wall = time.perf_counter() - t0
    if [len(o) for o in outs] != list(output_lens):  # equal work on both sides, or no comparison
        raise RuntimeError("HF generate did not produce exactly max_new_tokens per request")
    return wall, outs


def hf_padded_static_batch(prompts, output_lens) -> float:
    """One left-padded batch that runs until its longest member is done."""
    model = hf_without_eos()
    width = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    n = max(output_lens)
    t0 = time.perf_counter()
    with torch.inference_mode():
        g = model.generate(ids, attention_mask=mask, generation_config=_no_eos(n))
    wall = time.perf_counter() - t0
    if g.shape[1] != width + n:
        raise RuntimeError("HF generate stopped the padded batch before max_new_tokens")
    return wall


def engine_run(prompts, output_lens, model: str | SharedModel = MODEL,
               **knobs: Any) -> tuple[float, float, float, list[list[int]]]:
    """-> (wall seconds, seconds inside step(), seconds building traces, outputs).

    ``model`` / ``knobs`` (dtype, quantization, ...) choose the weights; fp32 by default."""
    engine = LLMEngine(model, max_num_seqs=NUM_REQUESTS, max_num_batched_tokens=512, num_blocks=1024, **knobs)
    ids = [engine.add_request(p, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
           for p, n in zip(prompts, output_lens)]
    step_seconds = 0.0
    t0 = time.perf_counter()
    while engine.has_unfinished_requests():
        step_seconds += _timed(engine.step)
    wall = time.perf_counter() - t0
    return wall, step_seconds, engine.trace_seconds, [list(engine.get_output(i).outputs[0].token_ids) for i in ids]


def batch1_decode_seconds(prompt: list[int], steps: int = 64, model: str | SharedModel = MODEL,
                          **knobs: Any) -> float:
    """Median seconds of ``steps`` batch-1 decode steps after the prefill."""
    engine = LLMEngine(model, max_num_seqs=1, **knobs)
    engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=steps + 1, ignore_eos=True))
    engine.step()  # prefill
    times = [_timed(engine.step) for _ in range(steps)]
    times.sort()
    return times[len(times) // 2]


def _decode_ready_engine(prompts: list[list[int]], max_tokens: int, model: str | SharedModel = MODEL,
                         **knobs: Any) -> LLMEngine:
    """An engine with every request past its prefill (engine.studies.quant_tradeoff.decode_ready_engine)."""
    return decode_ready_engine(model, prompts, max_tokens, **knobs)


def decode_steps_short_vs_one_long(source: list[int], steps: int = 12) -> tuple[float, float]:
    """Median decode step (s): 8 short requests vs 7 short + 1 with a >= 900-token context.

    Both engines are stepped alternately, so machine noise lands on both sides alike.
    """
    short = [source[i: i + SHORT_PROMPT] for i in range(DECODE_BATCH)]
    mixed = short[:-1] + [source[:LONG_PROMPT]]
    if len(mixed[-1]) < LONG_PROMPT:
        raise RuntimeError("the long prompt source is shorter than LONG_PROMPT tokens")
    a = _decode_ready_engine(short, steps + 4)
    b = _decode_ready_engine(mixed, steps + 4)
    times_a, times_b = [], []
    for _ in range(steps):
        times_a.append(_timed(a.step))
        times_b.append(_timed(b.step))
    return statistics.median(times_a), statistics.median(times_b)


GEMM_OPS = ("aten::mm", "aten::addmm", "aten::mv", "aten::addmv", "aten::bmm", "aten::matmul")
ATTENTION_OPS = ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::index_select",
                 "aten::index_copy_", "aten::index", "aten::index_put_")
FREE_OPS = ("aten::view", "aten::transpose", "aten::t", "aten::as_strided", "aten::reshape",
            "aten::_reshape_alias", "aten::unsqueeze", "aten::slice", "aten::select", "aten::split",
            "aten::split_with_sizes", "aten::chunk", "aten::narrow", "aten::expand", "aten::detach",
            "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::to", "aten::_to_copy",
            "aten::lift_fresh", "aten::alias", "aten::linear", "aten::scaled_dot_product_attention",
            "aten::_unsafe_view", "aten::contiguous")


def _profile_split(events: list, wall_s: float, steps: int, gemv_s: float = 0.0) -> list[tuple[str, float]]:
    """Self time (s) per profiled step by kind; what no aten op (nor the AVX2 GEMV library, timed
    apart: ``gemv_s`` per step) accounts for is Python."""
    kinds = {"GEMM (mm / addmm)": GEMM_OPS, "attention (SDPA, KV gather/scatter)": ATTENTION_OPS,
             "views / allocation / no-op casts (pure dispatch)": FREE_OPS}
    split = {k: 0.0 for k in kinds}
    split["other aten ops (elementwise, norms, RoPE, cat)"] = 0.0
    for e in events:
        if not e.key.startswith("aten::"):
            continue
        kind = next((k for k, ops in kinds.items() if e.key in ops), "other aten ops (elementwise, norms, RoPE, cat)")
        split[kind] += e.self_cpu_time_total / 1e6 / steps
    split["C library: GEMVs / fused decode layers (cpu_gemv.py, cpu_decode.py; ctypes call included)"] = gemv_s
    split["Python outside aten ops (scheduler, batch build, layer loop)"] = wall_s - sum(split.values())
    return list(split.items())


def profile_steps(engine: LLMEngine, steps: int) -> tuple[float, Any, float]:
    """``steps`` engine steps under torch's profiler -> (mean step s, events, mean s per step in
    the C library: the GEMVs (fp32, int4, int8) and the fused decode layers). Its calls go through ctypes, which
    the profiler does not see (it would count them as Python), so they are timed apart (the fused
    layers' few aten ops around the C call, ~30 µs, are then counted twice)."""
    from torch.profiler import ProfilerActivity, profile

    spent = [0.0]
    names = ("gemv", "gemv_int4", "gemv_int8")
    plain = {name: getattr(cpu_gemv, name) for name in names}
    plain_layers = cpu_decode.run_layers

    def timed(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def call(*args: Any) -> torch.Tensor:
            t0 = time.perf_counter()
            y = fn(*args)
            spent[0] += time.perf_counter() - t0
            return y
        return call
    for name in names:
        setattr(cpu_gemv, name, timed(plain[name]))
    cpu_decode.run_layers = timed(plain_layers)
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t0 = time.perf_counter()
            for _ in range(steps):
                engine.step()
            wall = (time.perf_counter() - t0) / steps
    finally:
        for name in names:
            setattr(cpu_gemv, name, plain[name])
        cpu_decode.run_layers = plain_layers
    return wall, prof.key_averages(), spent[0] / steps


def profile_batch1_step(prompt: list[int], warmup: int = 8, steps: int = 5, top: int = 15) -> str:
    """torch.profiler table of ``steps`` batch-1 decode steps, the mean split of one step by
    kind, and the unprofiled median step for scale (the profiler adds a few µs per op)."""
    engine = _decode_ready_engine([prompt], warmup + steps + 4)
    plain = statistics.median(_timed(engine.step) for _ in range(warmup))
    wall, events, gemv_s = profile_steps(engine, steps)
    calls = sum(e.count for e in events if e.key.startswith("aten::")) // steps
    lines = [events.table(sort_by="self_cpu_time_total", row_limit=top),
             f"threads {torch.get_num_threads()}; unprofiled median step {plain * 1e3:.1f} ms; "
             f"profiled step (mean of {steps}) {wall * 1e3:.1f} ms; aten op calls per step {calls}"]
    lines += [f"  {kind:<62} {sec * 1e3:7.1f} ms  {sec / wall:6.1%}"
              for kind, sec in _profile_split(events, wall, steps, gemv_s)]
    return "\n".join(lines)


def run() -> dict:
    torch.manual_seed(0)
    shared = get_shared_model(MODEL)
    prompts, output_lens = workload(shared.tokenizer)
    total_out = sum(output_lens)

    eng_wall, eng_steps, eng_trace, eng_outs = engine_run(prompts, output_lens)
    hf_seq_wall, hf_outs = hf_request_by_request(prompts, output_lens)
    hf_pad_wall = hf_padded_static_batch(prompts, output_lens)
    bw = read_bandwidth()
    weight_bytes = shared.model.weight_bytes
    decode_s = batch1_decode_seconds(prompts[0])
    long_source = shared.tokenizer((LONG + " ") * 12, add_special_tokens=False).input_ids
    short_s, mixed_s = decode_steps_short_vs_one_long(long_source)

    eng_tps, seq_tps, pad_tps = total_out / eng_wall, total_out / hf_seq_wall, total_out / hf_pad_wall
    bound_tps = bw / weight_bytes
    identical = sum(a == b for a, b in zip(eng_outs, hf_outs))
    rows = [
        {"metric": "engine throughput", "value": eng_tps, "unit": "tok/s"},
        {"metric": "HF generate request by request", "value": seq_tps, "unit": "tok/s"},
        {"metric": "HF generate one padded static batch", "value": pad_tps, "unit": "tok/s"},
        {"metric": "engine / HF request-by-request", "value": eng_tps / seq_tps, "unit": "x",
         "target": ">= 4", "met": eng_tps / seq_tps >= 4},
        {"metric": "engine / HF padded static batch", "value": eng_tps / pad_tps, "unit": "x",
         "target": "> 1", "met": eng_tps / pad_tps > 1},
        {"metric": "read bandwidth (sum, 512 MiB, 2 threads)", "value": bw / 1e9, "unit": "GB/s"},
        {"metric": "weight bytes read per decode step", "value": weight_bytes / 1e6, "unit": "MB"},
        {"metric": "batch-1 decode", "value": 1 / decode_s, "unit": "tok/s"},
        {"metric": "batch-1 decode bandwidth bound", "value": bound_tps, "unit": "tok/s"},
        {"metric": "batch-1 decode / bound", "value": (1 / decode_s) / bound_tps, "unit": "share",
         "target": ">= 0.5", "met": (1 / decode_s) / bound_tps >= 0.5},
        {"metric": f"decode step, {DECODE_BATCH} x {SHORT_PROMPT}-token prompts", "value": short_s * 1e3,
         "unit": "ms"},
        {"metric": f"decode step, {DECODE_BATCH - 1} short + 1 x {LONG_PROMPT}-token prompt", "value": mixed_s * 1e3,
         "unit": "ms"},
        {"metric": "decode step with one long / all short", "value": mixed_s / short_s, "unit": "x",
         "target": "<= 1.3", "met": mixed_s / short_s <= 1.3},
        {"metric": "trace recording / step time", "value": eng_trace / eng_steps, "unit": "share",
         "target": "< 0.05", "met": eng_trace / eng_steps < 0.05},
        {"metric": "requests token-identical to HF", "value": identical, "unit": f"of {NUM_REQUESTS}",
         "target": f"= {NUM_REQUESTS}", "met": identical == NUM_REQUESTS},
    ]
    return {"name": "engine", "model": MODEL, "threads": torch.get_num_threads(),
            "workload": {"prompt_tokens": [len(p) for p in prompts], "output_tokens": output_lens},
            "rows": rows}


if __name__ == "__main__":
    if "--profile" in sys.argv[1:]:
        tok = get_shared_model(MODEL).tokenizer
        print(profile_batch1_step(workload(tok)[0][0]))
    else:
        print(run())
