"""Serving under load: a workload served by a simulated deployment (the real scheduler, block pool
and prefix cache; step times predicted by the cost model), its latencies and queues, the
scheduling policies side by side, the capacity curve, and a step-through run for the live pages.

Thin script: controls -> app.studies.serving -> visualizers.serving -> st.*. Any input, however
wrong, ends in a message (st.error), never a traceback.
"""
from __future__ import annotations

from typing import Any

import streamlit as st

from app import current_run, session
from app.simulated_run import SIMULATED_BADGE
from app.studies import serving as study
from app.studies.serving import ServingInputs
from engine import memory as calc
from engine.simulate.simulator import Progress
from engine.simulate.workload import published_lengths
from visualizers import serving as vs
from visualizers.text import escape_markdown as md  # every non-literal text that reaches Markdown

PRESET_MODELS = calc.model_presets()
PRESET_HARDWARE = [h for h in calc.hardware_presets() if h != "this-machine"]  # calibration: not on this page
FRAMEWORK_OPTIONS = ["auto", "vllm", "sglang", "vllm-ascend", "mindie", "inferscope"]
LENGTH_KINDS = [*published_lengths(), "fixed", "uniform", "lognormal"]
PLAIN_DELTA: dict[str, Any] = {"delta_color": "off", "delta_arrow": "off"}
CHART = {"displaylogo": False}
MS = st.column_config.NumberColumn(format="%.1f")
SHARE = st.column_config.NumberColumn(format="percent")


def _framework_label(key: str) -> str:
    return "auto (by hardware)" if key == "auto" else calc.FRAMEWORK_LABELS[key]


def lengths(part: str, default: str) -> str:
    """A length distribution from its widgets, in engine.simulate.workload.parse_lengths' syntax."""
    kind = st.selectbox(f"{part.capitalize()} lengths", LENGTH_KINDS, index=LENGTH_KINDS.index(default),
                        key=f"sv_{part}_kind", help="published: lognormal fits of the dataset's token counts "
                                                    "(presets/workloads/lengths.json); or fixed, uniform, lognormal")
    c1, c2 = st.columns(2)
    if kind == "fixed":
        n = c1.number_input("tokens", min_value=1, max_value=1 << 20, value=256, key=f"sv_{part}_n")
        return str(int(n))
    if kind == "uniform":
        lo = c1.number_input("from", min_value=1, max_value=1 << 20, value=64, key=f"sv_{part}_lo")
        hi = c2.number_input("to", min_value=1, max_value=1 << 20, value=512, key=f"sv_{part}_hi")
        return f"uniform:{int(lo)}-{int(hi)}"
    if kind == "lognormal":
        mean = c1.number_input("mean", min_value=1.0, max_value=float(1 << 20), value=256.0, key=f"sv_{part}_mean")
        sigma = c2.number_input("sigma", min_value=0.01, max_value=4.0, value=1.0, key=f"sv_{part}_sigma")
        return f"lognormal:{mean:g},{sigma:g}"
    return kind


st.title("📈 Serving under load")
st.caption("How does a deployment behave under traffic? The real engine's scheduler, paged KV pool and prefix cache"
           " serve the workload; each step's time is predicted by a cost model for the hardware, so every time on"
           " this page is a prediction, not a measurement.")

# ---------------------------------------------------------------------------------------
# controls
with st.sidebar:
    st.header("Deployment")
    model = st.selectbox("Model", PRESET_MODELS, index=PRESET_MODELS.index("llama-3-70b"), key="sv_model")
    hardware = st.selectbox("Hardware", PRESET_HARDWARE, index=PRESET_HARDWARE.index("h100-sxm"), key="sv_hw")
    framework = st.selectbox("Framework", FRAMEWORK_OPTIONS, key="sv_fw", format_func=_framework_label,
                             help="Its KV budget rule (the pool), step overhead and prefill schedule")
    version = st.text_input("Framework version", key="sv_fwv", placeholder="latest")
    c1, c2 = st.columns(2)
    tp = c1.number_input("Tensor parallel", min_value=1, max_value=64, value=8, step=1, key="sv_tp")
    pp = c2.number_input("Pipeline parallel", min_value=1, max_value=64, value=1, step=1, key="sv_pp")
    policies = study.scheduling_policies()
    policy = st.selectbox("Scheduling policy", policies, key="sv_policy",
                          help="Who is admitted first and who is preempted (vLLM's scheduling_policy)")

    st.header("Workload")
    source = st.segmented_control("Requests", ["generated", "file"], default="generated", required=True,
                                  key="sv_source", help="Poisson arrivals at a rate, or a JSON workload file")
    workload_json, workload_name = "", ""
    rate, num_requests, prompt_len, output_len = 10.0, 100, "sharegpt", "sharegpt"
    if source == "file":
        uploaded = st.file_uploader("Workload file (JSON)", type=["json"], key="sv_file",
                                    help="A list of {arrival_s, prompt | prompt_tokens, max_tokens, priority?}")
        if uploaded is not None:
            workload_json = uploaded.getvalue().decode("utf-8", errors="replace")
            workload_name = uploaded.name
    else:
        c1, c2 = st.columns(2)
        rate = c1.number_input("Rate (req/s)", min_value=0.0, max_value=10_000.0, value=10.0, step=1.0,
                               key="sv_rate", help="Poisson arrivals per second")
        num_requests = c2.number_input("Requests", min_value=1, max_value=2000, value=100, step=50, key="sv_n",
                                       help="about 10 s of work here per 100 requests")
        prompt_len = lengths("prompt", "sharegpt")
        output_len = lengths("output", "sharegpt")
    seed = st.number_input("Seed", min_value=0, max_value=1 << 30, value=0, key="sv_seed")

    st.header("Targets")
    c1, c2 = st.columns(2)
    slo_ttft = c1.number_input("TTFT SLO (s)", min_value=0.0, max_value=600.0, value=1.0, step=0.1, key="sv_slo_ttft")
    slo_tpot = c2.number_input("TPOT SLO (s)", min_value=0.0, max_value=60.0, value=0.05, step=0.01, format="%.3f",
                               key="sv_slo_tpot")
    time_limit = st.number_input("Time limit per run (s)", min_value=1.0, max_value=600.0, value=30.0, step=5.0,
                                 key="sv_limit", help="Wall seconds here; a longer run stops, marked partial")

inputs = ServingInputs(model=model, hardware=hardware, framework=framework, framework_version=version.strip(),
                       tp=int(tp), pp=int(pp), rate=float(rate), num_requests=int(num_requests), prompt_len=prompt_len,
                       output_len=output_len, seed=int(seed), slo_ttft_s=float(slo_ttft), slo_tpot_s=float(slo_tpot),
                       time_limit_s=float(time_limit), workload_json=workload_json, workload_name=workload_name)

# ---------------------------------------------------------------------------------------
# the deployment
st.badge(SIMULATED_BADGE, icon=":material/timer:", color="violet")
try:
    sim = study.deployment(inputs)
    _ = inputs.slo  # checks the SLO fields before anything runs (a bare expression would be drawn)
except (ValueError, calc.SizingError) as exc:
    st.error(f"Can't simulate this: {md(exc)}", icon="🚫")
    st.stop()
except Exception as exc:  # noqa: BLE001 - the page promise: a message, never a traceback
    st.error(f"Unexpected problem with these inputs ({type(exc).__name__}): {md(exc)}", icon="🚫")
    st.stop()
d = sim.deployment
st.markdown(f"**{md(d.words)}**")
st.caption(f"Cost model: {md(sim.cost.label)}. Serving rule: {md(sim.serving.words)}.")
m = st.columns(4)
m[0].metric("KV pool", f"{d.kv_pool_tokens:,} tokens", f"{d.num_blocks:,} blocks of {d.block_size}", **PLAIN_DELTA,
            help="The calculator's KV room for this deployment (the Will it fit? page), in whole blocks")
m[1].metric("Devices", f"{d.tp * d.pp}", f"TP {d.tp} × PP {d.pp}", **PLAIN_DELTA)
m[2].metric("Token budget per step", f"{d.max_num_batched_tokens:,}", "max_num_batched_tokens", **PLAIN_DELTA)
m[3].metric("Context limit", f"{d.max_model_len:,}", "max_model_len", **PLAIN_DELTA)


def _progress_bar(label: str) -> Any:
    bar = st.progress(0.0, text=f"{label}…")

    def say(p: Progress) -> None:
        bar.progress(min(p.finished / max(p.total, 1), 1.0),
                     text=f"{label}: {p.finished:,} of {p.total:,} requests done, {p.clock_s:,.1f} s predicted"
                          f" in {p.wall_s:,.1f} s here")
    return bar, say


def _run(policy_name: str) -> Any:
    if study.cached(inputs, policy_name, "run"):
        return study.run(inputs, policy_name)
    bar, say = _progress_bar(f"Simulating ({policy_name})")
    try:
        return study.run(inputs, policy_name, say)
    finally:
        bar.empty()


# ---------------------------------------------------------------------------------------
# the run
pressed = st.button("Run", key="sv_run", type="primary", icon=":material/play_arrow:")
if pressed:
    session.serving_ran.set(inputs)
if session.serving_ran.get() != inputs:
    st.info("Press **Run** to serve this workload on the deployment (about 10 s per 100 requests here; the same"
            " inputs again are instant).")
    st.stop()
try:
    result = _run(policy)
    summary = study.summary(result, inputs)
except (ValueError, calc.SizingError) as exc:
    st.error(f"Can't run this: {md(exc)}", icon="🚫")
    st.stop()
except Exception as exc:  # noqa: BLE001 - a message, never a traceback
    st.error(f"Unexpected problem running this ({type(exc).__name__}): {md(exc)}", icon="🚫")
    st.stop()

if summary.partial:
    st.warning(f"PARTIAL: the run stopped at its time limit ({inputs.time_limit_s:g} s here) with"
               f" {summary.finished:,} of {summary.num_requests:,} requests finished; every figure below is of what"
               f" it did until then.", icon="⏱️")
st.caption(f"Workload: {md(study.workload(inputs).name)} · policy {md(policy)} · {summary.steps:,} engine steps in"
           f" {result.wall_s:,.1f} s here")
m = st.columns(4)
m[0].metric("Finished", f"{summary.finished:,} / {summary.num_requests:,}", f"in {summary.makespan_s:,.1f} s",
            **PLAIN_DELTA, help="first arrival to last finish, predicted")
m[1].metric("Throughput", f"{summary.output_tokens_per_s:,.0f} tok/s", f"{summary.requests_per_s:,.2f} req/s",
            **PLAIN_DELTA, help="output tokens and finished requests per second of the run")
m[2].metric("Goodput", f"{summary.goodput:,.2f} req/s", f"{summary.slo_attainment:.0%} met both SLOs", **PLAIN_DELTA,
            help="requests per second that met both the TTFT and the TPOT SLO (DistServe)")
m[3].metric("KV use (peak)", f"{summary.max_kv_usage:.1%}",
            f"{summary.preemptions:,} preemptions · prefix hits {summary.prefix_hit_rate:.0%}", **PLAIN_DELTA,
            help="most of the pool's blocks held by requests at once; prompt tokens found in the prefix cache")
left, right = st.columns([2, 3])
with left:
    st.subheader("Latency percentiles", anchor=False)
    st.dataframe(vs.latency_frame(summary), key="sv_latency", hide_index=True,
                 column_config={c: MS for c in ("p50 (ms)", "p90 (ms)", "p99 (ms)", "mean (ms)")})
    st.caption("Predicted. TTFT: from the client's send to the first token; TPOT: per output token after the first;"
               " E2E: send to last token (vLLM's benchmark definitions).")
with right:
    st.plotly_chart(vs.cdf_figure({policy: result}, inputs.slo), key="sv_cdf", config=CHART)
st.plotly_chart(vs.timeline_figure(result), key="sv_timeline", config=CHART)

# ---------------------------------------------------------------------------------------
# the step-through on the live pages
st.subheader("Step through it", anchor=False)
st.caption(f"The first {study.STEP_REQUESTS} requests of this workload on the same deployment become this session's"
           " run: the Paged KV cache, Batch composition and Prefix cache pages draw its block tables, batches and"
           " radix tree step by step, badged as simulated.")
if st.button("Step through it on the KV cache page", key="sv_step_through", icon=":material/grid_view:"):
    try:
        current_run.start_simulated(study.step_through(inputs, policy))
    except (ValueError, calc.SizingError) as exc:
        st.error(f"Can't build the step-through: {md(exc)}", icon="🚫")
    else:
        st.switch_page("app_pages/kv_cache.py")

# ---------------------------------------------------------------------------------------
# policies side by side
st.subheader("Scheduling policies side by side", anchor=False)
if st.button("Run every policy", key="sv_policies", icon=":material/compare_arrows:"):
    session.serving_policies.set(inputs)
compared = {}
if session.serving_policies.get() == inputs:
    try:
        compared = {p: study.summary(_run(p), inputs) for p in policies}
    except (ValueError, calc.SizingError) as exc:
        st.error(f"Can't compare the policies: {md(exc)}", icon="🚫")
else:
    st.caption(f"Runs the same workload once per policy ({', '.join(policies)}), every other knob equal.")
if compared:
    st.dataframe(vs.policy_frame(compared), key="sv_policy_table", hide_index=True,
                 column_config={**{c: MS for c in ("p50 TTFT (ms)", "p90 TTFT (ms)", "p50 TPOT (ms)", "p90 TPOT (ms)")},
                                "output tok/s": st.column_config.NumberColumn(format="%.0f"),
                                "req/s": st.column_config.NumberColumn(format="%.2f"),
                                "goodput req/s": st.column_config.NumberColumn(format="%.2f"),
                                "SLO attained": SHARE, "max KV use": SHARE, "prefix hit rate": SHARE})

# ---------------------------------------------------------------------------------------
# capacity
st.subheader("Capacity", anchor=False)
if inputs.from_file:
    st.caption("The capacity sweep varies the rate of a generated workload: choose generated requests.")
    st.stop()
st.caption(f"The highest request rate whose p90 TTFT and p90 TPOT meet the SLOs: about ten runs of"
           f" {min(inputs.num_requests, study.CAPACITY_REQUESTS)} requests, doubling the rate then bisecting.")
if st.button("Find the capacity", key="sv_capacity", icon=":material/speed:"):
    session.serving_capacity.set((inputs, policy))
if session.serving_capacity.get() == (inputs, policy):
    try:
        bar = st.progress(0.0, text="Sweeping the rate…")
        tried: list[str] = []

        def said(message: str) -> None:
            tried.append(message)
            bar.progress(min(len(tried) / 12, 1.0), text=message)
        cap = study.capacity(inputs, policy, said)
        bar.empty()
    except (ValueError, calc.SizingError) as exc:
        st.error(f"Can't find the capacity: {md(exc)}", icon="🚫")
        st.stop()
    if cap.max_rate > 0:
        st.success(f"Capacity: **{cap.max_rate:,.3g} req/s** meet p90 TTFT ≤ {inputs.slo_ttft_s:g} s and p90 TPOT ≤"
                   f" {inputs.slo_tpot_s:g} s (predicted).", icon="📈")
    else:
        st.error("No rate tried meets the SLOs (down to 0.001 req/s).", icon="🚫")
    st.plotly_chart(vs.capacity_figure(cap), key="sv_capacity_chart", config=CHART)
    with st.expander("Every rate tried"):
        st.dataframe(vs.capacity_frame(cap), key="sv_capacity_table", hide_index=True,
                     column_config={"p90 TTFT (ms)": MS, "p90 TPOT (ms)": MS})
