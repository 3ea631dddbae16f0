"""Shared scaffolding of the live pages: the views fragment (Play ticks and Run N progress),
the status header (live / REPLAY badge, step, queues), charts with export, presentation style.

A page calls ``live.page(title, render)`` where ``render(view, style)`` draws that page's
views from an immutable RunView. Everything that depends on the step is inside one keyed
fragment, so Play reruns only the views.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from app import charts, current_run, playback, presentation, session, timing
from app import controls as shared_controls  # (page() has a parameter named controls)
from app.simulated_run import SIMULATED_BADGE
from engine.replay.run import RunView, speculation_label
from engine.core.trace import RequestStatus
from visualizers.steps import step_table_csv
from visualizers.text import escape_markdown

# Presentation mode fits each live page's main chart and its key numbers on one 1920x1080
# screen: no header (the page keys replace the top navigation), little padding, a smaller
# metric value, and charts no taller than Style.max_chart_height.
PRESENTATION_CSS = """
<style>
html { font-size: 21px; }
[data-testid="stHeader"], [data-testid="stToolbar"], [data-testid="stDecoration"] { display: none; }
[data-testid="stMainBlockContainer"] { padding-top: 1.2rem; padding-bottom: 2rem; }
[data-testid="stMainBlockContainer"] h2 { padding-top: 0; padding-bottom: 0.3rem; }
[data-testid="stMetricValue"] { font-size: 1.8rem; }
</style>
"""
PRESENTATION_CHART_PX = 560
# The live pages that draw a simulated run (app/simulated_run.py): the others read the model's
# weights or start engines of their own, and a simulated run has neither.
SIMULATED_PAGES = ("kv-cache", "batching", "prefix-cache")
NOT_SIMULATED = ("Not available for a simulated run: this page needs the model's weights or engines of its own, "
                 "and a simulated run has no weights. The KV cache, Batch composition and Prefix cache pages draw "
                 "it; **Back to live engine** in the sidebar returns to the real engine.")
SIMULATED_COMPARISON = ("Not available for a simulated run: the comparison runs the scenario on the real engine. The "
                        "Serving under load page compares scheduling policies on the simulated deployment.")


@dataclass(frozen=True)
class Style:
    font_size: int
    explain: bool  # captions, explanations, export buttons
    max_chart_height: int | None = None  # px; a taller figure is drawn this tall (presentation mode)

    @classmethod
    def current(cls) -> "Style":
        present = presentation.presentation()
        return cls(font_size=19 if present else 12, explain=not present,
                   max_chart_height=PRESENTATION_CHART_PX if present else None)

    def fit(self, fig: go.Figure) -> go.Figure:
        """``fig`` no taller than ``max_chart_height`` (Plotly's default height is 450 px)."""
        if self.max_chart_height is not None and (fig.layout.height or 450) > self.max_chart_height:
            fig.update_layout(height=self.max_chart_height)
        return fig


def chart_config(name: str, zoom: bool = False) -> dict[str, Any]:
    """Plotly's own toolbar gives the PNG export (camera icon), drawn by the browser; ``zoom``
    keeps its zoom, pan and reset buttons (the figure's own dragmode decides what a drag does)."""
    removed = ["select2d", "lasso2d"] + ([] if zoom else ["zoom2d", "pan2d", "autoScale2d"])
    return {"displaylogo": False, "scrollZoom": False,
            "toImageButtonOptions": {"format": "png", "filename": f"inferscope-{name}", "scale": 2},
            "modeBarButtonsToRemove": removed}


def chart(fig: go.Figure, name: str, style: Style, width: charts.Width = "stretch", zoom: bool = False,
          fit: bool = True) -> None:
    """A figure, plus (outside presentation mode) an HTML export of it. ``fit=False`` keeps a
    figure of stacked fixed-height panels at its own height below the first screen (the cap
    would squash its panels until their axis titles overlap)."""
    with timing.phase(f"send {name}"):
        charts.live_chart(style.fit(fig) if fit else fig, key=f"chart_{name}", config=chart_config(name, zoom),
                          width=width)
    if style.explain:
        st.download_button(f"Figure as HTML", data=lambda: fig.to_html(include_plotlyjs=True, full_html=True),
                           file_name=f"inferscope-{name}.html", mime="text/html", on_click="ignore",
                           key=f"html_{name}", icon=":material/download:", type="tertiary")


def table(frame: pd.DataFrame, name: str, **kwargs: Any) -> None:
    st.dataframe(frame, key=f"table_{name}", hide_index=True, **kwargs)


def page(title: str, render: Callable[[RunView, Style], None], intro: str = "",
         controls: Callable[[], None] | None = None) -> None:
    """Title, the page's own controls (outside the fragment: a change reruns the whole script,
    so the run is rebuilt before the views), error/notice messages, then the views fragment."""
    style = Style.current()
    if not style.explain:
        st.html(PRESENTATION_CSS)
    st.header(title, anchor=False)
    if intro and style.explain:
        st.caption(intro)
    if controls is not None and style.explain:
        controls()
    elif controls is not None:  # presentation mode: the page's own settings fold away (1080p)
        with st.expander("Settings", icon=":material/tune:"):
            controls()
    run_every = playback.tick_seconds() if playback.draw_play_state() else None  # fixed until the next full run

    @st.fragment(run_every=run_every, key=playback.VIEWS_FRAGMENT)
    def views() -> None:
        with timing.phase("views"):
            _views()

    def _views() -> None:
        _advance()
        shared_controls.recording_download()  # first: its slot is written on every run (controls.py)
        view = playback.view()
        if view is not None and current_run.is_simulated() and session.page.get() not in SIMULATED_PAGES:
            st.info(NOT_SIMULATED, icon=":material/info:")
            return
        if current_run.error():
            st.error(escape_markdown(current_run.error()), icon=":material/error:")
        if view is None:
            if not current_run.error():
                st.info("No run yet: pick a scenario and a model in the sidebar.")
            return
        status(view, style)
        shared_controls.step_slider(view)  # the history cursor (app/playback.py)
        render(view, style)

    views()


def _advance() -> None:
    """Step presses counted in the browser; Play: one step per tick; Run N: the requested steps,
    with a progress bar."""
    current = current_run.run()
    if current is None:
        return
    if playback.play_changed_since_drawn():
        st.rerun()  # a full run: the Play/Pause button's label and the views' tick follow
    playback.apply_queued_steps()
    pending = playback.take_pending_steps()
    if pending:
        bar = st.progress(0.0, text=f"Running {pending} steps…")
        for i in range(pending):
            if not playback.step(1):  # done, or failed (a message, never a traceback)
                break
            bar.progress((i + 1) / pending, text=f"Step {i + 1} of {pending}")
        bar.empty()
    elif playback.playing():
        if playback.at_end():  # Play from an earlier step goes through the history first
            playback.stop_playing()
            st.rerun()  # a full run stops the timer (run_every is fixed at the last full run)
        playback.step(1)


def status(view: RunView, style: Style) -> None:
    """One row: live/replay badge, scenario, model, policy and precision (quantized runs), steps,
    queues, pool, last step's engine time."""
    m = view.meta
    snap = view.snapshot
    last = view.last_trace
    with st.container(horizontal=True, vertical_alignment="center"):
        sim = current_run.simulated_run()
        if view.is_replay:
            st.badge("REPLAY · recorded run, no model", icon=":material/replay:", color="orange")
        elif sim is not None:
            st.badge(SIMULATED_BADGE, icon=":material/timer:", color="violet")
        else:
            st.badge("LIVE engine", icon=":material/memory:", color="green")
        precision = f" · {m.precision}" if m.precision else ""  # e.g. "int4 g32 · KV int8"; nothing for fp32
        spec = speculation_label(m.config)
        precision += f" · {spec}" if spec else ""  # e.g. "ngram k=4"
        st.badge(escape_markdown(f"{m.title} · {m.model} · {m.policy}{precision}", brackets=False),
                 color="gray")  # it escapes [ ]
        if view.done:
            st.badge("all requests finished", icon=":material/check:", color="blue")
    statuses = [r.status for r in snap.requests]
    cols = st.columns(7)
    cols[0].metric("Steps done", view.step_label)  # "7 of 12" when the views are behind the run
    cols[1].metric("Running", statuses.count(RequestStatus.RUNNING))
    cols[2].metric("Waiting", statuses.count(RequestStatus.WAITING) + statuses.count(RequestStatus.PREEMPTED),
                   help="Arrived and queued (including preempted requests); not-yet-arrived ones are not counted.")
    cols[3].metric("Finished", f"{statuses.count(RequestStatus.FINISHED)} / {len(statuses)}")
    cols[4].metric("Free blocks", f"{snap.num_free_blocks} / {snap.num_blocks}")
    cols[5].metric("Cached blocks", f"{sum(1 for b in snap.blocks if b.cached)}",
                   help="Blocks the prefix cache holds; of them, those no running request uses "
                        f"({snap.num_evictable_blocks} now) are evicted (LRU) before anyone is preempted.")
    if sim is not None:  # its steps take predicted time on the target, not this machine's
        predicted = sim.last_step_seconds(view.step)
        cols[6].metric("Last step (predicted)", f"{predicted * 1e3:.1f} ms" if predicted is not None else "—",
                       help="The cost model's prediction of the last step on the simulated deployment.")
        if style.explain:
            st.caption(escape_markdown(f"Predicted clock: {sim.clock_at(view.step):,.3f} s after the first request"
                                       f" was sent. {sim.recipe.sim.deployment.words}. Cost model:"
                                       f" {sim.recipe.sim.cost.label}. {sim.pool_note}"))
    else:
        cols[6].metric("Last step (engine)", f"{last.total_ms:.1f} ms" if last else "—",
                       help="Schedule + forward + sample time of the last engine step, as the engine measured it.")
    if current_run.notice() and view.is_replay and style.explain:
        st.caption(escape_markdown(current_run.notice()))


View = Callable[[RunView, Style], None]


def tabbed_views(key: str, tabs: Mapping[str, View], view: RunView, style: Style) -> None:
    """Tabs that draw only the open one (``on_change="rerun"``: a Step redraws one tab, not
    all), then the step table export when explaining."""
    for tab, draw in zip(st.tabs(tuple(tabs), key=key, on_change="rerun"), tabs.values()):
        if tab.open:
            with tab:
                draw(view, style)
    if style.explain:
        exports(view)


def exports(view: RunView) -> None:
    """The step table as CSV (figures export next to each chart)."""
    st.download_button("Step table (CSV)", data=lambda: step_table_csv(view.traces),
                       file_name=f"inferscope-{view.meta.scenario}-steps.csv", mime="text/csv",
                       on_click="ignore", key="csv_steps", icon=":material/table:")


def comparison_button(label: str, key: str, caption: str, style: Style,
                      run: Callable[[Callable[[str, int], None]], None]) -> bool:
    """A button that runs the scenario to the end twice on the real engine (``run``, given a
    progress callback), with a progress bar meanwhile. -> True when it ran this time."""
    if style.explain:
        st.caption(caption)
    if not st.button(label, key=key, icon=":material/compare_arrows:"):
        return False
    bar = st.progress(0.0, text="Running…")

    def progress(name: str, n: int) -> None:
        bar.progress(min(n / 400, 1.0), text=f"{name}: step {n}")

    run(progress)
    bar.empty()
    return True
