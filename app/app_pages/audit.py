"""Audit: which known optimisations a deployment applies on its hardware (from its pasted or uploaded
logs and the framework version's defaults), how far it is from the roofline, what to change first;
and this project's engine measured with each optimisation off and on.

Thin script: controls -> app.studies.audit -> visualizers.audit -> st.*. Text from a log reaches
only tables, code blocks and escaped Markdown. Any input, however wrong, ends in a message.
"""
from __future__ import annotations

from typing import Any

import streamlit as st
from streamlit.elements.lib.column_types import ColumnConfig

from app import session
from app.studies import audit as study
from engine import memory as calc
from engine.audit.audit import AuditReport
from engine.audit.evidence import Evidence
from visualizers import audit as va
from visualizers.text import escape_markdown as md  # every non-literal text that reaches Markdown

PRESET_MODELS = calc.model_presets()
PRESET_HARDWARE = [h for h in calc.hardware_presets() if h != "this-machine"]  # this machine: the second tab
PLAIN_DELTA: dict[str, Any] = {"delta_color": "off", "delta_arrow": "off"}
CHART = {"displaylogo": False}


def text(width: int) -> ColumnConfig:
    """A text column ``width`` pixels wide: the tables fit the page at 1440 px (a long cell is cut,
    shown whole on hover), rather than hiding columns until scrolled."""
    return st.column_config.TextColumn(width=width)


FACTOR = st.column_config.NumberColumn(format="×%.2f", help="The predicted factor the ranking uses", width=70)
STATUS = st.column_config.TextColumn(width=120)  # "⛔ unsupported" whole

st.title("🩺 Audit")
st.caption("Why is it slow here? Which known optimisations a deployment applies on its hardware, how far it is from"
           " the roofline, and what to change first. The checklist and the gains are predicted (the calculator, the"
           " serving simulator and a sourced table of optimisations per framework version); only the figures a"
           " benchmark block or you give are measured.")

with st.sidebar:
    st.header("Deployment")
    model = st.selectbox("Model", PRESET_MODELS, index=PRESET_MODELS.index("llama-3.1-8b"), key="au_model")
    hardware = st.selectbox("Hardware", PRESET_HARDWARE, index=PRESET_HARDWARE.index("h100-sxm"), key="au_hw")
    framework_names = study.frameworks()
    framework = st.selectbox("Framework", framework_names, index=framework_names.index("vllm"), key="au_fw")
    version = st.selectbox("Version", study.versions(framework), key=f"au_version_{framework}",
                           help="A version the table does not list answers for the nearest known one, with a warning;"
                                " 'as the log says' takes the log's version (else the newest known)")
    c1, c2 = st.columns(2)
    batch = c1.number_input("Batch", min_value=1, max_value=4096, value=1, step=1, key="au_batch",
                            help="Concurrent sequences the roofline is drawn for")
    context = c2.number_input("Context", min_value=1, max_value=1 << 21, value=4096, step=1024, key="au_ctx",
                              help="Tokens per sequence")
    st.header("Measured (optional)")
    decode = st.number_input("Decode tokens/s per sequence", min_value=0.0, value=None, key="au_decode",
                             help="Measured; else a pasted benchmark block's 1000 / median TPOT")
    ttft = st.number_input("TTFT (s)", min_value=0.0, value=None, format="%.3f", key="au_ttft",
                           help="Measured time to first token; else a pasted benchmark block's median TTFT")
    simulate = st.checkbox("Predict gains with the serving simulator", value=True, key="au_simulate",
                           help="Prefix caching and chunked prefill priced by a simulated run (a few seconds)")

tab_audit, tab_engine = st.tabs(["Audit a deployment", "This engine, measured"])


def show_evidence(ev: Evidence | None, where: str) -> None:
    if ev is None:
        st.info("No log given: every setting below is the version's documented default.", icon="📄")
        return
    if ev.understood_anything:
        st.success(md(ev.summary()), icon="📄")
    else:
        st.warning(md(ev.summary()), icon="📄")
    if where:
        st.caption(md(where))


def show_report(report: AuditReport, ev: Evidence | None) -> None:
    for w in report.warnings:
        st.warning(md(w), icon="⚠️")
    st.markdown(f"**{md(report.model)} on {md(report.hardware)}, {md(report.framework)} {md(report.version)}**"
                + (f" ({md(report.engine)} engine)" if report.engine else ""))
    counts = {s: sum(1 for i in report.checklist if i.status == s) for s in va.STATUS_LABEL}
    m = st.columns(4)
    m[0].metric("On", f"{counts['on']}", f"of {len(report.checklist)} optimisations", **PLAIN_DELTA)
    m[1].metric("Off", f"{counts['off']}", f"{counts['unknown']} unknown", **PLAIN_DELTA)
    m[2].metric("Unsupported here", f"{counts['unsupported']}", f"{counts['not applicable']} not applicable",
                **PLAIN_DELTA)
    rl = report.roofline
    if rl is not None and rl.bandwidth_utilisation is not None:
        m[3].metric("Decode vs the bound, measured", f"{rl.bandwidth_utilisation:.0%}",
                    f"the preset expects {rl.typical_utilisation:.0%}", **PLAIN_DELTA,
                    help="Measured decode tokens/s per sequence over the bandwidth bound (the roofline)")
    elif rl is not None:
        m[3].metric("Decode, predicted", f"{rl.decode_predicted_tokens_per_s:,.3g} tok/s",
                    f"bound {rl.decode_bound_tokens_per_s:,.3g} tok/s", **PLAIN_DELTA)

    st.subheader("Settings", anchor=False)
    st.caption("What the readers took from the log (with its line), what you typed, and the version's defaults for"
               " the rest.")
    st.container(key="au_settings").dataframe(
        va.detected_frame(report.detected), hide_index=True,
        column_config={"setting": text(180), "value": text(170), "source": text(110),
                       "line": st.column_config.NumberColumn(width=50), "from": text(420)})
    if ev is not None and ev.benchmark is not None:
        with st.expander("Benchmark figures read"):
            st.dataframe(va.benchmark_frame(ev), hide_index=True)

    st.subheader("Checklist", anchor=False)
    st.caption(" · ".join(va.STATUS_LABEL.values()) + ". Expected gains are predicted for this model on this"
               " hardware; words without numbers are the table's sourced figures.")
    st.container(key="au_checklist").dataframe(
        va.styled_status(va.checklist_frame(report)), hide_index=True, height=35 * (len(report.checklist) + 1) + 3,
        column_order=["status", "optimisation", "evidence", "expected gain here", "how / why not"],
        column_config={"status": STATUS, "optimisation": text(200), "evidence": text(200),
                       "expected gain here": text(230), "how / why not": text(180)})

    st.subheader("The roofline gap", anchor=False)
    if rl is None:
        st.info("The calculator could not size this deployment, so there is no roofline to draw.", icon="📐")
    else:
        left, right = st.columns([3, 2])
        with left:
            st.plotly_chart(va.roofline_figure(rl), key="au_roofline", config=CHART)
        with right:
            if rl.ttft_measured_s is not None:
                st.metric("Prefill, measured TTFT", f"{rl.ttft_measured_s:,.3g} s",
                          f"compute bound {rl.prefill_bound_s:,.3g} s"
                          + (f" = {rl.compute_utilisation:.1%} utilisation" if rl.compute_utilisation else ""),
                          **PLAIN_DELTA)
            else:
                st.metric("Prefill, compute bound", f"{rl.prefill_bound_s:,.3g} s",
                          f"a {rl.context:,}-token prompt", **PLAIN_DELTA)
            st.markdown("**Where the gap goes**")
            st.markdown("\n".join(f"- {md(w)}" for w in rl.attribution) or "Nothing stands out.")
            st.caption(f"Typical: {md(rl.typical_source)}.")

    st.subheader("What to change first", anchor=False)
    if report.recommendations:
        st.container(key="au_recommendations").dataframe(
            va.recommendations_frame(report), hide_index=True,
            column_config={"rank": st.column_config.NumberColumn(width=50), "change": text(260),
                           "predicted gain": text(400), "factor": FACTOR, "how": text(180)})
    else:
        st.success("Nothing to recommend: every optimisation that applies and is supported here is on.", icon="✅")
    if report.cannot:  # a list, not a table: the reasons are sentences, read whole
        st.container(key="au_cannot").markdown(
            "**Not possible here**\n\n" + "\n".join(f"- **{md(t)}**: {md(w)}" for t, w in report.cannot))

    c1, c2, _ = st.columns([1, 1, 3])
    stem = f"audit-{report.model}-{report.hardware}-{report.framework}-{report.version}"
    c1.download_button("Report (Markdown)", data=va.report_markdown(report, ev), file_name=f"{stem}.md",
                       mime="text/markdown", key="au_export_md", icon=":material/description:")
    c2.download_button("Report (JSON)", data=va.report_as_json(report), file_name=f"{stem}.json",
                       mime="application/json", key="au_export_json", icon=":material/data_object:")


with tab_audit:
    pasted = st.text_area("Paste logs", key="au_log", height=180,
                          placeholder="A vLLM / vllm-ascend / SGLang / llama.cpp startup log, the server command, a"
                                      " `vllm bench serve` result block or a llama-bench table (several at once)")
    uploads = st.file_uploader("…or upload log files", accept_multiple_files=True, key="au_files")
    log = study.combine(pasted, [(u.name, u.getvalue()) for u in uploads or []])
    if st.button("Audit", key="au_run", type="primary", icon=":material/fact_check:"):
        session.audit_on.set(True)
    if not session.audit_on.get():
        st.info("Paste or upload what the deployment printed (or nothing: the version's defaults), pick the"
                " deployment in the sidebar, and press **Audit**.")
    else:
        inputs = study.AuditInputs(model=model, hardware=hardware, framework=framework, version=version,
                                   batch=int(batch), context=int(context), log_text=log.text,
                                   measured_decode_tok_s=decode, measured_ttft_s=ttft, simulate_gains=simulate)
        ev = study.evidence(log.text)
        show_evidence(ev, log.where())
        try:
            with st.spinner("Auditing (the serving simulator prices the gains)…"):
                report = study.audit(inputs)
        except (ValueError, calc.SizingError) as exc:
            st.error(f"Can't audit this: {md(exc)}", icon="🚫")
        except Exception as exc:  # noqa: BLE001 - the page promise: a message, never a traceback
            st.error(f"Unexpected problem with these inputs ({type(exc).__name__}): {md(exc)}", icon="🚫")
        else:
            show_report(report, ev)

with tab_engine:
    st.caption("The audit demonstrated on measurements: this project's engine, on this machine, serves one workload"
               " with its defaults and then with each optimisation flipped alone (a default turned off, an opt-in"
               " turned on). Every figure is measured (wall clock), so it moves with the machine's load.")
    c1, c2 = st.columns(2)
    engine_model = c1.selectbox("Engine model", study.ENGINE_MODELS, key="au_engine_model")
    workload = c2.selectbox("Workload", list(study.WORKLOADS), key="au_engine_workload",
                            format_func=lambda k: {"standard": "standard: 12 requests (about 2 min for SmolLM2)",
                                                   "quick": "quick: 4 short requests"}.get(k, k))
    measured = session.audit_ablations.get()
    if st.button("Measure this engine", key="au_measure", icon=":material/speed:"):
        bar = st.progress(0.0, text="Starting…")
        try:
            result = study.measure(engine_model, workload, lambda share, what: bar.progress(share, text=md(what)))
        except (ValueError, calc.SizingError) as exc:
            st.error(f"Can't measure this: {md(exc)}", icon="🚫")
        except Exception as exc:  # noqa: BLE001 - a message, never a traceback
            st.error(f"Unexpected problem measuring ({type(exc).__name__}): {md(exc)}", icon="🚫")
        else:
            measured = {**measured, (engine_model, workload): result}
            session.audit_ablations.set(measured)
        finally:
            bar.empty()
    abl = measured.get((engine_model, workload))
    if abl is None:
        st.info(f"Press **Measure this engine** to run {len(study.WORKLOADS[workload]().requests)} requests"
                f" {study.RUNS} times (the baseline and one run per optimisation); the result stays"
                " in this session.")
    else:
        st.caption(f"{md(abl.model)}: {md(abl.workload)} · measured in {abl.seconds:,.0f} s · load average"
                   f" {abl.load_average[0]:.1f} → {abl.load_average[1]:.1f}")
        number = st.column_config.NumberColumn
        st.container(key="au_ablation").dataframe(
            va.styled_status(va.ablation_frame(abl)), hide_index=True,
            column_config={"status": STATUS, "makespan (s)": number(format="%.2f"),
                           "speed-up": number(format="×%.2f", help="The baseline's makespan over this run's (> 1: faster)"),
                           "output tok/s": number(format="%.1f"), "TTFT p50 (ms)": number(format="%.0f"),
                           "TPOT p50 (ms)": number(format="%.1f")})
        st.plotly_chart(va.ablation_figure(abl), key="au_ablation_chart", config=CHART)
        if abl.decode_measured_tokens_per_s is not None and abl.decode_bound_tokens_per_s:
            st.caption(f"Roofline: the baseline decodes {abl.decode_measured_tokens_per_s:,.1f} tokens/s per sequence"
                       f" at its batch, {abl.decode_measured_tokens_per_s / abl.decode_bound_tokens_per_s:.0%} of"
                       f" this machine's batch-1 bandwidth bound ({abl.decode_bound_tokens_per_s:,.1f}).")
        elif abl.decode_bound_tokens_per_s is None:
            st.caption(f"No roofline for {md(abl.model)}: the calculator does not know this model.")
