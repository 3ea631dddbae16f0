"""A run: an engine being stepped (live) or a recorded history being stepped again (replay).

Both give the views the same immutable ``RunView`` (meta, every StepTrace so far, the
Snapshot after the latest step), so every view renders a replay exactly like a live run.

    live   = LiveRun.from_scenario(load_scenario("chat-burst"), get_shared_model("tiny-random"))
    live.step()                  # one engine step under the engine's lock
    view = live.view()           # immutable: what the views draw
    replay = ReplayRun(live.recording())   # no model needed

A live run keeps a snapshot after every step, so it can be recorded (engine.recording) and
replayed without the model.
"""
from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Callable, Mapping

from engine.scenario import Scenario, build_engine, run_to_end
from engine.schema import Length, Nested
from engine.trace import Positive, Snapshot, StepTrace

if TYPE_CHECKING:
    from engine.activations import ActivationRecorder

Name = Annotated[str, Length(1, 200)]
Title = Annotated[str, Length(0, 500)]


@dataclass(frozen=True)
class RunMeta:
    """What was run: enough to label a replay and to redo the run live."""

    model: Name
    scenario: Name
    title: Title
    # EngineConfig fields; speculative_config (a SpeculativeConfig) is its vLLM-shaped dict
    config: Annotated[Mapping[str, Any], Nested(("speculative_config",))]
    max_model_len: Positive
    kv_bytes_per_token: Positive
    chat_template: bool = False

    @property
    def policy(self) -> str:
        return str(self.config.get("policy", "continuous"))

    @property
    def kv_cache_dtype(self) -> str:
        """The KV cache's element type: ``kv_cache_dtype`` if set, else the weights' dtype."""
        return str(self.config.get("kv_cache_dtype") or self.config.get("dtype") or "float32")

    @property
    def precision(self) -> str:
        """How the run computes, for a badge: ``precision_label(config)`` ("" for plain fp32)."""
        return precision_label(self.config)


def precision_label(config: Mapping[str, Any]) -> str:
    """The precision knobs of an EngineConfig (as a dict) in a few words, "" for the default.

    Rule: only what differs from fp32 weights + a KV cache in the weights' dtype is named, in
    the order weights, sparsity, KV: ``"int4 g32 · KV int8"``, ``"w8a8 SmoothQuant 0.5"``,
    ``"bfloat16"``, ``"2:4 sparse"``. The group size is named for int4 only (the only scheme
    with groups); a quantized run's bfloat16 compute dtype is implied by the scheme.
    """
    parts: list[str] = []
    scheme = config.get("quantization")
    dtype = config.get("dtype", "float32")
    if scheme:
        label = str(scheme)
        if scheme == "int4":
            label += f" g{config.get('quantization_group_size')}"
        strength = config.get("quantization_smoothing_strength")
        if strength is not None:
            label += f" SmoothQuant {strength:g}"
        parts.append(label)
    elif dtype not in ("float32", "auto", None):
        parts.append(str(dtype))
    if config.get("sparsity"):
        parts.append(f"{config.get('sparsity')} sparse")
    kv = config.get("kv_cache_dtype")
    if kv and kv != dtype:
        parts.append(f"KV {kv}")
    return " · ".join(parts)


def speculation_label(config: Mapping[str, Any]) -> str:
    """The speculative_config of an EngineConfig (as a dict) in a few words, "" when off:
    ``"ngram k=4"``, ``"early exit 8 layers k=4"``, ``"draft smollm2-135m int4 k=4"``."""
    spec = config.get("speculative_config")
    if not isinstance(spec, Mapping):
        return ""
    k = spec.get("num_speculative_tokens")
    method = spec.get("method")
    if method == "early_exit":
        return f"early exit {spec.get('num_layers')} layers k={k}"
    if method == "draft_model":
        return f"draft {spec.get('model')} {spec.get('quantization') or 'fp32'} k={k}"
    return f"{method} k={k}"


@dataclass(frozen=True)
class PolicyRun:
    """One complete run of a scenario under one scheduling policy (for side-by-side views)."""

    policy: str
    traces: tuple[StepTrace, ...]
    final: Snapshot


@dataclass(frozen=True)
class RunView:
    """An immutable picture of a run after its latest step: what every view renders."""

    meta: RunMeta
    traces: tuple[StepTrace, ...]
    snapshot: Snapshot
    done: bool
    is_replay: bool
    comparison: Mapping[str, PolicyRun] = field(default_factory=dict)

    @property
    def step(self) -> int:
        return len(self.traces)

    @property
    def last_trace(self) -> StepTrace | None:
        return self.traces[-1] if self.traces else None


def meta_for(engine: Any, scenario: Scenario) -> RunMeta:
    return RunMeta(model=engine.shared.name, scenario=scenario.name, title=scenario.title,
                   config=asdict(engine.config), max_model_len=engine.max_model_len,
                   kv_bytes_per_token=engine.kv_cache_bytes_per_token, chat_template=scenario.chat_template)


class LiveRun:
    """A live engine plus its history. Every method takes the engine's lock."""

    is_replay = False

    def __init__(self, engine: Any, meta: RunMeta) -> None:
        self.engine = engine
        self.meta = meta
        self.lock: threading.RLock = engine.lock
        self.traces: list[StepTrace] = []
        self.snapshots: list[Snapshot] = [engine.snapshot()]
        self.comparison: dict[str, PolicyRun] = {}
        self._recorder: ActivationRecorder | None = None

    @classmethod
    def from_scenario(cls, scenario: Scenario, model: Any, **knob_overrides: Any) -> "LiveRun":
        engine = build_engine(scenario, model, **knob_overrides)
        return cls(engine, meta_for(engine, scenario))

    @property
    def done(self) -> bool:
        with self.lock:
            return not self.engine.has_unfinished_requests()

    def step(self, n: int = 1) -> list[StepTrace]:
        """Up to ``n`` engine steps (fewer when the run finishes); each is followed by a snapshot."""
        out = []
        with self.lock:
            for _ in range(n):
                if not self.engine.has_unfinished_requests():
                    break
                trace = self.engine.step()
                self.traces.append(trace)
                self.snapshots.append(self.engine.snapshot())
                out.append(trace)
        return out

    def view(self) -> RunView:
        with self.lock:
            return RunView(self.meta, tuple(self.traces), self.snapshots[-1],
                           not self.engine.has_unfinished_requests(), False, dict(self.comparison))

    def activation_recorder(self) -> ActivationRecorder:
        """The run's ActivationRecorder, attached to its engine on the first call: it first sees
        the tokens computed so far (each request's prompt and outputs, one private prefill), then
        every later step's forward. Attaching costs that one prefill; after it, each step pays the
        recorder's small per-linear cost (engine/activations.py)."""
        from engine.activations import ActivationRecorder, observe_prefill  # torch only when asked

        with self.lock:
            if self._recorder is None:
                runner = self.engine.runner
                recorder = ActivationRecorder(runner.model.config.num_hidden_layers)
                done = [tuple(r.all_token_ids[:r.num_computed_tokens]) for r in self.engine.requests.values()
                        if r.num_computed_tokens > 0]
                if done:
                    observe_prefill(self.engine, done, recorder)
                runner.observer = self._recorder = recorder
            return self._recorder


class ReplayRun:
    """Steps through a recording; needs no model. ``reset`` rewinds to step 0."""

    is_replay = True

    def __init__(self, recording: Any) -> None:
        self.recording = recording
        self.meta: RunMeta = recording.meta
        self.lock = threading.RLock()
        self.cursor = 0
        self.comparison: dict[str, PolicyRun] = dict(recording.comparison)

    @property
    def done(self) -> bool:
        return self.cursor >= len(self.recording.traces)

    def step(self, n: int = 1) -> list[StepTrace]:
        with self.lock:
            start = self.cursor
            self.cursor = min(len(self.recording.traces), self.cursor + n)
            return list(self.recording.traces[start:self.cursor])

    def reset(self) -> None:
        with self.lock:
            self.cursor = 0

    def view(self) -> RunView:
        with self.lock:
            c = self.cursor
            return RunView(self.meta, tuple(self.recording.traces[:c]), self.recording.snapshots[c],
                           self.done, True, dict(self.comparison))


def compare_policies(scenario: Scenario, model: Any, knob_overrides: Mapping[str, Any] | None = None,
                     policies: tuple[str, ...] = ("static", "continuous"),
                     on_step: Callable[[str, int], None] | None = None) -> dict[str, PolicyRun]:
    """Run the same scenario to the end once per policy, with every other knob equal."""
    out = {}
    for policy in policies:
        engine = build_engine(scenario, model, **{**(knob_overrides or {}), "policy": policy})
        callback = None if on_step is None else (lambda n, p=policy: on_step(p, n))
        traces = run_to_end(engine, on_step=callback)
        out[policy] = PolicyRun(policy, tuple(traces), engine.snapshot())
    return out


CACHING_RUNS: tuple[tuple[str, bool], ...] = (("caching on", True), ("caching off", False))


def compare_prefix_caching(scenario: Scenario, model: Any, knob_overrides: Mapping[str, Any] | None = None,
                           on_step: Callable[[str, int], None] | None = None) -> dict[str, PolicyRun]:
    """Run the same scenario to the end with prefix caching on and off, every other knob equal.

    -> {"caching on": run, "caching off": run}; each run's ``policy`` is the scheduling policy used.
    """
    out = {}
    for name, enabled in CACHING_RUNS:
        engine = build_engine(scenario, model, **{**(knob_overrides or {}), "enable_prefix_caching": enabled})
        callback = None if on_step is None else (lambda n, label=name: on_step(label, n))
        traces = run_to_end(engine, on_step=callback)
        out[name] = PolicyRun(engine.config.policy, tuple(traces), engine.snapshot())
    return out
