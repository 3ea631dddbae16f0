"""Presentation mode (``?present=true``: bigger type, no explanations) and the KV page's focus."""
from __future__ import annotations

import streamlit as st

from app import session


def init_presentation() -> None:
    """Presentation mode from the URL (``?present=true``) on a session's first run. The toggle is
    bound to the URL, but it is drawn after the page (controls.sidebar), so without this the page
    of that first run would not see the mode."""
    if not session.present.is_set():
        session.present.set(str(st.query_params.get(session.K.present, "")).lower() == "true")


def presentation() -> bool:
    return bool(session.present.get())


def focus() -> str | None:
    """The request the KV cache page highlights (None: all)."""
    value = session.focus.get()
    return None if value in (None, "all") else value


def keep_focus_among(options: list[str]) -> None:
    """Before the focus widget: a focus on a request that is gone falls back to "all"."""
    if session.focus.get() not in options:
        session.focus.set("all")
