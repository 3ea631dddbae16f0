"""Speculative decoding: every draft the engine proposed and what the target's verification did
with it, acceptance against the theory, and the same scenario with and without speculation.
Thin: RunView (StepTrace.spec records) -> visualizers -> st.*."""
from __future__ import annotations

import streamlit as st

from app import live
from app.studies import comparisons
from engine.replay.run import RunView, speculation_label
from visualizers import speculative as sv
from visualizers.theme import request_label, request_sort_key

INTRO = ("A cheap drafter proposes k tokens; the model verifies all of them in one forward pass (k + 1 query "
         "tokens in the step's batch) and keeps them up to the first one it disagrees with, plus one token of its "
         "own: a bonus when all k pass, or a recovered token sampled from max(0, p − q) at the first rejection. "
         "Greedy output is token for token what the model alone would write; sampled output has exactly its "
         "distribution. Every cell below is a token this engine really proposed and verified.")
OFF = ("Speculation is off for this run: pick a drafter under **Speculative decoding** in the sidebar (or the "
       "spec-copy / spec-chat / spec-sampled scenarios, which turn it on).")
TABS = ("Drafts", "Acceptance & theory", "With vs without")
SUMMARY_FORMATS = {"tokens / verification": st.column_config.NumberColumn(format="%.2f")}


def render(view: RunView, style: live.Style) -> None:
    if not speculation_label(view.meta.config):
        st.info(OFF, icon=":material/info:")
    live.tabbed_views("spec_tab", dict(zip(TABS, (drafts_tab, theory_tab, comparison_tab))), view, style)


def counters(view: RunView) -> None:
    s = sv.spec_summary(view.traces)
    cols = st.columns(4)
    cols[0].metric("Acceptance α", f"{s.alpha:.0%}" if s.alpha is not None else "—",
                   help="Drafts accepted / drafts verified, every step so far.")
    cols[1].metric("Tokens per verification", f"{s.tokens_per_verification:.2f}"
                   if s.tokens_per_verification is not None else "—",
                   help="Tokens one target forward gave a request that verified drafts (1 without speculation).")
    cols[2].metric("Drafts proposed", s.proposed)
    cols[3].metric("Drafts accepted", s.accepted)


def drafts_tab(view: RunView, style: live.Style) -> None:
    counters(view)
    last = view.last_trace
    live.chart(sv.drafts_figure(last, style.font_size, view.step), "spec_drafts", style)
    ids = sorted({v.request_id for t in view.traces for v in t.spec}, key=request_sort_key)
    if not ids:
        if style.explain:
            st.caption("No verification yet: drafts start once a request has its first token (after its prefill).")
        return
    chosen = st.selectbox("Request", ids, key="spec_request", format_func=request_label, width=200)
    left, right = st.columns([3, 2])
    with left:
        st.markdown(sv.spec_text_markdown(view.traces, chosen))
        if style.explain:
            st.caption("Green: accepted drafts · blue: bonus tokens · orange: recovered tokens · plain: steps "
                       "without drafts (prefill, or no n-gram match).")
    with right:
        mine = next((v for t in reversed(view.traces) for v in t.spec if v.request_id == chosen and v.drafts), None)
        if mine is not None:
            live.chart(sv.pq_figure(mine, style.font_size), "spec_pq", style)


def theory_tab(view: RunView, style: live.Style) -> None:
    s = sv.spec_summary(view.traces)
    if s.alpha is None:
        st.info("No drafts verified yet: step the run.", icon=":material/info:")
        return
    runs = comparisons.spec_comparison()
    plain = runs.get(sv.PLAIN_RUN)
    c = sv.draft_cost(view.traces, plain.traces if plain else None)
    speedup = sv.measured_speedup(runs) if runs else None
    live.chart(sv.theory_figure(s.alpha, s.k, c, s.tokens_per_verification, speedup,
                                style.font_size), "spec_theory", style)
    if style.explain:
        st.caption("The theory assumes each draft is accepted independently with probability α and a verification "
                   "costs one target step; copied text is accepted in runs (measured above the curve), and on this "
                   "CPU verifying k drafts costs 1.0–1.45 decode steps (make bench: bench_spec).")
        st.caption(f"c = {c:.3g}: drafting time per draft token / a target step's time"
                   + (" (decode steps of the run without speculation)." if runs else
                      " (this run's verifying steps; run the comparison for a plain decode step and the measured "
                      "speedup)."))
    live.chart(sv.tokens_per_step_figure(view.traces, style.font_size, view.step), "spec_tokens", style)
    left, right = st.columns(2)
    with left:
        live.table(sv.acceptance_by_position(view.traces), "spec_positions",
                   column_config={"alpha": st.column_config.NumberColumn(format="percent")})
    with right:
        live.table(sv.spec_requests_frame(view.traces), "spec_requests", column_config=SUMMARY_FORMATS)


def comparison_tab(view: RunView, style: live.Style) -> None:
    if view.is_replay:
        st.info("Recordings do not hold the comparison: run it on the live engine.")
        return
    runs = comparisons.spec_comparison()
    if not runs and speculation_label(view.meta.config):
        if live.comparison_button("Run with and without speculation", "run_spec_comparison",
                                  "Runs the scenario to the end twice on the real engine, with this drafter and "
                                  "without speculation, every other knob equal.", style,
                                  comparisons.run_spec_comparison):
            runs = comparisons.spec_comparison()
    if not runs:
        return
    frame = sv.comparison_frame(runs)
    cols = st.columns(3)
    cols[0].metric("Same text with and without", "yes" if bool(frame["same text as the other run"].all()) else "no",
                   help="Every request's output text equal in the two runs (greedy: token for token).")
    steps = dict(zip(frame["run"], frame["target steps"]))
    cols[1].metric("Target steps", f"{steps.get(sv.SPEC_RUN, 0)} vs {steps.get(sv.PLAIN_RUN, 0)}",
                   help="Engine steps (target forwards) to finish the scenario, with vs without speculation.")
    speed = sv.measured_speedup(runs)
    cols[2].metric("Engine time, without / with", f"×{speed:.2f}" if speed else "—",
                   help="Sum of the engine's step times; on this CPU verifying k tokens costs more than one "
                        "decode step, so fewer steps need not mean less time.")
    live.table(frame, "spec_comparison")
    live.chart(sv.comparison_figure(runs, style.font_size), "spec_comparison", style)


live.page("Speculative decoding", render, INTRO)
