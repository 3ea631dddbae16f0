"""Pipeline (and tensor) parallelism: what every worker process of the run did in a step, the
bubble measured against GPipe's formula, a measured sweep over micro-batches, and the
calculator's view of the same layout. Thin: controls -> knobs (app/knobs.py), RunView
(StepTrace.pipeline, Snapshot.parallel) -> visualizers/pipeline.py -> st.*."""
from __future__ import annotations

import streamlit as st

from app import current_run, knobs, live, models, session
from app.session import K
from app.studies import pipeline as pipeline_study
from app.studies import sizing
from engine.parallel.stats import merge_timelines, pipeline_stats
from engine.replay.run import RunView
from visualizers import pipeline as pv
from visualizers.events import step_events
from visualizers.steps import step_number
from visualizers.text import escape_markdown

INTRO = ("The model's layers are cut into p pipeline stages, each stage's heads and MLP columns into t tensor-parallel "
         "shards, and every piece runs in its own worker process (rank = stage × t + tp rank). GPipe cuts each "
         "step's batch into m micro-batches that flow stage to stage; the batch queue keeps whole batches in "
         "flight instead. Every box below is a forward a worker really ran, timed on the clock all processes "
         "share; grey is idle. GPipe's bubble for m equal micro-batches without communication is "
         "(p − 1)/(m + p − 1).")
OFF = ("This run is a single process (p = t = 1): there is no pipeline to draw. Set the stages above, or switch to "
       "the **pipeline** scenario (eight equal requests, p = 2, GPipe with m = 4).")
TABS = ("Schedule", "Bubble sweep", "Calculator")
MAX_SHOWN = 16  # steps drawn on one axis at most
SCHEDULES = {"gpipe": "GPipe (micro-batches)", "batch_queue": "batch queue (whole batches)"}
SPLIT_LABELS = {"even": "even", "front-heavy": "front-heavy (2:1)", "custom": "custom"}
DEFAULT_HARDWARE = "l4"
SHARES = {c: st.column_config.NumberColumn(format="percent") for c in ("compute", "comm", "bubble", "theory bubble")}
SHARES.update({c: st.column_config.NumberColumn(format="%.2f") for c in ("span ms", "window ms")})


def knob(name: str) -> str:
    return session.knob(name).key


def controls() -> None:
    """p, t, schedule, m and the layer split; each change rebuilds the run (new workers)."""
    disabled = current_run.controls_locked()
    with st.container(horizontal=True, vertical_alignment="bottom"):
        st.number_input("Pipeline stages p", min_value=1, max_value=4, step=1, key=knob("pipeline_parallel_size"),
                        persist_state="session", disabled=disabled, width=140,
                        help="pipeline_parallel_size: contiguous layer ranges, one worker group each "
                             "(tiny-random has 2 layers, SmolLM2 30).")
        st.number_input("Tensor ranks t", min_value=1, max_value=2, step=1, key=knob("tensor_parallel_size"),
                        persist_state="session", disabled=disabled, width=130,
                        help="tensor_parallel_size: each stage's heads and MLP columns split over t ranks, two "
                             "all-reduces per layer. SmolLM2's 9 heads / 3 KV heads split 6/3 and 2/1 with t = 2.")
        st.segmented_control("Schedule", tuple(SCHEDULES), key=knob("pipeline_schedule"), required=True,
                             format_func=lambda s: SCHEDULES.get(s, str(s)), persist_state="session",
                             disabled=disabled)
        st.number_input("Micro-batches m", min_value=1, max_value=8, step=1, key=knob("num_microbatches"),
                        persist_state="session", width=140,
                        disabled=disabled or session.knob("pipeline_schedule").get() == "batch_queue",
                        help="num_microbatches (GPipe only; fewer when the batch has fewer requests).")
    with st.container(horizontal=True, vertical_alignment="bottom"):
        st.segmented_control("Layer split", knobs.SPLIT_MODES, key=K.split_mode, required=True,
                             format_func=lambda s: SPLIT_LABELS.get(s, str(s)), persist_state="session",
                             disabled=disabled, help="pipeline_layer_split: layers per stage.")
        st.text_input("Layers per stage", key=K.split_text, placeholder="e.g. 20, 10", persist_state="session",
                      disabled=disabled or session.split_mode.get() != "custom", width=180)
    if not disabled:
        st.caption("Changing any of these restarts the run: the old workers are stopped and new ones start "
                   "(SmolLM2: about 10 s).")


def render(view: RunView, style: live.Style) -> None:
    if current_run.worker_failed() and not view.is_replay:
        st.button("Restart workers", key="restart_workers", on_click=current_run.restart_workers, type="primary",
                  icon=":material/restart_alt:")
    if view.snapshot.parallel is None:
        st.info(OFF, icon=":material/info:")
        if not view.is_replay:
            st.button("Switch to the pipeline scenario", key="switch_pipeline", on_click=pipeline_study.switch_to_pipeline,
                      icon=":material/swap_horiz:")
        return
    live.tabbed_views("pipeline_tab", dict(zip(TABS, (schedule_tab, sweep_tab, calculator_tab))), view, style)


def schedule_tab(view: RunView, style: live.Style) -> None:
    timed = pv.timed_steps(view.traces)
    if not timed:
        st.info("Step the run: each step's timeline appears here.", icon=":material/info:")
        return
    steps = [step_number(t) for t, _ in reversed(timed)]
    latest = timed[-1][1]
    queue = latest.schedule == "batch_queue"
    left, right = st.columns(2)
    chosen = left.selectbox("Step", steps, format_func=lambda s: f"step {s}" + (" (latest)" if s == steps[0] else ""),
                            width=200)
    shown = right.number_input("Steps shown", 1, MAX_SHOWN, 2 * latest.pipeline_parallel_size if queue else 1,
                               key="pipeline_shown", width=200,
                               help="Several steps on one axis: with the batch queue a batch is still in the "
                                    "later stages while the next ones start, so one step alone looks half empty.")
    end = next(i for i, (t, _) in enumerate(timed) if step_number(t) == chosen) + 1
    trace = timed[end - 1][0]
    timeline = merge_timelines([line for _, line in timed[max(0, end - int(shown)):end]])
    s = pipeline_stats(timeline)
    overall = pipeline_stats(merge_timelines([line for _, line in timed]))
    cols = st.columns(4)
    cols[0].metric("Bubble, measured", f"{s.bubble_fraction:.0%}",
                   help="Share of lanes × window (first forward start to last forward end) no worker computed or "
                        "sent in: idle and waiting for activations.")
    cols[1].metric("GPipe (p − 1)/(m + p − 1)", f"{s.theory_bubble:.0%}",
                   help=f"p = {timeline.pipeline_parallel_size}, m = {s.num_units} units drawn "
                        f"({'batches' if queue else 'micro-batches'}); equal units back to back, no communication"
                        + (": the fill and drain of this window only; in flight, the queue has no drain between "
                           "steps." if queue else "."))
    cols[2].metric("Communication", f"{s.comm_fraction:.0%}", help="Sends and all-reduces, share of lanes × window.")
    cols[3].metric("Bubble, whole run", f"{overall.bubble_fraction:.0%}",
                   help="Every step so far on one axis, from the first forward to the last: the gaps between "
                        "steps (the driver sampling and scheduling while the workers wait) count as bubble too. "
                        "GPipe drains the pipeline every step; the batch queue keeps it full across steps.")
    done = next(i for i, t in enumerate(view.traces) if t is trace) + 1  # steps done when it ran (meta.step)
    live.chart(pv.gantt_figure(timeline, view.snapshot.parallel, style.font_size, done, step_events([trace])),
               "pipeline_gantt", style, zoom=True)
    if style.explain:
        st.caption("Boxes: forwards, coloured by micro-batch (GPipe) or batch (batch queue) · thin hatched bars: "
                   "sends and all-reduces · pale blue: blocked waiting for the previous stage · grey: idle. On this "
                   "2-core CPU the processes share two cores and messages go through local sockets, so "
                   "communication and start-up costs are far larger than on GPUs with NVLink.")
        if queue:
            st.caption("The batch queue keeps up to p batches in flight while steps follow one another (Run N, "
                       "Play, or LLM.generate): stage 0 starts the next batch while stage 1 still runs the last. "
                       "Stepping by hand leaves every worker idle while the page redraws, drawn grey between "
                       "batches.")
    live.table(pv.stats_frame(view.traces), "pipeline_stats", column_config=SHARES)


def sweep_tab(view: RunView, style: live.Style) -> None:
    if view.is_replay:
        st.info("Recordings do not hold the sweep: it starts engines of its own. Measure it on the live engine.",
                icon=":material/info:")
        return
    layout = view.snapshot.parallel
    assert layout is not None
    p, t, model = layout.pipeline_parallel_size, layout.tensor_parallel_size, view.meta.model
    if p < 2:
        st.info("The sweep needs at least two pipeline stages (p ≥ 2).", icon=":material/info:")
        return
    if style.explain:
        st.caption(f"For m = 1, 2, 4, 8: a fresh GPipe engine of {model} with p = {p}, t = {t} runs one prefill step "
                   "of 8 equal prompts (32 tokens each), and the bubble of that step is measured. Each m starts its "
                   "own workers (num_microbatches is fixed at start-up): about 5 s each on tiny-random, 10–20 s "
                   "on SmolLM2.")
    if st.button("Measure sweep", key="measure_sweep", icon=":material/speed:"):
        bar = st.progress(0.0, text="Starting…")

        def progress(msg: str, f: float) -> None:
            bar.progress(min(max(f, 0.0), 1.0), text=msg)

        pipeline_study.measure_sweep(model, p, t, progress)
        bar.empty()
    points = pipeline_study.sweep_points(model, p, t)
    if points:
        live.chart(pv.sweep_figure(points, p, style.font_size), "pipeline_sweep", style)
        live.table(pv.sweep_frame(points), "pipeline_sweep", column_config={
            "measured": st.column_config.NumberColumn(format="percent"),
            "theory": st.column_config.NumberColumn(format="percent")})


def calculator_tab(view: RunView, style: live.Style) -> None:
    from engine.sizing import hardware_presets, model_presets

    layout = view.snapshot.parallel
    assert layout is not None
    model = view.meta.model
    dims = models.model_dims(model)
    presets = hardware_presets()
    hardware = st.selectbox("Hardware preset", presets, key="pipeline_hardware", persist_state="session",
                            index=presets.index(DEFAULT_HARDWARE) if DEFAULT_HARDWARE in presets else 0, width=260)
    est, refusal = (None, f"the calculator has no preset for {model}") if model not in model_presets() \
        else sizing.layout_estimate(model, hardware, layout.pipeline_parallel_size, layout.tensor_parallel_size)
    calc = pv.calculator_view(layout, dims, view.meta.config, est, refusal, view.traces,
                              view.meta.kv_bytes_per_token, style.font_size)
    left, right = st.columns(2)
    with left:
        live.chart(calc.figure, "pipeline_memory", style)
        live.table(calc.workers, "pipeline_workers", column_config={
            c: st.column_config.NumberColumn(format="%.1f") for c in ("weights MiB", "KV pool MiB", "total MiB")})
        st.caption(f"On the wire per token: {calc.comm.pipeline:,.0f} B between stages (hidden × bytes per stage "
                   f"boundary) · {calc.comm.tensor:,.0f} B per rank for the all-reduces (2 per layer, each a ring "
                   "moving 2(t − 1)/t × hidden × bytes).")
    with right:
        t = layout.tensor_parallel_size
        if est is None:
            note = f"The calculator does not take this layout: {refusal}."
            if t > 1 and "divide" in refusal:
                note += (" vLLM refuses it too (tensor_parallel_size must divide the heads); this engine splits the "
                         "heads unevenly instead (see the per-worker memory).")
            st.info(escape_markdown(note), icon=":material/info:")
        else:
            st.markdown(f"**Calculator, {escape_markdown(est.hardware_name)}** (batch {est.batch}, context "
                        f"{est.context:,}, p = {est.pp}, t = {est.tp}):")
            live.table(calc.calculator, "pipeline_calculator",
                       column_config={"value": st.column_config.NumberColumn(format="%.3g")})
        live.table(calc.throughput, "pipeline_throughput",
                   column_config={"ms per step": st.column_config.NumberColumn(format="%.1f"),
                                  "tokens/s": st.column_config.NumberColumn(format="%.0f")})
        if style.explain:
            st.caption("Honest throughput: on this 2-core machine more processes are not faster: the workers share "
                       "two cores and pay for every message, so a step takes longer than in one process. The rows "
                       "labelled model are the calculator's roofline for the hardware preset, and that rate with "
                       "the schedule's theoretical bubble taken out: a model, not a measurement.")


live.page("Pipeline parallelism", render, INTRO, controls=controls)
