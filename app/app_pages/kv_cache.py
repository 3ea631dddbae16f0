"""Paged KV cache: the block pool, each request's block table, what this step did, and the
memory paging saves against a contiguous reservation. Thin: RunView -> visualizers -> st.*."""
from __future__ import annotations

import streamlit as st

from app import live, presentation
from app.session import K
from engine.replay.run import RunView
from visualizers import kv_blocks as kv
from visualizers.text import escape_markdown
from visualizers.theme import request_label

INTRO = ("Top: every square is one physical KV block; its colour is the request that owns it (the same colour in "
         "every view), its opacity how full it is; a dark outline marks a block allocated in the last step, a red "
         "one a block freed, a teal one a block the prefix cache holds (pale fill: cached but unused, evictable). "
         "Below: each running request's block table, logical block → physical block. Hover a block for its id, "
         "owner, ref count, the tokens it holds and its prefix-cache state.")


def render(view: RunView, style: live.Style) -> None:
    snap = view.snapshot
    options = ["all", *(r.request_id for r in kv.running_tables(snap))]
    presentation.keep_focus_among(options)
    left, right = st.columns([7, 4])
    with left:
        live.chart(kv.kv_figure(snap, view.last_trace, presentation.focus(), style.font_size), "kv_cache", style,
                   width="content")
    with right:
        st.subheader("What the last step did", anchor=False)
        st.markdown(kv.step_events_markdown(kv.step_events_frame(view.last_trace)))
        frame = kv.waste_frame(snap, view.meta.max_model_len)
        live.chart(kv.waste_figure(frame, snap.num_blocks * snap.block_size, snap.step, style.font_size),
                   "kv_waste", style)
        st.markdown(kv.waste_summary(frame, view.meta.max_model_len))
        st.markdown(kv.pool_summary(snap, view.meta.kv_cache_dtype))
        st.segmented_control("Highlight a request", options, key=K.focus, required=True,
                             format_func=lambda r: "all" if r == "all" else escape_markdown(request_label(r)))
    if style.explain:
        with st.expander("Block tables with the tokens each block holds"):
            live.table(kv.block_table_frame(snap), "block_tables",
                       column_config={"fill": st.column_config.ProgressColumn(min_value=0, max_value=1,
                                                                              format="percent")})
        live.exports(view)


live.page("Paged KV cache", render, INTRO)
