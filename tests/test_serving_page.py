"""The Serving under load page (/serving) through Streamlit's AppTest.

The numbers on the page are the simulator's: a run of the same inputs through the engine's API
(simulated_model -> generate -> simulate -> summarize) gives every figure shown, digit for digit
(the clock is virtual, so the run is deterministic). Bad inputs are messages naming the field;
"Step through it" makes a simulated run the session's run, which the KV cache page draws badged.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app.studies import serving as study
from engine.costmodel.model import simulated_model
from engine.simulate.metrics import SLO, summarize
from engine.simulate.simulator import simulate
from engine.simulate.workload import generate, parse_lengths
from engine.sizing import Settings, estimate, Workload as SizingWorkload

ROOT = Path(__file__).resolve().parents[1]
MAIN = ROOT / "app" / "main.py"
SERVING = "app_pages/serving.py"
KV_CACHE = "app_pages/kv_cache.py"
TIMEOUT = 120
BADGE = "SIMULATED — predicted times"

pytestmark = pytest.mark.usefixtures("streamlit_clean")


def ok(at: AppTest) -> AppTest:
    assert not at.exception, [e.value for e in at.exception]
    return at


def open_serving(**widgets: object) -> AppTest:
    at = AppTest.from_file(str(MAIN), default_timeout=TIMEOUT)
    ok(at.run())
    ok(at.switch_page(SERVING).run())
    for key, value in widgets.items():
        at.number_input(key=key).set_value(value)
    return ok(at.run())


def metrics(at: AppTest) -> dict[str, tuple[str, str]]:
    return {m.label: (m.value, m.proto.delta) for m in at.metric}


def markdown(at: AppTest) -> str:
    return "\n".join(str(m.value) for m in at.markdown)


def errors(at: AppTest) -> str:
    return "\n".join(str(e.value) for e in at.error)


def test_a_run_shows_the_simulators_numbers() -> None:
    at = open_serving(sv_n=10)
    assert BADGE in markdown(at)
    ok(at.button(key="sv_run").click().run())
    assert not errors(at)

    # the same run through the engine's API (the page's defaults: Llama-3-70B on 8 x H100, vLLM rule)
    sim = simulated_model("llama-3-70b", "h100-sxm", Settings(tp=8, pp=1, framework="auto"))
    work = generate(10, 10.0, parse_lengths("sharegpt", "p", "prompt"), parse_lengths("sharegpt", "o", "output"), seed=0)
    s = summarize(simulate(sim, work), SLO(1.0, 0.05))
    room = estimate("llama-3-70b", "h100-sxm", SizingWorkload(batch=1, context=sim.deployment.max_model_len),
                    Settings(tp=8, pp=1), detail=False).kv_room_tokens

    got = metrics(at)
    assert got["KV pool"][0] == f"{sim.deployment.kv_pool_tokens:,} tokens"
    assert sim.deployment.kv_pool_tokens // sim.deployment.block_size * sim.deployment.block_size == \
        room // sim.deployment.block_size * sim.deployment.block_size  # the calculator's KV room
    assert got["Finished"][0] == f"{s.finished:,} / {s.num_requests:,}" and s.finished == 10
    assert got["Throughput"][0] == f"{s.output_tokens_per_s:,.0f} tok/s"
    assert got["Goodput"][0] == f"{s.goodput:,.2f} req/s"
    assert got["KV use (peak)"][0] == f"{s.max_kv_usage:.1%}"
    assert f"{s.preemptions:,} preemptions" in got["KV use (peak)"][1]

    table = at.dataframe[0].value.set_index("metric")
    assert table.loc["TTFT", "p50 (ms)"] == pytest.approx(s.ttft_p50_s * 1e3)
    assert table.loc["TTFT", "p99 (ms)"] == pytest.approx(s.ttft_p99_s * 1e3)
    assert table.loc["TPOT", "p90 (ms)"] == pytest.approx(s.tpot_p90_s * 1e3)
    assert table.loc["E2E", "p50 (ms)"] == pytest.approx(s.e2e_p50_s * 1e3)
    ok(at.button(key="sv_policies").click().run())
    policies = at.dataframe[1].value.set_index("policy")
    assert list(policies.index) == list(study.scheduling_policies())
    assert policies.loc["fcfs", "p90 TTFT (ms)"] == pytest.approx(table.loc["TTFT", "p90 (ms)"])  # neighbours agree
    figures = {el.proto.spec for el in at.get("plotly_chart")}
    assert len(figures) == 2  # the CDFs and the timeline
    assert not at.warning  # complete, not partial

    # a rerun with the same inputs draws the cached result: the same numbers
    ok(at.run())
    assert metrics(at) == got


def test_bad_inputs_are_messages() -> None:
    at = open_serving(sv_n=5, sv_rate=0.0)
    ok(at.button(key="sv_run").click().run())
    assert "rate" in errors(at)
    at.number_input(key="sv_rate").set_value(5.0)
    at.number_input(key="sv_slo_ttft").set_value(0.0)
    ok(at.run())
    assert "slo_ttft" in errors(at)
    at.number_input(key="sv_slo_ttft").set_value(1.0)
    at.selectbox(key="sv_model").set_value("llama-3.1-405b")
    at.selectbox(key="sv_hw").set_value("l4")
    at.number_input(key="sv_tp").set_value(1)
    ok(at.run())
    assert "does not fit" in errors(at)


def test_a_malformed_workload_file_names_the_field() -> None:
    # AppTest cannot upload a file: the page hands the uploaded text to this same function
    inputs = study.ServingInputs("llama-3-8b", "h100-sxm", tp=1, workload_json='[{"arrival_s": -1, "max_tokens": 4}]')
    with pytest.raises(ValueError, match="request 0: arrival_s"):
        study.workload(inputs)
    with pytest.raises(ValueError, match="not valid JSON"):
        study.workload(study.ServingInputs("llama-3-8b", "h100-sxm", workload_json="{nope"))


def test_a_run_past_its_time_limit_is_marked_partial() -> None:
    at = open_serving(sv_n=2000, sv_limit=1.0, sv_rate=1000.0)
    ok(at.button(key="sv_run").click().run())
    assert "PARTIAL" in "\n".join(str(w.value) for w in at.warning)
    finished, _ = metrics(at)["Finished"]
    assert not finished.startswith("2,000 /")


def test_step_through_on_the_kv_cache_page() -> None:
    at = open_serving(sv_n=5)
    ok(at.button(key="sv_run").click().run())
    ok(at.button(key="sv_step_through").click().run())
    ok(at.switch_page(KV_CACHE).run())
    assert BADGE in markdown(at)
    ok(at.number_input(key="run_n").set_value(12).run())
    ok(at.button(key="run_n_button").click().run())
    got = metrics(at)
    assert got["Steps done"][0] == "12"
    free, total = (int(x) for x in got["Free blocks"][0].split(" / "))
    assert free < total  # requests hold blocks of the simulated pool
    assert got["Last step (predicted)"][0].endswith(" ms")
    ok(at.switch_page("app_pages/quantization.py").run())
    assert any("Not available for a simulated run" in str(i.value) for i in at.info)
    ok(at.switch_page(KV_CACHE).run())
    ok(at.button(key="leave_simulated").click().run())
    assert BADGE not in markdown(at)
