"""Quantization: what each scheme does to the model's own weights, why activations are the hard
part (measured on this run's tokens), what each scheme costs and buys on this machine, and what
a quantized KV cache holds. Thin: engine records -> visualizers -> st.*."""
from __future__ import annotations

import streamlit as st

from app import live
from app.studies import activations, quant
from engine.model.activations import DEFAULT_THRESHOLD, LINEARS
from engine.studies.quant_inspect import MATRICES
from engine.replay.run import RunView
from visualizers import quant_activations as qa
from visualizers import quant_tradeoff as qt
from visualizers import quant_weights as qw
from visualizers.text import escape_markdown

INTRO = ("Quantization stores weights (and optionally activations and the KV cache) in fewer bits: int8 per output "
         "channel, int4 in groups of 32 or 64 input weights, fp8 (e4m3) per channel, or w8a8 — int8 weights times "
         "per-token int8 activations, with LLM.int8()'s outlier columns kept in floating point. Every figure here "
         "comes from the bundled model's own tensors and from this run's own tokens.")
BF16_NOTE = ("Quantized modes compute in **bfloat16**: torch's CPU int8/int4 kernels (`_weight_int8pack_mm`, "
             "`_weight_int4pack_mm_for_cpu`) have SIMD paths only for bf16 activations (with fp32 they fall back to "
             "scalar loops). RMSNorm weights stay 16-bit; the tied embedding / LM head is int8 per row (fp8 in fp8 "
             "mode). Pick the live run's scheme under Precision in the sidebar.")
TABS = ("Weights", "Activations", "SmoothQuant", "Trade-offs", "KV cache")
SCHEMES = {"int8": ("int8", 32), "int4 g32": ("int4", 32), "int4 g64": ("int4", 64), "fp8": ("fp8", 32)}
SMOOTHING_STRENGTHS = (0.5, 0.8)
SMOOTHING_NOTE = ("SmoothQuant (w8a8 with quantization_smoothing_strength = α) divides each input channel of the "
                  "activations by s = max|X|^α / max|W|^(1−α) and multiplies the weight's column by the same s, "
                  "folded into the RMSNorm (qkv, gate/up) or up_proj (down) so nothing runs at runtime. Calibrated "
                  "on the shipped prompts (presets/calibration.json) with the fp32 model. At α = 0.5 the two \"after\" "
                  "curves are the same numbers.")
Q4_NOTE = ("SmolLM2's bundled weights come from a Q4_1 GGUF (blocks of 32 with a scale and a minimum), so int4 with "
           "groups of 32 lands almost back on that grid: its error is lower than int8's. Groups of 64 show what int4 "
           "costs a model that was never 4-bit.")
TRADEOFF_FORMATS = {c: st.column_config.NumberColumn(format=f) for c, f in (
    ("weight MB", "%.1f"), ("batch-1 tok/s", "%.1f"), ("bound tok/s", "%.0f"), ("share of bound", "%.2f"),
    ("calculator tok/s", "%.1f"), ("ppl", "%.2f"), ("ppl vs fp32", "%.3f"), ("load s", "%.1f"))}
KV_FORMATS = {c: st.column_config.NumberColumn(format=f) for c, f in (
    ("capacity vs fp32", "%.2f"), ("K error %", "%.2f"), ("V error %", "%.2f"), ("K max abs error", "%.3f"),
    ("V max abs error", "%.3f"), ("max logit diff", "%.3f"))}


def render(view: RunView, style: live.Style) -> None:
    if style.explain:
        st.caption(BF16_NOTE)
    draws = (weights_tab, activations_tab, smoothing_tab, tradeoffs_tab, kv_tab)
    live.tabbed_views("quant_tab", dict(zip(TABS, draws)), view, style)


def weights_tab(view: RunView, style: live.Style) -> None:
    model = view.meta.model
    with st.container(horizontal=True, vertical_alignment="bottom"):
        label = st.segmented_control("Scheme", list(SCHEMES), key="quant_scheme", default="int4 g32",
                                     required=True)
        layer = st.number_input("Layer", min_value=0, max_value=num_layers(view) - 1, value=0, step=1,
                                key="quant_layer", width=110)
        matrix = st.selectbox("Matrix", MATRICES, key="quant_matrix", width=180)
    scheme, group_size = SCHEMES[label or "int4 g32"]
    with st.spinner(f"Quantizing layer {layer} {matrix} with {label}…"):
        ins = quant.weight_inspection(model, scheme, group_size, int(layer), matrix)
    live.chart(qw.histogram_figure(ins, style.font_size), "quant_histogram", style, zoom=True)
    left, right = st.columns(2)
    with left:
        live.chart(qw.scales_figure(ins, style.font_size), "quant_scales", style)
    with right:
        with st.spinner(f"Quantizing every matrix with {label}…"):
            grid = quant.error_grid(model, scheme, group_size)
        live.chart(qw.error_heatmap(grid, style.font_size), "quant_errors", style)
    if style.explain:
        live.table(qw.inspection_frame(ins), "quant_inspection")
        if model == "smollm2-135m":
            st.caption(Q4_NOTE)


def num_layers(view: RunView) -> int:
    return quant.num_layers(view.meta.model)


def activations_tab(view: RunView, style: live.Style) -> None:
    if view.is_replay:
        st.info("Activation statistics need the live engine (they run this run's tokens through its model); "
                "recordings do not hold them.", icon=":material/info:")
        return
    quant = view.meta.config.quant_config
    with st.container(horizontal=True, vertical_alignment="bottom"):
        linear = st.segmented_control("Linear input", LINEARS, key="quant_linear", default="qkv", required=True)
        threshold = st.number_input("Outlier threshold", min_value=0.5, max_value=100.0, step=0.5,
                                    value=quant.outlier_threshold if quant else DEFAULT_THRESHOLD,
                                    key="quant_threshold", width=150,
                                    help="LLM.int8(): input columns holding any |x| above it stay in float (6.0).")
        hist_layer = st.selectbox("Histogram layer", ["loudest", *range(num_layers(view))], key="quant_hist_layer",
                                  width=150, help="The layer whose input values the histogram shows; \"loudest\" "
                                                  "= the one holding the largest |x|.")
    try:
        with st.spinner("Attaching the activation recorder (one pass over the tokens computed so far)…"):
            stats = activations.run_activation_stats(linear or "qkv", float(threshold),
                                               None if hist_layer == "loudest" else int(hist_layer))
    except ValueError as e:  # a parallel run: its layers live in worker processes
        st.info(escape_markdown(str(e)), icon=":material/info:")
        return
    if stats is None:
        st.info("Step the run: the activations appear from its first step.", icon=":material/info:")
    else:
        if style.explain:
            st.caption(f"Every linear input the run's engine computed: {stats.num_tokens:,} tokens up to step "
                       f"{view.step} (prompts and generated tokens), on its own model ({quant_label(view)}).")
        live.chart(qa.absmax_heatmap(stats, stats.histogram.linear, style.font_size, view.step),
                   "activation_absmax", style, zoom=True)
        left, right = st.columns(2)
        with left:
            live.chart(qa.activation_histogram(stats.histogram, stats.threshold, style.font_size, view.step),
                       "activation_histogram", style)
        with right:
            live.chart(qa.float_columns_figure(stats, style.font_size, view.step), "activation_float_columns", style)


def smoothing_tab(view: RunView, style: live.Style) -> None:
    if style.explain:
        st.caption(SMOOTHING_NOTE)
    with st.container(horizontal=True, vertical_alignment="bottom"):
        strength = st.segmented_control("α (smoothing strength)", SMOOTHING_STRENGTHS, key="quant_alpha",
                                        default=0.5, required=True)
        with st.spinner("Calibrating SmoothQuant on the shipped prompts…"):
            record = quant.smoothing(view.meta.model, float(strength or 0.5))
        layer = st.number_input("Layer", min_value=0, max_value=num_layers(view) - 1, step=1, width=110,
                                value=qa.widest_layer(record, "qkv"), key="quant_smooth_layer",
                                help="Opens on the layer whose qkv input channels differ most (max / median).")
        linear = st.selectbox("Linear", ("qkv", "gate_up", "down"), key="quant_smooth_linear", width=150)
    live.chart(qa.smoothing_figure(record, int(layer), linear, style.font_size), "smoothing", style)
    if style.explain:
        with st.expander("Every smoothed linear"):
            live.table(qa.smoothing_frame(record), "smoothing_table")


def tradeoffs_tab(view: RunView, style: live.Style) -> None:
    model = view.meta.model
    result = quant.tradeoff_result(model)
    if style.explain:
        st.caption("Every scheme measured on this machine, in this process: weight bytes read per decode step, "
                   "batch-1 decode speed against its bandwidth bound, perplexity on a shipped public-domain text, "
                   "greedy agreement with fp32, and the calculator's prediction for the same format.")
    if st.button("Measure on this machine" if result is None else "Measure again", key="measure_tradeoffs",
                 icon=":material/speed:"):
        bar = st.progress(0.0, text="Measuring…")

        def progress(text: str, frac: float) -> None:
            bar.progress(min(max(frac, 0.0), 1.0), text=text)

        quant.measure_tradeoffs(model, progress)
        bar.empty()
        result = quant.tradeoff_result(model)
    if result is None:
        st.info(f"Not measured yet in this process for {model}: press the button (about a minute for smollm2-135m "
                "the first time, while each scheme is quantized and cached).", icon=":material/info:")
        return
    live.table(qt.tradeoff_frame(result), "tradeoffs", column_config=TRADEOFF_FORMATS)
    live.chart(qt.tradeoff_figure(result, style.font_size), "tradeoffs", style)
    if style.explain:
        st.caption(" · ".join((*result.notes, Q4_NOTE if model == "smollm2-135m" else "")))


def kv_tab(view: RunView, style: live.Style) -> None:
    with st.spinner("Measuring the KV-cache dtypes on a real prompt…"):
        rows = quant.kv_tradeoff(view.meta.model)
    live.table(qt.kv_frame(rows), "kv_tradeoff", column_config=KV_FORMATS)
    live.chart(qt.kv_figure(rows, style.font_size), "kv_tradeoff", style)


def quant_label(view: RunView) -> str:
    return view.meta.precision or "fp32"


live.page("Quantization", render, INTRO)
