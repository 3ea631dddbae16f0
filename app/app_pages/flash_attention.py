"""FlashAttention: the Triton kernel's tiles, running max / sum / rescale and split-KV merge on the
live run's own tensors at the current step, and naive vs tiled memory traffic. Thin: the study
(app/studies/flash_attention.py) -> visualizers/flash_attention.py -> st.*."""
from __future__ import annotations

import streamlit as st

from app import live, session
from app.session import K
from app.studies import flash_attention as flash
from engine.replay.run import RunView
from engine.studies.flash_attention import (
    MAX_TRACE_TILES, TILE_WIDTHS, TRACE_CONTEXT, TRAFFIC_MODELS, Candidate, FlashStudy, candidates, estimated_tiles,
    preset_traffic, step_traffic, traceable_width,
)
from visualizers import flash_attention as fv
from visualizers.text import escape_markdown
from visualizers.theme import request_label

INTRO = ("FlashAttention never writes the score matrix to memory: each program takes a block of query rows and "
         "walks the context in KV tiles, keeping per row a running max m, a running sum l of exp(score − m) and "
         "an unnormalised output, rescaled by exp(m_old − m_new) whenever the max grows. Here the engine's own "
         "Triton kernel runs on this step's real q, K and V of one request, layer and head, with its trace on: "
         "every number below is what the kernel stored after each tile.")
BOUNDS = (f"How: the request's tokens go once more through the run's own model up to the chosen layer (a private "
          f"KV pool; the engine's is untouched), K/V are laid out at the request's real block table, and the kernel "
          f"runs for the step's new tokens and the chosen head's GQA group of one KV head. On a CPU it runs in "
          f"Triton's interpreter (TRITON_INTERPRET=1): the same kernel code, executed exactly and slowly — seconds "
          f"per trace, so the trace is bounded to {TRACE_CONTEXT} context tokens (a longer context is refused, not "
          f"cut) and one KV head, and cached per step, request, layer, head, tile width and segments.")
MERGE_NOTE = ("FlashDecoding: a decode has one query row, so one program per KV head would leave a GPU idle. Split-KV "
              "cuts the context's tiles into segments of ⌈tiles / S⌉ (so the last may be empty: m = −inf, l = 0, "
              "weight 0), each program computes its segment's (m_s, l_s, o_s), and a second kernel merges them: "
              "with M = max m_s and w_s = l_s·exp(m_s − M), out = Σ w_s·o_s / Σ w_s (the log-sum-exp of each "
              "segment is m_s + ln l_s).")
TRAFFIC_NOTE = ("Naive attention writes the score matrix S to memory, reads it back for the softmax, writes the "
                "probabilities P and reads them again for P·V; the tiled kernel keeps S and P in on-chip tiles and "
                "reads K and V once per query block (⌈M / Br⌉ passes). Bytes of one layer, every head, without the "
                "causal saving (which roughly halves a prefill's S and K/V tiles for both).")

QUERY_CHOICES = ("decode (1)", "prefill (= context)")
TABLE_ROW_PX = 35  # st.dataframe's row height: the traffic table shown whole


def _request_label(c: Candidate) -> str:
    what = "decode" if c.kind == "decode" else f"prefill of {c.num_tokens}"
    return escape_markdown(f"{request_label(c.request_id)} · {what} · context {c.seq_len}")


def render(view: RunView, style: live.Style) -> None:
    problem = flash.unavailable(view) or flash.kernel_problem()
    if problem is not None:
        st.info(escape_markdown(problem), icon=":material/info:")
        traffic_section(None, style)
        return
    cands, notes = candidates(view.snapshot, view.last_trace)
    if view.last_trace is None:
        st.info("Step the run: the page traces a request the last step scheduled.", icon=":material/info:")
        traffic_section(None, style)
        return
    if not cands:
        st.info(escape_markdown("No request of this step can be traced: " + "; ".join(notes or ["none scheduled"])),
                icon=":material/info:")
        traffic_section(None, style)
        return
    study = trace_controls(view, cands)
    if style.explain:
        st.caption(BOUNDS)
        if notes:
            st.caption(escape_markdown("Not traceable at this step: " + "; ".join(notes)))
    st.markdown(fv.summary_markdown(study))
    cols = st.columns(5)
    cols[0].metric("Context", study.seq_len)
    cols[1].metric("New tokens", study.num_tokens)
    cols[2].metric("Tile Br × Bc", f"{study.block_m} × {study.block_n}",
                   help=f"Br: query tokens per program (its rows are these tokens × the GQA group of {study.group}, "
                        "padded to a power of two); Bc: context positions per KV tile.")
    cols[3].metric("Tiles visited", len(study.tiles))
    cols[4].metric("Max abs difference", f"{study.max_abs_diff:.1e}",
                   help="max |kernel output − softmax(QKᵀ)V in float64| over this head's rows and dimensions "
                        f"(the whole GQA group: {study.group_max_abs_diff:.1e}).")
    tiles_section(study, style)
    if study.segments:
        segments_section(study, style)
    else:
        final_section(study, style)
    traffic_section(study, style)


def trace_controls(view: RunView, cands: list[Candidate]) -> FlashStudy:
    """Request, layer, head, tile width and segments; the kernel's trace for them (a spinner meanwhile)."""
    layers, heads, kv_heads = flash.num_layers_heads()
    ids = [c.request_id for c in cands]
    if session.flash_request.get() not in ids:
        session.flash_request.set(ids[0])
    for slot, count in ((session.flash_layer, layers), (session.flash_head, heads)):
        if slot.is_set() and slot.get() not in range(count):  # another model since: its first one
            slot.set(0)
    by_id = {c.request_id: c for c in cands}
    with st.container(horizontal=True, vertical_alignment="bottom"):
        rid = st.selectbox("Request (scheduled this step)", ids, key=K.flash_request, width=300,
                           format_func=lambda r: _request_label(by_id[r]))
        layer = st.selectbox("Layer", range(layers), key=K.flash_layer, width=90)
        head = st.selectbox("Query head", range(heads), key=K.flash_head, width=110,
                            help=f"{heads} query heads share {kv_heads} KV heads: head h reads KV head "
                                 f"h // {heads // kv_heads}.")
        block_n = st.segmented_control("KV tile Bc", TILE_WIDTHS, key=K.flash_block_n,
                                       default=session.flash_block_n.default, required=True)
        cand = by_id[rid or ids[0]]
        decode = cand.num_tokens == 1
        segments = st.slider("Split-KV segments", 1, 8, key=K.flash_segments,
                             value=session.flash_segments.default, width=220,
                             disabled=not decode, help="FlashDecoding: for a decode (one new token) only.")
    segments = int(segments) if decode else 1
    chosen = int(block_n or session.flash_block_n.default)
    group = heads // kv_heads
    width = traceable_width(cand.start, cand.num_tokens, group, chosen)
    if width != chosen:
        st.caption(f"Tiles of {chosen} would be {estimated_tiles(cand.start, cand.num_tokens, group, chosen):,} for "
                   f"this chunk, over the {MAX_TRACE_TILES:,} a trace takes in Triton's interpreter (a few ms "
                   f"each): traced with Bc = {width}.")
    with st.spinner(escape_markdown(f"Running the Triton kernel on {request_label(cand.request_id)}'s tensors "
                                    "(Triton's interpreter takes a few seconds)…")):
        return flash.trace(view, cand, int(layer or 0), int(head or 0), segments, width)


def tiles_section(study: FlashStudy, style: live.Style) -> None:
    st.subheader("The tiles, in the order the kernel visits them", anchor=False)
    orders = [t.order for t in study.tiles]
    if session.flash_tile.get() not in orders:
        session.flash_tile.set(study.first_tile_shown())
    chosen = st.select_slider("Tile", orders, key=K.flash_tile,
                              format_func=lambda o: fv.tile_label(study.tiles[o]))
    tile = study.tiles[int(chosen if chosen is not None else orders[-1])]
    live.chart(fv.score_figure(study, tile.order, style.font_size), "flash_scores", style)
    if style.explain:
        st.caption("Each outlined tile is one step of one program's loop: a block of Br query tokens against Bc "
                   "context positions, numbered in visiting order (programs in grid order; on a GPU they run in "
                   "parallel). Blank cells are causally masked: a query sees positions up to its own; tiles past a "
                   "block's last query are never visited.")
    st.markdown(f"**After tile #{tile.order}** (positions {tile.positions[0]}–{tile.positions[1] - 1}): per query "
                "row the running max m, the running sum l, the rescale applied to everything summed before (0 at "
                "a program's first tile: nothing was summed yet; 1 while the max holds), and the partial output "
                "acc / l.")
    live.table(fv.tile_frame(study, tile), "flash_tile")
    left, right = st.columns(2)
    with left:
        live.chart(fv.partial_output_figure(study, tile, style.font_size), "flash_partial", style)
    with right:
        live.chart(fv.running_figure(study, tile.rows[-1], style.font_size), "flash_running", style)


def final_section(study: FlashStudy, style: live.Style) -> None:
    st.subheader("After the last tile: the kernel against softmax(QKᵀ)V", anchor=False)
    st.markdown(f"Max abs difference, kernel (fp32) against the float64 reference: **{study.max_abs_diff:.2e}** "
                f"(this head), {study.group_max_abs_diff:.2e} (its GQA group).")
    live.table(fv.final_frame(study), "flash_final")
    if style.explain:
        with st.expander("The last query token's output, dimension by dimension"):
            live.table(fv.output_frame(study), "flash_output")


def segments_section(study: FlashStudy, style: live.Style) -> None:
    st.subheader(f"Split-KV: {study.num_segments} segments and their merge", anchor=False)
    if style.explain:
        st.caption(MERGE_NOTE)
    live.table(fv.segments_frame(study), "flash_segments")
    st.markdown(fv.merge_markdown(study))
    st.markdown(f"Max abs difference, merged kernel output against the float64 reference: "
                f"**{study.max_abs_diff:.2e}**.")


def traffic_section(study: FlashStudy | None, style: live.Style) -> None:
    st.subheader("Memory traffic: naive against tiled", anchor=False)
    if style.explain:
        st.caption(TRAFFIC_NOTE)
    with st.container(horizontal=True, vertical_alignment="bottom"):
        model = st.selectbox("Model (calculator preset)", TRAFFIC_MODELS, key=K.flash_model, width=200,
                             index=TRAFFIC_MODELS.index(session.flash_model.default))
        context = st.number_input("Context", min_value=1, max_value=1 << 20, value=session.flash_context.default,
                                  step=1024, key=K.flash_context, width=140)
        queries = st.segmented_control("Query tokens", QUERY_CHOICES, key=K.flash_queries,
                                       default=session.flash_queries.default, required=True)
    n = int(context)
    preset = preset_traffic(model or TRAFFIC_MODELS[0], n, 1 if queries == QUERY_CHOICES[0] else n)
    rows = [preset]
    if study is not None:
        layers, heads, kv_heads = flash.num_layers_heads()
        rows.insert(0, step_traffic(study, heads, kv_heads, flash.dtype_bytes(), layers,
                                    f"this step ({request_label(study.request_id)})"))
    frame = fv.traffic_frame(rows)
    live.table(frame, "flash_traffic", height=TABLE_ROW_PX * (len(frame) + 1) + 3)
    for t in rows:
        st.markdown(fv.traffic_markdown(t))


live.page("FlashAttention", render, INTRO)
