"""The Attention architectures page's studies: the calculator's rows for the real configs (a pure
function of the device, context and weight format, cached by value) and the MHA / GQA / MQA
engines run on one workload (frozen records shared read-only by every session, cached per
workload), with the session's cursor over their recorded steps.
"""
from __future__ import annotations

import streamlit as st

from app import session
from app.models import configure_torch
from engine.studies.architectures import ArchitectureRow, compare_architectures
from engine.studies.attention_layouts import LayoutStudy, LayoutWorkload


@st.cache_data(show_spinner=False, max_entries=64)
def architecture_rows(hardware: str, context: int, weights: str) -> tuple[ArchitectureRow, ...]:
    """Every architecture on one ``hardware`` device at ``context`` (SizingError names a bad input)."""
    return compare_architectures(hardware, context, weights)


@st.cache_resource(show_spinner=False, max_entries=16)
def layout_study(workload: LayoutWorkload) -> LayoutStudy:
    """The three engines run to the end on ``workload`` (about a second on tiny-random); ValueError
    (the study's, naming the limit) when a pool cannot hold one request."""
    from engine.studies.attention_layouts import run_layouts

    configure_torch()
    return run_layouts(workload)


def steps_done(workload: LayoutWorkload, last: int) -> int:
    """The step the session shows for ``workload`` (0 for a new workload), at most ``last``."""
    cursor = session.arch_cursor.get()
    if cursor is None or cursor[0] != workload:
        return 0
    return max(0, min(cursor[1], last))


def move(workload: LayoutWorkload, last: int, to: int | None = None, by: int = 0) -> None:
    """Widget callback: show step ``to`` (or the current one + ``by``), kept within 0 .. ``last``."""
    target = steps_done(workload, last) + by if to is None else to
    session.arch_cursor.set((workload, max(0, min(target, last))))
