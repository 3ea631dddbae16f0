"""Settings a link (the URL) gave that a page could not take.

Streamlit drops a URL value a bound widget (``bind="query-params"``) cannot take: an unknown model,
batch=-5, ... A page takes ``snapshot()`` before drawing its bound widgets and calls
``warn_ignored`` after them, which names the dropped ones. A value equal to the widget's default
also leaves the URL: that one was taken, not dropped.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

import streamlit as st

from app import session
from visualizers.text import escape_markdown as md


def snapshot() -> dict[str, str]:
    """The URL's settings as they arrived, before the page's widgets took them."""
    return {k: st.query_params[k] for k in st.query_params}


def same_value(text: str, value: object) -> bool:
    """Does the URL text ``text`` denote the widget value ``value``?"""
    if isinstance(value, bool):
        return text.lower() == str(value).lower()
    if isinstance(value, (int, float)):
        try:
            return float(text) == float(value)
        except ValueError:
            return False
    return text == str(value)


def warn_ignored(before: Mapping[str, str], keys: Iterable[str]) -> None:
    """One warning naming each of ``keys`` the link gave that its widget did not take."""
    bound = set(keys)
    dropped = [f"{k}={v}" for k, v in before.items()
               if k in bound and st.query_params.get(k) != v and not same_value(v, session.widget_value(k))]
    if dropped:
        st.warning("Ignored link settings that are not valid here: " + md(", ".join(dropped))
                   + " (the defaults are shown instead).", icon="🔗")
