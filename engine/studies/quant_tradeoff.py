"""The quantization trade-off, measured on this machine: what each weight scheme costs and buys.

``measure_tradeoffs(model, settings)`` runs every scheme (``MODES``: fp32, bf16, int8, int4 g32,
int4 g64, fp8, w8a8) side by side in one process and returns one ``TradeoffRow`` per scheme:

    weight bytes per decode step   every decoder layer's tensors + the final norm + the LM head,
                                   as stored (codes + scales). The embedding lookup gathers one row
                                   per token, so the table counts only as the LM head (tied in
                                   SmolLM2: counted once).             (``decode_read_bytes``)
    KV bytes per token             the engine's, for the scheme's default KV dtype (= its dtype)
    batch-1 decode tok/s           1 / the median of N decode steps after warm-up, one request with
                                   a DECODE_PROMPT_TOKENS-token prompt; the schemes are stepped
                                   round-robin so machine noise lands on all of them alike (the
                                   slow ones fewer steps, no warm-up)
    bandwidth bound                read bandwidth (``read_bandwidth``: a sum over a large fp32
                                   tensor, not a copy; the better of a run before and one after)
                                   / weight bytes per step
    perplexity                     engine.perplexity on presets/texts/sqlite3_h_comments.txt,
                                   window PPL_WINDOW / stride PPL_STRIDE, over the text's first
                                   ``settings.ppl_tokens`` tokens (the same prefix for every scheme)
    greedy agreement with fp32     tokens until the first divergence from the fp32 engine, mean over
                                   the parity prompts (presets/parity_prompts.json, the prompts of
                                   the Hugging Face parity tests), EOS ignored
    calculator                     engine.sizing.estimate for this machine (measured): its roofline
                                   and its expected batch-1 decode tok/s for the scheme's format;
                                   a model with no calculator preset (tiny-random) is described to
                                   it from the engine's own config (a note says so)

``kv_tradeoff(model)`` is the same question for the KV cache's dtype (weights fixed at fp32):
bytes per token, tokens a fixed pool holds, and the error each dtype adds, measured on the K/V a
real prompt wrote (``KVTradeoffRow``).

Records only: no streamlit, no plotly (visualizers/quant_tradeoff.py draws them).
"""
from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.model import kv_quant
from engine.core.config import EngineConfig, SamplingParams
from engine.serving.engine import LLMEngine
from engine.model.shared import SharedModel, get_shared_model
from engine.studies.evaluation import perplexity
from engine.model.runner import DTYPES, kv_cache_bytes_per_token, kv_dtype_name
from engine.model.llama import LlamaModel, ModelConfig
from engine.model.private_prefill import PrivatePrefill
from engine.model.quantization import QuantizedLinear, Weight

__all__ = ["AGREEMENT_LONG_INDEX", "FULL", "KVTradeoffRow", "LoadedMode", "MODES", "Mode", "PAGE", "QUICK",
           "Settings", "TINY", "TradeoffResult", "TradeoffRow", "agreement_prompts", "calculator",
           "decode_read_bytes", "decode_ready_engine", "kv_tradeoff", "load_modes", "measure_tradeoffs",
           "read_bandwidth", "tokens_until_divergence"]

PRESETS = Path(__file__).resolve().parents[2] / "presets"
TEXT = PRESETS / "texts" / "sqlite3_h_comments.txt"
PROMPTS_FILE = PRESETS / "parity_prompts.json"
PPL_WINDOW, PPL_STRIDE = 512, 256
DECODE_PROMPT_TOKENS = 32
REFERENCE = "fp32"  # the label every ratio and agreement is taken against

Progress = Callable[[str, float], None]


def _prompts_data() -> dict[str, Any]:
    data = json.loads(PROMPTS_FILE.read_text("utf-8"))
    if not isinstance(data, dict) or not isinstance(data.get("prompts"), list):
        raise ValueError(f"{PROMPTS_FILE.name}: must be an object with a 'prompts' list")
    return data


def agreement_prompts() -> tuple[str, ...]:
    """The greedy-agreement prompts (presets/parity_prompts.json; tests/parity.PROMPTS too)."""
    return tuple(str(p) for p in _prompts_data()["prompts"])


#: Index of the long prompt among ``agreement_prompts()`` (tests/parity.LONG).
AGREEMENT_LONG_INDEX: int = int(_prompts_data()["long_index"])


@dataclass(frozen=True)
class Mode:
    """One scheme: a label, the engine knobs that make it, whether it is slow (fewer steps)."""

    label: str
    knobs: tuple[tuple[str, Any], ...]
    calculator_format: str | None  # engine.sizing weight format of the same scheme
    slow: bool = False

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.knobs)

    @property
    def dtype(self) -> str:
        return str(self.kwargs.get("dtype", "float32"))


MODES: tuple[Mode, ...] = (
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
    """How much of each measurement to run."""

    warmup: int  # batch-1 decode steps before timing (fast schemes only)
    decode_steps: int  # timed batch-1 decode steps (the median is reported)
    slow_decode_steps: int
    ppl_tokens: int  # perplexity over the text's first ppl_tokens tokens
    agree_tokens: int  # greedy tokens per prompt compared with fp32
    slow_agree_tokens: int
    bandwidth_mib: int = 512  # the read-bandwidth probe's tensor
    agree_prompts: int | None = None  # the first N agreement prompts (None: all of them)


FULL = Settings(warmup=3, decode_steps=12, slow_decode_steps=3, ppl_tokens=768, agree_tokens=32, slow_agree_tokens=16)
QUICK = Settings(warmup=1, decode_steps=3, slow_decode_steps=1, ppl_tokens=300, agree_tokens=4, slow_agree_tokens=2)
#: The page's "Measure on this machine" (the first 4 agreement prompts). Measured on smollm2-135m,
#: quantized weights in the disk cache, 2 cores shared with other jobs (load average 5.5): 86 s
#: in all, 28 s of it loading the 7 schemes; with all 16 prompts and 5 decode steps it took 165 s.
#: fp8 (its weights decoded at every forward, ~1 tok/s) is the slowest part.
PAGE = Settings(warmup=1, decode_steps=3, slow_decode_steps=1, ppl_tokens=128, agree_tokens=8, slow_agree_tokens=4,
                agree_prompts=4)
#: Tests on tiny-random: one decode step, a few perplexity tokens.
TINY = Settings(warmup=0, decode_steps=1, slow_decode_steps=1, ppl_tokens=24, agree_tokens=4, slow_agree_tokens=2,
                bandwidth_mib=8)


@dataclass(frozen=True)
class LoadedMode:
    """A scheme's shared weights and the seconds it took to get them (quantize or disk cache)."""

    mode: Mode
    shared: SharedModel
    load_s: float


@dataclass(frozen=True)
class TradeoffRow:
    label: str
    knobs: tuple[tuple[str, Any], ...]
    weight_bytes: int  # read per decode step (decode_read_bytes)
    kv_bytes_per_token: int  # the engine's, at the scheme's default KV dtype
    batch1_tok_s: float
    decode_steps: int  # the median is over this many steps
    bound_tok_s: float  # read bandwidth / weight_bytes
    ppl: float
    ppl_ratio: float  # ppl / the fp32 ppl
    agreement: float  # mean greedy tokens equal to fp32's until the first divergence
    agreement_of: int  # tokens generated per prompt
    calculator_format: str | None
    calculator_expected_tok_s: float | None  # None: no calculator format for the scheme
    calculator_roofline_tok_s: float | None
    load_s: float

    @property
    def share_of_bound(self) -> float:
        return self.batch1_tok_s / self.bound_tok_s


@dataclass(frozen=True)
class TradeoffResult:
    model: str
    settings: Settings
    read_bandwidth_gbs: float  # GB/s (1e9 bytes)
    notes: tuple[str, ...]
    rows: tuple[TradeoffRow, ...]
    threads: int
    num_prompts: int  # greedy-agreement prompts

    def row(self, label: str) -> TradeoffRow:
        for r in self.rows:
            if r.label == label:
                return r
        raise ValueError(f"label: no row {label!r} (rows: {[r.label for r in self.rows]})")


# -- pieces ------------------------------------------------------------------------------


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def read_bandwidth(nbytes: int = 512 * 2**20, repeats: int = 5, threads: int = 2) -> float:
    """Bytes/s read by a sum over a large fp32 tensor (best of ``repeats``, ``threads`` threads).

    A decode step only reads its weights, so this — not a copy, which also writes — bounds it.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = torch.ones(nbytes // 4, dtype=torch.float32)  # [nbytes / 4]
        x.sum()  # touch every page once
        best = min(_timed(x.sum) for _ in range(repeats))
    finally:
        torch.set_num_threads(before)
    return nbytes / best


def _nbytes(t: Weight) -> int:
    return t.nbytes if isinstance(t, QuantizedLinear) else t.numel() * t.element_size()


def decode_read_bytes(model: LlamaModel) -> int:
    """Weight bytes one decode step reads: every decoder layer's tensors, the final norm and the
    LM head, as stored. The embedding table is read one row per token, so it counts only as
    the LM head (once when tied)."""
    layers = sum(_nbytes(t) for layer in model.layers for t in layer.tensors())
    return layers + _nbytes(model.norm) + _nbytes(model.lm_head)


def decode_ready_engine(model: str | SharedModel, prompts: list[list[int]], max_tokens: int,
                        **knobs: Any) -> LLMEngine:
    """An engine with every request past its prefill: each further step is decodes only."""
    engine = LLMEngine(model, max_num_seqs=len(prompts), max_num_batched_tokens=512, **knobs)
    for p in prompts:
        engine.add_request(p, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    while engine.step().num_prefill_tokens:
        pass
    return engine


def step_round_robin(engines: Mapping[str, LLMEngine]) -> dict[str, float]:
    """Step every unfinished engine once per round until all are done -> seconds in step() each."""
    spent = {k: 0.0 for k in engines}
    while True:
        live = [k for k, e in engines.items() if e.has_unfinished_requests()]
        if not live:
            return spent
        for k in live:
            spent[k] += _timed(engines[k].step)


def tokens_until_divergence(ref: Sequence[int], got: Sequence[int]) -> int:
    """Length of the common prefix of two greedy outputs (both capped at the shorter)."""
    n = min(len(ref), len(got))
    return next((i for i in range(n) if ref[i] != got[i]), n)


def load_modes(model: str, modes: Sequence[Mode] = MODES, progress: Progress | None = None,
               done: int = 0, total: int | None = None) -> dict[str, LoadedMode]:
    """Every scheme's shared weights, held here (get_shared_model's cache keeps only 4)."""
    total = total or len(modes)
    out: dict[str, LoadedMode] = {}
    for i, m in enumerate(modes):
        if progress is not None:
            progress(f"loading {m.label} weights", (done + i) / total)
        t0 = time.perf_counter()
        shared = get_shared_model(model, **m.kwargs)
        out[m.label] = LoadedMode(m, shared, time.perf_counter() - t0)
    return out


def batch1_decode(loaded: Mapping[str, LoadedMode], prompt: list[int], s: Settings) -> dict[str, float]:
    """Median batch-1 decode step (s) per scheme; stepped round-robin, slow ones fewer times and
    with no warm-up."""
    modes = [lm.mode for lm in loaded.values()]
    engines = {m.label: decode_ready_engine(loaded[m.label].shared, [prompt], s.warmup + s.decode_steps + 4,
                                            **m.kwargs) for m in modes}
    for _ in range(s.warmup):
        for m in modes:
            if not m.slow:
                engines[m.label].step()
    times: dict[str, list[float]] = {m.label: [] for m in modes}
    for i in range(s.decode_steps):
        for m in modes:
            if not m.slow or i < s.slow_decode_steps:
                times[m.label].append(_timed(engines[m.label].step))
    return {k: statistics.median(v) for k, v in times.items()}


def greedy_outputs(loaded: Mapping[str, LoadedMode], prompts: Sequence[str],
                   s: Settings) -> dict[str, list[tuple[int, ...]]]:
    """Greedy tokens per prompt per scheme (EOS ignored), the engines stepped round-robin."""
    engines, ids = {}, {}
    for label, lm in loaded.items():
        n = s.slow_agree_tokens if lm.mode.slow else s.agree_tokens
        e = LLMEngine(lm.shared, **lm.mode.kwargs, max_num_seqs=len(prompts))
        ids[label] = [e.add_request(p, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)) for p in prompts]
        engines[label] = e
    step_round_robin(engines)
    return {k: [engines[k].get_output(i).outputs[0].token_ids for i in ids[k]] for k in engines}


def _calculator_spec(model: str, config: ModelConfig, notes: list[str]) -> Any:
    """The calculator's ModelSpec: its preset when it has one, else the engine's own config."""
    from engine.sizing.formats import SizingError
    from engine.sizing import get_model, model_from_config

    try:
        return get_model(model)
    except SizingError:
        notes.append(f"calculator: no preset for {model!r}; described to it from the engine's config")
        return model_from_config(config.to_hf(), model)


def calculator(model: str, config: ModelConfig, modes: Sequence[Mode],
               notes: list[str]) -> dict[str, tuple[float, float] | None]:
    """(expected, roofline) decode tok/s at batch 1 from engine.sizing for this machine (measured),
    per scheme; None where the calculator has no such format."""
    from engine.sizing import Settings as SizingSettings, Workload, estimate
    from engine.sizing.hardware import this_machine

    spec = _calculator_spec(model, config, notes)
    hw = this_machine()
    notes.append(f"calculator: this machine measured, copy bandwidth {hw.bandwidth / 1e9:.1f} GB/s, "
                 f"eta_memory {hw.eta_memory}")
    out: dict[str, tuple[float, float] | None] = {}
    for m in modes:
        if m.calculator_format is None:
            out[m.label] = None
            continue
        e = estimate(spec, hw, Workload(batch=1), SizingSettings(weights=m.calculator_format), detail=False)
        out[m.label] = (e.decode_tokens_per_s, e.decode_tokens_per_s_roofline)
    return out


def _check_modes(modes: Sequence[Mode]) -> tuple[Mode, ...]:
    modes = tuple(modes)
    if not modes or not all(isinstance(m, Mode) for m in modes):
        raise ValueError("modes: must be a non-empty sequence of Mode records")
    labels = [m.label for m in modes]
    if len(set(labels)) != len(labels):
        raise ValueError(f"modes: labels must be distinct, got {labels}")
    if REFERENCE not in labels:
        raise ValueError(f"modes: must include the {REFERENCE!r} reference, got {labels}")
    return modes


# -- the whole table ---------------------------------------------------------------------


def measure_tradeoffs(model: str, settings: Settings, modes: Sequence[Mode] = MODES,
                      progress: Progress | None = None,
                      loaded: Mapping[str, LoadedMode] | None = None) -> TradeoffResult:
    """Every scheme of ``modes`` measured side by side (module doc). ``loaded`` reuses weights
    the caller already holds (``load_modes``); ``progress(message, fraction)`` is called before
    each phase with a fraction in [0, 1) and once at the end with 1.0.

    Invariants: the fp32 row has ppl_ratio 1 and agreement == agreement_of; every row's
    kv_bytes_per_token is kv_cache_bytes_per_token(config, its dtype)."""
    modes = _check_modes(modes)
    if not isinstance(settings, Settings):
        raise ValueError(f"settings: must be a Settings record, got {type(settings).__name__}")
    for name, value in settings.__dict__.items():
        low = 0 if name == "warmup" else 2 if name == "ppl_tokens" else 1
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
            raise ValueError(f"settings.{name}: must be an integer >= {low}, got {value!r}")
    n = len(modes)
    total = (0 if loaded is not None else n) + 1 + 1 + 1 + n + 1  # loads, bw, decode, greedy, ppl, end

    def report(message: str, done: int) -> None:
        if progress is not None:
            progress(message, min(done / total, 1.0))

    if loaded is None:
        loaded = load_modes(model, modes, progress, 0, total)
    missing = [m.label for m in modes if m.label not in loaded]
    if missing:
        raise ValueError(f"loaded: no weights for {missing}")
    loaded = {m.label: loaded[m.label] for m in modes}
    done = total - (3 + 1 + n + 1)
    ref = loaded[REFERENCE].shared
    config = ref.model.config
    every_prompt = agreement_prompts()
    prompts = every_prompt[:settings.agree_prompts]
    decode_prompt = list(ref.tokenizer(every_prompt[AGREEMENT_LONG_INDEX], add_special_tokens=False).input_ids)
    decode_prompt = decode_prompt[:DECODE_PROMPT_TOKENS]

    report("measuring read bandwidth", done)
    bw_bytes = settings.bandwidth_mib * 2**20
    bw = read_bandwidth(bw_bytes)
    report("batch-1 decode, every scheme round-robin", done + 1)
    decode_s = batch1_decode(loaded, decode_prompt, settings)
    report(f"greedy agreement over {len(prompts)} prompts", done + 2)
    outs = greedy_outputs(loaded, prompts, settings)
    text = TEXT.read_text("utf-8")
    ppl: dict[str, float] = {}
    for i, m in enumerate(modes):
        report(f"perplexity of {m.label}", done + 3 + i)
        ppl[m.label] = perplexity(LLMEngine(loaded[m.label].shared, **m.kwargs, max_num_seqs=1, num_blocks=1), text,
                                  window=PPL_WINDOW, stride=PPL_STRIDE, max_tokens=settings.ppl_tokens).ppl
    report("calculator and read bandwidth again", done + 3 + n)
    bw = max(bw, read_bandwidth(bw_bytes))  # the better of the two bounds the steps
    notes: list[str] = []
    calc = calculator(model, config, modes, notes)

    rows = []
    for m in modes:
        wb = decode_read_bytes(loaded[m.label].shared.model)
        c = calc[m.label]
        agree_n = settings.slow_agree_tokens if m.slow else settings.agree_tokens
        agree = statistics.mean(tokens_until_divergence(r, g) for r, g in zip(outs[REFERENCE], outs[m.label]))
        rows.append(TradeoffRow(
            label=m.label, knobs=m.knobs, weight_bytes=wb,
            kv_bytes_per_token=kv_cache_bytes_per_token(config, m.dtype),
            batch1_tok_s=1 / decode_s[m.label],
            decode_steps=settings.slow_decode_steps if m.slow else settings.decode_steps,
            bound_tok_s=bw / wb, ppl=ppl[m.label], ppl_ratio=ppl[m.label] / ppl[REFERENCE],
            agreement=float(agree), agreement_of=min(agree_n, settings.agree_tokens),
            calculator_format=m.calculator_format,
            calculator_expected_tok_s=None if c is None else c[0],
            calculator_roofline_tok_s=None if c is None else c[1],
            load_s=loaded[m.label].load_s))
    report("done", total)
    return TradeoffResult(model=model, settings=settings, read_bandwidth_gbs=bw / 1e9, notes=tuple(notes),
                          rows=tuple(rows), threads=torch.get_num_threads(), num_prompts=len(prompts))


# -- the KV cache's dtype ----------------------------------------------------------------


@dataclass(frozen=True)
class KVTradeoffRow:
    """One KV-cache dtype on fp32 weights (errors against the float32 cache on the same prompt)."""

    kv_cache_dtype: str
    bytes_per_token: int  # the engine's kv_cache_bytes_per_token
    calculator_bytes_per_token: int  # engine.sizing.kv_bytes_per_token for the same dtype
    pool_bytes: int
    tokens: int  # pool_bytes // bytes_per_token
    capacity_ratio: float  # tokens / the tokens a float32 cache of pool_bytes holds
    k_rel_error: float  # ||K - K~||_F / ||K||_F over every layer, the prompt's K
    v_rel_error: float
    k_max_abs_error: float
    v_max_abs_error: float
    max_logit_diff: float  # max |logits - float32-cache logits|, teacher-forced over the generation
    agreement: int  # greedy tokens equal to the float32 cache's until the first divergence
    agreement_of: int
    prompt_tokens: int


def _round_trip(x: torch.Tensor, name: str) -> torch.Tensor:
    """x [..., head_dim] fp32 -> what a cache of dtype ``name`` stores for it, as fp32."""
    if kv_quant.is_quantized(name):
        q, scale = kv_quant.quantize(x, name)
        return kv_quant.dequantize(q, scale, torch.float32)
    return x.to(DTYPES[name]).float()


@torch.inference_mode()
def _teacher_forced(model: LlamaModel, ids: list[int], rows: torch.Tensor, kv_dtype: str,
                    block_size: int) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """One prefill of ids [L] into a private cache of ``kv_dtype`` -> (logits [len(rows), V] fp32,
    per layer the float K, V the cache holds [L, kv_heads, head_dim] fp32, float caches only)."""
    n = len(ids)
    prefill = PrivatePrefill(model, n, block_size, kv_dtype)
    logits = prefill.logits(ids, rows).float()
    kvs: list[tuple[torch.Tensor, torch.Tensor]] = []
    for k, v in prefill.kv_caches:
        if isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor):
            c = model.config
            kvs.append((k.reshape(-1, c.num_key_value_heads, c.head_dim)[:n].float(),
                        v.reshape(-1, c.num_key_value_heads, c.head_dim)[:n].float()))
    return logits, kvs


def _errors(kvs: list[tuple[torch.Tensor, torch.Tensor]], name: str) -> tuple[float, float, float, float]:
    """(K rel Frobenius, V rel Frobenius, K max abs, V max abs) of the round trip over every layer."""
    out: list[float] = []
    for side in (0, 1):
        num = den = 0.0
        worst = 0.0
        for pair in kvs:
            x = pair[side]
            d = _round_trip(x, name) - x
            num += float(d.double().square().sum())
            den += float(x.double().square().sum())
            worst = max(worst, float(d.abs().max()))
        out += [math.sqrt(num / den) if den > 0 else 0.0, worst]
    return out[0], out[2], out[1], out[3]


def _greedy(shared: SharedModel, ids: list[int], kv_dtype: str, n: int) -> tuple[int, ...]:
    e = LLMEngine(shared, dtype="float32", kv_cache_dtype=kv_dtype, max_num_seqs=1)
    rid = e.add_request(ids, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
    while e.has_unfinished_requests():
        e.step()
    return e.get_output(rid).outputs[0].token_ids


def kv_tradeoff(model: str, dtypes: Sequence[str] = ("float32", "bfloat16", "int8", "fp8"),
                pool_bytes: int | None = None, prompt: str | None = None,
                gen_tokens: int = 16) -> tuple[KVTradeoffRow, ...]:
    """Per KV-cache dtype on ``model``'s fp32 weights: bytes per token, tokens ``pool_bytes`` hold
    (default: the default engine pool at float32), and the error the dtype adds on ``prompt``
    (default: the long parity prompt):

        K/V error        the float32 cache's K and V after one prefill of the prompt, round-tripped
                         through the dtype (kv_quant.quantize/dequantize, or a cast), against
                         themselves: relative Frobenius over every layer, and the max abs error
        logits           prompt + the float32 cache's greedy continuation, one prefill into a
                         cache of the dtype (attention reads what the cache holds) -> max |logit
                         difference| from the float32 cache over the continuation's rows
        agreement        greedy ``gen_tokens`` tokens with the dtype's cache: tokens equal to the
                         float32 cache's until the first divergence

    Invariants: float32 has zero error, full agreement, capacity ratio 1; bytes_per_token ==
    calculator_bytes_per_token."""
    from engine.sizing import kv_bytes_per_token as calculator_kv_bytes

    if isinstance(dtypes, str) or not isinstance(dtypes, Sequence) or not dtypes:
        raise ValueError(f"dtypes: must be a non-empty sequence of KV dtype names, got {str(dtypes)[:60]!r}")
    names = [kv_dtype_name(d) for d in dtypes]  # ValueError naming kv_cache_dtype
    if isinstance(gen_tokens, bool) or not isinstance(gen_tokens, int) or not 1 <= gen_tokens <= 256:
        raise ValueError(f"gen_tokens: must be an integer in [1, 256], got {gen_tokens!r}")
    shared = get_shared_model(model, "float32")
    config = shared.model.config
    if pool_bytes is None:
        pool_bytes = EngineConfig().cache_config.pool_tokens * kv_cache_bytes_per_token(config, "float32")
    if isinstance(pool_bytes, bool) or not isinstance(pool_bytes, int) or pool_bytes <= 0:
        raise ValueError(f"pool_bytes: must be a positive integer, got {pool_bytes!r}")
    if prompt is None:
        prompt = agreement_prompts()[AGREEMENT_LONG_INDEX]
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("prompt: must be a non-empty string")
    ids = list(shared.tokenizer(prompt, add_special_tokens=False).input_ids)
    if not ids:
        raise ValueError("prompt: encodes to no tokens")
    ref = _greedy(shared, ids, "float32", gen_tokens)
    seq = ids + list(ref)
    rows = torch.arange(len(ids) - 1, len(seq), dtype=torch.long)  # [gen_tokens + 1]: every generated position
    block = EngineConfig().cache_config.block_size
    ref_logits, ref_kv = _teacher_forced(shared.model, seq, rows, "float32", block)
    spec_notes: list[str] = []
    spec = _calculator_spec(model, config, spec_notes)
    fp32_tokens = pool_bytes // kv_cache_bytes_per_token(config, "float32")
    if fp32_tokens < 1:
        raise ValueError(f"pool_bytes: must hold at least one float32 token "
                         f"({kv_cache_bytes_per_token(config, 'float32')} bytes), got {pool_bytes}")
    out = []
    for name in names:
        bpt = kv_cache_bytes_per_token(config, name)
        logits = ref_logits if name == "float32" else _teacher_forced(shared.model, seq, rows, name, block)[0]
        got = ref if name == "float32" else _greedy(shared, ids, name, gen_tokens)
        ke, ve, km, vm = _errors(ref_kv, name)
        out.append(KVTradeoffRow(
            kv_cache_dtype=name, bytes_per_token=bpt,
            calculator_bytes_per_token=calculator_kv_bytes(spec, kv_quant.SIZING_KV_DTYPES[name]),
            pool_bytes=pool_bytes, tokens=pool_bytes // bpt, capacity_ratio=(pool_bytes // bpt) / fp32_tokens,
            k_rel_error=ke, v_rel_error=ve, k_max_abs_error=km, v_max_abs_error=vm,
            max_logit_diff=float((logits - ref_logits).abs().max()),
            agreement=tokens_until_divergence(ref, got), agreement_of=gen_tokens, prompt_tokens=len(ids)))
    return tuple(out)
