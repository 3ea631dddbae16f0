"""Prefix cache: the engine's radix tree after each step, what the step did to it, the block
pool with its cached blocks, the hit rate over time, and the same scenario with caching off.
Thin: RunView -> visualizers -> st.*."""
from __future__ import annotations

import streamlit as st

from app import current_run, live
from app.studies import comparisons
from engine.replay.run import RunView
from visualizers import prefix_stats as ps
from visualizers import prefix_tree as pt

INTRO = ("The radix tree of the engine's prefix cache: each box is a node holding whole KV blocks of tokens that "
         "some prompt began with; a path from the root spells a cached prefix. Grey = in use (locked by running "
         "requests, whose colours sit under the box), pale blue = cached but unused (evictable; \"LRU 1\" goes "
         "first), and what the last step did: blue = matched by a request just admitted, green = inserted, "
         "sand = split, red = evicted (shown faded where it was). Hover a box for its full text; drag to zoom, "
         "double-click to reset.")
TABS = ("Radix tree", "Caching on vs off")
CACHING_OFF = ("Prefix caching is off for this run (Engine knobs → Prefix caching): nothing is cached, every prompt "
               "is prefilled in full.")


def render(view: RunView, style: live.Style) -> None:
    tree_tab, compare_tab = st.tabs(TABS, key="prefix_tab", on_change="rerun")
    if tree_tab.open:
        with tree_tab:
            tree_view(view, style)
    if compare_tab.open:
        with compare_tab:
            comparison(view, style)
    if style.explain:
        live.exports(view)


def tree_view(view: RunView, style: live.Style) -> None:
    snap = view.snapshot
    if not snap.prefix_tree:
        st.info(CACHING_OFF, icon=":material/info:")
    live.chart(pt.tree_figure(snap, view.last_trace, view.traces, style.font_size,
                              max_height=style.max_chart_height), "prefix_tree", style, zoom=True)
    counters(view)
    st.subheader("What the last step did", anchor=False)
    st.markdown(pt.events_markdown(view.last_trace, snap.block_size))
    # full width: beside the text (a column 4/9 wide) its block grid ran past the page at 1440 px
    live.chart(ps.cache_figure(view.traces, snap, style.font_size), "prefix_stats", style, fit=False)
    if style.explain:
        with st.expander("Every cached node"):
            live.table(pt.tree_frame(snap), "prefix_nodes")


def counters(view: RunView) -> None:
    totals = ps.cache_stats_frame(view.traces)
    rate = ps.hit_rate(view.traces)
    cols = st.columns(4)
    cols[0].metric("Hit rate", f"{rate:.0%}" if rate is not None else "—",
                   help="Prompt tokens served from the cache / prompt tokens looked up at admission, so far.")
    cols[1].metric("Prefill tokens saved", int(totals["cached tokens"].sum()))
    cols[2].metric("Evictable blocks", view.snapshot.num_evictable_blocks,
                   help="Blocks held by the tree that no running request uses: evicted (LRU) before anyone is "
                        "preempted.")
    cols[3].metric("Blocks evicted", int(totals["evicted blocks"].sum()))


def comparison(view: RunView, style: live.Style) -> None:
    if current_run.is_simulated():
        st.info(live.SIMULATED_COMPARISON, icon=":material/info:")
        return
    runs = comparisons.caching_comparison()
    if view.is_replay:
        st.info("Recordings do not hold the caching comparison: run it on the live engine.")
        return
    if not runs:
        if live.comparison_button("Run with caching on and off", "run_caching_comparison",
                                  "Runs the scenario to the end twice on the real engine, with prefix caching on "
                                  "and off, every other knob equal.", style, comparisons.run_caching_comparison):
            runs = comparisons.caching_comparison()
    if not runs:
        return
    live.table(ps.caching_summary(runs), "caching_summary",
               column_config={"hit rate": st.column_config.NumberColumn(format="percent"),
                              "mean TTFT (steps)": st.column_config.NumberColumn(format="%.1f"),
                              "mean TTFT (ms)": st.column_config.NumberColumn(format="%.0f"),
                              "engine time (ms)": st.column_config.NumberColumn(format="%.0f")})
    live.chart(ps.caching_comparison_figure(runs, style.font_size), "caching_comparison", style)
    with st.expander("Per request"):
        live.table(ps.caching_requests_frame(runs), "caching_requests",
                   column_config={c: st.column_config.NumberColumn(format="%.1f")
                                  for c in ("TTFT ms (on)", "TTFT ms (off)")})


live.page("Prefix cache", render, INTRO)
