"""Which scenario the live pages run: the catalogue, each page's own scenario, and the user's choice.

Rule: the page's scenario (PAGE_SCENARIOS) applies whenever a live page is drawn and the user
has not chosen a scenario in this session (the Scenario dropdown, a ``?live_scenario=`` link,
or a page's "switch" button); once they have, their choice stays on every page. A replay is
never replaced.
"""
from __future__ import annotations

from dataclasses import replace

import streamlit as st

from app import knobs, session
from app.models import MODELS
from app.run_spec import RunSpec
from app.simulated_run import SimulatedRun
from engine.replay.run import ReplayRun
from engine.core.config import EngineConfig
from engine.replay.scenario import Scenario, list_scenarios, load_scenario

DEFAULT_SCENARIO = "chat-burst"
# Each live page opens on the scenario that shows its idea in a few steps.
PAGE_SCENARIOS = {"kv-cache": "memory-pressure", "batching": "mixed-lengths", "prefix-cache": "shared-prefix",
                  "speculative": "spec-copy", "pipeline": "pipeline"}


@st.cache_data(show_spinner=False)
def scenario_names() -> list[str]:
    return list_scenarios()


@st.cache_data(show_spinner=False)
def scenario(name: str) -> Scenario:
    return load_scenario(name)


def scenario_from_param(value: str | None) -> str | None:
    """A link's ``live_scenario`` as a scenario name: a name (``shared-prefix``) or the title
    the bound Scenario dropdown itself writes into the address bar (its format_func's text), so
    a URL copied from the browser opens the same scenario; None when it names none."""
    if value is None:
        return None
    if value in scenario_names():
        return value
    return next((n for n in scenario_names() if scenario(n).title == value), None)


def init_defaults() -> None:
    """First run of a session: the default scenario's model and knobs (the URL may override;
    a ``?live_scenario=`` link counts as the user's choice, see ``apply_page_scenario``)."""
    if not session.scenario.is_set():
        name = scenario_from_param(st.query_params.get(session.K.scenario))
        session.scenario.set(name or DEFAULT_SCENARIO)
        session.scenario_chosen.set(session.scenario_chosen.get() or name is not None)
    sc = scenario(session.scenario.get())
    if not session.model.is_set():
        name = st.query_params.get(session.K.model, sc.model)
        session.model.set(name if name in MODELS else MODELS[0])
    knobs.put_scenario_knobs(sc, only_unset=True)


def apply_page_scenario(page: str) -> None:
    """Before the run is built: the page's own scenario (PAGE_SCENARIOS), unless the user chose one."""
    session.page.set(page)
    name = PAGE_SCENARIOS.get(page)
    replay = isinstance(session.run.get(), (ReplayRun, SimulatedRun))  # the controls do not describe it
    if name is None or session.scenario_chosen.get() or replay or session.scenario.get() == name:
        return
    session.scenario.set(name)
    on_scenario_change()


def page_scenario() -> str | None:
    """The scenario of the live page being drawn (None: the page has none of its own)."""
    return PAGE_SCENARIOS.get(session.page.get())


def choose_scenario(name: str) -> None:
    """Callback body: the user's explicit choice of ``name`` with its knobs; a full rerun follows
    (the caller may sit in the views fragment, whose own rerun would not rebuild the run)."""
    session.scenario.set(name)
    on_scenario_pick()
    st.rerun()


def on_scenario_pick() -> None:
    """The Scenario dropdown's callback: the user's choice, kept on every page."""
    session.scenario_chosen.set(True)
    on_scenario_change()


def on_scenario_change() -> None:
    """A new scenario brings its own knobs (the chosen model stays)."""
    try:
        sc = scenario(session.scenario.get())
    except ValueError as e:
        session.error.set(str(e))
        return
    knobs.put_scenario_knobs(sc)
    session.playing.set(False)


def requested_spec() -> RunSpec:
    """What the controls ask for: the scenario's knobs with the controls' on top (a None knob
    replaces too: quantization "none" turns off a scenario's quantization), as an EngineConfig;
    a knob the engine refuses leaves the config None, with the engine's message naming it."""
    model, name = session.model.get(), session.scenario.get()
    try:
        config = EngineConfig.from_knobs(**{**scenario(name).knobs, **knobs.requested_knobs(model)})
    except ValueError as e:
        return RunSpec(model, name, None, str(e))
    return RunSpec(model, name, config)


def spec_scenario(spec: RunSpec) -> Scenario:
    """The spec's scenario with the spec's config as its knobs; ValueError with the spec's
    problem when the engine refused the controls' knobs."""
    if spec.config is None:
        raise ValueError(spec.problem)
    return replace(scenario(spec.scenario), knobs=spec.config.to_knobs())
