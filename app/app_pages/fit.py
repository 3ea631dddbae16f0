"""Will it fit? — the hardware-fit calculator page.

Thin script: controls -> engine.memory -> visualizers.memory -> st.*. Every control is bound
to the URL (bind="query-params"), so a sizing answer is a shareable link. Any input, however
wrong, ends in a message (st.error), never a traceback.
"""
from __future__ import annotations

from typing import Any

import streamlit as st

from app import link_settings
from app.studies import sizing
from app.studies.sizing import CUSTOM, CustomDevice
from engine import memory as calc
from visualizers import memory as vm
from visualizers.text import escape_markdown as md  # every non-literal text that reaches Markdown

PRESET_MODELS = calc.model_presets()
PRESET_HARDWARE = calc.hardware_presets()
FRAMEWORK_OPTIONS = ["auto", "none", "vllm", "sglang", "vllm-ascend", "mindie", "inferscope"]
WEIGHT_OPTIONS = ["auto", *calc.WEIGHT_FORMATS]
KV_OPTIONS = ["auto", *calc.KV_DTYPES]
VISION_OPTIONS = ["auto", "fp32", "bf16", "fp16", "fp8", "w8a8"]
PLAIN_DELTA: dict[str, Any] = {"delta_color": "off", "delta_arrow": "off"}  # a metric's note, not a change
# Short headers (full names in the help) and widths in px: the comparison's columns fit a
# 1440 px window unscrolled ("devices needed" is said by "fits?": "no — needs N").
_number = st.column_config.NumberColumn
_text = st.column_config.TextColumn
COMPARE_COLUMNS = {
    "hardware": _text("hardware", width=190),
    "fits?": _text("fits?", width=105),
    "devices needed": None,
    "tp x pp": _text("tp×pp", help="tensor x pipeline parallel degree", width=62),
    "memory GiB": _number("GiB", help="memory per device, GiB", width=62),
    "needed GiB/device": _number("needed", help="needed GiB per device", width=70),
    "usable GiB": _number("usable", help="usable GiB per device", width=70),
    "decode tok/s (expected)": _number("tok/s", help="decode tokens/s, expected (with efficiency)", width=70),
    "decode tok/s (roofline)": _number("roofline", help="decode tokens/s at the roofline", width=76),
    "TTFT s": _number("TTFT s", help="time to first token, seconds", width=66),
    "framework": _text("framework", width=100),
    "note": _text("note", width=90),
}
FORMAT_COLUMNS = {
    "format": _text("format", width=190),
    "weights GiB": _number("weights", help="weights, GiB", width=80),
    "needed GiB/device": _number("needed", help="needed GiB per device", width=80),
    "fits?": _text("fits?", width=60),
    "decode tok/s (roofline)": _number("roofline", help="decode tokens/s at the roofline", width=80),
    "decode tok/s (expected)": _number("tok/s", help="decode tokens/s, expected (with efficiency)", width=70),
    "KV room tokens": _number("KV room", help="tokens of KV cache that fit beside the weights", width=90),
    "support": _text("support", width=300),
}
BOUND_KEYS = ("model", "hw", "c_mem", "c_bw", "c_tf", "c_int8", "c_bf16", "c_fw", "batch", "ctx", "out", "img",
              "tiles", "w", "kv", "vis", "fw", "fwv", "tp", "pp", "util", "block", "eta_m", "eta_c")


def _format_label(key: str) -> str:
    return "auto (checkpoint / hardware)" if key == "auto" else calc.WEIGHT_FORMATS[key].label


def _kv_label(key: str) -> str:
    return "auto (model dtype)" if key == "auto" else calc.KV_DTYPES[key].label


def _framework_label(key: str) -> str:
    return "auto (by hardware)" if key == "auto" else calc.FRAMEWORK_LABELS[key]


st.title("📐 Will it fit?")
st.caption("Does model X fit on device Y, and how fast will it run? Every control below is kept in the URL:"
           " copy the address bar to share this exact answer.")

# ---------------------------------------------------------------------------------------
# controls
url_before = link_settings.snapshot()
with st.sidebar:
    st.header("Model")
    model_key = st.selectbox("Model", [*PRESET_MODELS, CUSTOM], index=PRESET_MODELS.index("internvl2-8b"),
                             key="model", bind="query-params", help="a preset, or 'custom' to paste a config.json")
    if model_key != CUSTOM:
        st.caption(md(sizing.model_label(model_key)))
    config_text = ""
    if model_key == CUSTOM:
        uploaded = st.file_uploader("Upload a config.json", type=["json"], key="cfg_file")
        pasted = st.text_area("…or paste config.json", height=180, key="cfg_text",
                              placeholder='{"model_type": "llama", "hidden_size": 4096, ...}')
        if uploaded is not None:
            config_text = uploaded.getvalue().decode("utf-8", errors="replace")
        else:
            config_text = pasted or ""

    st.header("Hardware")
    hw_key = st.selectbox("Device", [*PRESET_HARDWARE, CUSTOM], index=PRESET_HARDWARE.index("atlas-300v-pro"),
                          key="hw", bind="query-params", help="a preset, or 'custom' to type in your own")
    if hw_key != CUSTOM:
        st.caption(md(sizing.hardware_label(hw_key)))
    custom_hw: CustomDevice | None = None
    if hw_key == CUSTOM:
        c1, c2 = st.columns(2)
        c_mem = c1.number_input("Memory per device (GiB)", min_value=0.5, max_value=4096.0, value=24.0,
                                step=1.0, key="c_mem", bind="query-params")
        c_bw = c2.number_input("Bandwidth (GB/s)", min_value=1.0, max_value=100000.0, value=300.0, step=10.0,
                               key="c_bw", bind="query-params")
        c_tf = c1.number_input("FP16 TFLOPS (dense)", min_value=0.01, max_value=100000.0, value=100.0, step=1.0,
                               key="c_tf", bind="query-params")
        c_int8 = c2.number_input("INT8 TOPS (0 = none)", min_value=0.0, max_value=200000.0, value=0.0, step=1.0,
                                 key="c_int8", bind="query-params")
        c_bf16 = st.toggle("BF16 supported", value=True, key="c_bf16", bind="query-params")
        c_fw = st.selectbox("Usual framework", ["vllm", "sglang", "none"], key="c_fw", bind="query-params")
        custom_hw = CustomDevice(float(c_mem), float(c_bw), float(c_tf), int8_tops=float(c_int8) or None,
                                 bf16=bool(c_bf16), framework=c_fw)

    st.header("Workload")
    c1, c2 = st.columns(2)
    batch = c1.number_input("Concurrent sequences", min_value=1, max_value=calc.MAX_BATCH, value=1, step=1,
                            key="batch", bind="query-params")
    context = c2.number_input("Context (tokens/sequence)", min_value=2, max_value=calc.MAX_CONTEXT, value=4096,
                              step=1024, key="ctx", bind="query-params",
                              help="prompt text + image tokens + output")
    output = c1.number_input("Output tokens", min_value=1, max_value=calc.MAX_CONTEXT, value=512, step=128,
                             key="out", bind="query-params")
    images = c2.number_input("Images per sequence", min_value=0, max_value=64, value=None, step=1,
                             key="img", bind="query-params", placeholder="auto",
                             help="vision-language models; auto = 1 image if it fits")
    tiles = c1.number_input("Tiles per image", min_value=1, max_value=40, value=None, step=1, key="tiles",
                            bind="query-params", placeholder="auto", help="InternVL: 256 tokens per tile")

    st.header("Precision")
    weights = st.selectbox("Weights", WEIGHT_OPTIONS, key="w", bind="query-params",
                           help="; ".join(f"{k}: {_format_label(k)}" for k in WEIGHT_OPTIONS))
    kv = st.selectbox("KV cache", KV_OPTIONS, key="kv", bind="query-params",
                      help="; ".join(f"{k}: {_kv_label(k)}" for k in KV_OPTIONS))
    vision = st.selectbox("Vision tower", VISION_OPTIONS, key="vis", bind="query-params",
                          help="precision of the vision tower and projector (VLMs); auto = 16-bit")

    st.header("Serving")
    framework = st.selectbox("Framework (budget rule)", FRAMEWORK_OPTIONS, key="fw", bind="query-params",
                             help="; ".join(f"{k}: {_framework_label(k)}" for k in FRAMEWORK_OPTIONS))
    framework_version = st.text_input("Framework version", key="fwv", bind="query-params", placeholder="latest",
                                      help="vLLM or SGLang version whose budget rule applies, e.g. 0.7 (vLLM V0),"
                                           " 0.10.1 (vLLM V1), 0.4.3 (SGLang); empty: vLLM >= 0.21, SGLang 0.4")
    c1, c2 = st.columns(2)
    tp = c1.number_input("Tensor parallel", min_value=1, max_value=64, value=None, step=1, key="tp",
                         bind="query-params", placeholder="auto")
    pp = c2.number_input("Pipeline parallel", min_value=1, max_value=64, value=1, step=1, key="pp",
                         bind="query-params")
    util = c1.number_input("Memory fraction", min_value=0.05, max_value=1.0, value=None, step=0.01, key="util",
                           bind="query-params", placeholder="default",
                           help="vLLM gpu_memory_utilization (0.90) / SGLang mem_fraction_static")
    block = c2.number_input("KV block size", min_value=1, max_value=1024, value=None, step=1, key="block",
                            bind="query-params", placeholder="default")
    eta_m = c1.number_input("Bandwidth efficiency", min_value=0.05, max_value=1.0, value=None, step=0.05,
                            key="eta_m", bind="query-params", placeholder="device default")
    eta_c = c2.number_input("Compute efficiency", min_value=0.05, max_value=1.0, value=None, step=0.05,
                            key="eta_c", bind="query-params", placeholder="device default")

link_settings.warn_ignored(url_before, BOUND_KEYS)  # what Streamlit dropped from the link, named

# ---------------------------------------------------------------------------------------
# the answer
workload = calc.Workload(batch=int(batch), context=int(context), output=int(output),
                         images=None if images is None else int(images), tiles=None if tiles is None else int(tiles))
settings = calc.Settings(weights=weights, kv_dtype=kv, vision_dtype=vision, tp=None if tp is None else int(tp),
                         pp=int(pp), framework=framework, framework_version=framework_version or None,
                         gpu_memory_utilization=util,
                         block_size=None if block is None else int(block), eta_memory=eta_m, eta_compute=eta_c)

try:
    if model_key == CUSTOM:
        if not config_text.strip():
            st.info("Paste or upload a Hugging Face config.json in the sidebar (composite ones with"
                    " vision_config + llm_config/text_config work too).")
            st.stop()
    model = sizing.model(model_key, config_text)
    if custom_hw is not None:
        hardware = custom_hw.hardware()
    else:
        with st.spinner("Measuring this machine…") if hw_key == "this-machine" else st.empty():
            hardware = calc.get_hardware(hw_key)
    est = calc.estimate(model, hardware, workload, settings)
except calc.SizingError as exc:
    st.error(f"Can't size this: {md(exc)}", icon="🚫")
    st.stop()
except Exception as exc:  # noqa: BLE001 - the page promise: a message, never a traceback
    st.error(f"Unexpected problem with these inputs ({type(exc).__name__}): {md(exc)}", icon="🚫")
    st.stop()

def _here(est: calc.Estimate) -> str:
    """The devices asked for, in words: "2 × H100 SXM 80GB" (escaped)."""
    return f"{est.devices} × {md(est.hardware_name)}"


def _headline(est: calc.Estimate) -> str:
    """The verdict line. Fits: green "Fits". Otherwise "Does not fit on N × device" first, then
    what would (amber "— needs K" when more devices fit, red when none up to 64 do) and how far over."""
    if est.fits:
        return f"## :green[Fits] — {md(est.model_name)} on {_here(est)}"
    colour, needs = ("orange", f" — needs {est.devices_needed}") if est.devices_needed else ("red", "")
    return (f"## :{colour}[Does not fit on {_here(est)}{needs}] — {md(est.model_name)},"
            f" {md(est.margin)} per {md(est.device_unit)}")


def _speed_metrics(est: calc.Estimate) -> None:
    """Speed on the devices asked for where it fits there; otherwise "does not fit" in their place
    and, beside them, the speed on the fewest devices that fit, labelled so."""
    asked = f"on {est.devices} (asked)" if not est.fits else f"on {est.devices}"
    there = est.at_devices_needed
    cols = st.columns(4 if there else 2)
    if est.fits:
        cols[0].metric(f"Decode {asked}", f"{est.decode_tokens_per_s:,.1f} tok/s",
                       f"≤ {est.decode_tokens_per_s_roofline:,.1f} roofline, {est.bound}-bound", **PLAIN_DELTA,
                       help=f"Expected {est.decode_basis}; the roofline is the upper bound.")
        cols[1].metric(f"Time to first token {asked}", f"{est.prefill_seconds:,.2f} s",
                       f"≥ {est.prefill_seconds_roofline:,.2f} s roofline", **PLAIN_DELTA)
        return
    for col, what in zip(cols, ("Decode", "Time to first token")):
        col.metric(f"{what} {asked}", "does not fit", "no speed: it cannot run there", **PLAIN_DELTA)
    if there:
        fewest = f"on {there.devices}, fewest that fit"
        cols[2].metric(f"Decode {fewest}", f"{there.decode_tokens_per_s:,.1f} tok/s",
                       f"≤ {there.decode_tokens_per_s_roofline:,.1f} roofline (tp {there.tp}, pp {there.pp})",
                       **PLAIN_DELTA)
        cols[3].metric(f"Time to first token {fewest}", f"{there.prefill_seconds:,.2f} s",
                       f"≥ {there.prefill_seconds_roofline:,.2f} s roofline", **PLAIN_DELTA)


def render(est: calc.Estimate, hardware: calc.Hardware) -> None:
    """Everything below the controls; pure display of one estimate."""
    # verdict first, in words and colour: anything but "fits" starts with "Does not fit"
    st.markdown(_headline(est))
    box = {"fits": st.success, "needs_more_devices": st.warning, "does_not_fit": st.error}[est.verdict_key]
    box(f"**{md(est.verdict[0].upper() + est.verdict[1:])}** with {md(calc.FRAMEWORK_LABELS[est.framework])}: "
        f"{md(est.reason)}.",
        icon={"fits": "✅", "needs_more_devices": "⛔", "does_not_fit": "⛔"}[est.verdict_key])

    if est.server:
        st.info(md(est.server), icon="🗄️")
    for v in est.variants:  # the same product with other memory: its verdict where it differs
        st.warning(f"**{md(v.hardware_name)}** ({v.device_memory_bytes / calc.GiB:.0f} GiB): {md(v.verdict)}"
                   + (f" (fewest that fit: {v.devices_needed})" if v.devices_needed and not v.fits else ""), icon="🔀")

    m = st.columns(3)
    m[0].metric("Weights", f"{est.weight_bytes / calc.GiB:.2f} GiB", f"{est.weights_format.upper()}", delta_color="off")
    m[1].metric("KV per token", f"{est.kv_bytes_per_token / 1024:,.1f} KiB", f"{est.kv_dtype.upper()}", delta_color="off")
    m[2].metric(f"Needed per {md(est.device_unit)}", f"{est.total_bytes_per_device / calc.GiB:.2f} GiB",
                f"of {est.usable_bytes_per_device / calc.GiB:.2f} GiB usable" if est.fits
                else md(est.margin), **PLAIN_DELTA)
    _speed_metrics(est)
    there = est.at_devices_needed  # when it only fits on more devices, the command is for there

    st.plotly_chart(vm.memory_bar(est), key="memory_bar", width="stretch", config={"displaylogo": False})

    room = (f"KV room: **{est.kv_pool_bytes / calc.GiB:.2f} GiB ≈ {est.kv_room_tokens:,} {md(est.kv_room_unit)}**"
            + (f" ({md(est.kv_room_meaning)})" if est.kv_window else "") + " · "
            if est.kv_bytes_per_token else "Constant recurrent state (no per-token KV) · ")
    st.markdown(room + f"longest context at {est.batch} sequence(s): **{est.max_context:,}** · most sequences at"
                f" {est.context:,} tokens: **{est.max_batch:,}** · fewest {md(est.device_unit)}s that fit:"
                f" **{est.devices_needed if est.devices_needed else 'none ≤ 64'}**")

    if est.suggestions:
        st.subheader("What would make it fit")
        st.markdown("\n".join(f"- {md(s)}" for s in est.suggestions))
    for w in est.warnings:
        st.warning(md(w), icon="⚠️")
    for n in est.notes:
        st.caption(f"ℹ️ {md(n)}")

    st.subheader("Serve it")
    where = f" on {there.devices} {md(est.device_unit)}s (tp {there.tp}, pp {there.pp}), where it fits" if there else ""
    st.caption(f"With {md(est.serve_heading)}{where}:")
    st.code(there.serve_command if there else est.serve_command, language="bash")
    if est.serve_note:
        st.caption(f"ℹ️ {md(est.serve_note)}")

    tab_cmp, tab_fmt, tab_roof, tab_ctx = st.tabs(["Every device", "Other formats", "Roofline", "Context vs sequences"])
    with tab_cmp:
        try:
            rows = sizing.compare(model_key, config_text, workload, settings)
            st.dataframe(vm.compare_table(rows), key="compare_table", hide_index=True, width="stretch",
                         column_config=COMPARE_COLUMNS)
            st.caption("Same model and settings on every preset (framework chosen per device unless you picked one)."
                       " Where it does not fit on the devices asked for (\"no — needs N\"), memory and speed are"
                       " for the fewest that fit (the tp x pp column).")
        except calc.SizingError as exc:
            st.error(f"Comparison unavailable: {md(exc)}")
    with tab_fmt:
        st.dataframe(vm.alternatives_table(est), key="formats_table", hide_index=True, width="stretch",
                     column_config=FORMAT_COLUMNS)
    with tab_roof:
        st.plotly_chart(vm.roofline_figure(est), key="roofline", width="stretch", config={"displaylogo": False})
        st.caption(md(est.formulas.get("ridge", "")))
    with tab_ctx:
        try:
            curve = sizing.curve(model_key, config_text, hw_key, custom_hw, workload, settings)
            st.plotly_chart(vm.concurrency_figure(curve, est.context, est.batch), key="curve", width="stretch",
                            config={"displaylogo": False})
        except calc.SizingError as exc:
            st.error(f"Curve unavailable: {md(exc)}")

    with st.expander(f"{md(hardware.name)}: figures, sources and confidence"):
        rows = vm.hardware_sources_table(hardware)
        if len(rows):
            st.dataframe(rows, key="hw_sources", hide_index=True, width="stretch")
        for note in hardware.notes:
            st.caption(md(note))

    with st.expander("Formulas, with the numbers filled in"):
        st.code(vm.formula_text(est), language=None)
        st.dataframe(vm.memory_table(est), key="memory_table", hide_index=True)


try:
    render(est, hardware)
except Exception as exc:  # noqa: BLE001 - a message, never a traceback
    st.error(f"Could not draw this answer ({type(exc).__name__}): {md(exc)}", icon="🚫")
