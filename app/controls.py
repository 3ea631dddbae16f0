"""The controls every live view shares, in the sidebar: model, scenario, engine knobs,
Step / Run N / Play-Pause / Reset, record and replay, presentation mode.

Widgets keep their values across page switches (``persist_state="session"``); model,
scenario and presentation mode are also in the URL, so a talk slide can link to an exact set-up
(``?present=true`` opens every live page in presentation mode).

Keyboard (app/step_queue.py ``KEYS``; it works whatever was clicked last, except while typing in
a text or number input; Enter there commits and leaves the field):
PageDown or S = Step (a presenter's clicker sends PageDown), PageUp or B = Step back,
N = Run N, P = Play / Pause, 0 = Reset, ] = next live page, [ = previous live page.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from app import current_run, models, playback, presentation, replay, scenarios, session, step_queue
from app.session import K
from engine.core.config import (INT4_GROUP_SIZES, MAX_BLOCK_SIZE, MAX_NUM_BATCHED_TOKENS, MAX_NUM_BLOCKS, MAX_NUM_SEQS,
                           SCHEMES)
from engine.replay.run import RunView

KNOB_LABELS = {
    "block_size": ("Block size (tokens)", f"Tokens per KV block (1 to {MAX_BLOCK_SIZE})."),
    "num_blocks": ("KV blocks in the pool", f"Physical blocks (1 to {MAX_NUM_BLOCKS:,}, and what memory "
                                            "allows); the pool holds blocks x block size tokens."),
    "max_num_batched_tokens": ("Token budget per step", "max_num_batched_tokens: all requests together "
                                                        f"(1 to {MAX_NUM_BATCHED_TOKENS:,})."),
    "max_num_seqs": ("Max running requests", f"max_num_seqs: most requests in one batch (1 to {MAX_NUM_SEQS:,})."),
}
# The widgets' upper bounds are the engine's hard caps (engine.core.config), so the browser never
# sends a value the engine would take minutes to refuse; below them, the engine checks the
# memory the knobs need and its ValueError is shown as a message (current_run.build_run). The lower
# bound stays 0 so that a 0 reaches the engine and its message names the knob.
KNOB_MAX = {"block_size": MAX_BLOCK_SIZE, "num_blocks": MAX_NUM_BLOCKS,
            "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS, "max_num_seqs": MAX_NUM_SEQS}


QUANT_LABELS = {"none": "none (fp32)", "int8": "int8 (weights)", "int4": "int4 (weights, grouped)",
                "fp8": "fp8 e4m3 (weights)", "w8a8": "w8a8 (weights + activations)"}
QUANT_OPTIONS = ("none", *SCHEMES)
QUANT_HELP = ("quantization: store the decoder's projection weights in fewer bits and run them through "
              "torch's quantized CPU kernels. int8: one scale per output channel. int4: one scale and zero "
              "point per group of input weights (group size below). fp8: e4m3 with a per-channel scale. w8a8: "
              "int8 weights and int8 activations (LLM.int8()-style: outlier columns stay in floating point). "
              "The embedding and norms are not quantized.")
GROUP_HELP = ("quantization_group_size (int4 only): input weights that share one scale and zero point. Smaller "
              "groups follow the weights more closely and cost more scales. It must divide every input "
              "dimension: SmolLM2 (576, 1536) and tiny-random (64, 128) take 32 or 64, so 128 and 256 are refused "
              "with the engine's message.")
KV_OPTIONS = ("auto", "int8", "fp8")
KV_LABELS = {"auto": "auto (the model's dtype)", "int8": "int8", "fp8": "fp8 e4m3"}
KV_HELP = ("kv_cache_dtype: what the paged KV cache stores. auto: the weights' compute dtype (fp32, or bf16 when "
           "quantized). int8 / fp8: quantized on write with one fp32 scale per token and KV head, dequantized on "
           "read, so the pool holds about 4x (vs fp32) more tokens per byte; the KV page shows the bytes per token.")
PRECISION_CAPTION = ("Quantized modes compute in bfloat16: torch's CPU int8/int4 kernels have SIMD paths only for "
                     "bf16 activations. The first quantization of a model takes seconds; its weights are then "
                     "cached on disk. Changing one restarts the scenario.")


def _options(options: tuple[object, ...], current: object) -> list[object]:
    """``options``, plus the widget's current value if a scenario file set one not among them
    (so the widget can show it, and the engine's message says what is wrong with it)."""
    return [*options, current] if current is not None and current not in options else list(options)


@dataclass(frozen=True)
class Sidebar:
    """The sidebar's places, laid out before the page runs (``prepare``); ``sidebar`` fills them
    after it, except ``download``, which the views fragment fills (``recording_download``)."""

    controls: DeltaGenerator  # step queue, run buttons, workload, precision, knobs
    recording: DeltaGenerator  # the "Record / replay" expander
    download: DeltaGenerator  # its first slot: the recording download
    presentation: DeltaGenerator  # the presentation toggle and the key map


def prepare(page: str = "") -> Sidebar:
    """Before the page: defaults for a new session, the page's own scenario (``page`` is its
    url_path; scenarios.PAGE_SCENARIOS), a deep link's replay or steps (once per session), a run
    that matches the controls, and the sidebar's places.

    The widgets themselves are drawn after the page (``sidebar``): their values are already in
    the session state, and drawing the views first gets them to the browser sooner.
    """
    scenarios.init_defaults()
    playback.init_defaults()
    presentation.init_presentation()
    scenarios.apply_page_scenario(page)
    problem = replay.apply_deep_link()
    current_run.ensure_run()
    if problem:
        current_run.report(problem)
    controls = st.sidebar.container()
    recording = st.sidebar.expander("Record / replay", expanded=current_run.is_replay())
    download = recording.empty()
    replay.set_download_slot(download)
    return Sidebar(controls, recording, download, st.sidebar.container())


def recording_download() -> None:
    """The "Download recording (JSON)" button, drawn by the views fragment into its sidebar slot.

    Why there: Streamlit keeps a download's data callable only while the run that drew the
    button is the session's latest; a views-only rerun (every Step) counted as one that did not
    draw it, so a button drawn with the sidebar pointed at a dropped callable. The fragment
    redraws it on every rerun. The callable holds the run itself: Streamlit calls it outside
    any script run, where the session state (and so ``current_run.run()``) is out of reach.
    """
    current, slot = current_run.run(), replay.download_slot()
    if slot is None:
        return
    if current is None or current_run.is_simulated():  # (a recording would lose "predicted")
        # Written on every run all the same: Streamlit lets a fragment rerun fill a container from
        # outside the fragment only if the last full run wrote to it (else
        # StreamlitInvalidLayoutContextError, seen when a Step press reran the views right after a
        # first full run that had no run yet).
        slot.empty()
        return
    name = f"inferscope-{current.meta.scenario}-{current.meta.model}.json"
    slot.download_button("Download recording (JSON)", data=replay.recording_json(current), file_name=name,
                         mime="application/json", on_click="ignore", key="download_recording",
                         icon=":material/download:")


def switch_page(page: st.Page, pages: Sequence[st.Page]) -> None:
    """The next / previous page key (app/step_queue.py): switch to the neighbour of ``page`` in
    ``pages`` (no wrap-around at either end)."""
    step = playback.take_page_step()
    urls = [p.url_path for p in pages]
    if step and page.url_path in urls:
        target = urls.index(page.url_path) + step
        if 0 <= target < len(pages):
            # query_params={}: the default (None) clears the URL's parameters the checked way,
            # which Streamlit refuses for parameters bound to widgets; the target page's widgets
            # put model, scenario and presentation mode back (their values live in the session)
            st.switch_page(pages[target], query_params={})


def sidebar(places: Sidebar) -> None:
    """Render the shared controls into the places ``prepare`` laid out."""
    with places.controls:
        playback.mount_step_queue()
        _run_buttons()
        _workload()
        _precision()
        _speculation()
        _knobs()
    with places.recording:
        _record_replay()
    with places.presentation:
        st.toggle("Presentation mode", key=K.present, bind="query-params", persist_state="session",
                  help="Large fonts, no explanations or exports; each view fits one 1920×1080 screen. "
                       f"Keys: {step_queue.keys_caption()} (a presenter's clicker sends PageDown / PageUp).")
        if presentation.presentation():
            st.caption(f"**Keys** {step_queue.keys_caption()}")


def _run_buttons() -> None:
    playing = playback.playing()
    with st.container(horizontal=True):
        st.button("Step", key="step", on_click=playback.on_step_click, type="primary",
                  icon=":material/skip_next:")
        # no help=: its tooltip icon would be a second button under .st-key-step_back (the key map's target)
        st.button("Step back", key="step_back", on_click=playback.step_back, icon=":material/skip_previous:")
        st.button("Pause" if playing else "Play", key="play", on_click=playback.toggle_play,
                  icon=":material/pause:" if playing else ":material/play_arrow:")
        st.button("Reset", key="reset", on_click=playback.reset, icon=":material/restart_alt:")
    with st.container(horizontal=True, vertical_alignment="bottom"):
        st.number_input("Steps", min_value=1, max_value=1000, step=1, key=K.run_n, persist_state="session",
                        width=110)
        st.button("Run N", key="run_n_button", on_click=playback.request_steps)
        st.select_slider("Seconds per step (Play)", options=[0.25, 0.5, 1.0, 2.0], key=K.tick,
                         persist_state="session")


def _workload() -> None:
    disabled = current_run.controls_locked()
    if current_run.is_simulated():
        st.button("Back to live engine", key="leave_simulated", on_click=current_run.leave_simulated,
                  help="Drop the simulated run; the scenario and model above run on the real engine again.")
    st.selectbox("Scenario", scenarios.scenario_names(), key=K.scenario, on_change=scenarios.on_scenario_pick,
                 format_func=lambda n: scenarios.scenario(n).title, bind="query-params", persist_state="session",
                 disabled=disabled)
    st.selectbox("Model", models.MODELS, key=K.model, bind="query-params", persist_state="session",
                 disabled=disabled, help="smollm2-135m: the real SmolLM2-135M-Instruct. tiny-random: instant, "
                                         "gibberish text, same engine.")


def _precision() -> None:
    """Weight quantization, its int4 group size, and the KV cache's dtype (knobs.NONE_WORDS)."""
    disabled = current_run.controls_locked()
    with st.expander("Precision", expanded=False):
        scheme, group, kv = (session.knob(k) for k in ("quantization", "quantization_group_size", "kv_cache_dtype"))
        st.selectbox("Weight quantization", _options(QUANT_OPTIONS, scheme.get()), key=scheme.key,
                     format_func=lambda q: QUANT_LABELS.get(q, str(q)), help=QUANT_HELP, persist_state="session",
                     disabled=disabled)
        st.segmented_control("int4 group size", _options(INT4_GROUP_SIZES, group.get()), key=group.key,
                             required=True, help=GROUP_HELP, persist_state="session",
                             disabled=disabled or scheme.get() != "int4")
        st.selectbox("KV cache dtype", _options(KV_OPTIONS, kv.get()), key=kv.key,
                     format_func=lambda d: KV_LABELS.get(d, str(d)), help=KV_HELP, persist_state="session",
                     disabled=disabled)
        st.caption(PRECISION_CAPTION)


SPEC_LABELS = {"none": "off", "ngram": "n-gram (prompt lookup)", "early_exit": "early exit (first layers)",
               "draft_model": "draft model (self, quantized)"}
SPEC_HELP = ("speculative_config: a drafter proposes k tokens, the model verifies them in one forward and keeps "
             "the accepted ones (exact: greedy output is unchanged, sampled output has the same distribution). "
             "n-gram: the tokens that followed an earlier occurrence of the last few tokens; early exit: the "
             "model's own first layers + its LM head; draft model: the same model quantized.")


def _speculation() -> None:
    """speculative_config as four widgets (knobs.SpecChoice builds the dict)."""
    disabled = current_run.controls_locked()
    with st.expander("Speculative decoding", expanded=False):
        method = session.spec_method.get()
        st.selectbox("Drafter", _options(tuple(SPEC_LABELS), method), key=K.spec_method, help=SPEC_HELP,
                     format_func=lambda m: SPEC_LABELS.get(m, str(m)), persist_state="session", disabled=disabled)
        off = disabled or method == "none"
        st.number_input("Draft tokens per step (k)", min_value=1, max_value=16, step=1, key=K.spec_k,
                        persist_state="session", disabled=off, help="num_speculative_tokens (1 to 16).")
        st.number_input("Early-exit layers", min_value=1, max_value=64, step=1, key=K.spec_layers,
                        persist_state="session", disabled=off or method != "early_exit",
                        help="num_layers: how many of the model's first layers draft (fewer than it has).")
        st.selectbox("Draft model precision", _options(("int4", "int8", "none"), session.spec_draft_quant.get()),
                     key=K.spec_draft_quant, persist_state="session", disabled=off or method != "draft_model",
                     format_func=lambda q: "fp32" if q == "none" else q,
                     help="The draft model is the run's own model, quantized (cheaper per token).")


def _knobs() -> None:
    disabled = current_run.controls_locked()
    with st.expander("Engine knobs", expanded=False):
        for knob, (label, help_text) in KNOB_LABELS.items():
            st.number_input(label, min_value=0, max_value=KNOB_MAX[knob], step=1, key=K.knob + knob,
                            help=help_text, persist_state="session", disabled=disabled)
        st.toggle("Chunked prefill", key=K.knob + "enable_chunked_prefill", persist_state="session",
                  disabled=disabled, help="Split prompts larger than the remaining budget across steps.")
        st.toggle("Prefix caching", key=K.knob + "enable_prefix_caching", persist_state="session",
                  disabled=disabled, help="enable_prefix_caching: keep the full KV blocks of computed prompts in a "
                                          "radix tree and reuse them for later prompts that start the same way "
                                          "(on by default, as in vLLM).")
        st.segmented_control("Policy", ["continuous", "static"], key=K.knob + "policy", required=True,
                             persist_state="session", disabled=disabled,
                             help="continuous: refill free slots every step; static: a batch runs until its "
                                  "longest request finishes.")
        st.caption("Changing a knob restarts the scenario.")


def _record_replay() -> None:
    """The rest of the "Record / replay" expander (the download is the views fragment's)."""
    bundled = replay.page_recording()
    if bundled is not None:
        st.button("Replay the bundled recording", key="replay_bundled", on_click=replay.replay_bundled,
                  args=(bundled,), icon=":material/slideshow:",
                  help=f"A recording of the {bundled} scenario on SmolLM2 that ships with InferScope "
                       "(presets/recordings/): no model is loaded.")
    st.file_uploader("Replay a recording", type=["json"], key=K.upload, on_change=replay.load_recording_upload,
                     help="Replays without loading the model: for talks on any laptop.")
    if current_run.is_replay():
        st.button("Back to live engine", key="leave_replay", on_click=replay.leave_replay)


def step_slider(view: RunView) -> None:
    """The "Step" slider over the run's history (0 .. steps done): dragging it makes the views
    draw that step (playback.on_step_slider). Drawn in the views fragment, so it follows every step."""
    if view.latest < 1:
        return
    playback.show_step_slider_at(view.step)  # before the widget: it shows the cursor
    st.slider("Step", min_value=0, max_value=view.latest, key=K.step_slider, on_change=playback.on_step_slider,
              help="Any step of the run so far, redrawn from its recorded traces and snapshots. Step moves "
                   "forward through the history first; the engine runs only past the latest step.")
