"""Moving through the session's run: Step (button, keys, a clicker), Step back, the Step slider,
Run N, Play / Pause, Reset, and the history cursor they share.

Rule (the history cursor): while the views are behind the run's latest step, a step moves the
cursor forward through the recorded history (no engine work); only the steps beyond the latest
run the engine (a replay: its recording), under the run's lock. So Step, Run N, Play and
queued presses all continue from the step on screen.
"""
from __future__ import annotations

import uuid

import streamlit as st
from streamlit.errors import StreamlitAPIException

from app import session, step_queue, timing
from app.current_run import close_run, is_worker_error, run
from app.simulated_run import SimulatedRun
from engine.replay.run import LiveRun, ReplayRun, RunView
from engine.core.trace import StepTrace

VIEWS_FRAGMENT = "views"  # @st.fragment key of the live views (app/live.py)


def init_defaults() -> None:
    """First run of a session: Run N's count, Play's tick, the step counter's epoch."""
    session.run_n.setdefault(10)
    session.tick.setdefault(0.5)
    session.playing.setdefault(False)
    session.epoch.setdefault(uuid.uuid4().hex)
    session.steps_applied.setdefault(0)
    session.plays_applied.setdefault(0)


def view() -> RunView | None:
    """The session's run at the history cursor (its latest step when the cursor is at the end)."""
    current = run()
    return current.view(cursor()) if current is not None else None


def step(n: int = 1) -> list[StepTrace]:
    """``n`` steps forward -> the StepTraces stepped over ([] when done or failed).

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
        session.error.set(f"the worker processes failed: {e}" if failed else f"step failed: {e}")
        session.worker_failed.set(failed)
        session.playing.set(False)
    return []


def reset() -> None:
    """Widget callback: back to step 0 (a replay rewinds; a live run is rebuilt from the controls)."""
    current = run()
    session.playing.set(False)
    session.pending.set(0)
    session.steps_applied.set(queued_presses())  # presses before Reset do not carry into the new run
    session.plays_applied.set(queued_presses("plays"))
    session.cursor.set(None)
    if isinstance(current, ReplayRun):
        current.reset()
    elif isinstance(current, SimulatedRun):  # the same simulated workload from its start
        close_run()
        session.run.set(current.restart())
    else:
        close_run()
        session.run_spec.set(None)
        session.error.set(None)
        session.worker_failed.set(False)


# -- the history cursor: the step the views draw ------------------------------------------------

def cursor() -> int | None:
    """The step the views draw; None follows the run's latest step."""
    at = session.cursor.get()
    return None if at is None else int(at)


def _set_cursor(current: LiveRun | ReplayRun, at: int) -> None:
    """Point the views at step ``at`` (clamped to the history); at the latest step the cursor
    follows the run again (None)."""
    end = current.num_steps
    session.cursor.set(None if at >= end else max(0, at))


def _cursor_forward(current: LiveRun | ReplayRun, n: int) -> list[StepTrace]:
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
    session.playing.set(False)


def on_step_slider() -> None:
    """The Step slider's callback: the views draw the chosen step; Play pauses."""
    current = run()
    if current is None:
        return
    _set_cursor(current, int(session.step_slider.get()))
    session.playing.set(False)


def show_step_slider_at(step: int) -> None:
    """Before the slider is drawn: it shows the cursor's step."""
    session.step_slider.set(step)


def at_end() -> bool:
    """The views are at the latest step of a finished run (Play has nothing left to show)."""
    current = run()
    return current is None or (cursor() is None and current.done)


# -- Step presses counted in the browser (app/step_queue.py) -------------------------------------

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
    """The browser counter changed: Play/Pause presses toggle Play now, and the page reruns whole
    (the views' tick and the button's label change); Step presses are applied by the views, which
    alone rerun."""
    with timing.phase("presses callback"):
        if not apply_queued_plays():
            rerun_views()


def apply_queued_plays() -> bool:
    """Toggle Play once for every Play/Pause press counted in the browser and not applied yet
    (an even number cancels out) -> whether any press was new."""
    plays = queued_presses("plays")
    pending = plays - session.plays_applied.get()
    if pending <= 0:
        return False
    session.plays_applied.set(plays)
    if pending % 2:
        toggle_play()
    return True


def queued_presses(what: str = "count") -> int:
    """Step presses (``what`` "count") or Play/Pause presses ("plays") the browser has counted
    in this session (0 before the first one)."""
    return step_queue.presses(session.step_queue.get(), session.epoch.get(), what) or 0


def apply_queued_steps() -> None:
    """Step once for every press counted in the browser and not applied yet, in order.

    Presses made before the run exists (first load, a rebuild) wait here until it does. Two
    script runs may get here at once (a new press stops the old run only at its next st.*
    call); the run's lock and the re-read under it apply each press exactly once.
    """
    current = run()
    if current is None:
        return
    with current.lock:
        presses = queued_presses()
        pending = presses - session.steps_applied.get()
        if pending <= 0:
            return
        session.steps_applied.set(presses)
        step(pending)


def mount_step_queue() -> None:
    step_queue.mount(session.K.step_queue, session.epoch.get(), on_step_presses, on_page_key)


def on_page_key() -> None:
    """The next / previous page key (app/step_queue.py): the entry point switches page."""
    session.page_step.set(step_queue.navigation(session.step_queue.get()))


def take_page_step() -> int:
    """+1 / -1 when a page key asked for the next / previous live page since the last run, else 0."""
    return int(session.page_step.pop() or 0)


# -- Run N and Play ------------------------------------------------------------------------------

def request_steps() -> None:
    """Widget callback for Run N: the steps run in the views, with a progress bar."""
    session.pending.set(int(session.run_n.get()))


def take_pending_steps() -> int:
    return int(session.pending.pop() or 0)


def toggle_play() -> None:
    session.playing.set(not session.playing.get())


def playing() -> bool:
    return bool(session.playing.get())


def draw_play_state() -> bool:
    """Play's state as this full run fixes the views' tick and draws the button (a full run only:
    the page calls it before its views fragment)."""
    session.play_drawn.set(playing())
    return playing()


def play_changed_since_drawn() -> bool:
    """From inside the views: Play/Pause presses applied since the last full run changed Play, so
    the button's label and the views' tick (fixed at the last full run) need a full run. A press
    that arrives with a tick's fragment run is applied here, too (its callback may run there,
    where a full run cannot be asked for)."""
    apply_queued_plays()
    return playing() != session.play_drawn.get()


def stop_playing() -> None:
    """From inside the views (run finished): Play stops; the full run the caller asks for (or the
    next tick, ``play_changed_since_drawn``) draws the button and stops the timer."""
    session.playing.set(False)


def tick_seconds() -> float:
    return float(session.tick.get())
