"""A step's time on this machine, from curves measured on the real engine (engine/simulate/calibrate.py).

The real engine's step (engine/serving/engine.py ``step``) on one CPU process is, one part after
another:

    gemm         every layer's four linear calls (qkv, o, gate_up, down) at M = the step's tokens
                 + the LM head (final norm, head matmul) on the sampled rows
    attention    per layer: the K/V write and paged attention (engine/model/attention.py):
                   decodes   in groups (engine/model/forward_batch.py ``group_decodes``, the same
                             rule here): a time per group by its padded slots, rows x width (not
                             linear: on the machine this was written on 24 rows of 512 took 5x
                             8 rows of 512, as the gathered K/V outgrow the caches)
                   prefills  one SDPA per chunk: causal (the chunk is the whole sequence) by its
                             causal (query, key) pairs; masked (after cached tokens) by q x context
    elementwise  norms, rotary, SiLU, residual adds, embedding, batch building: a time per decode
                 row, per prefill token and per prefill chunk
    overhead     scheduling, sampling, postprocess, the trace: a time per step + a time per
                 scheduled request

A decode-only step of up to 16 rows runs every layer in one C call where the C library is built
(engine/model/cpu_decode.py): its layers and LM head are timed as the engine runs them
(``FusedDecode``: by rows at a short context, plus a time per further context slot), and the
per-row elementwise time does not apply (it is inside the call).

GEMM and attention are timed alone and taken as they are (inside a real step the GEMMs take what
they take alone: torch's profiler agrees); the rest is fitted to whole engine steps under a
calibration traffic, so the prediction is of the step as the engine runs it.

Each curve is piecewise linear between measured points (linear extrapolation past the last one,
the first point's value below the first); GEMM time interpolates in log M, where its points are
spaced. Curves that must grow with their input (GEMM vs M, LM head vs rows, attention vs pairs or
width) are made non-decreasing when the profile is built, so measurement noise never predicts a
bigger batch as faster.
"""
from __future__ import annotations

import bisect
import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from engine.costmodel.cost import StepCost
from engine.costmodel.shape import ChunkShape, StepShape
from engine.model.forward_batch import GROUP_OVERHEAD_SLOTS, group_decodes

#: the profile file format; a file of another version is measured again, never read
PROFILE_VERSION = 4
#: the context (slots) of every row when the fused decode step is timed against its rows (``FusedDecode``)
FUSED_CONTEXT = 32


@dataclass(frozen=True)
class Curve:
    """y(x) piecewise linear through measured points (xs strictly increasing, x > 0 when log_x)."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]
    log_x: bool = False

    def __post_init__(self) -> None:
        if len(self.xs) != len(self.ys) or not self.xs:
            raise ValueError("curve: xs and ys must be non-empty and of one length")
        if any(not math.isfinite(v) for v in (*self.xs, *self.ys)):
            raise ValueError("curve: points must be finite")
        if any(b <= a for a, b in zip(self.xs, self.xs[1:])):
            raise ValueError(f"curve: xs must increase strictly, got {self.xs}")
        if self.log_x and self.xs[0] <= 0:
            raise ValueError("curve: log_x needs xs > 0")
        if any(y < 0 for y in self.ys):
            raise ValueError("curve: times must be >= 0")

    @classmethod
    def monotone(cls, xs: tuple[float, ...], ys: tuple[float, ...], log_x: bool = False) -> Curve:
        """The non-decreasing curve closest to the points (pool-adjacent-violators, least squares):
        noise at one point is averaged with its neighbours instead of kept as a dip."""
        blocks: list[list[float]] = []  # [sum, count]
        for y in ys:
            blocks.append([max(0.0, y), 1.0])
            while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
                s, n = blocks.pop()
                blocks[-1][0] += s
                blocks[-1][1] += n
        out: list[float] = []
        for s, n in blocks:
            out.extend([s / n] * int(n))
        return cls(tuple(float(x) for x in xs), tuple(out), log_x)

    @property
    def is_monotone(self) -> bool:
        return all(b >= a for a, b in zip(self.ys, self.ys[1:]))

    def _t(self, x: float) -> float:
        return math.log(x) if self.log_x else x

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if len(xs) == 1 or x <= xs[0]:
            return ys[0]
        if x >= xs[-1]:
            # past the last point: the last segment's slope per unit of x (linear, not log: GEMM
            # time grows linearly with M once compute-bound)
            slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
            return ys[-1] + max(0.0, slope) * (x - xs[-1])
        i = bisect.bisect_right(xs, x)
        x0, x1 = self._t(xs[i - 1]), self._t(xs[i])
        w = (self._t(x) - x0) / (x1 - x0)
        return ys[i - 1] + w * (ys[i] - ys[i - 1])

    def to_json(self) -> dict[str, Any]:
        return {"xs": list(self.xs), "ys": list(self.ys), "log_x": self.log_x}

    @classmethod
    def from_json(cls, d: Any) -> Curve:
        if not isinstance(d, dict):
            raise ValueError("curve: expected an object")
        return cls(tuple(float(v) for v in d["xs"]), tuple(float(v) for v in d["ys"]), bool(d.get("log_x", False)))


@dataclass(frozen=True)
class MachineInfo:
    """The machine a profile was measured on: a profile from another one is never used."""

    cpu_model: str
    cpu_count: int
    torch_threads: int
    torch_version: str
    platform: str

    @property
    def key(self) -> str:
        """A short file-name-safe key of these facts."""
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class StepOverhead:
    """The parts of a step outside the model's GEMMs and attention, fitted to whole engine steps."""

    per_step_s: float  # scheduling, batch building, sampling, postprocess, the trace
    per_request_s: float  # each scheduled request: scheduling, sampling, postprocess
    per_decode_s: float  # each decode row in the forward: norms, rotary, SiLU, residuals, its batch entries
    per_token_s: float  # each prefill token in the forward: the same ops
    #: each prefill chunk in the forward: its own slices, mask and per-layer calls (a small prefill
    #: riding with decodes ran 6-8 % over a prediction without it)
    per_prefill_s: float


@dataclass(frozen=True)
class FusedDecode:
    """The fused C decode layers (engine/model/cpu_decode.py), where they ran at calibration: a
    decode-only step of up to ``max_rows`` rows runs every layer in one C call (norms, GEMVs, RoPE,
    the K/V write, attention over each row's own slots, SwiGLU), so its time is not the parts'
    sum: the layers and the LM head at rows x FUSED_CONTEXT slots as measured, plus a time per
    context slot beyond them."""

    rows: Curve  # s, every layer and the LM head, vs rows at FUSED_CONTEXT slots each
    per_slot_s: float  # s per further context slot (the C attention reads each row's own slots)

    @property
    def max_rows(self) -> int:
        return int(self.rows.xs[-1])

    def attention_s(self, contexts: list[int]) -> float:
        """s of attention beyond ``rows``' for rows holding ``contexts`` slots each."""
        return self.per_slot_s * sum(max(0, c - FUSED_CONTEXT) for c in contexts)

    def to_json(self) -> dict[str, Any]:
        return {"rows": self.rows.to_json(), "per_slot_s": self.per_slot_s}

    @classmethod
    def from_json(cls, d: Any) -> FusedDecode | None:
        if d is None:
            return None
        if not isinstance(d, dict):
            raise ValueError("fused: expected an object or null")
        return cls(Curve.from_json(d["rows"]), _time(d["per_slot_s"]))


@dataclass(frozen=True)
class CostProfile:
    """What calibration measured on one machine for one model (JSON round-trip: ``to_json`` /
    ``from_json``; any missing or malformed field is a ValueError)."""

    model: str
    dtype: str
    machine: MachineInfo
    num_layers: int
    gemm: Curve  # s, every layer's linear calls, vs M tokens (log M)
    lm_head: Curve  # s, final norm + LM head, vs sampled rows
    decode_group: Curve  # s, every layer: one decode group vs its padded slots, rows x width
    prefill_causal: Curve  # s, every layer: a whole-sequence chunk vs causal pairs q (q + 1) / 2
    prefill_masked: Curve  # s, every layer: a chunk after cached tokens vs q x context
    overhead: StepOverhead
    fused: FusedDecode | None = None  # None where the C library did not run (torch's layers then)
    measured_at: str = ""  # ISO time
    seconds: float = 0.0  # how long the profile took
    fit_error: float = 0.0  # median |predicted - measured| / measured over the calibration steps
    version: int = PROFILE_VERSION
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> str:
        d = asdict(self)
        for name in ("gemm", "lm_head", "decode_group", "prefill_causal", "prefill_masked"):
            d[name] = getattr(self, name).to_json()
        d["fused"] = None if self.fused is None else self.fused.to_json()
        d["notes"] = list(self.notes)
        return json.dumps(d, indent=1)

    @classmethod
    def from_json(cls, text: str | bytes) -> CostProfile:
        """The profile in ``text``; ValueError if it is not one of this version."""
        try:
            d = json.loads(text)
            if not isinstance(d, dict):
                raise ValueError("not an object")
            if d.get("version") != PROFILE_VERSION:
                raise ValueError(f"version {d.get('version')!r}, this build reads {PROFILE_VERSION}")
            m, o = d["machine"], d["overhead"]
            return cls(model=str(d["model"]), dtype=str(d["dtype"]),
                       machine=MachineInfo(str(m["cpu_model"]), int(m["cpu_count"]), int(m["torch_threads"]),
                                           str(m["torch_version"]), str(m["platform"])),
                       num_layers=int(d["num_layers"]), gemm=Curve.from_json(d["gemm"]),
                       lm_head=Curve.from_json(d["lm_head"]), decode_group=Curve.from_json(d["decode_group"]),
                       prefill_causal=Curve.from_json(d["prefill_causal"]),
                       prefill_masked=Curve.from_json(d["prefill_masked"]),
                       overhead=StepOverhead(_time(o["per_step_s"]), _time(o["per_request_s"]),
                                             _time(o["per_decode_s"]), _time(o["per_token_s"]),
                                             _time(o["per_prefill_s"])),
                       fused=FusedDecode.from_json(d["fused"]), measured_at=str(d.get("measured_at", "")),
                       seconds=float(d.get("seconds", 0.0)),
                       fit_error=float(d.get("fit_error", 0.0)), version=PROFILE_VERSION,
                       notes=tuple(str(n) for n in d.get("notes", ())))
        except (KeyError, TypeError, ValueError, json.JSONDecodeError) as e:
            raise ValueError(f"calibration profile: {type(e).__name__}: {e}") from None


def _time(v: Any) -> float:
    x = float(v)
    if not (math.isfinite(x) and x >= 0):
        raise ValueError(f"a time must be finite and >= 0, got {v!r}")
    return x


class MeasuredCost:
    """The CostModel of the real engine on this machine, from a CostProfile (module doc)."""

    def __init__(self, profile: CostProfile) -> None:
        self.profile = profile

    @property
    def label(self) -> str:
        p, m = self.profile, self.profile.machine
        return (f"measured on this machine: {p.model} {p.dtype}, {m.cpu_model} ({m.cpu_count} CPUs, "
                f"{m.torch_threads} torch threads, torch {m.torch_version}); calibrated {p.measured_at}")

    def attention_s(self, chunks: tuple[ChunkShape, ...]) -> float:
        p = self.profile
        decode_widths = [c.context for c in chunks if c.new_tokens == 1]
        total = 0.0
        if decode_widths:
            # the engine's own grouping rule (forward_batch.group_decodes), so the groups are its groups
            for g in group_decodes(decode_widths, GROUP_OVERHEAD_SLOTS):
                total += p.decode_group(len(g) * max(decode_widths[i] for i in g))
        for c in chunks:
            if c.new_tokens > 1:
                total += p.prefill_causal(c.causal_pairs) if c.start == 0 else \
                    p.prefill_masked(c.new_tokens * c.context)
        return total

    def step_cost(self, shape: StepShape) -> StepCost:
        p, o = self.profile, self.profile.overhead
        if not shape.chunks:
            return StepCost(0.0, 0.0, 0.0, 0.0, o.per_step_s)
        m, d = shape.num_tokens, shape.num_decodes
        overhead = o.per_step_s + o.per_request_s * shape.num_requests
        if p.fused is not None and d == m <= p.fused.max_rows:  # decode only: the fused C layers
            # every layer's arithmetic and the LM head at FUSED_CONTEXT slots a row (reported as GEMM)
            return StepCost(gemm_s=p.fused.rows(d), attention_s=p.fused.attention_s([c.context for c in shape.chunks]),
                            elementwise_s=0.0, comm_s=0.0, overhead_s=overhead)
        gemm = p.gemm(m) + (p.lm_head(shape.num_samples) if shape.num_samples else 0.0)
        return StepCost(gemm_s=gemm, attention_s=self.attention_s(shape.chunks),
                        elementwise_s=o.per_decode_s * d + o.per_token_s * (m - d)
                        + o.per_prefill_s * shape.num_prefill_chunks,
                        comm_s=0.0, overhead_s=overhead)
