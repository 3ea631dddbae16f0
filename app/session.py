"""The browser session's state: the only module that touches ``st.session_state``.

Every key is declared here once, as a ``Slot`` with the type of its value and the value it has
before anything set it; the rest of the app reads and writes the session through these slots
(tests/test_app_modules.py fails if another module touches ``st.session_state``). Widget keys
are slots too, so a widget's ``key=`` and the code that reads it agree on the name (``K``).

Everything here is per session. What the whole process shares (weights, measurements) lives in
app/models.py and app/studies/ behind ``st.cache_resource``.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import streamlit as st
from streamlit.runtime.scriptrunner import get_script_run_ctx

if TYPE_CHECKING:
    from streamlit.delta_generator import DeltaGenerator
    from streamlit.runtime.uploaded_file_manager import UploadedFile

    from app.run_spec import RunSpec
    from app.studies.serving import ServingInputs
    from engine.audit.this_engine import Ablation
    from engine.serving.generation import GenerateResult
    from engine.replay.run import LiveRun, PolicyRun, ReplayRun, SweepPoint
    from engine.studies.attention_layouts import LayoutWorkload
    from engine.studies.flash_attention import FlashStudy

T = TypeVar("T")


class K:
    """Session-state key names (widgets and plain values)."""

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
    step_slider = "step_slider"
    step_queue = "step_queue"  # the browser's Step-press counter (app/step_queue.py)
    # the Generate page's widgets
    gen_model = "gen_model"
    gen_max_tokens = "gen_max_tokens"
    gen_temperature = "gen_temperature"
    gen_chat = "gen_chat"
    # plain (non-widget) state
    run = "_run"
    run_spec = "_run_spec"
    error = "_run_error"
    notice = "_run_notice"
    playing = "_playing"
    pending = "_pending_steps"
    play_drawn = "_play_drawn"
    generate = "_generate_result"
    caching_runs = "_caching_runs"  # (RunSpec, runs): the prefix-caching on/off comparison
    spec_runs = "_spec_runs"  # (RunSpec, runs): with and without speculation
    scheduling_runs = "_scheduling_runs"  # (RunSpec, runs): one per scheduling policy
    worker_failed = "_worker_failed"  # the run's workers died (WorkerError): offer a restart
    sweeps = "_bubble_sweeps"  # (model, p, t) -> [SweepPoint]: the Pipeline page's measured sweep
    steps_applied = "_step_presses_applied"
    plays_applied = "_play_presses_applied"
    epoch = "_session_epoch"
    cursor = "_history_cursor"  # the step the views draw; None: the run's latest (app/playback.py)
    scenario_chosen = "_scenario_chosen"  # the user picked a scenario (dropdown, link, button)
    link_applied = "_deep_link_applied"  # ?step= / ?recording= are applied once per session
    page = "_live_page"  # url_path of the live page being drawn
    download_slot = "_download_slot"  # the sidebar slot the views fragment draws the download into
    page_step = "_page_step"  # +1 / -1: a page key asked for the next / previous live page
    # the Attention architectures page: its widgets (bound to the URL) and the live part's cursor
    arch_hw = "arch_hw"
    arch_ctx = "arch_ctx"
    arch_weights = "arch_w"
    arch_budget = "arch_budget"
    arch_requests = "arch_requests"
    arch_tokens = "arch_tokens"
    arch_cursor = "_arch_cursor"  # (LayoutWorkload, steps done): where the three engines are shown
    # the Serving under load page: the inputs last run (results are cached by them)
    serving_ran = "_serving_ran"
    serving_policies = "_serving_policies"  # inputs every policy ran for
    serving_capacity = "_serving_capacity"  # (inputs, policy) the capacity sweep ran for
    # the Audit page: Audit was pressed (from then on every change re-audits), this engine's ablations
    audit_on = "_audit_on"
    audit_ablations = "_audit_ablations"  # (model, workload) -> Ablation, measured in this session
    # the FlashAttention page: its widgets, and the kernel traces computed for this session's run
    flash_request = "flash_request"
    flash_layer = "flash_layer"
    flash_head = "flash_head"
    flash_block_n = "flash_block_n"
    flash_segments = "flash_segments"
    flash_tile = "flash_tile"
    flash_model = "flash_model"
    flash_context = "flash_context"
    flash_queries = "flash_queries"
    flash_traces = "_flash_traces"  # (run, {(step, request, layer, head, segments, Bc): FlashStudy})


class Slot(Generic[T]):
    """One session-state key, the type of its value, and its value before anything set it.

    The type is the declaration's promise, not checked at run time: widgets write their own
    keys, and a test may seed any key (``AppTest.session_state``)."""

    __slots__ = ("key", "default")

    def __init__(self, key: str, default: T) -> None:
        self.key = key
        self.default = default

    def get(self) -> T:
        value: T = st.session_state.get(self.key, self.default)
        return value

    def set(self, value: T) -> None:
        st.session_state[self.key] = value

    def pop(self) -> T:
        """The value, and the key removed (a one-shot request)."""
        value: T = st.session_state.pop(self.key, self.default)
        return value

    def is_set(self) -> bool:
        return self.key in st.session_state

    def setdefault(self, value: T) -> None:
        """Set ``value`` unless the key has one (a widget's first value, once per session)."""
        if self.key not in st.session_state:
            st.session_state[self.key] = value


def knob(name: str) -> Slot[Any]:
    """The widget of engine knob ``name`` (its value as the widget holds it: app/knobs.py)."""
    return Slot(K.knob + name, None)


def widget_value(key: str) -> object:
    """The value of the widget under ``key`` (the calculator page's URL-bound widgets), None if unset."""
    return st.session_state.get(key)


def session_id() -> str:
    """This browser session's id (the worker reaper's key)."""
    ctx = get_script_run_ctx()
    return ctx.session_id if ctx is not None else "no-session"


# -- the live pages' shared controls (app/controls.py draws them) ------------------------------
scenario: Slot[str] = Slot(K.scenario, "")
scenario_chosen: Slot[bool] = Slot(K.scenario_chosen, False)
model: Slot[str] = Slot(K.model, "")
spec_method: Slot[str] = Slot(K.spec_method, "none")
spec_k: Slot[int] = Slot(K.spec_k, 4)
spec_layers: Slot[int] = Slot(K.spec_layers, 8)
spec_draft_quant: Slot[str] = Slot(K.spec_draft_quant, "int4")
split_mode: Slot[str] = Slot(K.split_mode, "even")
split_text: Slot[str] = Slot(K.split_text, "")
run_n: Slot[int] = Slot(K.run_n, 10)
tick: Slot[float] = Slot(K.tick, 0.5)
present: Slot[bool] = Slot(K.present, False)
focus: Slot[str | None] = Slot(K.focus, None)
upload: Slot[UploadedFile | None] = Slot(K.upload, None)
step_slider: Slot[int] = Slot(K.step_slider, 0)
step_queue: Slot[object] = Slot(K.step_queue, None)  # the counter component's value (app/step_queue.py)
page: Slot[str] = Slot(K.page, "")
page_step: Slot[int] = Slot(K.page_step, 0)
download_slot: Slot[DeltaGenerator | None] = Slot(K.download_slot, None)

# -- the session's run (app/current_run.py) and its playback (app/playback.py) ------------------
run: Slot[LiveRun | ReplayRun | None] = Slot(K.run, None)
run_spec: Slot[RunSpec | None] = Slot(K.run_spec, None)
error: Slot[str | None] = Slot(K.error, None)
notice: Slot[str | None] = Slot(K.notice, None)
worker_failed: Slot[bool] = Slot(K.worker_failed, False)
playing: Slot[bool] = Slot(K.playing, False)
play_drawn: Slot[bool] = Slot(K.play_drawn, False)  # Play's state when the last full run fixed the views' tick
pending: Slot[int] = Slot(K.pending, 0)
steps_applied: Slot[int] = Slot(K.steps_applied, 0)
plays_applied: Slot[int] = Slot(K.plays_applied, 0)  # Play/Pause presses counted in the browser, applied
epoch: Slot[str] = Slot(K.epoch, "")
cursor: Slot[int | None] = Slot(K.cursor, None)
link_applied: Slot[bool] = Slot(K.link_applied, False)

# -- per-session studies (app/studies/) ----------------------------------------------------------
Comparison = tuple["RunSpec", Mapping[str, "PolicyRun"]]  # the set-up they ran for, and the runs
caching_runs: Slot[Comparison | None] = Slot(K.caching_runs, None)
spec_runs: Slot[Comparison | None] = Slot(K.spec_runs, None)
scheduling_runs: Slot[Comparison | None] = Slot(K.scheduling_runs, None)
sweeps: Slot[Mapping[tuple[str, int, int], list[SweepPoint]]] = Slot(K.sweeps, {})

# -- the Generate page ----------------------------------------------------------------------------
gen_model: Slot[str] = Slot(K.gen_model, "")
gen_max_tokens: Slot[int] = Slot(K.gen_max_tokens, 0)
gen_temperature: Slot[float] = Slot(K.gen_temperature, 0.0)
gen_chat: Slot[bool] = Slot(K.gen_chat, True)
generate: Slot[GenerateResult | None] = Slot(K.generate, None)

# -- the Attention architectures page ---------------------------------------------------------------
arch_hw: Slot[str] = Slot(K.arch_hw, "h200")
arch_ctx: Slot[int] = Slot(K.arch_ctx, 4096)
arch_weights: Slot[str] = Slot(K.arch_weights, "bf16")
arch_budget: Slot[int] = Slot(K.arch_budget, 64)  # KiB
arch_requests: Slot[int] = Slot(K.arch_requests, 8)
arch_tokens: Slot[int] = Slot(K.arch_tokens, 16)
arch_cursor: Slot[tuple[LayoutWorkload, int] | None] = Slot(K.arch_cursor, None)

# -- the Serving under load page (results cached by these inputs: app/studies/serving.py) ------------
serving_ran: Slot[ServingInputs | None] = Slot(K.serving_ran, None)
serving_policies: Slot[ServingInputs | None] = Slot(K.serving_policies, None)
serving_capacity: Slot[tuple[ServingInputs, str] | None] = Slot(K.serving_capacity, None)

# -- the Audit page (audits cached by their inputs: app/studies/audit.py) ------------------------------
audit_on: Slot[bool] = Slot(K.audit_on, False)
audit_ablations: Slot[Mapping[tuple[str, str], Ablation]] = Slot(K.audit_ablations, {})

# -- the FlashAttention page (kernel traces of this session's run: app/studies/flash_attention.py) -----
FlashKey = tuple[int, str, int, int, int, int]  # (step, request, layer, query head, segments, tile width)
flash_request: Slot[str | None] = Slot(K.flash_request, None)
flash_layer: Slot[int] = Slot(K.flash_layer, 0)
flash_head: Slot[int] = Slot(K.flash_head, 0)
flash_block_n: Slot[int] = Slot(K.flash_block_n, 8)
flash_segments: Slot[int] = Slot(K.flash_segments, 1)
flash_tile: Slot[int | None] = Slot(K.flash_tile, None)
flash_model: Slot[str] = Slot(K.flash_model, "llama-3-8b")
flash_context: Slot[int] = Slot(K.flash_context, 32768)
flash_queries: Slot[str] = Slot(K.flash_queries, "decode (1)")
flash_traces: Slot[tuple[object, dict[FlashKey, FlashStudy]] | None] = Slot(K.flash_traces, None)
