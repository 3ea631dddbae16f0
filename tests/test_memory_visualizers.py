"""visualizers.memory: estimate records -> figures and tables (no Streamlit)."""
import math
import sys

import pytest

from engine.memory import MAX_BATCH, MAX_CONTEXT, GiB, Settings, Workload, compare_hardware, concurrency_curve, estimate
from visualizers import memory as vm
from visualizers.theme import MEMORY_COLORS, VERDICT_COLORS


@pytest.fixture(scope="module")
def est():
    return estimate("internvl2-8b", "atlas-300v-pro")


def test_visualizers_do_not_import_streamlit():
    import subprocess

    out = subprocess.run([sys.executable, "-c", "import visualizers.memory, sys; print('streamlit' in sys.modules)"],
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False"


def test_memory_bar_stacks_to_the_total_with_theme_colours(est):
    fig = vm.memory_bar(est)
    names = [t.name for t in fig.data]
    assert names == ["weights", "vision tower", "KV cache", "activations", "310P attention mask", "overhead",
                     "framework reserve"]
    assert sum(t.x[0] for t in fig.data) * GiB == pytest.approx(est.total_bytes_per_device)
    assert fig.data[0].marker.color == MEMORY_COLORS["weights"]
    assert fig.data[2].marker.color == MEMORY_COLORS["kv_cache"]
    assert fig.layout.barmode == "stack"
    lines = [s for s in fig.layout.shapes if s.type == "line"]
    assert any(s.x0 == pytest.approx(est.usable_bytes_per_device / GiB) for s in lines)


def test_memory_bar_marks_overflow():
    over = estimate("llama-3-70b", "rtx-4090", detail=False)
    fig = vm.memory_bar(over)
    assert any(s.type == "rect" for s in fig.layout.shapes)
    assert vm.verdict_color(over) == VERDICT_COLORS["needs_more_devices"]


def test_roofline_places_points_on_the_roof(est):
    fig = vm.roofline_figure(est)
    roof = fig.data[0]
    peak = est.peak_flops / 1e12
    assert max(roof.y) == pytest.approx(peak)
    ridge = next(t for t in fig.data if t.name == "ridge point")
    assert ridge.x[0] == pytest.approx(est.peak_flops / est.bandwidth_bytes_per_s)
    decode = next(t for t in fig.data if t.name.startswith("decode ("))
    ai = decode.x[0]
    # memory-bound decode sits on the sloped part of the roof: attained = intensity x bandwidth
    assert ai < ridge.x[0]
    assert decode.y[0] == pytest.approx(ai * est.bandwidth_bytes_per_s / 1e12, rel=1e-6)
    prefill = next(t for t in fig.data if t.name.startswith("prefill ("))
    assert prefill.x[0] > ridge.x[0] and prefill.y[0] == pytest.approx(peak, rel=0.05)
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"


def test_tables(est):
    mt = vm.memory_table(est)
    assert list(mt["component"])[-2:] == ["total needed", "usable"]
    assert mt.iloc[-2]["bytes"] == f"{est.total_bytes_per_device:,}"
    at = vm.alternatives_table(est)
    assert list(at["format"]) == ["FP16 (current)", "INT8 W8A8", "INT4 W4A16 g128 (AWQ/GPTQ)"]
    rows = compare_hardware("llama-3-8b", ["rtx-4090", "t4", "atlas-300i-duo"])
    ct = vm.compare_table(rows)
    assert list(ct["fits?"]) == ["yes", "no — needs 2", "yes"]
    assert ct.iloc[1]["devices needed"] == 2 and ct.iloc[1]["tp x pp"] == "2 x 1"


def test_compare_rows_report_errors_instead_of_raising():
    rows = compare_hardware("llama-2-7b", ["t4", "no-such-device"])
    assert rows[1].error.startswith("unknown hardware")
    assert vm.compare_table(rows).iloc[1]["fits?"] == "n/a"


def test_huge_numbers_do_not_overflow_tables():
    # the documented maxima (issue 7: 100,000,000 tokens is now refused)
    e = estimate("llama-3.1-405b", "jetson-agx-orin", Workload(batch=MAX_BATCH, context=MAX_CONTEXT), detail=True)
    vm.memory_table(e).to_string()
    vm.alternatives_table(e).to_string()
    assert math.isfinite(vm.memory_bar(e).data[0].x[0])


def test_concurrency_curve_figure():
    pts = concurrency_curve("llama-3-8b", "h100-sxm")
    assert [p.context for p in pts] == sorted(p.context for p in pts)
    assert all(a.max_batch >= b.max_batch for a, b in zip(pts, pts[1:]))
    fig = vm.concurrency_figure(pts, 4096, 8)
    assert len(fig.data) == 2 and fig.data[1].x[0] == 4096


def test_formula_text(est):
    text = vm.formula_text(est)
    assert text.splitlines()[0].startswith("parameters:")
    assert "kv_per_token:" in text and "131,072" in text


def test_hardware_sources_table():
    from engine.memory import custom_hardware, get_hardware

    t = vm.hardware_sources_table(get_hardware("h100-sxm"))
    assert {"memory (GiB)", "bandwidth (GB/s)", "FP16 TFLOPS (dense)", "FP8 TFLOPS (dense)"} <= set(t["figure"])
    assert all(t["source"].str.len() > 0) and all(t["confidence"].str.len() > 0)
    mine = vm.hardware_sources_table(get_hardware("this-machine"))
    bw = mine[mine["figure"] == "bandwidth (GB/s)"].iloc[0]
    assert bw["value"] != "not supported" and "measured" in bw["source"]
    assert vm.hardware_sources_table(custom_hardware(8, 100, 10)).empty
