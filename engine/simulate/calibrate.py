"""Calibration on this machine: ``hardware="this-machine"`` predicts the real engine's step times.

    calibrate(model)          a CostProfile (engine/costmodel/measured.py): measured here in well under
                              a minute, cached on disk, re-measured on demand (``force``)
    this_machine_model(...)   a SimulatedModel whose cost is MeasuredCost(profile) and whose KV pool
                              is the real engine's pool (num_blocks x block_size), so a simulated run
                              and ``run_real`` on the same workload schedule the same batches

What is measured (medians of interleaved repeats, so a burst of load elsewhere spoils one sample
of a point, not the point; on a busy machine the repeats stop at the plan's time budget and the
profile says it was busy), all on the loaded model, in the engine's dtype and torch threads:

    GEMMs          every layer's four linear calls at M tokens (1 .. 512)
    LM head        final norm + head matmul at R rows
    fused layers   where the C library runs, a decode-only step's layers in one C call
                   (engine/model/cpu_decode.py) and its LM head: by rows (1 .. 16) at a short
                   context, and the time per further context slot
    attention      the K/V write + paged attention, every layer, through the engine's attention
                   backend on per-layer caches, each row on its own slots: decode groups of 1 to
                   48 rows (-> a time per group by its padded slots), whole-sequence and
                   after-cache prefill chunks
    whole steps    real ``engine.step()`` calls under a calibration traffic (``_engine_steps``:
                   ragged decode batches of 1 .. 32 requests, prefills alone and with decodes,
                   prefix hits, its own lengths), split by the trace into the runner's forward and
                   the rest: what the parts above do not explain is fitted (relative least
                   squares) as a time per step, per request and per token (scheduler, batch
                   building, sampler, trace; norms, rotary, SiLU)

The cache file is ``<cache root>/calibration/<model>-<dtype>-<machine key>.json`` (JSON only;
the machine key hashes the CPU model and count, torch threads and version): a file that does not
parse, is of another version, or names another model or machine is measured again.
"""
from __future__ import annotations

import contextlib
import hashlib
import math
import os
import platform
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

import torch

from engine.core.config import SamplingParams
from engine.core.trace import StepTrace
from engine.costmodel.measured import FUSED_CONTEXT, CostProfile, Curve, FusedDecode, MachineInfo, MeasuredCost, \
    StepOverhead
from engine.costmodel.model import Deployment, SimulatedModel
from engine.costmodel.shape import ChunkShape, StepShape
from engine.model import cache as model_cache
from engine.model.attention import attention_backend
from engine.model import cpu_decode, cpu_gemv
from engine.model.forward_batch import ForwardBatch, build_forward_batch
from engine.model.kv_quant import KVCache
from engine.model.llama import rms_norm
from engine.model.quantization import linear
from engine.model.runner import DTYPES, kv_cache_bytes_per_token
from engine.model.shared import SharedModel, get_shared_model
from engine.serving.engine import LLMEngine
from engine.sizing.plan import DEFAULT_LINK

#: the hardware name that means "the real engine on this machine"
THIS_MACHINE = "this-machine"
#: the real engine's pool and step budget when nobody sets them (CacheConfig, SchedulerConfig defaults)
DEFAULT_NUM_BLOCKS = 512
DEFAULT_BLOCK_SIZE = 16
DEFAULT_BATCHED_TOKENS = 512

Progress = Callable[[str], None]
#: a load average above this per CPU marks a profile as measured on a busy machine (its notes)
BUSY_LOAD_PER_CPU = 0.75
#: GEMM time is made non-decreasing in M from here on (``measure``)
GEMM_MONOTONE_FROM = 8


@dataclass(frozen=True)
class CalibrationPlan:
    """Which points are measured (the default fits smollm2-135m's profile in well under a minute)."""

    gemm_m: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
    head_rows: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    #: decode groups (rows, width): their padded slots rows x width, 16 .. 16,384
    decode_groups: tuple[tuple[int, int], ...] = ((1, 16), (1, 128), (1, 512), (8, 128), (1, 2048), (24, 128),
                                                  (8, 512), (48, 128), (16, 512), (24, 512), (16, 1024))
    #: the fused C decode layers (where the library runs): rows at FUSED_CONTEXT slots each, and
    #: (rows, context) for their time per further slot
    fused_rows: tuple[int, ...] = (1, 2, 4, 8, 12, 16)
    fused_slot_probe: tuple[int, int] = (8, 512)
    fused_repeats: int = 5  # most serving steps are these: more repeats than the parts get
    causal_q: tuple[int, ...] = (4, 16, 64, 128, 256, 512)
    masked: tuple[tuple[int, int], ...] = ((4, 60), (16, 112), (32, 224), (64, 448), (128, 384), (256, 256))
    #: whole engine steps (``_engine_steps``): requests in the engine, level by level
    traffic_levels: tuple[int, ...] = (1, 3, 8, 2, 16, 5, 24, 1, 12, 32, 4, 20)
    traffic_level_steps: int = 8  # steps at each level
    traffic_prompt: tuple[int, int] = (4, 256)  # tokens, log-uniform
    traffic_output: tuple[int, int] = (4, 64)  # tokens, uniform: most steps decode, as in serving
    traffic_s: float = 28.0  # the traffic stops here (seconds) if its levels have not ended
    #: whole prefill steps (one prompt of this many tokens alone), timed before the traffic: they fix
    #: the times per prefill token and per prefill chunk, which the traffic's small prefills left
    #: loose (per token 0.18 .. 0.45 ms from one profile to the next, 15 % of a 357-token prefill)
    prefill_steps: tuple[int, ...] = (32, 128, 256, 512)
    prefill_step_repeats: int = 2
    repeats: int = 3
    #: seconds for the repeats of the parts (after loading); shares per stage: ``STAGE_SHARES``
    budget_s: float = 20.0
    #: GEMM points above this M time every k-th layer and scale (compute-bound: layers are alike)
    gemm_stride_above: int = 64


#: cumulative shares of ``budget_s`` by which each stage's repeats end: GEMMs, head, decode, fused
#: decode layers, prefill
STAGE_SHARES = (0.42, 0.52, 0.6, 0.75, 1.0)

#: a quick plan for tests (tiny-random): every curve has points, few repeats
TINY_PLAN = CalibrationPlan(gemm_m=(1, 8, 64), head_rows=(1, 8), decode_groups=((1, 16), (4, 64)),
                            fused_rows=(1, 4), fused_slot_probe=(4, 64),
                            causal_q=(8, 32), masked=((8, 24), (16, 48)), traffic_levels=(1, 4, 2),
                            traffic_level_steps=4, traffic_prompt=(4, 64), traffic_output=(2, 8),
                            prefill_steps=(16, 48), prefill_step_repeats=1, repeats=1)


def use_app_threads() -> int:
    """Set torch's intra-op threads as the app runs the real engine (INFERSCOPE_TORCH_THREADS,
    default 1: app/models.configure_torch) and return them. On a small shared machine two threads
    wait on each other whenever another process takes a core (steps several times slower, at
    random); one thread slows in proportion. The CLI and the benchmark call this; ``calibrate``
    itself measures with whatever the process has (the profile is keyed by it)."""
    try:
        threads = max(1, int(os.environ.get("INFERSCOPE_TORCH_THREADS", "1")))
    except ValueError:
        raise ValueError("INFERSCOPE_TORCH_THREADS: must be a whole number >= 1") from None
    torch.set_num_threads(threads)
    return threads


def machine_info() -> MachineInfo:
    return MachineInfo(cpu_model=_cpu_model(), cpu_count=os.cpu_count() or 1, torch_threads=torch.get_num_threads(),
                       torch_version=str(torch.__version__), platform=f"{platform.system()} {platform.machine()}")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def cache_path(model: str, dtype: str = "float32", machine: MachineInfo | None = None,
               cache_dir: Path | None = None) -> Path:
    """Where the profile of ``model`` on this machine lives (module doc)."""
    m = machine or machine_info()
    name = model_cache.safe_name(model)
    if name != model:  # a path or an odd name: keep different ones apart
        name = f"{name}-{hashlib.sha256(model.encode('utf-8', 'replace')).hexdigest()[:8]}"
    root = cache_dir if cache_dir is not None else model_cache.cache_root() / "calibration"
    return root / f"{name}-{dtype}-{m.key}.json"


def load_cached(model: str, dtype: str = "float32", cache_dir: Path | None = None,
                progress: Progress | None = None) -> CostProfile | None:
    """The cached profile of ``model`` on this machine, or None (missing, unreadable, another
    version, model or machine: then ``progress`` hears why)."""
    machine = machine_info()
    path = cache_path(model, dtype, machine, cache_dir)
    if not path.is_file():
        return None
    try:
        profile = CostProfile.from_json(path.read_bytes())
    except (OSError, ValueError) as e:
        _say(progress, f"cached calibration {path.name} is not usable ({e}); measuring again")
        return None
    if (profile.model, profile.dtype, profile.machine) != (model, dtype, machine):
        _say(progress, f"cached calibration {path.name} is of {profile.model} {profile.dtype} on another machine; "
                       f"measuring again")
        return None
    return profile


def _store(profile: CostProfile, path: Path) -> None:
    """Write by one rename, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".calibration-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(profile.to_json())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _say(progress: Progress | None, text: str) -> None:
    if progress is not None:
        progress(text)


def calibrate(model: str = "smollm2-135m", *, progress: Progress | None = None, force: bool = False,
              plan: CalibrationPlan = CalibrationPlan(), cache_dir: Path | None = None) -> CostProfile:
    """The profile of ``model`` on this machine: the cached one, or measured now (``force``: always
    measured) and cached. ``progress`` hears each stage. ValueError for a model the engine cannot load."""
    dtype = "float32"  # the engine's default dtype ("auto" without quantization)
    if not force:
        cached = load_cached(model, dtype, cache_dir, progress)
        if cached is not None:
            _say(progress, f"calibration of {model} on this machine: cached ({cache_path(model, dtype, None, cache_dir)})")
            return cached
    profile = measure(model, plan, progress)
    path = cache_path(model, dtype, profile.machine, cache_dir)
    try:
        _store(profile, path)
        _say(progress, f"calibration saved to {path}")
    except OSError as e:  # a read-only cache: the profile still serves this process
        _say(progress, f"calibration not saved ({e})")
    return profile


# -- measuring ------------------------------------------------------------------------------------

def _median_sweeps(points: Sequence[Any], run: Callable[[Any], float], repeats: int,
                   deadline: float = math.inf) -> list[float]:
    """Median over up to ``repeats`` sweeps of every point (sweeps interleave, see module doc); a
    sweep that would end past ``deadline`` (perf_counter) is not started, the first always is: a
    busy machine gets fewer repeats, not a longer profile."""
    samples: list[list[float]] = [[] for _ in points]
    last = 0.0
    for n in range(max(1, repeats)):
        t0 = time.perf_counter()
        if n and t0 + last > deadline:
            break
        for i, p in enumerate(points):
            samples[i].append(run(p))
        last = time.perf_counter() - t0
    return [statistics.median(s) for s in samples]


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


class _Parts:
    """Times the model's parts directly (GEMMs, head, attention) on the loaded weights."""

    def __init__(self, shared: SharedModel, max_slots: int) -> None:
        self.model = m = shared.model
        c = m.config
        self.c = c
        self.dtype = m.dtype
        self.attention = attention_backend("torch")
        blocks = -(-max_slots // DEFAULT_BLOCK_SIZE)
        shape = (blocks, DEFAULT_BLOCK_SIZE, c.num_key_value_heads, c.head_dim)
        gen = torch.Generator().manual_seed(0)
        # per-layer caches, as the engine has: a decode reads each layer's own K/V from memory
        self.caches: list[tuple[KVCache, KVCache]] = [
            (torch.randn(shape, generator=gen).to(m.dtype), torch.randn(shape, generator=gen).to(m.dtype))
            for _ in m.layers]

    @torch.inference_mode()
    def gemm(self, m_tokens: int, stride: int) -> float:
        c, layers = self.c, self.model.layers[::stride]
        x = torch.randn(m_tokens, c.hidden_size).to(self.dtype)
        a = torch.randn(m_tokens, c.num_attention_heads * c.head_dim).to(self.dtype)
        act = torch.randn(m_tokens, c.intermediate_size).to(self.dtype)

        def run() -> None:
            for layer in layers:
                linear(x, layer.qkv, layer.qkv_bias)
                linear(a, layer.o, layer.o_bias)
                linear(x, layer.gate_up)
                linear(act, layer.down)
        return _timed(run) * len(self.model.layers) / len(layers)

    @torch.inference_mode()
    def head(self, rows: int) -> float:
        m = self.model
        h = torch.randn(rows, self.c.hidden_size).to(self.dtype)
        return _timed(lambda: linear(rms_norm(h, m.norm, self.c.rms_norm_eps), m.lm_head).float())

    @staticmethod
    def _batch(chunks: Sequence[tuple[int, int]]) -> ForwardBatch:
        """Chunks of (new tokens, start), each on its own slots, as the engine's requests are (rows
        sharing slots read the same K/V from cache: up to a third faster at 8 rows of 400 tokens on
        the machine this was written on)."""
        slots: list[list[int]] = []
        for n, s in chunks:
            first = slots[-1][-1] + 1 if slots else 0
            slots.append(list(range(first, first + s + n)))
        return build_forward_batch([[0] * n for n, _ in chunks], [s for _, s in chunks], slots, [1] * len(chunks))

    def fused_applies(self) -> bool:
        """The engine's decode-only steps run the fused C layers here (the library built, the model's format)."""
        m, batch = self.model, self._batch([(1, FUSED_CONTEXT - 1)])
        return cpu_gemv.status() == "ready" and cpu_decode.applies(self.c, m.layers, m.embed(batch), batch,
                                                                   self.caches, True, "torch")

    @torch.inference_mode()
    def fused(self, rows: int, context: int) -> float:
        """A decode step's model work as the engine runs it where the fused C layers apply: the
        layers in one C call, then the final norm and LM head, over ``rows`` decodes holding
        ``context`` slots each (one measurement, not two noisy ones added)."""
        m, batch = self.model, self._batch([(1, context - 1)] * rows)
        hidden, (cos, sin) = m.embed(batch), m.rope(batch)
        return _timed(lambda: m.compute_logits(
            cpu_decode.run_layers(self.c, m.layers, hidden, cos, sin, batch, self.caches), batch))

    @torch.inference_mode()
    def chunks(self, chunks: Sequence[tuple[int, int]]) -> float:
        """K/V write + attention of every layer for chunks of (new tokens, start), each on its own
        slots (``_batch``), through torch's attention."""
        c = self.c
        batch = self._batch(chunks)
        t = batch.num_tokens
        q = torch.randn(t, c.num_attention_heads, c.head_dim).to(self.dtype)
        k = torch.randn(t, c.num_key_value_heads, c.head_dim).to(self.dtype)
        v = torch.randn(t, c.num_key_value_heads, c.head_dim).to(self.dtype)
        scale = c.head_dim ** -0.5

        def run() -> None:
            for kc, vc in self.caches:
                self.attention.write_kv(kc, vc, k, v, batch.slot_mapping)
                self.attention.attention(q, kc, vc, batch, scale)
        return _timed(run)


class _Step(NamedTuple):
    shape: StepShape
    total_s: float  # the whole engine.step()
    forward_s: float  # of which the runner's forward: batch building and the model (the trace's forward_ms)


def _engine_steps(shared: SharedModel, plan: CalibrationPlan, progress: Progress | None) -> list[_Step]:
    """Whole ``engine.step()`` calls under a calibration traffic, timed (``plan.traffic_s`` at most).

    The traffic holds the number of running requests at a level that moves through
    ``plan.traffic_levels`` (every ``plan.traffic_level_steps`` steps), topping it up with new
    requests, so the steps are the shapes serving makes: ragged decode batches of every size,
    prefills alone and riding along with decodes, prefix-cache hits (every fourth prompt starts
    with the previous one's first blocks), preemptions when the pool fills. Its lengths come from
    its own generator (log-uniform prompts, uniform outputs), not from any validation workload."""
    out: list[_Step] = []
    rng = random.Random(0)
    vocab = min(shared.model.config.vocab_size, 30_000)
    lo, hi = plan.traffic_prompt

    def prompt(previous: list[int]) -> list[int]:
        n = round(math.exp(rng.uniform(math.log(lo), math.log(hi))))
        head = previous[:(len(previous) // DEFAULT_BLOCK_SIZE) * DEFAULT_BLOCK_SIZE] if rng.random() < 0.25 else []
        return head[:n] + [rng.randrange(3, vocab) for _ in range(max(1, n - len(head)))]

    def params() -> SamplingParams:
        return SamplingParams(temperature=0.0, max_tokens=rng.randint(*plan.traffic_output), ignore_eos=True)

    with LLMEngine(shared, num_blocks=DEFAULT_NUM_BLOCKS, block_size=DEFAULT_BLOCK_SIZE,
                   max_num_batched_tokens=DEFAULT_BATCHED_TOKENS, max_num_seqs=256) as engine:
        engine.add_request([rng.randrange(3, vocab) for _ in range(24)], SamplingParams(temperature=0.0, max_tokens=3))
        while engine.has_unfinished_requests():  # warm-up: first-call allocations, not timed
            engine.step()
        _say(progress, f"whole prefill steps of {', '.join(map(str, plan.prefill_steps))} tokens")
        for n in plan.prefill_steps * plan.prefill_step_repeats:
            # fresh random tokens (no prefix hit); max_tokens 1: the request ends with this step
            engine.add_request([rng.randrange(3, vocab) for _ in range(n)], SamplingParams(temperature=0.0, max_tokens=1))
            out.append(_timed_step(engine))
        _say(progress, f"whole engine steps under a calibration traffic (up to {plan.traffic_s:.0f} s)")
        last: list[int] = []
        deadline = time.perf_counter() + plan.traffic_s
        for i in range(len(plan.traffic_levels) * plan.traffic_level_steps):
            level = plan.traffic_levels[i // plan.traffic_level_steps]
            while len(engine.intake.pending) + len(engine.scheduler.waiting) + len(engine.scheduler.running) < level:
                last = prompt(last)
                engine.add_request(last, params())
            step = _timed_step(engine)
            if step.shape.chunks:
                out.append(step)
            if time.perf_counter() > deadline:
                break
    return out


def _timed_step(engine: LLMEngine) -> _Step:
    """One ``engine.step()``, timed whole, with the trace's forward time."""
    t0 = time.perf_counter()
    trace = engine.step()
    dt = time.perf_counter() - t0
    return _Step(trace_shape(trace), dt, min(dt, trace.forward_ms / 1e3))


def _load_average() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:  # not every platform has one
        return 0.0


def trace_shape(trace: StepTrace) -> StepShape:
    """The StepShape of a real step, from its trace (a chunk samples when its request sampled)."""
    sampled = {s.request_id for s in trace.sampled}
    return StepShape(tuple(ChunkShape(c.num_tokens, c.start, (1 + c.num_spec_tokens) if c.request_id in sampled else 0)
                           for c in trace.scheduled))


def _nnls(rows: Sequence[tuple[Sequence[float], float, float]]) -> list[float]:
    """Non-negative coefficients c minimising sum(((c . x - y) / t)^2) over rows (x, y, t), t > 0:
    each row's error as a share of its step's time t (the validation's measure); a negative
    coefficient is dropped and the rest refitted."""
    n = len(rows[0][0]) if rows else 0
    active = list(range(n))
    while active:
        a = [[sum(x[i] * x[j] / t ** 2 for x, _, t in rows) for j in active] for i in active]
        y = [sum(x[i] * v / t ** 2 for x, v, t in rows) for i in active]
        sol = _solve(a, y)
        if sol is None:
            active.pop()
            continue
        if all(v >= 0 for v in sol):
            coef = [0.0] * n
            for i, v in zip(active, sol):
                coef[i] = v
            return coef
        active = [i for i, v in zip(active, sol) if v >= 0]
    return [0.0] * n


def _fit_overhead(steps: Sequence[_Step], parts: Callable[[StepShape], float]) -> StepOverhead:
    """Two fits, each on what the trace separates, of what the parts (GEMMs, head, attention timed
    alone, taken as they are) leave unexplained:
        forward - parts  = a1 + d x decodes + c x prefill tokens + e x prefill chunks
                                                  (norms, rotary, SiLU, batch building)
        step - forward   = a2 + b x requests   (scheduling, sampling, postprocess, the trace)
    -> per step a1 + a2, per request b, per decode row d, per prefill token c, per prefill chunk e.

    The features are chosen to be apart: decode steps fix a1 + d x decodes, prefill steps c (a
    time per request in the forward too was collinear with both, and moved 0.6 .. 5.7 ms from one
    profile to the next). The parts are not scaled by a fitted factor either: it is collinear
    with the per-row terms, and moved by +-10 % between profiles, which the validation met as a
    bias."""
    fwd = [((1.0, float(s.shape.num_decodes), float(s.shape.num_tokens - s.shape.num_decodes),
             float(s.shape.num_prefill_chunks)),
            s.forward_s - parts(s.shape), s.total_s) for s in steps if s.forward_s > 0]
    rest = [((1.0, float(s.shape.num_requests)), s.total_s - s.forward_s, s.total_s)
            for s in steps if s.total_s > s.forward_s]
    a1, d, c, e = _nnls(fwd) if fwd else [0.0, 0.0, 0.0, 0.0]
    a2, b = _nnls(rest) if rest else [0.0, 0.0]
    return StepOverhead(a1 + a2, b, d, c, e)


def _solve(a: list[list[float]], y: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when singular."""
    n = len(y)
    m = [row[:] + [y[i]] for i, row in enumerate(a)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[piv][col]) < 1e-18:
            return None
        m[col], m[piv] = m[piv], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * z for x, z in zip(m[r], m[col])]
    return [m[i][n] / m[i][i] for i in range(n)]


def measure(model: str, plan: CalibrationPlan = CalibrationPlan(), progress: Progress | None = None) -> CostProfile:
    """Measure ``model``'s profile now (module doc); nothing read from or written to the cache."""
    t_start = time.perf_counter()
    load0 = _load_average()
    _say(progress, f"calibrating {model} on this machine: loading the model")
    shared = get_shared_model(model)
    m = shared.model
    dtype = next(k for k, v in DTYPES.items() if v == m.dtype)
    max_slots = max((*(n * w for n, w in plan.decode_groups), *plan.causal_q, *(n + s for n, s in plan.masked),
                     plan.fused_slot_probe[0] * plan.fused_slot_probe[1], max(plan.fused_rows) * FUSED_CONTEXT))
    parts = _Parts(shared, max_slots)
    # first calls allocate and pick kernels: run each part once untimed
    parts.gemm(plan.gemm_m[0], 1)
    parts.head(plan.head_rows[0])
    parts.chunks([(1, plan.decode_groups[0][1] - 1)])
    parts.chunks([(plan.causal_q[0], 0)])
    parts.chunks([plan.masked[0]])

    _say(progress, f"GEMMs of every layer at M = {', '.join(map(str, plan.gemm_m))}")
    t_parts = time.perf_counter()
    ends = [t_parts + share * plan.budget_s for share in STAGE_SHARES]
    gemm = _median_sweeps(plan.gemm_m, lambda mt: parts.gemm(
        mt, max(1, mt // plan.gemm_stride_above) if mt > plan.gemm_stride_above else 1), plan.repeats, ends[0])
    _say(progress, f"LM head at {', '.join(map(str, plan.head_rows))} rows")
    head = _median_sweeps(plan.head_rows, parts.head, plan.repeats, ends[1])

    _say(progress, f"decode attention: groups of {', '.join(f'{n} x {w}' for n, w in plan.decode_groups)} slots")
    dec = _median_sweeps(plan.decode_groups, lambda p: parts.chunks([(1, p[1] - 1)] * p[0]), plan.repeats, ends[2])
    dec_x = [n * w for n, w in plan.decode_groups]
    dec_order = sorted(range(len(dec_x)), key=lambda i: dec_x[i])

    fused = _fused(parts, plan, progress, ends[3])

    _say(progress, "prefill attention (whole prompts and after cached tokens)")
    prefill = [(q, 0) for q in plan.causal_q] + list(plan.masked)
    both = _median_sweeps(prefill, lambda p: parts.chunks([p]), plan.repeats, ends[4])
    causal, masked = both[:len(plan.causal_q)], both[len(plan.causal_q):]
    masked_x = [n * (n + s) for n, s in plan.masked]
    order = sorted(range(len(masked_x)), key=lambda i: masked_x[i])

    # Below GEMM_MONOTONE_FROM rows the BLAS picks its kernel by M (on the machine this was written
    # on, M = 2 and 3 ran slower than M = 4): kept as measured; above, time only grows with M.
    small = [i for i, mt in enumerate(plan.gemm_m) if mt < GEMM_MONOTONE_FROM]
    big = Curve.monotone(tuple(float(plan.gemm_m[i]) for i in range(len(small), len(gemm))), tuple(gemm[len(small):]))
    gemm_c = Curve(tuple(float(plan.gemm_m[i]) for i in small) + big.xs, tuple(gemm[i] for i in small) + big.ys,
                   log_x=True)
    head_c = Curve.monotone(tuple(map(float, plan.head_rows)), tuple(head), log_x=True)
    group_c = Curve.monotone(tuple(float(dec_x[i]) for i in dec_order), tuple(dec[i] for i in dec_order))
    causal_c = Curve.monotone(tuple(float(q * (q + 1) // 2) for q in plan.causal_q), tuple(causal))
    masked_c = Curve.monotone(tuple(float(masked_x[i]) for i in order), tuple(masked[i] for i in order))
    zero = StepOverhead(0.0, 0.0, 0.0, 0.0, 0.0)

    def profile(overhead: StepOverhead, fit_error: float = 0.0) -> CostProfile:
        return CostProfile(model=model, dtype=dtype, machine=machine_info(), num_layers=len(m.layers), gemm=gemm_c,
                           lm_head=head_c, decode_group=group_c, prefill_causal=causal_c,
                           prefill_masked=masked_c, overhead=overhead, fused=fused,
                           measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                           seconds=time.perf_counter() - t_start, fit_error=fit_error, notes=notes)

    notes: tuple[str, ...] = ()
    steps = _engine_steps(shared, plan, progress)
    load1, cpus = _load_average(), os.cpu_count() or 1
    if max(load0, load1) > BUSY_LOAD_PER_CPU * cpus:
        notes = (f"measured on a busy machine (load average {load0:.1f} -> {load1:.1f} on {cpus} CPUs): the times "
                 f"include the other work; --recalibrate when it is quiet",)
        _say(progress, notes[0])
    _say(progress, f"fitting the step overhead to {len(steps)} whole engine steps")
    bare = MeasuredCost(profile(zero))
    overhead = _fit_overhead(steps, lambda s: bare.step_cost(s).total_s)
    fitted = MeasuredCost(profile(overhead))
    errors = [abs(fitted.step_cost(s.shape).total_s - s.total_s) / s.total_s for s in steps if s.total_s > 0]
    result = profile(overhead, statistics.median(errors) if errors else 0.0)
    _say(progress, f"calibrated in {result.seconds:.1f} s: per step "
                   f"{overhead.per_step_s * 1e3:.2f} ms, per request {overhead.per_request_s * 1e3:.3f} ms, per decode row "
                   f"{overhead.per_decode_s * 1e3:.3f} ms, per prefill token {overhead.per_token_s * 1e3:.3f} ms, per prefill chunk "
                   f"{overhead.per_prefill_s * 1e3:.2f} ms; median step error on the calibration steps "
                   f"{result.fit_error:.1%}")
    return result


def _fused(parts: _Parts, plan: CalibrationPlan, progress: Progress | None, deadline: float) -> FusedDecode | None:
    """The fused C decode layers' curve by rows and their time per further slot, or None where the
    engine's decode steps do not take them here."""
    if not parts.fused_applies():
        _say(progress, f"fused C decode layers: not used here ({cpu_gemv.status()}); torch's layers are timed")
        return None
    rows, context = plan.fused_slot_probe
    _say(progress, f"fused C decode layers: {', '.join(map(str, plan.fused_rows))} rows, and {rows} rows of {context}")
    parts.fused(1, FUSED_CONTEXT)  # untimed: the first call builds the step table
    # each (rows, slots) point once: the probe's short point is usually one of the rows' points
    points = list(dict.fromkeys([(r, FUSED_CONTEXT) for r in plan.fused_rows] + [(rows, FUSED_CONTEXT), (rows, context)]))
    times = dict(zip(points, _median_sweeps(points, lambda p: parts.fused(*p), plan.fused_repeats, deadline)))
    return FusedDecode(Curve.monotone(tuple(map(float, plan.fused_rows)),
                                      tuple(times[(r, FUSED_CONTEXT)] for r in plan.fused_rows)),
                       max(0.0, (times[(rows, context)] - times[(rows, FUSED_CONTEXT)]) / (rows * (context - FUSED_CONTEXT))))


# -- the simulated model ----------------------------------------------------------------------------

def this_machine_model(model: str = "smollm2-135m", profile: CostProfile | None = None, *,
                       num_blocks: int = DEFAULT_NUM_BLOCKS, block_size: int = DEFAULT_BLOCK_SIZE,
                       max_num_batched_tokens: int = DEFAULT_BATCHED_TOKENS, max_model_len: int | None = None,
                       progress: Progress | None = None, cache_dir: Path | None = None) -> SimulatedModel:
    """``model`` served by the real engine on this machine, simulated: the cost is MeasuredCost of
    ``profile`` (default: ``calibrate(model)``, cached), the facts and tokenizer are the real
    model's, and the KV pool is the real engine's (``num_blocks`` x ``block_size``: the engine's
    CacheConfig defaults unless given), not a calculator's budget: pass the same numbers to
    ``run_real`` and both runs hold exactly the same blocks."""
    if profile is None:
        profile = calibrate(model, progress=progress, cache_dir=cache_dir)
    elif profile.model != model:
        raise ValueError(f"profile: measured for {profile.model!r}, not {model!r}")
    for name, v in (("num_blocks", num_blocks), ("block_size", block_size),
                    ("max_num_batched_tokens", max_num_batched_tokens)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: must be an integer >= 1, got {v!r}")
    shared = get_shared_model(model, profile.dtype)
    c = shared.model.config
    pool = num_blocks * block_size
    length = min(c.max_position_embeddings, pool) if max_model_len is None else max_model_len
    if not 2 <= length <= min(c.max_position_embeddings, pool):
        raise ValueError(f"max_model_len: must be 2 .. {min(c.max_position_embeddings, pool):,} (the model's "
                         f"positions and the pool of {pool:,} tokens), got {length!r}")
    cpu = profile.machine.cpu_model
    deployment = Deployment(
        model=model, model_name=model, hardware=THIS_MACHINE, hardware_name=f"this machine ({cpu})",
        framework="inferscope", budget_rule=f"the real engine's pool: {num_blocks} blocks x {block_size} tokens",
        tp=1, pp=1, weights_format=profile.dtype, kv_dtype=profile.dtype, block_size=block_size,
        kv_pool_tokens=pool, kv_bytes_per_token=kv_cache_bytes_per_token(c, profile.dtype),
        max_num_batched_tokens=max_num_batched_tokens, max_model_len=length,
        link_bytes_per_s=DEFAULT_LINK)  # (one process: no link is crossed; disaggregation would assume PCIe)
    # eos ids stay empty: a simulated request ends at its max_tokens (run_real sets ignore_eos too)
    facts = c.facts._replace(eos_token_ids=())
    return SimulatedModel(name=f"{model} (simulated on this machine)", facts=facts, tokenizer=shared.tokenizer,
                          cost=MeasuredCost(profile), deployment=deployment)

