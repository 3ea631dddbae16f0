"""Record and replay: the recording download, an uploaded or bundled recording as the session's
run, and deep links (``?recording=<bundled name>``, ``?step=N``) applied once per session.
"""
from __future__ import annotations

from typing import Callable

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from app import session
from app.current_run import close_run
from app.scenarios import page_scenario
from engine.replay.recording import Recording, from_json, record, to_json
from engine.replay.run import LiveRun, ReplayRun

STEP_PARAM = "step"  # ?step=12: open at step 12
RECORDING_PARAM = "recording"  # ?recording=spec-copy: replay that bundled recording
MAX_LINK_STEPS = 1000  # as the Run N field


def set_download_slot(slot: DeltaGenerator) -> None:
    """The sidebar slot of the recording download (app/controls.py), laid out by the last full run."""
    session.download_slot.set(slot)


def download_slot() -> DeltaGenerator | None:
    return session.download_slot.get()


def recording_json(current: LiveRun | ReplayRun) -> Callable[[], str]:
    """The recording download's data: a callable that serialises ``current`` when the browser
    asks for the file. Streamlit calls it outside any script run, where there is no session
    state to find the run in, so it holds the run itself (``record`` takes the run's lock)."""
    return lambda: to_json(record(current))


def load_recording_upload() -> None:
    """Widget callback: an uploaded JSON recording becomes the session's run (replay mode)."""
    uploaded = session.upload.get()
    if uploaded is None:
        return
    try:
        start_replay(from_json(uploaded.getvalue()))
    except ValueError as e:
        session.error.set(str(e))


def start_replay(recording: Recording) -> None:
    close_run()
    session.run.set(ReplayRun(recording))
    session.error.set(None)
    session.playing.set(False)
    session.notice.set(f"Replaying a recording of {recording.meta.title} on {recording.meta.model} "
                       f"({len(recording.traces)} steps); no model is loaded.")


def leave_replay() -> None:
    close_run()
    session.run_spec.set(None)
    session.notice.set(None)  # the upload is a file_uploader's key: read-only, assigning it raises


def page_recording() -> str | None:
    """The bundled recording (engine.replay.bundled) of the page's scenario, else of the session's
    scenario; None when there is none."""
    from engine.replay.bundled import bundled_names

    name = page_scenario() or session.scenario.get()
    return name if name in bundled_names() else None


def replay_bundled(name: str) -> None:
    """Widget callback: bundled recording ``name`` becomes the session's run (replay mode)."""
    from engine.replay.bundled import load_bundled

    try:
        start_replay(load_bundled(name))
    except ValueError as e:
        session.error.set(str(e))


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

    Model, scenario and presentation mode are widget values bound to the URL (the scenario
    defaults read the first two before the run is built, so a link never builds the default run first)."""
    if session.link_applied.get():
        return None
    session.link_applied.set(True)
    name, raw = st.query_params.get(RECORDING_PARAM), st.query_params.get(STEP_PARAM)
    try:
        if name is not None:
            from engine.replay.bundled import load_bundled

            start_replay(load_bundled(name))
        if raw is not None:
            session.pending.set(link_steps(raw))
    except ValueError as e:
        return str(e)
    return None
