"""Attention architectures: what each layout keeps per token, and what that does to a device.

Thin script. Top: seven real configs sized by the calculator on one device at one context
(engine/studies/architectures.py -> visualizers/architectures.py). Bottom: MHA, GQA and MQA
tiny-random engines run on one workload with the same KV-cache bytes, stepped together through
their recorded steps (engine/studies/attention_layouts.py). Any input, however wrong, ends in a
message, never a traceback.
"""
from __future__ import annotations

import streamlit as st

from app import link_settings, session
from app.session import K
from app.studies import architectures as study
from engine import memory as calc
from engine.studies.attention_layouts import LayoutWorkload
from visualizers import architectures as va
from visualizers.text import escape_markdown as md

HARDWARE = [h for h in calc.hardware_presets() if h != "this-machine"]  # accelerators; this CPU says little here
WEIGHTS = list(calc.WEIGHT_FORMATS)
BUDGETS_KIB = [8, 16, 32, 48, 64, 96, 128, 256]
BOUND_KEYS = (K.arch_hw, K.arch_ctx, K.arch_weights)
CHART_CONFIG = {"displaylogo": False}
_number = st.column_config.NumberColumn
TABLE_COLUMNS = {
    "KV/token KiB": _number("KV/token KiB", help="KV-cache bytes per token over all layers (0: a constant state)"),
    "KV/sequence MiB": _number("KV/seq MiB", help="KV (and recurrent state) of one sequence at this context,"
                                                  " rounded to whole KV blocks"),
    "sequences": _number("sequences", help="most sequences at this context the device holds beside the weights"),
    "GB read per full step": _number("GB/step full", help="bytes one decode step reads with the device full:"
                                                          " weights + every sequence's KV"),
}

st.title("🧠 Attention architectures")
st.caption("MHA, MQA, GQA, MLA, sliding windows, state-space and hybrid models keep very different amounts of"
           " memory per token. Above: real configurations sized by the calculator on one device. Below: the real"
           " engine running the same requests with MHA, GQA and MQA heads on the same KV-cache memory.")

# ---------------------------------------------------------------------------------------------
# real configurations, side by side (the calculator)
url_before = link_settings.snapshot()
c1, c2, c3 = st.columns(3)
hw = c1.selectbox("Device", HARDWARE, index=HARDWARE.index(session.arch_hw.default), key=K.arch_hw,
                  bind="query-params", format_func=lambda h: f"{h} ({calc.preset_info(h).name})")
context = c2.number_input("Context (tokens per sequence)", min_value=1, max_value=calc.MAX_CONTEXT,
                          value=session.arch_ctx.default, step=1024, key=K.arch_ctx, bind="query-params")
weights = c3.selectbox("Weights", WEIGHTS, index=WEIGHTS.index(session.arch_weights.default), key=K.arch_weights,
                       bind="query-params", help="the same weight format for every model (the calculator may"
                                                 " substitute what the device runs, e.g. fp16 for bf16 on a T4)")
link_settings.warn_ignored(url_before, BOUND_KEYS)

try:
    rows = study.architecture_rows(hw, int(context), weights)
except calc.SizingError as exc:
    st.error(f"Can't size these: {md(exc)}", icon="🚫")
    rows = ()
except Exception as exc:  # noqa: BLE001 - the page promise: a message, never a traceback
    st.error(f"Unexpected problem with these inputs ({type(exc).__name__}): {md(exc)}", icon="🚫")
    rows = ()

if rows:
    first = rows[0]
    st.caption(f"One {md(first.hardware_name)} (tp = pp = 1), {md(calc.FRAMEWORK_LABELS[first.framework])}'s budget,"
               f" weights {md(first.weights_format.upper())}, KV in each model's dtype. *sequences*: the most"
               " sequences of this context the device holds after the weights (the calculator's own search)."
               " Decode figures are the roofline (efficiency 1), memory- or compute-bound as said, with every"
               " sequence's KV read counted: for one sequence, and for the device full of sequences.")
    st.dataframe(va.architecture_table(rows), key="arch_table", hide_index=True, width="stretch",
                 column_config=TABLE_COLUMNS)
    st.plotly_chart(va.architecture_figure(rows), key="arch_chart", width="stretch", config=CHART_CONFIG)
    for row in rows:
        with st.expander(f"{md(row.kind)} · {md(row.model_name)}: the formulas with their numbers"):
            st.markdown(md(row.idea))
            for heading, line in row.formulas:
                st.markdown(f"**{md(heading)}**")
                st.code(line, language=None, wrap_lines=True)
            for warning in row.warnings:
                st.caption(f"⚠️ {md(warning)}")

# ---------------------------------------------------------------------------------------------
# the live part: the real engine, MHA / GQA / MQA on the same KV-cache bytes
st.header("Live: MHA, GQA and MQA on the real engine", anchor=False)
st.caption("Three tiny-random models (hidden size 64, 4 query heads of 16, 2 layers) that differ only in their KV"
           " heads: 4 (MHA), 2 (GQA), 1 (MQA). Each engine gets the same KV-cache bytes, so it cuts them into"
           " blocks of 4 tokens whose size follows its KV bytes per token: the MHA pool has a quarter of the MQA"
           " pool's blocks. Every pool below is drawn as the same square (the same bytes); a square is one"
           " physical block, coloured by the request that owns it. All requests arrive at step 0.")
c1, c2, c3 = st.columns(3)
budget = c1.select_slider("KV-cache memory for each engine (KiB)", BUDGETS_KIB, value=session.arch_budget.default,
                          key=K.arch_budget)
requests = c2.slider("Requests", 1, 16, value=session.arch_requests.default, key=K.arch_requests)
tokens = c3.slider("Tokens each request generates", 1, 64, value=session.arch_tokens.default, key=K.arch_tokens,
                   help="greedy, EOS ignored; every prompt is 24 tokens")
try:
    workload = LayoutWorkload(kv_budget_bytes=int(budget) * 1024, num_requests=int(requests),
                              max_tokens=int(tokens))
    with st.spinner("Running the three engines to the end…"):
        layouts = study.layout_study(workload)
except ValueError as exc:
    st.error(f"Can't run this workload: {md(exc)}", icon="🚫")
    st.stop()
except Exception as exc:  # noqa: BLE001 - a message, never a traceback
    st.error(f"The engines failed ({type(exc).__name__}): {md(exc)}", icon="🚫")
    st.stop()

last = layouts.num_steps
done = study.steps_done(workload, last)
b = st.columns([1, 1, 1, 1, 3])
b[0].button("◀ Back", key="arch_back", on_click=study.move, args=(workload, last), kwargs={"by": -1},
            disabled=done == 0, width="stretch")
b[1].button("Step ▶", key="arch_step", on_click=study.move, args=(workload, last), kwargs={"by": 1},
            disabled=done == last, width="stretch", type="primary")
b[2].button("Run to end", key="arch_end", on_click=study.move, args=(workload, last), kwargs={"to": last},
            disabled=done == last, width="stretch")
b[3].button("Reset", key="arch_reset", on_click=study.move, args=(workload, last), kwargs={"to": 0},
            disabled=done == 0, width="stretch")
b[4].markdown(f"**Steps done: {done}** of {last} (the three engines ran this workload to the end, each step"
              " checked; the buttons move all three through their recorded steps together)")

st.plotly_chart(va.pools_figure(layouts, done), key="arch_pools", width="stretch", config=CHART_CONFIG)
st.dataframe(va.step_frame(layouts, done), key="arch_steps", hide_index=True, width="stretch")
st.plotly_chart(va.running_figure(layouts, done), key="arch_running", width="stretch", config=CHART_CONFIG)
mha, gqa, mqa = layouts.runs
st.markdown(f"At most **{mha.peak_running}** (MHA), **{gqa.peak_running}** (GQA) and **{mqa.peak_running}** (MQA)"
            f" sequences ran at once; {mha.preemptions}, {gqa.preemptions} and {mqa.preemptions} preemptions; all"
            f" {workload.num_requests} requests done after {mha.num_steps}, {gqa.num_steps} and {mqa.num_steps}"
            " steps.")
