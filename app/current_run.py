"""The session's run: a LiveRun owning its own engine, KV pool and scheduler (and worker
processes when p or t is above 1), or a ReplayRun over a recording. Every engine step happens
under that run's lock (app/playback.py).

Problems building or stepping it (a bad knob, a prompt too long for the pool, dead workers)
end up as a message (``error``), never as an exception.
"""
from __future__ import annotations

import sys

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from app import session, session_reaper
from app.models import shared_model
from app.run_spec import RunSpec
from app.scenarios import requested_spec, spec_scenario
from app.simulated_run import SimulatedRun
from engine.replay.run import LiveRun, ReplayRun


def run() -> LiveRun | ReplayRun | None:
    return session.run.get()


def live_run() -> LiveRun | None:
    """The session's run when it is live (None in a replay or before the first run)."""
    current = run()
    return current if isinstance(current, LiveRun) else None


def is_replay() -> bool:
    return isinstance(run(), ReplayRun)


def simulated_run() -> SimulatedRun | None:
    """The session's run when it is a simulated one (the Serving page's step-through)."""
    current = run()
    return current if isinstance(current, SimulatedRun) else None


def is_simulated() -> bool:
    return simulated_run() is not None


def controls_locked() -> bool:
    """The sidebar's model, scenario and knobs do not apply: the run is a replay or a simulated run."""
    return is_replay() or is_simulated()


def start_simulated(new: SimulatedRun) -> None:
    """``new`` becomes the session's run (the old one's workers stopped); the live pages draw it
    until "Back to live engine" (``leave_simulated``)."""
    close_run()
    session.run.set(new)
    session.error.set(None)
    session.worker_failed.set(False)
    session.playing.set(False)
    session.notice.set(None)


def leave_simulated() -> None:
    """Widget callback: drop the simulated run; the controls' live run is built on the next run."""
    close_run()
    session.run_spec.set(None)


def error() -> str | None:
    return session.error.get()


def notice() -> str | None:
    return session.notice.get()


def report(message: str) -> None:
    """Show ``message`` above the views (as a failed step would be)."""
    session.error.set(message)


def worker_failed() -> bool:
    return bool(session.worker_failed.get())


def ensure_run() -> None:
    """Build the session's live run if there is none or the controls changed (not in a replay or
    a simulated run: the controls do not describe those)."""
    if controls_locked():
        return
    spec = requested_spec()
    if run() is not None and session.run_spec.get() == spec:
        return
    if session.run_spec.get() == spec and error():
        return  # same bad request as last time: keep the message, do not retry every rerun
    build_run(spec)


def close_run() -> None:
    """Stop the session's live run's worker processes (if any) and drop the run."""
    current = run()
    session.run.set(None)
    session.cursor.set(None)
    if isinstance(current, LiveRun):
        current.close()
        session_reaper.release(session.session_id())


def build_run(spec: RunSpec) -> None:
    """A new live run for ``spec``; the old one's workers are stopped first. When workers stop
    or start, a progress bar shows it from the first moment (``WorkerProgress``)."""
    old = run()
    stopping = isinstance(old, LiveRun) and old.meta.config.parallel_config.world_size > 1
    progress = WorkerProgress.show(stopping, spec.parallel)
    close_run()
    session.run_spec.set(spec)
    session.error.set(None)
    session.worker_failed.set(False)
    session.playing.set(False)
    try:
        sc = spec_scenario(spec)
        config = sc.engine_config()
        parallel = config.parallel_config
        model = shared_model(spec.model, config)
        if parallel.world_size == 1:
            session.run.set(LiveRun.from_scenario(sc, model))
        else:
            progress.starting(parallel.world_size, parallel.pipeline_parallel_size, parallel.tensor_parallel_size)
            built = LiveRun.from_scenario(sc, model, progress=progress.say)
            session.run.set(built)
            session_reaper.adopt(session.session_id(), built)  # its workers end with the session
    except (ValueError, OSError) as e:
        session.error.set(str(e))
    except RuntimeError as e:
        if not is_worker_error(e):
            raise
        session.error.set(f"workers failed to start: {e}")
        session.worker_failed.set(True)
    except MemoryError:  # the engine checks memory first; this is the OS changing its mind
        session.error.set("out of memory building the engine: lower num_blocks or max_num_batched_tokens")
    finally:
        progress.done()


def restart_workers() -> None:
    """Widget callback after a WorkerError: a fresh live run (new workers) from the controls."""
    build_run(requested_spec())


def is_worker_error(e: BaseException) -> bool:
    """``e`` is engine.executor's WorkerError (imported only once a parallel engine exists, so
    the app does not load torch for this check)."""
    module = sys.modules.get("engine.parallel.executor")
    return module is not None and isinstance(e, module.WorkerError)


class WorkerProgress:
    """A progress bar for stopping and starting worker processes, drawn before anything slow
    happens (the old workers' stop, the model, the spawn), so a knob change shows progress at
    once. It takes the first slot of the page, so it replaces whatever a previous run left there,
    and it is removed when the run is built: no finished box stays behind to go stale during
    the next restart."""

    def __init__(self, slot: DeltaGenerator | None = None) -> None:
        self.slot = slot
        self.workers = 1

    @classmethod
    def show(cls, stopping: bool, starting: bool) -> WorkerProgress:
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
