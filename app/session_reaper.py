"""Worker processes must not outlive the browser session that started them.

A session that closes its tab is kept by Streamlit for ``server.disconnectedSessionTTL``
(120 s) in case it reconnects, and then dropped lazily, with its session state (the run, its
engine, their workers) freed whenever that happens. So every live run with worker processes
is adopted here under its session id, and a daemon thread stops the workers of a session that
has not been connected for ``SESSION_GRACE_S`` (30 s: a page reload or a short network drop
reconnects well within it; ``INFERSCOPE_SESSION_GRACE_S`` overrides it, the browser test uses
2 s). Stopping is ``LiveRun.close``: a later step of that run, should the session come back,
is a WorkerError message with a Restart button.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from engine.replay.run import LiveRun

SESSION_GRACE_S = float(os.environ.get("INFERSCOPE_SESSION_GRACE_S", "30"))
POLL_S = 1.0

_runs: dict[str, LiveRun] = {}  # session id -> its live run with workers
_away_since: dict[str, float] = {}  # session id -> when it was first seen disconnected
_lock = threading.Lock()
_thread: threading.Thread | None = None


def adopt(session_id: str, run: LiveRun) -> None:
    """Watch ``run`` (which has worker processes) for the session ``session_id``."""
    global _thread
    with _lock:
        _runs[session_id] = run
        _away_since.pop(session_id, None)
        if _thread is None:
            _thread = threading.Thread(target=_watch, name="inferscope-session-reaper", daemon=True)
            _thread.start()


def release(session_id: str) -> None:
    """The session closed its run itself: stop watching it."""
    with _lock:
        _runs.pop(session_id, None)
        _away_since.pop(session_id, None)


def sessions() -> list[str]:
    """The ids of the sessions whose runs are watched."""
    with _lock:
        return list(_runs)


def reap(is_connected: Callable[[str], bool], now: float, grace_s: float = SESSION_GRACE_S) -> list[str]:
    """Close the runs of sessions disconnected for at least ``grace_s``; -> their ids.

    Rule: a session seen connected clears its clock; one seen disconnected starts it (once);
    when the clock reaches ``grace_s`` the run is closed and forgotten."""
    closed: list[tuple[str, LiveRun]] = []
    with _lock:
        for sid in list(_runs):
            if is_connected(sid):
                _away_since.pop(sid, None)
            elif now - _away_since.setdefault(sid, now) >= grace_s:
                closed.append((sid, _runs.pop(sid)))
                _away_since.pop(sid, None)
    for _, run in closed:  # outside the lock: stopping workers takes up to seconds
        run.close()
    return [sid for sid, _ in closed]


def _watch() -> None:
    from streamlit.runtime import Runtime

    while True:
        time.sleep(POLL_S)
        if Runtime.exists():
            runtime = Runtime.instance()
            reap(runtime.is_active_session, time.monotonic())
