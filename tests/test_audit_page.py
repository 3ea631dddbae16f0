"""The Audit page (/audit, issue #23 item 6) through Streamlit's AppTest.

Real logs from public threads are pasted (tests/data/audit_logs/, sources in its index.json); what
the page shows is checked against the engine's own audit of the same inputs (engine.audit), and
the exports against the CLI's JSON.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from app.studies import audit as study
from engine.audit.__main__ import report_json
from engine.audit.audit import run_audit
from engine.audit.readers import read_evidence
from tests.test_markdown_escaping import assert_no_injection
from visualizers import audit as va
from visualizers.text import WORD_JOINER

ROOT = Path(__file__).resolve().parents[1]
MAIN = ROOT / "app" / "main.py"
AUDIT = "app_pages/audit.py"
LOGS = ROOT / "tests" / "data" / "audit_logs"
TIMEOUT = 180

pytestmark = pytest.mark.usefixtures("streamlit_clean")


def ok(at: AppTest) -> AppTest:
    assert not at.exception, [e.value for e in at.exception]
    return at


def open_audit() -> AppTest:
    at = AppTest.from_file(str(MAIN), default_timeout=TIMEOUT)
    ok(at.run())
    return ok(at.switch_page(AUDIT).run())


def audited(at: AppTest, log: str = "", **choices: object) -> AppTest:
    """Paste ``log``, choose ``choices`` (widget key -> value), press Audit."""
    for key, value in choices.items():
        widget = next(w for w in (*at.selectbox, *at.number_input, *at.checkbox) if w.key == key)
        widget.set_value(value)
        ok(at.run())  # a framework change swaps the version box: set the next choice on the new page
    at.text_area(key="au_log").input(log)
    return ok(at.button(key="au_run").click().run())


#: each table the page draws, by a column only it has
TABLES = {"settings": "setting", "checklist": "expected gain here", "recommendations": "predicted gain",
"ablation": "makespan (s)", "benchmark": "figure"}


def table(at: AppTest, which: str) -> pd.DataFrame:
    """The table ``which`` (``TABLES``) the page drew."""
    found = [d.value for d in at.dataframe if TABLES[which] in d.value.columns]
    assert len(found) == 1, f"{which}: {len(found)} tables"
    return found[0]


def has_table(at: AppTest, which: str) -> bool:
    return any(TABLES[which] in d.value.columns for d in at.dataframe)


def texts(elements: object) -> str:
    """The elements' texts, Markdown escapes removed (the page escapes every text it did not write)."""
    return "\n".join(str(e.value) for e in elements).replace("\\", "").replace(WORD_JOINER, "")  # type: ignore[attr-defined]


def test_a_pasted_vllm_command_and_benchmark_block() -> None:
    """bench-03: a vLLM V1 `vllm serve ... --no-enable-prefix-caching` command and its benchmark block."""
    log = (LOGS / "bench-03.txt").read_text()
    at = audited(open_audit(), log)
    assert "understood" in texts(at.success) and "a benchmark block" in texts(at.success)

    checklist = table(at, "checklist").set_index("name")
    assert checklist.loc["prefix_caching", "status"] == "⭕ off"
    assert checklist.loc["prefix_caching", "evidence"] == "log line 1: enable_prefix_caching = False"
    assert checklist.loc["prefix_caching", "how / why not"] == "--enable-prefix-caching"
    assert set(checklist["status"]) <= set(va.STATUS_LABEL.values())

    settings = table(at, "settings").set_index("setting")
    assert settings.loc["enable_prefix_caching", "source"] == "log"
    assert settings.loc["enable_prefix_caching", "line"] == 1
    assert "--no-enable-prefix-caching" in settings.loc["enable_prefix_caching", "from"]
    assert settings.loc["max_num_seqs", "value"] == "512"

    # the same audit through the engine: the page shows it, item by item
    report = run_audit("llama-3.1-8b", "h100-sxm", "vllm", None, evidence=read_evidence(log), batch=1, context=4096)
    assert list(checklist["status"]) == [va.STATUS_LABEL[i.status] for i in report.checklist]
    assert list(checklist["evidence"]) == [i.evidence for i in report.checklist]
    recs = table(at, "recommendations")
    assert list(recs["change"]) == [r.title for r in report.recommendations]
    assert "Prefix caching (automatic / radix)" in list(recs["change"])
    # the benchmark block's median TPOT (33.15 ms) is the measured decode speed against the bound
    assert report.roofline is not None and report.roofline.decode_measured_tokens_per_s == pytest.approx(1000 / 33.15)
    metric = {m.label: m.value for m in at.metric}["Decode vs the bound, measured"]
    assert metric == f"{report.roofline.bandwidth_utilisation:.0%}"
    assert len(at.get("plotly_chart")) == 1


def test_atlas_300v_pro_with_vllm_ascend_and_mindie() -> None:
    """The question this audit started from: InternVL2-8B on an Atlas 300V Pro (Ascend 310P)."""
    at = audited(open_audit(), "", au_model="internvl2-8b", au_hw="atlas-300v-pro", au_fw="vllm-ascend",
                 **{"au_version_vllm-ascend": "0.11.0"}, au_simulate=False)
    checklist = table(at, "checklist").set_index("name")
    assert checklist.loc["cuda_graphs", "status"] == "⛔ unsupported"
    assert "310P" in checklist.loc["cuda_graphs", "how / why not"]
    assert checklist.loc["weight_quant_fp8", "status"] == "⛔ unsupported"
    assert "no FP8" in checklist.loc["weight_quant_fp8", "how / why not"]
    assert checklist.loc["weight_quant_fp8", "expected gain here"] == "— (cannot run here)"  # no gain promised
    cannot = texts(at.markdown)
    assert "Not possible here" in cannot
    assert "**CUDA graphs (ACL graph on Ascend)**: " in cannot and "runs eager mode only" in cannot
    assert "**FP8 weights (W8A8-FP8)**: " in cannot and "Atlas 300V Pro has no FP8" in cannot
    recs = list(table(at, "recommendations")["change"])
    assert not {"FP8 weights (W8A8-FP8)", "CUDA graphs (ACL graph on Ascend)"} & set(recs)  # never recommended
    assert "No log given" in texts(at.info)

    at.selectbox(key="au_fw").set_value("mindie")
    ok(at.run())
    checklist = table(at, "checklist").set_index("name")
    assert checklist.loc["weight_quant_fp8", "status"] == "⛔ unsupported"
    assert "mindie" in texts(at.markdown)


def test_a_garbage_paste_is_understood_as_nothing() -> None:
    at = audited(open_audit(), "hello\n\x00\x1b[31m not a log ][ {{{\n" * 40)
    assert "understood none of 80 line(s)" in texts(at.warning)
    assert not at.error
    checklist = table(at, "checklist").set_index("name")
    assert checklist.loc["prefix_caching", "evidence"].startswith("default")  # the version's default, said so


def test_bad_inputs_are_messages() -> None:
    at = audited(open_audit(), "", au_decode=0.0)
    assert "measured_decode_tok_s" in texts(at.error)
    at.number_input(key="au_decode").set_value(25.0)
    ok(at.run())
    assert not at.error
    assert {m.label for m in at.metric} >= {"Decode vs the bound, measured"}


def test_uploaded_files_and_the_exports() -> None:
    """Two uploaded files (an SGLang command + server args, then a benchmark block) are read as one
    text; the exports are the CLI's JSON and a Markdown report of the same audit."""
    sgl, bench = (LOGS / "sgl-06.txt").read_bytes(), (LOGS / "sglbench-01.txt").read_bytes()
    at = open_audit()
    at.selectbox(key="au_fw").set_value("sglang")
    at.checkbox(key="au_simulate").uncheck()
    at.file_uploader(key="au_files").set_value([("sgl-06.txt", sgl, "text/plain"), ("bench.txt", bench, "text/plain")])
    ok(at.run())
    ok(at.button(key="au_run").click().run())
    n = len(sgl.decode().splitlines())
    assert f"lines 1–{n}: sgl-06.txt; lines {n + 1}–" in texts(at.caption)
    assert "a benchmark block" in texts(at.success)
    settings = table(at, "settings").set_index("setting")
    assert settings.loc["enable_prefix_caching", "source"] == "log"
    assert settings.loc["enable_prefix_caching", "line"] <= n
    assert has_table(at, "benchmark")
    assert [el.proto.label for el in at.get("download_button")] == ["Report (Markdown)", "Report (JSON)"]
    assert [el.proto.url.rsplit(".", 1)[-1] for el in at.get("download_button")] == ["md", "json"]

    # the buttons' bytes are these functions of the page's (cached) audit
    text = study.combine("", [("sgl-06.txt", sgl), ("bench.txt", bench)]).text
    inputs = study.AuditInputs("llama-3.1-8b", "h100-sxm", "sglang", log_text=text, simulate_gains=False)
    report = study.audit(inputs)
    exported = json.loads(va.report_as_json(report))
    assert exported == json.loads(json.dumps(report_json(report), default=str))  # the CLI's JSON
    assert set(exported) >= {"detected", "checklist", "roofline", "recommendations"}
    assert exported["detected"]["enable_prefix_caching"] == {
        "value": False, "source": "log", "line": report.detected["enable_prefix_caching"].line}
    item = next(i for i in exported["checklist"] if i["name"] == "prefix_caching")
    assert set(item) >= {"name", "applies", "supported", "enabled", "evidence", "expected_gain", "how"}
    assert item["enabled"] is False and item["status"] == "off"
    assert exported["roofline"]["decode_measured_tokens_per_s"] is not None  # from the benchmark block
    md = va.report_markdown(report, study.evidence(text))
    assert md.startswith("# Audit: llama-3.1-8b on h100-sxm, sglang")
    assert "| ⭕ off | Prefix caching (automatic / radix) |" in md
    assert "## Recommendations" in md and "## Roofline gap" in md


def test_a_log_line_never_becomes_markdown() -> None:
    """A pasted command whose model and values are Markdown / HTML payloads: quoted in a warning,
    shown in the tables, never rendered (tests/test_markdown_escaping.py's checks)."""
    name = "![p](https://example.com/p.png)"
    log = f"vllm serve '{name}' --quantization ':red[boom]' --kv-cache-dtype '<img src=x onerror=alert(1)>'\n"
    at = audited(open_audit(), log)
    assert_no_injection(at, shown=(name,))
    settings = table(at, "settings").set_index("setting")
    assert settings.loc["model", "value"] == name  # in a table cell, as text


def test_combine_numbers_lines_through_the_paste_then_each_file() -> None:
    log = study.combine("a\nb\n", [("one.log", b"c\nd\ne\n"), ("empty.log", b""), ("bad.log", b"\xff\xfe x")])
    assert log.text == "a\nb\nc\nd\ne\n\ufffd\ufffd x"
    assert log.where() == "lines 1–2: pasted text; lines 3–5: one.log; line 6: bad.log"
    assert study.versions("vllm")[:2] == [study.AS_THE_LOG_SAYS, "0.11.0"]


def test_this_engine_measured_once_and_kept(torch_single_thread: None) -> None:
    at = open_audit()
    at.selectbox(key="au_engine_model").set_value("tiny-random")
    at.selectbox(key="au_engine_workload").set_value("quick")
    ok(at.run())
    assert not has_table(at, "ablation")
    ok(at.button(key="au_measure").click().run())
    assert not at.error, texts(at.error)
    got = table(at, "ablation")
    assert list(got["optimisation"])[0] == "the engine's defaults"
    assert len(got) == study.RUNS
    assert got["makespan (s)"].gt(0).all()
    assert "No roofline for tiny-random" in texts(at.caption)  # the calculator does not know it: no bound drawn
    first = got.copy()
    ok(at.run())  # a redraw shows the session's result: nothing is measured again
    pd.testing.assert_frame_equal(table(at, "ablation"), first)
