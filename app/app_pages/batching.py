"""Batch composition per iteration: tokens per request per step against the budget, the
request x step swim lane, queues, latency, and static vs continuous batching side by side.
Thin: RunView -> visualizers -> st.*."""
from __future__ import annotations

import streamlit as st

from app import current_run, live
from app.studies import comparisons
from engine.replay.run import RunView
from visualizers import batching as vb
from visualizers import comparison as vc
from visualizers import scheduling as vs

INTRO = ("Each engine step computes one flattened batch of at most `max_num_batched_tokens` tokens. Top: which "
         "requests filled it (colour = request, solid = prefill chunk, faded = decode) and how many decodes and "
         "prefill chunks it held; then every request's state in every step, and the queues.")
TABS = ("Live batches", "Latency per request", "Static vs continuous", "Scheduling policies")


def render(view: RunView, style: live.Style) -> None:
    live_tab, latency_tab, compare_tab, policy_tab = st.tabs(TABS, key="batching_tab", on_change="rerun")
    if live_tab.open:
        with live_tab:
            live.chart(vb.timeline_figure(view.traces, view.snapshot, style.font_size), "batch_timeline", style)
    if latency_tab.open:
        with latency_tab:
            live.chart(vb.latency_figure(view.snapshot, style.font_size), "batch_latency", style)
            live.table(vb.latency_frame(view.snapshot), "latency",
                       column_config={c: st.column_config.NumberColumn(format="%.1f")
                                      for c in ("TTFT (ms)", "TPOT (ms)", "E2E (ms)")})
    if compare_tab.open:
        with compare_tab:
            comparison(view, style)
    if policy_tab.open:
        with policy_tab:
            scheduling_comparison(view, style)
    if style.explain:
        live.exports(view)


def comparison(view: RunView, style: live.Style) -> None:
    if current_run.is_simulated():
        st.info(live.SIMULATED_COMPARISON, icon=":material/info:")
        return
    runs = view.comparison
    if not runs and not view.is_replay:
        if live.comparison_button("Run both policies", "run_comparison",
                                  "Runs the scenario to the end twice on the real engine, once per policy, "
                                  "every other knob equal.", style, comparisons.run_comparison):
            runs = comparisons.comparison()
    if not runs:
        if view.is_replay:
            st.info("This recording has no comparison runs.")
        return
    max_seqs = view.meta.config.scheduler_config.max_num_seqs
    live.table(vc.policy_summary(runs, max_seqs), "policy_summary",
               column_config={"tokens / step": st.column_config.NumberColumn(format="%.2f"),
                              "tokens / s (measured)": st.column_config.NumberColumn(format="%.0f"),
                              "mean TTFT (steps)": st.column_config.NumberColumn(format="%.1f"),
                              "mean latency (steps)": st.column_config.NumberColumn(format="%.1f"),
                              "mean E2E (ms)": st.column_config.NumberColumn(format="%.0f")})
    live.chart(vc.lanes_side_by_side(runs, style.font_size), "policy_lanes", style)
    live.chart(vc.latency_comparison_figure(runs, style.font_size), "policy_latency", style)



def scheduling_comparison(view: RunView, style: live.Style) -> None:
    """The scenario run to the end once per scheduling_policy on the real engine (live runs only)."""
    if view.is_replay:
        st.info("Scheduling policies are compared on a live run (a recording holds one policy's run).")
        return
    runs = comparisons.scheduling_comparison()
    if not runs and live.comparison_button(
            "Run every scheduling policy", "run_scheduling_comparison",
            "Runs the scenario to the end once per scheduling_policy (fcfs, priority, sjf, lpm, mlfq) on the "
            "real engine, every other knob equal. TTFT is counted in engine steps. The scenarios carry no "
            "request priorities, so 'priority' orders by arrival here, as fcfs does.",
            style, comparisons.run_scheduling_comparison):
        runs = comparisons.scheduling_comparison()
    if not runs:
        return
    live.table(vs.scheduling_summary(runs), "scheduling_summary",
               column_config={"mean TTFT (steps)": st.column_config.NumberColumn(format="%.1f"),
                              "p90 TTFT (steps)": st.column_config.NumberColumn(format="%.0f"),
                              "prefix hit rate": st.column_config.NumberColumn(format="percent")})
    live.chart(vs.ttft_figure(runs, style.font_size), "scheduling_ttft", style)


live.page("Batch composition", render, INTRO)
