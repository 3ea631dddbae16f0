"""The Attention architectures page through Streamlit's AppTest (issue #21 item 6).

No exception; the calculator table has the seven architectures with the calculator's numbers;
the live part steps the three engines together and its numbers agree with the records; bad
inputs (a budget below one request, a link with an unknown device) give a message.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from engine.studies.architectures import ARCHITECTURES, compare_architectures

ROOT = Path(__file__).resolve().parents[1]
MAIN = ROOT / "app" / "main.py"
TIMEOUT = 60

pytestmark = pytest.mark.usefixtures("streamlit_clean", "torch_single_thread")


def open_page(**query: str) -> AppTest:
    at = AppTest.from_file(str(MAIN), default_timeout=TIMEOUT)
    for key, value in query.items():
        at.query_params[key] = value
    at.run()
    at.switch_page("app_pages/architectures.py")
    at.run()
    return at


def no_traceback(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def frames(at: AppTest) -> dict:
    """The page's two tables by their first column (AppTest does not expose a dataframe's key)."""
    names = {"architecture": "arch_table", "layout": "arch_steps"}
    return {names[el.value.columns[0]]: el.value for el in at.dataframe}


def steps_label(at: AppTest) -> str:
    return next(m.value for m in at.markdown if m.value.startswith("**Steps done:"))


def test_table_rows_are_the_seven_architectures_with_the_calculators_numbers() -> None:
    at = open_page()
    no_traceback(at)
    table = frames(at)["arch_table"]
    assert list(table["architecture"]) == [c.kind for c in ARCHITECTURES]
    rows = compare_architectures("h200", 4096, "bf16")
    assert list(table["sequences"]) == [r.max_sequences for r in rows]
    assert list(table["KV/token KiB"]) == [round(r.kv_bytes_per_token / 1024, 2) for r in rows]
    assert len(at.expander) >= len(ARCHITECTURES)
    # the formulas are the calculator's lines with its numbers
    codes = [c.value for c in at.code]
    assert rows[0].formulas[0][1] in codes
    chart = next(json.loads(el.proto.spec) for el in at.get("plotly_chart"))
    assert chart["layout"]["xaxis"]["type"] == "log"


def test_stepping_moves_the_three_engines_together() -> None:
    at = open_page()
    assert steps_label(at).startswith("**Steps done: 0**")
    at.button(key="arch_step").click().run()
    at.button(key="arch_step").click().run()
    no_traceback(at)
    assert steps_label(at).startswith("**Steps done: 2**")
    steps = frames(at)["arch_steps"]
    assert list(steps["layout"]) == ["MHA", "GQA", "MQA"]
    used = [int(s.split("/")[1]) for s in steps["blocks used"]]
    assert used[0] < used[1] < used[2]  # same bytes: 1 : 2 : 4 blocks
    pools = next(json.loads(el.proto.spec) for el in at.get("plotly_chart") if el.key == "arch_pools")
    assert pools["layout"]["meta"]["step"] == 2
    titles = " ".join(a["text"] for a in pools["layout"]["annotations"])
    for layout, blocks, running in zip(steps["layout"], steps["blocks used"], steps["running"]):
        assert f"{blocks} used · {running} running" in titles, layout
    at.button(key="arch_end").click().run()
    label = steps_label(at)
    last = int(label.split(" of ")[1].split(" ")[0])
    assert label.startswith(f"**Steps done: {last}**")
    assert list(frames(at)["arch_steps"]["running"]) == [0, 0, 0]
    at.button(key="arch_reset").click().run()
    assert steps_label(at).startswith("**Steps done: 0**")


def test_bad_inputs_give_a_message() -> None:
    at = open_page(arch_hw="no-such-device")
    no_traceback(at)
    assert any("Ignored link settings" in w.value for w in at.warning)
    at.select_slider(key="arch_budget").set_value(8).run()
    no_traceback(at)
    assert any("Can't run this workload" in e.value and "one request needs" in e.value for e in at.error)
