"""Issue #25, the decode step's speed on this CPU: ``python -m tests.bench speed``.

Side by side in one run (engines stepped alternately, so machine noise lands on all):
    batch-1 fp32 decode three ways (MODES): torch throughout (F.linear = MKL sgemv), the AVX2 /
    AVX-512 GEMVs under torch's layer loop (engine/model/cpu_gemv.py), and the fused C decode
    layers (engine/model/cpu_decode.py, the default), each against the read-bandwidth bound
    measured in the same run (target >= 0.7 on the default path);
    the GEMVs alone: every weight of one step read by each kernel (GB/s against the read loop);
    a decode step of 8 requests against a step of 1 (target <= 2x);
    the batch-1 step split: the C library, aten ops, and Python / dispatch outside both (target
    <= 1.5 ms; the median of three profiled runs), and the same work with the kernels stubbed out
    (warm caches: what is left is the cost of re-warming them after each kernel);
    LLM.generate end to end, int4 against fp32, on one unseen 48-token answer (target >= 2.5x);
    start-up: the GEMV library's build on a cold cache, and the first step after LLMEngine().
    llama.cpp's batch-1 decode rate on the same Q4_1 GGUF, 2 threads (the int4 target's
    reference): ``llama-cpp-python`` from the package index, built from source once into the
    cache (``kernels/llama-cpp-python``; ~15 min on 2 cores) for this benchmark only, or a row that
    says why it could not run.
The 16-request mix against HF is ``bench_engine.py``'s.
"""
from __future__ import annotations

import json
import os
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from engine import LLM, LLMEngine, SamplingParams
from engine.model import cpu_decode, cpu_gemv
from engine.model.shared import get_shared_model
from engine.studies.quant_tradeoff import decode_read_bytes, decode_ready_engine, read_bandwidth
from tests.bench.bench_engine import _profile_split, _timed, batch1_decode_seconds, profile_steps

MODEL = "smollm2-135m"
PROMPT = "Write two sentences about the history of the bicycle and why it changed cities."
STEPS = 24
ROOT = Path(__file__).resolve().parents[2]


#: The batch-1 paths side by side: torch throughout (F.linear = MKL); the AVX2 GEMVs under torch's
#: layer loop; the fused C decode layers (engine/model/cpu_decode.py, the default).
MODES = {"torch": (False, False), "AVX2 GEMV": (True, False), "fused C layers": (True, True)}


@contextmanager
def mode(name: str) -> Iterator[None]:
    """The C GEMVs and the fused decode layers on or off as MODES[name] says."""
    gemv, fused = MODES[name]
    with cpu_gemv.enabled(gemv), cpu_decode.enabled(fused):
        yield


def _ready(prompts: list[list[int]], name: str) -> LLMEngine:
    with mode(name):
        return decode_ready_engine(MODEL, prompts, STEPS * 3 + 8)


DEFAULT = "fused C layers"


def _alternate(engines: dict[str, tuple[str, LLMEngine]], steps: int) -> dict[str, float]:
    """Median step (s) of each named (mode, engine), the engines stepped alternately so noise lands
    on all, each under its own mode (MODES)."""
    times: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(steps):
        for name, (how, engine) in engines.items():
            with mode(how):
                times[name].append(_timed(engine.step))
    return {name: statistics.median(t) for name, t in times.items()}


def batch1_side_by_side(prompt: list[int]) -> dict[str, float]:
    """Median batch-1 decode step (s) of each of MODES."""
    return _alternate({name: (name, _ready([prompt], name)) for name in MODES}, STEPS)


def gemv_read_rates() -> tuple[float, float]:
    """Bytes/s of every fp32 weight GEMV of one step (layers and LM head), F.linear and AVX2."""
    model = get_shared_model(MODEL).model
    every = [w for layer in model.layers for w in (layer.qkv, layer.o, layer.gate_up, layer.down)] + [model.lm_head]
    weights = [w for w in every if isinstance(w, torch.Tensor)]  # fp32: all of them
    inputs = {w.shape[1]: torch.randn(1, w.shape[1]) for w in weights}
    nbytes = sum(w.numel() * 4 for w in weights)

    def run(gemv: bool) -> None:
        for w in weights:
            if gemv:
                cpu_gemv.gemv(inputs[w.shape[1]], w)
            else:
                torch.nn.functional.linear(inputs[w.shape[1]], w)
    best = {g: min(_timed(lambda: run(g)) for _ in range(5)) for g in (False, True, False, True)}
    return nbytes / best[False], nbytes / best[True]


def int4_batch1(prompt: list[int]) -> tuple[float, int]:
    """(median batch-1 int4 decode step s, weight bytes one int4 step reads)."""
    shared = get_shared_model(MODEL, quantization="int4")
    return batch1_decode_seconds(prompt, STEPS, shared), decode_read_bytes(shared.model)


def eight_vs_one(source: list[int]) -> tuple[float, float]:
    """Median decode step (s) of 1 request and of 8 (the default path: the fused C layers)."""
    one = _ready([source[:24]], DEFAULT)
    eight = _ready([source[i * 24: (i + 1) * 24] for i in range(8)], DEFAULT)
    times = _alternate({"1": (DEFAULT, one), "8": (DEFAULT, eight)}, STEPS // 2)
    return times["1"], times["8"]


def _python_s(split: list[tuple[str, float]]) -> float:
    return next(v for k, v in split if k.startswith("Python"))


def step_split(prompt: list[int], steps: int = 8, blocks: int = 3) -> tuple[float, list[tuple[str, float]]]:
    """(mean profiled step s, [(kind, s)]) of batch-1 decode steps (bench_engine's split), default
    path: ``blocks`` profiled runs of ``steps`` steps each, the run with the median Python share
    (one noisy-neighbour spike on this VM moved a single run's figure by half)."""
    engine = _ready([prompt], DEFAULT)
    for _ in range(2):
        engine.step()
    runs = []
    for _ in range(blocks):
        wall, events, gemv_s = profile_steps(engine, steps)
        runs.append((wall, _profile_split(events, wall, steps, gemv_s)))
    return sorted(runs, key=lambda run: _python_s(run[1]))[blocks // 2]


def warm_outside_kernels(prompt: list[int], steps: int = 24) -> float:
    """Median s per batch-1 step outside the C kernels with the kernels replaced by stand-ins that
    return at once (the layers give back their input, the LM head a fixed logits row): the same
    Python and torch work with warm caches. The gap to the profiled figure is what re-warming the
    caches costs after each kernel has run for milliseconds (reference/cpu.md)."""
    engine = _ready([prompt], DEFAULT)
    engine.step()
    real_layers, real_gemv = cpu_decode.run_layers, cpu_gemv.gemv
    logits: dict[tuple[int, int], torch.Tensor] = {}
    cpu_decode.run_layers = lambda config, layers, hidden, *rest: hidden.float()
    cpu_gemv.gemv = lambda x, w: logits.setdefault((x.shape[0], w.shape[0]), torch.randn(x.shape[0], w.shape[0]))
    try:
        return statistics.median(_timed(engine.step) for _ in range(steps))
    finally:
        cpu_decode.run_layers, cpu_gemv.gemv = real_layers, real_gemv


def generate_int4_vs_fp32() -> tuple[float, float, int]:
    """(fp32 s, int4 s, tokens) of LLM.generate on PROMPT, 48 tokens, each warmed once."""
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    llms = {"fp32": LLM(MODEL), "int4": LLM(MODEL, quantization="int4")}
    for llm in llms.values():
        llm.generate(["Warm-up."], SamplingParams(temperature=0, max_tokens=4))
    secs = {k: _timed(lambda: llm.generate([PROMPT], params)) for k, llm in llms.items()}
    return secs["fp32"], secs["int4"], 48


def build_seconds() -> float:
    """The GEMV library's build on a cold cache (a fresh process and cache folder)."""
    with tempfile.TemporaryDirectory() as tmp:
        code = "from engine.model import cpu_gemv; assert cpu_gemv.status() == 'ready', cpu_gemv.status()"
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "INFERSCOPE_CACHE": tmp},
                       check=True, timeout=300)
        return time.perf_counter() - t0


def first_step_seconds(prompt: list[int]) -> float:
    """LLMEngine() on a loaded model through its first decode step (prefill, then one decode)."""
    t0 = time.perf_counter()
    engine = LLMEngine(MODEL, max_num_seqs=1)
    engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    engine.step()
    engine.step()
    return time.perf_counter() - t0


LLAMA_CPP_TIMEOUT_S = 3600


def llama_cpp_dir() -> Path:
    """Where llama-cpp-python is built for the benchmark (the model cache's ``kernels/``)."""
    from engine.model.cache import cache_root
    return cache_root() / "kernels" / "llama-cpp-python"


def _llama_cpp() -> None:
    """Build ``llama-cpp-python`` once into LLAMA_CPP_DIR (benchmark only), unless it is there; of
    its requirements only ``diskcache`` is not already in the venv."""
    target = llama_cpp_dir()
    if (target / "llama_cpp" / "__init__.py").exists():
        return
    print("  building llama-cpp-python from the package index (once; ~10-15 min on 2 cores)...", flush=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--upgrade", "--target", str(target),
                    "llama-cpp-python", "diskcache"], check=True, timeout=LLAMA_CPP_TIMEOUT_S)


def llama_cpp_rate(steps: int = 64) -> tuple[float | None, str]:
    """(batch-1 decode tok/s of llama.cpp on the bundled GGUF, 2 threads, or None; what ran / why not),
    measured by tests/bench/llama_cpp_rate.py in a process of its own (its docstring says why)."""
    from engine.model.convert import bundled_gguf_path
    try:
        _llama_cpp()  # built once, here, with its progress line
    except (subprocess.SubprocessError, OSError, ImportError) as e:
        return None, f"llama-cpp-python could not be built here: {str(e)[:120]}"
    args = [str(llama_cpp_dir()), str(bundled_gguf_path()), PROMPT, str(steps)]
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("llama_cpp_rate.py")), *args],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        return None, f"llama.cpp's process failed (exit {done.returncode}): {done.stderr.strip()[-120:]}"
    rate, how = json.loads(done.stdout.strip().splitlines()[-1])
    return rate, how


def run() -> dict[str, Any]:
    torch.manual_seed(0)
    shared = get_shared_model(MODEL)
    prompt = shared.tokenizer(PROMPT, add_special_tokens=False).input_ids
    source = shared.tokenizer((PROMPT + " ") * 12, add_special_tokens=False).input_ids
    status = cpu_gemv.status()
    bw = read_bandwidth()
    nbytes = decode_read_bytes(shared.model)
    bound = bw / nbytes  # tok/s
    batch1 = batch1_side_by_side(prompt)
    on_s = batch1[DEFAULT]
    lin_bw, gemv_bw = gemv_read_rates()
    one_s, eight_s = eight_vs_one(source)
    wall, split = step_split(prompt)
    python_s = _python_s(split)
    warm_s = warm_outside_kernels(prompt)
    fp32_s, int4_s, n = generate_int4_vs_fp32()
    int4_step, int4_bytes = int4_batch1(prompt)
    int4_bound = bw / int4_bytes
    rows: list[dict[str, Any]] = [
        {"metric": f"C library (GEMVs, fused decode layers; {' '.join(cpu_gemv.flags())}): {status}",
         "value": 0.0, "unit": "", "target": "", "met": None},
        {"metric": "read bandwidth (sum, 512 MiB, 2 threads)", "value": bw / 1e9, "unit": "GB/s"},
        {"metric": "weight bytes read per decode step", "value": nbytes / 1e6, "unit": "MB"},
        {"metric": "batch-1 decode bandwidth bound", "value": bound, "unit": "tok/s"},
        *({"metric": f"batch-1 decode, {name}", "value": 1 / sec, "unit": "tok/s"} for name, sec in batch1.items()),
        *({"metric": f"  {name} / bound", "value": (1 / sec) / bound, "unit": "share"}
          for name, sec in batch1.items() if sec is not on_s),
        {"metric": "  fused C layers / bound", "value": (1 / on_s) / bound, "unit": "share", "target": ">= 0.7",
         "met": (1 / on_s) / bound >= 0.7},
        {"metric": "  fused C layers / torch", "value": batch1["torch"] / on_s, "unit": "x"},
        {"metric": "GEMVs of one step alone: F.linear", "value": lin_bw / 1e9, "unit": "GB/s"},
        {"metric": "GEMVs of one step alone: AVX2 GEMV", "value": gemv_bw / 1e9, "unit": "GB/s"},
        {"metric": "decode step of 1 request", "value": one_s * 1e3, "unit": "ms"},
        {"metric": "decode step of 8 requests", "value": eight_s * 1e3, "unit": "ms"},
        {"metric": "  step of 8 / step of 1", "value": eight_s / one_s, "unit": "x", "target": "<= 2",
         "met": eight_s / one_s <= 2},
        {"metric": "batch-1 step, profiled (mean)", "value": wall * 1e3, "unit": "ms"},
        *({"metric": f"  {k}", "value": v * 1e3, "unit": "ms"} for k, v in split if not k.startswith("Python")),
        {"metric": "  Python and dispatch outside kernels", "value": python_s * 1e3, "unit": "ms",
         "target": "<= 1.5", "met": python_s * 1e3 <= 1.5},
        {"metric": "  everything outside the kernels, kernels stubbed (warm caches)", "value": warm_s * 1e3,
         "unit": "ms"},
        {"metric": f"LLM.generate {n} tokens, fp32", "value": fp32_s, "unit": "s"},
        {"metric": f"LLM.generate {n} tokens, int4", "value": int4_s, "unit": "s"},
        {"metric": "  int4 / fp32 speed", "value": fp32_s / int4_s, "unit": "x", "target": ">= 2.5",
         "met": fp32_s / int4_s >= 2.5},
        {"metric": "GEMV library build, cold cache (new process)", "value": build_seconds(), "unit": "s"},
        {"metric": "LLMEngine() to its first decode step", "value": first_step_seconds(prompt), "unit": "s"},
    ]
    rows += [
        {"metric": "int4 g32 batch-1 decode", "value": 1 / int4_step, "unit": "tok/s"},
        {"metric": f"  int4 bound ({int4_bytes / 1e6:.0f} MB a step)", "value": int4_bound, "unit": "tok/s"},
        {"metric": "  int4 / its bound", "value": (1 / int4_step) / int4_bound, "unit": "share", "target": ">= 0.5",
         "met": (1 / int4_step) / int4_bound >= 0.5},
    ]
    rate, how = llama_cpp_rate()
    rows.append({"metric": f"llama.cpp batch-1 decode ({how})", "value": float("nan") if rate is None else rate,
                 "unit": "tok/s"})
    if rate is not None:
        rows.append({"metric": "  int4 batch-1 / llama.cpp", "value": (1 / int4_step) / rate, "unit": "x",
                     "target": ">= 1", "met": (1 / int4_step) / rate >= 1})
    return {"name": "decode speed (issue #25)", "model": MODEL, "threads": torch.get_num_threads(), "rows": rows}
