"""The only module that touches ``st.session_state`` and ``st.cache_resource``.

* Weights and tokenizers: one read-only copy per (model, precision) for the whole process
  (``st.cache_resource``), shared by every browser session; the precision is the
  quantization knobs (scheme, int4 group size, ...), fp32 when none is set.
* Everything mutable is per session: the session's run (a LiveRun owning its own engine,
  KV pool and scheduler, or a ReplayRun over a recording), its comparison runs, the Generate
  page's last answer, play/pause. Every engine step happens under that run's lock.
* Widget keys live here too (``K``), so pages and controls agree on them.
"""
from __future__ import annotations

import gc
import os
import sys
import threading
import uuid
from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping

import streamlit as st
from streamlit.errors import StreamlitAPIException
from streamlit.runtime.scriptrunner import get_script_run_ctx

from app import session_reaper, step_queue, timing
from engine.core.config import DEFAULT_GROUP_SIZE, DEFAULT_OUTLIER_THRESHOLD, EngineConfig
from engine.parallel.layout import ModelDims, front_heavy_split, parse_layer_split
from engine.replay.recording import Recording, from_json, record, to_json
from engine.replay.run import (LiveRun, PolicyRun, ReplayRun, RunView, compare_policies, compare_prefix_caching,
                        compare_speculation)
from engine.replay.scenario import Scenario, list_scenarios, load_scenario, with_knobs

MODELS = ("smollm2-135m", "tiny-random")
VIEWS_FRAGMENT = "views"  # @st.fragment key of the live views (app/live.py)
DEFAULT_SCENARIO = "chat-burst"
KNOBS = ("block_size", "num_blocks", "max_num_batched_tokens", "max_num_seqs", "enable_chunked_prefill", "policy",
         "enable_prefix_caching", "quantization", "quantization_group_size", "kv_cache_dtype",
         "pipeline_parallel_size", "tensor_parallel_size", "pipeline_schedule", "num_microbatches")
# pipeline_layer_split comes from two widgets (K.split_mode, K.split_text): see layer_split().
SPLIT_MODES = ("even", "front-heavy", "custom")
# Knobs whose engine value None (off / the default) is a word in the widget, since a select
# widget's None means "nothing chosen": quantization None = "none", kv_cache_dtype None = "auto"
# (vLLM's word: the weights' dtype).
NONE_WORDS = {"quantization": "none", "kv_cache_dtype": "auto"}
MAX_SHARED_MODELS = 6  # weight copies kept per process: SmolLM2 is ~540 MB in fp32, ~100-300 MB quantized


class K:
    """Session-state keys (widgets and plain values)."""

    # speculative decoding (one engine knob, speculative_config, from four widgets)
    spec_method = "spec_method"
    spec_k = "spec_k"
    spec_layers = "spec_layers"
    spec_draft_quant = "spec_draft_quant"
    # pipeline parallelism (pipeline_layer_split from two widgets)
    split_mode = "pipeline_split_mode"
    split_text = "pipeline_split_text"

    model = "live_model"
    scenario = "live_scenario"
    knob = "knob_"  # + knob name
    run_n = "run_n"
    tick = "tick"
    present = "present"
    focus = "focus"
    upload = "recording_upload"
    # plain (non-widget) state
    run = "_run"
    run_spec = "_run_spec"
    error = "_run_error"
    notice = "_run_notice"
    playing = "_playing"
    pending = "_pending_steps"
    stop_play = "_stop_play"
    generate = "_generate_result"
    caching_runs = "_caching_runs"  # (RunSpec, runs): the prefix-caching on/off comparison
    spec_runs = "_spec_runs"  # (RunSpec, runs): with and without speculation
    worker_failed = "_worker_failed"  # the run's workers died (WorkerError): offer a restart
    sweeps = "_bubble_sweeps"  # (model, p, t) -> [SweepPoint]: the Pipeline page's measured sweep
    step_queue = "step_queue"  # the browser's Step-press counter (app/step_queue.py)
    steps_applied = "_step_presses_applied"
    epoch = "_session_epoch"
    cursor = "_history_cursor"  # the step the views draw; None: the run's latest (see step())
    step_slider = "step_slider"
    scenario_chosen = "_scenario_chosen"  # the user picked a scenario (dropdown, link, button)
    link_applied = "_deep_link_applied"  # ?step= / ?recording= are applied once per session
    page = "_live_page"  # url_path of the live page being drawn
    download_slot = "_download_slot"  # the sidebar slot the views fragment draws the download into
    page_step = "_page_step"  # +1 / -1: a page key asked for the next / previous live page


_torch_once = threading.Lock()
_torch_done = False


def configure_torch() -> None:
    """Cap torch's intra-op threads once per process (INFERSCOPE_TORCH_THREADS, default 1).

    On small shared machines one thread per session is fastest: the tiny model's ops are too
    small to split, and two sessions stepping at once would fight over the same cores.
    """
    global _torch_done
    with _torch_once:
        if _torch_done:
            return
        import torch

        torch.set_num_threads(max(1, int(os.environ.get("INFERSCOPE_TORCH_THREADS", "1"))))
        _torch_done = True


@st.cache_resource(show_spinner=False, max_entries=MAX_SHARED_MODELS)
def shared_model(name: str, quantization: str | None = None, quantization_group_size: int = DEFAULT_GROUP_SIZE,
                 quantization_outlier_threshold: float = DEFAULT_OUTLIER_THRESHOLD,
                 quantization_smoothing_strength: float | None = None, sparsity: str | None = None):
    """Weights + tokenizer, loaded once per process and precision; read-only, so sessions may
    share them. A quantization knob the model cannot take (an int4 group size that does not
    divide one of its dimensions) is the engine's ValueError naming the knob."""
    from engine.model.shared import get_shared_model

    configure_torch()
    model = get_shared_model(name, quantization=quantization, quantization_group_size=quantization_group_size,
                             quantization_outlier_threshold=quantization_outlier_threshold,
                             quantization_smoothing_strength=quantization_smoothing_strength, sparsity=sparsity)
    # Weights, modules and imports live as long as the process: move them out of the cyclic
    # GC's reach so its full collections (which would pause a step) stay short.
    gc.freeze()
    return model


def load_model(name: str, config: EngineConfig | None = None):
    """``shared_model`` for the precision ``config`` asks for (fp32 without one), with a progress
    message (the first smollm2 load converts the GGUF; the first quantization of a model takes
    seconds, then its weights come from the disk cache)."""
    if name not in MODELS:
        raise ValueError(f"model: choose one of {MODELS}, got {name!r}")
    if config is None or (config.quantization is None and config.sparsity is None):
        with st.spinner(f"Loading {name} weights (first load converts the bundled model, about a minute)…"):
            return shared_model(name)
    c = config
    scheme = c.quantization or "fp32"
    with st.spinner(f"Loading {name} weights as {scheme} (the first quantization takes seconds; it is then "
                    f"cached on disk)…"):
        return shared_model(name, c.quantization, c.quantization_group_size, c.quantization_outlier_threshold,
                            c.quantization_smoothing_strength, c.sparsity)


@st.cache_data(show_spinner=False)
def scenario_names() -> list[str]:
    return list_scenarios()


@st.cache_data(show_spinner=False)
def scenario(name: str) -> Scenario:
    return load_scenario(name)


# -- controls' values -------------------------------------------------------------------------

def init_defaults() -> None:
    """First run of a session: the default scenario's model and knobs (the URL may override;
    a ``?live_scenario=`` link counts as the user's choice, see ``apply_page_scenario``)."""
    ss = st.session_state
    if K.scenario not in ss:
        name = scenario_from_param(st.query_params.get(K.scenario))
        ss[K.scenario] = name or DEFAULT_SCENARIO
        ss[K.scenario_chosen] = ss.get(K.scenario_chosen, False) or name is not None
    sc = scenario(ss[K.scenario])
    if K.model not in ss:
        name = st.query_params.get(K.model, sc.model)
        ss[K.model] = name if name in MODELS else MODELS[0]
    for knob, value in scenario_knobs(sc).items():
        ss.setdefault(K.knob + knob, widget_value(knob, value))
    for key, value in spec_widgets(sc.knobs.get("speculative_config")).items():
        ss.setdefault(key, value)
    ss.setdefault(K.split_mode, "even")
    ss.setdefault(K.split_text, "")
    ss.setdefault(K.run_n, 10)
    ss.setdefault(K.tick, 0.5)
    ss.setdefault(K.playing, False)
    ss.setdefault(K.epoch, uuid.uuid4().hex)
    ss.setdefault(K.steps_applied, 0)
    if ss.pop(K.stop_play, False):
        ss[K.playing] = False


def scenario_from_param(value: str | None) -> str | None:
    """A link's ``live_scenario`` as a scenario name: a name (``shared-prefix``) or the title
    the bound Scenario dropdown itself writes into the address bar (its format_func's text), so
    a URL copied from the browser opens the same scenario; None when it names none."""
    if value is None:
        return None
    if value in scenario_names():
        return value
    return next((n for n in scenario_names() if scenario(n).title == value), None)


def scenario_knobs(sc: Scenario) -> dict[str, Any]:
    """The scenario's knobs with EngineConfig defaults for the ones it leaves out."""
    defaults = {f.name: f.default for f in fields(EngineConfig)}
    return {k: sc.knobs.get(k, defaults[k]) for k in KNOBS}


# Each live page opens on the scenario that shows its idea in a few steps. Rule: the page's
# scenario applies whenever a live page is drawn and the user has not chosen a scenario in this
# session (the Scenario dropdown, a ``?live_scenario=`` link, or a page's "switch" button); once
# they have, their choice stays on every page. A replay is never replaced.
PAGE_SCENARIOS = {"kv-cache": "memory-pressure", "batching": "mixed-lengths", "prefix-cache": "shared-prefix",
                  "speculative": "spec-copy", "pipeline": "pipeline"}


def apply_page_scenario(page: str) -> None:
    """Before the run is built: the page's own scenario (PAGE_SCENARIOS), unless the user chose one."""
    ss = st.session_state
    ss[K.page] = page
    name = PAGE_SCENARIOS.get(page)
    if name is None or ss.get(K.scenario_chosen) or is_replay() or ss.get(K.scenario) == name:
        return
    ss[K.scenario] = name
    on_scenario_change()


def page_scenario() -> str | None:
    """The scenario of the live page being drawn (None: the page has none of its own)."""
    return PAGE_SCENARIOS.get(st.session_state.get(K.page, ""))


def choose_scenario(name: str) -> None:
    """Callback body: the user's explicit choice of ``name`` with its knobs; a full rerun follows
    (the caller may sit in the views fragment, whose own rerun would not rebuild the run)."""
    st.session_state[K.scenario] = name
    on_scenario_pick()
    st.rerun()


def on_scenario_pick() -> None:
    """The Scenario dropdown's callback: the user's choice, kept on every page."""
    st.session_state[K.scenario_chosen] = True
    on_scenario_change()


def on_scenario_change() -> None:
    """A new scenario brings its own knobs (the chosen model stays)."""
    ss = st.session_state
    try:
        sc = scenario(ss[K.scenario])
    except ValueError as e:
        ss[K.error] = str(e)
        return
    for knob, value in scenario_knobs(sc).items():
        ss[K.knob + knob] = widget_value(knob, value)
    for key, value in spec_widgets(sc.knobs.get("speculative_config")).items():
        ss[key] = value
    split = sc.knobs.get("pipeline_layer_split")
    ss[K.split_mode], ss[K.split_text] = ("custom", ", ".join(map(str, split))) if split else ("even", "")
    ss[K.playing] = False


def widget_value(knob: str, value: Any) -> Any:
    """An engine knob's value as its widget holds it (None is a word, see NONE_WORDS)."""
    return NONE_WORDS[knob] if value is None and knob in NONE_WORDS else value


def engine_value(knob: str, value: Any) -> Any:
    """A widget's value as the engine knob takes it (the inverse of ``widget_value``)."""
    return None if knob in NONE_WORDS and value == NONE_WORDS[knob] else value


@dataclass(frozen=True)
class RunSpec:
    """What the controls ask for; a run is rebuilt whenever this changes."""

    model: str
    scenario: str
    knobs: tuple[tuple[str, Any], ...]


def requested_spec() -> RunSpec:
    """The controls as engine knobs. The int4 group size counts only with int4: any other scheme
    gets the default, so its disabled widget neither rebuilds the run nor loads another copy."""
    ss = st.session_state
    knobs = {k: engine_value(k, ss[K.knob + k]) for k in KNOBS}
    if knobs["quantization"] != "int4":
        knobs["quantization_group_size"] = DEFAULT_GROUP_SIZE
    knobs["speculative_config"] = speculative_config(ss[K.model])
    if knobs["pipeline_schedule"] == "batch_queue":  # whole batches in flight: m is GPipe's only
        knobs["num_microbatches"] = 1
    knobs["pipeline_layer_split"] = layer_split(ss[K.model], knobs["pipeline_parallel_size"])
    return RunSpec(ss[K.model], ss[K.scenario], tuple(knobs.items()))


def layer_split(model: str, p: Any) -> tuple[int, ...] | str | None:
    """pipeline_layer_split from the split widgets: None for "even" (or one stage), the 2:1
    front-heavy split for the model's layers, or the custom text's counts (the text itself when
    it does not parse, so the engine's ValueError names pipeline_layer_split)."""
    ss = st.session_state
    mode = ss.get(K.split_mode, "even")
    if not isinstance(p, int) or p < 2 or mode == "even":
        return None
    if mode == "front-heavy":
        layers = model_dims(model).num_layers
        return front_heavy_split(layers, p) if p <= layers else None  # too many stages: the engine says so
    text = str(ss.get(K.split_text, ""))
    try:
        return parse_layer_split(text)
    except ValueError:
        return text


@st.cache_data(show_spinner=False)
def model_hf_config(name: str) -> dict[str, Any]:
    """The model's Hugging Face config.json as a dict (no weights loaded)."""
    if name == "tiny-random":
        from engine.model.loader import TINY_RANDOM_CONFIG

        return dict(TINY_RANDOM_CONFIG)
    from engine.sizing import model_preset_config

    return dict(model_preset_config(name))


def model_dims(name: str) -> ModelDims:
    return ModelDims.from_hf(model_hf_config(name))


SPEC_METHOD_NONE = "none"
SPEC_DEFAULTS = {K.spec_method: SPEC_METHOD_NONE, K.spec_k: 4, K.spec_layers: 8, K.spec_draft_quant: "int4"}


def spec_widgets(config: Any) -> dict[str, Any]:
    """The speculation widgets' values for a scenario's ``speculative_config`` (a vLLM-shaped
    dict or None; a bad one is left to the engine, whose message names the key)."""
    out = dict(SPEC_DEFAULTS)
    if isinstance(config, Mapping):
        out[K.spec_method] = config.get("method", SPEC_METHOD_NONE)
        out[K.spec_k] = config.get("num_speculative_tokens", out[K.spec_k])
        out[K.spec_layers] = config.get("num_layers", out[K.spec_layers])
        out[K.spec_draft_quant] = config.get("quantization") or "none"
    return out


def speculative_config(model: str) -> dict[str, Any] | None:
    """The widgets as vLLM's ``speculative_config`` dict (None when off). draft_model drafts with
    the run's own model at the chosen quantization (a self-draft: same vocabulary)."""
    ss = st.session_state
    method = ss.get(K.spec_method, SPEC_METHOD_NONE)
    if method == SPEC_METHOD_NONE:
        return None
    config: dict[str, Any] = {"method": method, "num_speculative_tokens": ss.get(K.spec_k)}
    if method == "early_exit":
        config["num_layers"] = ss.get(K.spec_layers)
    elif method == "draft_model":
        quant = ss.get(K.spec_draft_quant)
        config.update(model=model, quantization=None if quant == "none" else quant)
    return config


def spec_scenario(spec: RunSpec) -> Scenario:
    """The spec's scenario with its knobs replaced by the controls' (a None knob replaces too:
    quantization "none" turns off a scenario's quantization); ValueError names a bad knob."""
    return with_knobs(scenario(spec.scenario), **dict(spec.knobs))


def spec_model(spec: RunSpec, sc: Scenario):
    """The shared weights the spec's engine needs: its model at the precision of ``sc``'s knobs."""
    return load_model(spec.model, sc.engine_config())


# -- the session's run ------------------------------------------------------------------------

def run() -> LiveRun | ReplayRun | None:
    return st.session_state.get(K.run)


def is_replay() -> bool:
    return isinstance(run(), ReplayRun)


def ensure_run() -> None:
    """Build the session's live run if there is none or the controls changed (not in replay).

    Problems (a bad knob, a prompt too long for the pool) end up as a message in
    ``K.error`` and leave no run, never as an exception.
    """
    ss = st.session_state
    if is_replay():
        return
    spec = requested_spec()
    if ss.get(K.run) is not None and ss.get(K.run_spec) == spec:
        return
    if ss.get(K.run_spec) == spec and ss.get(K.error):
        return  # same bad request as last time: keep the message, do not retry every rerun
    build_run(spec)


def session_id() -> str:
    """This browser session's id (the worker reaper's key)."""
    ctx = get_script_run_ctx()
    return ctx.session_id if ctx is not None else "no-session"


def close_run() -> None:
    """Stop the session's live run's worker processes (if any) and drop the run."""
    ss = st.session_state
    current = ss.get(K.run)
    ss[K.run] = None
    ss[K.cursor] = None
    if isinstance(current, LiveRun):
        current.close()
        session_reaper.release(session_id())


def build_run(spec: RunSpec) -> None:
    """A new live run for ``spec``; the old one's workers are stopped first. When workers stop
    or start, a progress bar shows it from the first moment (``WorkerProgress``)."""
    ss = st.session_state
    old = ss.get(K.run)
    progress = WorkerProgress.show(isinstance(old, LiveRun) and is_parallel(old.meta.config),
                                   is_parallel(dict(spec.knobs)))
    close_run()
    ss[K.run_spec], ss[K.error], ss[K.worker_failed] = spec, None, False
    ss[K.playing] = False
    try:
        sc = spec_scenario(spec)
        config = sc.engine_config()
        model = spec_model(spec, sc)
        if config.num_workers == 1:
            ss[K.run] = LiveRun.from_scenario(sc, model)
        else:
            progress.starting(config.num_workers, config.pipeline_parallel_size, config.tensor_parallel_size)
            ss[K.run] = LiveRun.from_scenario(sc, model, progress=progress.say)
            session_reaper.adopt(session_id(), ss[K.run])  # its workers end with the session
    except (ValueError, OSError) as e:
        ss[K.error] = str(e)
    except RuntimeError as e:
        if not is_worker_error(e):
            raise
        ss[K.error] = f"workers failed to start: {e}"
        ss[K.worker_failed] = True
    except MemoryError:  # the engine checks memory first; this is the OS changing its mind
        ss[K.error] = "out of memory building the engine: lower num_blocks or max_num_batched_tokens"
    finally:
        progress.done()


def is_parallel(knobs: Mapping[str, Any]) -> bool:
    """The knobs ask for worker processes (p or t above 1)."""
    return any(isinstance(knobs.get(k), int) and knobs[k] > 1
               for k in ("pipeline_parallel_size", "tensor_parallel_size"))


class WorkerProgress:
    """A progress bar for stopping and starting worker processes, drawn before anything slow
    happens (the old workers' stop, the model, the spawn), so a knob change shows progress at
    once. It takes the first slot of the page, so it replaces whatever a previous run left there,
    and it is removed when the run is built: no finished box stays behind to go stale during
    the next restart."""

    def __init__(self, slot: Any = None) -> None:
        self.slot = slot
        self.workers = 1

    @classmethod
    def show(cls, stopping: bool, starting: bool) -> "WorkerProgress":
        if not (stopping or starting):
            return cls()  # a single-process run replacing another: instant, nothing to show
        progress = cls(st.empty())
        progress.update(0.02, "Stopping the old worker processes…" if stopping else "Preparing the engine…")
        return progress

    def update(self, fraction: float, text: str) -> None:
        if self.slot is not None:
            self.slot.progress(min(max(fraction, 0.0), 1.0), text=text)

    def starting(self, workers: int, p: int, t: int) -> None:
        self.workers = workers
        self.update(0.05, f"Starting {workers} worker processes (p = {p}, t = {t}); each loads its share of "
                          "the model (SmolLM2: about 10 s)…")

    def say(self, message: object) -> None:
        """engine.parallel.executor's start-up messages ("worker k of n ready" moves the bar)."""
        text = str(message)
        words = text.split()
        ready = int(words[1]) if len(words) > 1 and words[0] == "worker" and words[1].isdigit() else 0
        self.update(0.05 + 0.95 * ready / max(self.workers, 1), text[:1].upper() + text[1:] + "…")

    def done(self) -> None:
        if self.slot is not None:
            self.slot.empty()


def reset() -> None:
    """Widget callback: back to step 0 (a replay rewinds; a live run is rebuilt from the controls)."""
    ss = st.session_state
    current = run()
    ss[K.playing] = False
    ss[K.pending] = 0
    ss[K.steps_applied] = queued_presses()  # presses before Reset do not carry into the new run
    ss[K.cursor] = None
    if isinstance(current, ReplayRun):
        current.reset()
    else:
        close_run()
        ss[K.run_spec] = None
        ss[K.error] = None
        ss[K.worker_failed] = False


def restart_workers() -> None:
    """Widget callback after a WorkerError: a fresh live run (new workers) from the controls."""
    build_run(requested_spec())


def worker_failed() -> bool:
    return bool(st.session_state.get(K.worker_failed, False))


def step(n: int = 1) -> list:
    """``n`` steps forward -> the StepTraces stepped over ([] when done or failed).

    Rule (the history cursor): while the views are behind the run's latest step, a step moves
    the cursor forward through the recorded history (no engine work); only the steps beyond the
    latest run the engine (a replay: its recording), under the run's lock. So Step, Run N, Play
    and queued presses all continue from the step on screen.

    A failure is a message; a WorkerError (a worker process died or hung; the executor has
    stopped them all) also marks the run for the "Restart workers" button.
    """
    current = run()
    if current is None:
        return []
    moved = _cursor_forward(current, n)
    if len(moved) == n:
        return moved
    try:
        with timing.phase("engine step"):
            return moved + current.step(n - len(moved))
    except (ValueError, RuntimeError, MemoryError) as e:  # the failed step was rolled back
        failed = is_worker_error(e)
        st.session_state[K.error] = f"the worker processes failed: {e}" if failed else f"step failed: {e}"
        st.session_state[K.worker_failed] = failed
        st.session_state[K.playing] = False
    return []


def is_worker_error(e: BaseException) -> bool:
    """``e`` is engine.executor's WorkerError (imported only once a parallel engine exists, so
    the app does not load torch for this check)."""
    module = sys.modules.get("engine.parallel.executor")
    return module is not None and isinstance(e, module.WorkerError)


def rerun_views() -> None:
    """From a widget callback: rerun only the views fragment, not the page and the sidebar.

    The fragment is known only after a full run drew it (a fresh page's first run may have been
    interrupted); then the callback returns normally and Streamlit does its full rerun.
    """
    try:
        st.rerun(VIEWS_FRAGMENT)
    except StreamlitAPIException:
        return


def on_step_click() -> None:
    """The Step button's own callback: only where the browser counter is not listening (AppTest,
    or a page whose counter has not mounted yet), so a plain full rerun is fine here."""
    step(1)


def on_step_presses() -> None:
    """The browser counter changed: its presses are applied by the views, which rerun now."""
    with timing.phase("presses callback"):
        rerun_views()


def queued_presses() -> int:
    """Step presses the browser has counted in this session (0 before the first one)."""
    ss = st.session_state
    return step_queue.presses(ss.get(K.step_queue), ss.get(K.epoch, "")) or 0


def apply_queued_steps() -> None:
    """Step once for every press counted in the browser and not applied yet, in order.

    Presses made before the run exists (first load, a rebuild) wait here until it does. Two
    script runs may get here at once (a new press stops the old run only at its next st.*
    call); the run's lock and the re-read under it apply each press exactly once.
    """
    current = run()
    if current is None:
        return
    ss = st.session_state
    with current.lock:
        presses = queued_presses()
        pending = presses - ss.get(K.steps_applied, 0)
        if pending <= 0:
            return
        ss[K.steps_applied] = presses
        step(pending)


def mount_step_queue() -> None:
    step_queue.mount(K.step_queue, st.session_state[K.epoch], on_step_presses, on_page_key)


def on_page_key() -> None:
    """The next / previous page key (app/step_queue.py): the entry point switches page."""
    ss = st.session_state
    ss[K.page_step] = step_queue.navigation(ss.get(K.step_queue))


def take_page_step() -> int:
    """+1 / -1 when a page key asked for the next / previous live page since the last run, else 0."""
    return int(st.session_state.pop(K.page_step, 0) or 0)


def request_steps() -> None:
    """Widget callback for Run N: the steps run in the views, with a progress bar."""
    st.session_state[K.pending] = int(st.session_state.get(K.run_n, 10))


def take_pending_steps() -> int:
    return int(st.session_state.pop(K.pending, 0) or 0)


def toggle_play() -> None:
    st.session_state[K.playing] = not st.session_state.get(K.playing, False)


def playing() -> bool:
    return bool(st.session_state.get(K.playing, False))


def stop_playing() -> None:
    """From inside the views (run finished): Play's state is changed before the next full run."""
    st.session_state[K.stop_play] = True


def tick_seconds() -> float:
    return float(st.session_state.get(K.tick, 0.5))


def view() -> RunView | None:
    """The session's run at the history cursor (its latest step when the cursor is at the end)."""
    current = run()
    return current.view(cursor()) if current is not None else None


# -- the history cursor: the step the views draw ------------------------------------------------

def cursor() -> int | None:
    """The step the views draw; None follows the run's latest step."""
    at = st.session_state.get(K.cursor)
    return None if at is None else int(at)


def _set_cursor(current: LiveRun | ReplayRun, at: int) -> None:
    """Point the views at step ``at`` (clamped to the history); at the latest step the cursor
    follows the run again (None)."""
    end = current.num_steps
    st.session_state[K.cursor] = None if at >= end else max(0, at)


def _cursor_forward(current: LiveRun | ReplayRun, n: int) -> list:
    """Up to ``n`` steps of the history between the cursor and the latest step -> their traces."""
    at = cursor()
    if at is None or n <= 0:
        return []
    end = current.num_steps
    target = min(end, at + n)
    _set_cursor(current, target)
    return list(current.view(target).traces[at:target])


def step_back() -> None:
    """The Step back button's callback: the views draw the previous step (none before step 0);
    Play pauses. The run itself is not changed. Step presses the browser counted before this
    one are applied first (a callback runs before the views apply them), so PageDown then B
    lands where the speaker expects."""
    current = run()
    if current is None:
        return
    apply_queued_steps()
    at = cursor()
    _set_cursor(current, (current.num_steps if at is None else at) - 1)
    st.session_state[K.playing] = False


def on_step_slider() -> None:
    """The Step slider's callback: the views draw the chosen step; Play pauses."""
    current = run()
    if current is None:
        return
    _set_cursor(current, int(st.session_state.get(K.step_slider, 0)))
    st.session_state[K.playing] = False


def at_end() -> bool:
    """The views are at the latest step of a finished run (Play has nothing left to show)."""
    current = run()
    return current is None or (cursor() is None and current.done)


def error() -> str | None:
    return st.session_state.get(K.error)


def notice() -> str | None:
    return st.session_state.get(K.notice)


# -- record / replay --------------------------------------------------------------------------

def set_download_slot(slot: Any) -> None:
    """The sidebar slot of the recording download (app/controls.py), laid out by the last full run."""
    st.session_state[K.download_slot] = slot


def download_slot() -> Any:
    return st.session_state.get(K.download_slot)


def recording_json(current: LiveRun | ReplayRun) -> Callable[[], str]:
    """The recording download's data: a callable that serialises ``current`` when the browser
    asks for the file. Streamlit calls it outside any script run, where there is no session
    state to find the run in, so it holds the run itself (``record`` takes the run's lock)."""
    return lambda: to_json(record(current))


def load_recording_upload() -> None:
    """Widget callback: an uploaded JSON recording becomes the session's run (replay mode)."""
    ss = st.session_state
    uploaded = ss.get(K.upload)
    if uploaded is None:
        return
    try:
        start_replay(from_json(uploaded.getvalue()))
    except ValueError as e:
        ss[K.error] = str(e)


def start_replay(recording: Recording) -> None:
    ss = st.session_state
    close_run()
    ss[K.run] = ReplayRun(recording)
    ss[K.error] = None
    ss[K.playing] = False
    ss[K.notice] = f"Replaying a recording of {recording.meta.title} on {recording.meta.model} " \
                   f"({len(recording.traces)} steps); no model is loaded."


def page_recording() -> str | None:
    """The bundled recording (engine.replay.bundled) of the page's scenario, else of the session's
    scenario; None when there is none."""
    from engine.replay.bundled import bundled_names

    name = page_scenario() or st.session_state.get(K.scenario)
    return name if name in bundled_names() else None


def replay_bundled(name: str) -> None:
    """Widget callback: bundled recording ``name`` becomes the session's run (replay mode)."""
    from engine.replay.bundled import load_bundled

    try:
        start_replay(load_bundled(name))
    except ValueError as e:
        st.session_state[K.error] = str(e)


# -- deep links -------------------------------------------------------------------------------

STEP_PARAM = "step"  # ?step=12: open at step 12
RECORDING_PARAM = "recording"  # ?recording=spec-copy: replay that bundled recording
MAX_LINK_STEPS = 1000  # as the Run N field


def link_steps(raw: str) -> int:
    """A link's ``?step=`` value as a step count; ValueError naming ``step``."""
    text = raw.strip()
    if not text.isdigit() or int(text) > MAX_LINK_STEPS:
        raise ValueError(f"step: the link's step must be a whole number from 0 to {MAX_LINK_STEPS}, got {raw!r}")
    return int(text)


def apply_deep_link() -> str | None:
    """Once per session, before its run is built: ``?recording=<name>`` replays that bundled
    recording, and ``?step=N`` runs the engine (or the replay) to step N in the views, with
    Run N's progress bar -> a message for a bad link (None when it applies or there is none).

    Model, scenario and presentation mode are widget values bound to the URL (init_defaults
    reads the first two before the run is built, so a link never builds the default run first)."""
    ss = st.session_state
    if ss.get(K.link_applied):
        return None
    ss[K.link_applied] = True
    name, raw = st.query_params.get(RECORDING_PARAM), st.query_params.get(STEP_PARAM)
    try:
        if name is not None:
            from engine.replay.bundled import load_bundled

            start_replay(load_bundled(name))
        if raw is not None:
            ss[K.pending] = link_steps(raw)
    except ValueError as e:
        return str(e)
    return None


def report(message: str) -> None:
    """Show ``message`` above the views (as a failed step would be)."""
    st.session_state[K.error] = message


def leave_replay() -> None:
    ss = st.session_state
    close_run()
    ss[K.run_spec] = None
    ss[K.notice] = None  # K.upload is a file_uploader's key: read-only, assigning it raises


# -- static vs continuous ---------------------------------------------------------------------

def comparison() -> dict[str, PolicyRun]:
    current = run()
    return dict(current.comparison) if current is not None else {}


def run_comparison(progress: Callable[[str, int], None] | None = None) -> None:
    """Run the current scenario to the end under both policies (live runs only)."""
    current = run()
    if current is None or isinstance(current, ReplayRun):
        return
    spec = st.session_state.get(K.run_spec)
    if spec is None:
        return
    try:
        sc = spec_scenario(spec)
        runs = compare_policies(sc, spec_model(spec, sc), on_step=progress)
    except (ValueError, RuntimeError) as e:
        st.session_state[K.error] = f"comparison failed: {e}"
        return
    with current.lock:
        current.comparison.update(runs)


# -- side-by-side comparisons kept per set-up: prefix caching on vs off, speculation on vs off ----
# Not part of a recording (engine/replay/recording.py accepts only the two scheduling policies as
# comparison runs), so a replay has none; a change of model, scenario or knob drops them.

Compare = Callable[..., dict[str, PolicyRun]]  # engine.run.compare_*(scenario, model, on_step=...)


def _stored_comparison(key: str) -> dict[str, PolicyRun]:
    """The runs stored under ``key`` for the current live set-up, if run."""
    ss = st.session_state
    stored = ss.get(key)
    if is_replay() or stored is None or stored[0] != ss.get(K.run_spec):
        return {}
    return dict(stored[1])


def _run_stored_comparison(key: str, compare: Compare, progress: Callable[[str, int], None] | None) -> None:
    """Run the current scenario to the end both ways with ``compare`` and store the runs under
    ``key`` (live runs only); a failure is a message."""
    ss = st.session_state
    spec = ss.get(K.run_spec)
    if run() is None or is_replay() or spec is None:
        return
    try:
        sc = spec_scenario(spec)
        runs = compare(sc, spec_model(spec, sc), on_step=progress)
    except (ValueError, RuntimeError) as e:
        ss[K.error] = f"comparison failed: {e}"
        return
    ss[key] = (spec, runs)


def caching_comparison() -> dict[str, PolicyRun]:
    """The caching on/off runs of the current live set-up (same model, scenario and knobs), if run."""
    return _stored_comparison(K.caching_runs)


def run_caching_comparison(progress: Callable[[str, int], None] | None = None) -> None:
    """Run the current scenario to the end with prefix caching on and off (live runs only)."""
    _run_stored_comparison(K.caching_runs, compare_prefix_caching, progress)


def spec_comparison() -> dict[str, PolicyRun]:
    """The with/without-speculation runs of the current live set-up, if run."""
    return _stored_comparison(K.spec_runs)


def run_spec_comparison(progress: Callable[[str, int], None] | None = None) -> None:
    """Run the current scenario to the end with its speculative_config and without (live only)."""
    _run_stored_comparison(K.spec_runs, compare_speculation, progress)


# -- presentation -----------------------------------------------------------------------------

def init_presentation() -> None:
    """Presentation mode from the URL (``?present=true``) on a session's first run. The toggle is
    bound to the URL, but it is drawn after the page (controls.sidebar), so without this the page
    of that first run would not see the mode."""
    ss = st.session_state
    if K.present not in ss:
        ss[K.present] = str(st.query_params.get(K.present, "")).lower() == "true"


def presentation() -> bool:
    return bool(st.session_state.get(K.present, False))


def focus() -> str | None:
    value = st.session_state.get(K.focus)
    return None if value in (None, "all") else value


# -- the Generate page ------------------------------------------------------------------------

def generate_result() -> dict | None:
    return st.session_state.get(K.generate)


def set_generate_result(result: dict) -> None:
    st.session_state[K.generate] = result


# -- the Quantization page -----------------------------------------------------------------------
# Weights, inspections and measurements are process-wide (read-only records, shared by every
# session); the live run's activation statistics are per session (they are of that run's tokens).

@st.cache_resource(show_spinner=False, max_entries=2)
def fp32_model(name: str):
    """The model as loaded from disk: fp32 weights by Hugging Face name (what every scheme
    quantizes) and its config."""
    from engine.model.loader import load_model as load_weights

    if name not in MODELS:
        raise ValueError(f"model: choose one of {MODELS}, got {name!r}")
    configure_torch()
    return load_weights(name, progress=lambda *_: None)


def fp32_weights(name: str) -> dict:
    return fp32_model(name).weights


def num_layers(name: str) -> int:
    """The model's layer count: from the session's live engine when it runs ``name`` (no load),
    else from the fp32 weights the Weights tab loads anyway (a replay)."""
    current = run()
    if isinstance(current, LiveRun) and current.meta.model == name:
        return int(current.engine.shared.model.config.num_hidden_layers)  # the driver's copy, parallel or not
    return int(fp32_model(name).config.num_hidden_layers)


@st.cache_resource(show_spinner=False, max_entries=32)
def weight_inspection(name: str, scheme: str, group_size: int, layer: int, matrix: str):
    from engine.studies.quant_inspect import inspect_weight

    return inspect_weight(fp32_weights(name), scheme, layer, matrix, group_size=group_size)


@st.cache_resource(show_spinner=False, max_entries=8)
def error_grid(name: str, scheme: str, group_size: int):
    from engine.studies.quant_inspect import error_grid as grid

    return grid(fp32_weights(name), scheme, group_size)


@st.cache_resource(show_spinner=False, max_entries=4)
def smoothing(name: str, strength: float):
    """SmoothQuant's record for ``strength`` (calibration prompts on the fp32 model)."""
    from engine.model.shared import calibrated_smoothing

    configure_torch()
    return calibrated_smoothing(name, strength, dict(fp32_weights(name)))[1]


@st.cache_resource(show_spinner=False, max_entries=2)
def kv_tradeoff(name: str):
    from engine.studies.quant_tradeoff import kv_tradeoff as measure

    configure_torch()
    return measure(name)


@st.cache_resource(show_spinner=False)
def _tradeoff_store() -> dict:
    """model -> the last TradeoffResult measured in this process (the page's "Measure" button)."""
    return {}


def tradeoff_result(name: str):
    return _tradeoff_store().get(name)


def measure_tradeoffs(name: str, progress: Callable[[str, float], None]) -> None:
    """Measure every scheme on this machine (the page's quick settings); kept for every session."""
    from engine.studies.quant_tradeoff import PAGE, measure_tradeoffs as measure

    configure_torch()
    try:
        _tradeoff_store()[name] = measure(name, PAGE, progress=progress)
    except (ValueError, RuntimeError, OSError) as e:
        st.session_state[K.error] = f"measurement failed: {e}"


def run_activation_stats(linear: str, threshold: float, layer: int | None = None):
    """Activation statistics of the session's live run (its ActivationRecorder: every token its
    engine computed), the histogram of ``layer`` (None: the loudest); None in a replay or before
    the first step."""
    current = run()
    if not isinstance(current, LiveRun):
        return None
    return current.activation_recorder().stats(threshold, layer, linear)


# -- the Pipeline page -----------------------------------------------------------------------------

PIPELINE_SCENARIO = "pipeline"


def switch_to_pipeline() -> None:
    """Widget callback: the pipeline scenario (p = 2, GPipe, m = 4) with its knobs; the model stays.

    The button sits in the views fragment, whose own rerun would neither rebuild the run nor
    redraw the sidebar: ``choose_scenario`` asks for a full rerun (defect 4)."""
    choose_scenario(PIPELINE_SCENARIO)


def sweep_points(model: str, p: int, t: int) -> list | None:
    """The bubble sweep measured in this session for (model, p, t), if any."""
    return st.session_state.get(K.sweeps, {}).get((model, p, t))


def measure_sweep(model: str, p: int, t: int, progress: Callable[[str, float], None]) -> None:
    """Measure the bubble over m (engine.replay.run.measure_bubble_sweep: one fresh engine per m) and
    keep it in the session; a failure is a message."""
    from engine.replay.run import measure_bubble_sweep

    ss = st.session_state
    try:
        points = measure_bubble_sweep(load_model(model), p, t, progress=progress)
    except (ValueError, RuntimeError, OSError) as e:
        ss[K.error] = f"bubble sweep failed: {e}"
        return
    ss.setdefault(K.sweeps, {})[(model, p, t)] = points
