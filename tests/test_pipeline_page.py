"""The "Pipeline parallelism" page through Streamlit's AppTest, on real worker processes
(tiny-random, p = 2; its two layers allow no more stages).

A single-process run explains itself and offers the pipeline scenario; stepping draws each
worker's real timeline (Gantt) with the bubble measured against GPipe's formula; changing a
control rebuilds the run and stops the old workers; a worker that dies shows a message and a
"Restart workers" button (never a traceback); a recording replays without any process; the
Quantization page's Activations tab says why a parallel run has no activation statistics.
"""
from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
from streamlit.testing.v1 import AppTest

from app.session import K
from engine.replay.recording import from_json, record, to_json
from engine.replay.run import LiveRun
from tests.test_live_app import badges, chart, charts, click, errors, ok, open_app, run_n

PIPELINE = "app_pages/pipeline.py"
QUANT = "app_pages/quantization.py"

pytestmark = pytest.mark.usefixtures("streamlit_clean")  # tests/conftest.py


def workers(run: LiveRun) -> list:
    return list(run.engine.runner.executor.processes)


def close(at: AppTest) -> None:
    run = at.session_state[K.run] if K.run in at.session_state else None
    if isinstance(run, LiveRun):
        run.close()


@pytest.fixture
def session() -> Iterator[AppTest]:
    """The page on a single-process run, switched to the pipeline scenario with its button."""
    at = open_app(PIPELINE)
    try:
        yield at
    finally:
        close(at)


def switched(at: AppTest) -> AppTest:
    assert any("single process" in i.value for i in at.info) and not errors(at)
    click(at, "switch_pipeline")
    assert not errors(at)
    run = at.session_state[K.run]
    assert run.engine.config.parallel_config.pipeline_parallel_size == 2 and run.engine.config.parallel_config.num_microbatches == 4
    assert all(p.is_alive() for p in workers(run))
    return at


def test_the_page_draws_the_workers_real_timeline_and_replays_it(session: AppTest) -> None:
    at = switched(session)
    assert any("Step the run" in i.value for i in at.info)
    run_n(at, 3)
    fig = chart(at, "chart_pipeline_gantt")
    meta = fig["layout"]["meta"]
    assert meta["step"] == 3 and meta["lanes"][0].startswith("stage 0 · tp 0") and len(meta["lanes"]) == 2
    last = at.session_state[K.run].traces[-1]
    forwards = [e for e in last.pipeline.events if e.kind == "forward"]
    unit_bars = [d for d in fig["data"] if str(d["name"]).startswith("mb ")]
    assert sum(len(d["x"]) for d in unit_bars) == len(forwards) > 0
    assert "Bubble measured" in fig["layout"]["title"]["text"]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Bubble, measured"].endswith("%") and metrics["GPipe (p − 1)/(m + p − 1)"].endswith("%")
    frame = next(d.value for d in at.dataframe if "bubble" in d.value.columns)
    assert list(frame["step"]) == [t.step + 1 for t in at.session_state[K.run].traces] and len(frame) == 3
    assert ((frame["compute"] + frame["comm"] + frame["bubble"]).round(6) == 1).all()

    # the recording round-trips with its timelines and layout, and replays with no process
    recording = record(at.session_state[K.run])
    text = to_json(recording)
    again = from_json(text)
    assert again.traces == recording.traces and again.snapshots[-1].parallel == recording.snapshots[-1].parallel
    replay = open_app(PIPELINE)
    replay.file_uploader(key=K.upload).set_value(("run.json", text.encode(), "application/json"))
    ok(replay.run())
    assert "REPLAY" in badges(replay)[0] and not errors(replay)
    run_n(replay, 3)
    assert chart(replay, "chart_pipeline_gantt")["data"] == fig["data"]
    replay.session_state["pipeline_tab"] = "Bubble sweep"
    ok(replay.run())
    assert any("Recordings do not hold the sweep" in i.value for i in replay.info)


def test_a_control_change_rebuilds_the_run_and_stops_the_old_workers(session: AppTest) -> None:
    at = switched(session)
    old = workers(at.session_state[K.run])
    at.segmented_control(key=K.knob + "pipeline_schedule").set_value("batch_queue")
    ok(at.run())
    run = at.session_state[K.run]
    assert run.engine.config.parallel_config.pipeline_schedule == "batch_queue" and run.engine.config.parallel_config.num_microbatches == 1
    assert not any(p.is_alive() for p in old)
    assert all(p.is_alive() for p in workers(run))
    at.number_input(key=K.knob + "pipeline_parallel_size").set_value(3)  # tiny-random has 2 layers
    ok(at.run())
    assert any("pipeline_parallel_size" in e for e in errors(at)) and at.session_state[K.run] is None
    assert not any(p.is_alive() for p in workers(run))


def test_a_dead_worker_is_a_message_and_a_restart_button(session: AppTest) -> None:
    at = switched(session)
    run_n(at, 1)
    run = at.session_state[K.run]
    os.kill(run.engine.runner.executor.pids[1], signal.SIGKILL)
    run_n(at, 2)
    assert any("worker processes failed" in e for e in errors(at))
    assert not any(p.is_alive() for p in workers(run))
    click(at, "restart_workers")
    fresh = at.session_state[K.run]
    assert fresh is not run and all(p.is_alive() for p in workers(fresh)) and not errors(at)
    run_n(at, 1)
    assert chart(at, "chart_pipeline_gantt")["layout"]["meta"]["step"] == 1


def test_calculator_tab_and_the_quantization_page_on_a_parallel_run(session: AppTest) -> None:
    at = switched(session)
    run_n(at, 1)
    at.session_state["pipeline_tab"] = "Calculator"
    ok(at.run())
    assert "chart_pipeline_memory" in charts(at) and not errors(at)
    workers_frame = next(d.value for d in at.dataframe if "weights MiB" in d.value.columns)
    assert list(workers_frame["worker"]) == ["stage 0 · tp 0", "stage 1 · tp 0"]
    assert any("no preset for tiny-random" in i.value for i in at.info)
    ok(at.switch_page(QUANT).run())
    at.session_state["quant_tab"] = "Activations"
    ok(at.run())
    assert any("worker processes" in i.value for i in at.info) and not errors(at)
