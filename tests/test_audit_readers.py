"""Evidence readers (engine/audit/readers/) on real logs from public threads (issue #23).

tests/data/audit_logs/ holds 37 texts as their threads show them (most are the part of the thread
a search excerpt shows, cut where it was cut; soft-wrapped config lines kept as stored), and
index.json: per text its source URL, what the readers must extract (``expected``) and what a
person reading the thread noted as stated (``stated_by_researcher``, an independent reading).
Each test checks: every expected setting is read with its value; nothing else is read; every
setting carries a line of the text that holds its value (nothing invented); and every canonical
setting the independent reading found is read, but for the differences listed in
``READING_DIFFERENCES`` with why.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from engine.audit.evidence import CANONICAL, Setting
from engine.audit.readers import read_evidence

DATA = Path(__file__).parent / "data" / "audit_logs"
INDEX: list[dict[str, Any]] = json.loads((DATA / "index.json").read_text())

#: (log id, setting) -> why our reading differs from the independent one
READING_DIFFERENCES: dict[tuple[str, str], str] = {
    ("v1-04", "cuda_graphs"): "the log downgrades FULL_AND_PIECEWISE to PIECEWISE: graphs are on (True)",
    ("v1-05", "attention_backend"): "'Flash Attention (V1)' is vLLM's flash_attn backend, spelled one way",
    ("v1-04", "attention_backend"): "TritonMLABackend is vLLM's triton_mla backend, spelled one way",
    ("v1-05", "cuda_graphs"): "only a compilation_config fragment; no line says graphs were captured",
    ("v1-05", "tensor_parallel_size"): "only 'world size 1 ... TP rank 0': a rank, not the setting",
    ("v1-05", "pipeline_parallel_size"): "only 'PP rank 0': a rank, not the setting",
    ("mindie-01", "framework"): "GPUStack's log around MindIE: MindIE itself prints nothing here",
    ("mindie-01", "model"): "the path is GPUStack's argument, not a MindIE statement",
    ("bench-02", "framework"): "a vLLM result block with no backend line: the block does not say which server",
    ("bench-02", "tensor_parallel_size"): "'TP2' is a label in the thread's prose, not in the log",
    **{(i, "quantization"): "SGLang's ServerArgs quantization=None means 'not given' (the checkpoint decides), not "
       "'unquantized'" for i in ("sgl-01", "sgl-02", "sgl-05", "sgl-06")},
    **{(i, "gpu_memory_utilization"): "mem_fraction_static, read as SGLang's counterpart (a number)"
       for i in ("sgl-01", "sgl-02", "sgl-05", "sgl-06")},
    ("lcpp-01", "flash_attn"): "'enabled' read as True", ("lcpp-bench-02", "flash_attn"): "fa 1 read as True",
    ("lcpp-01", "kv_cache_dtype"): "K and V both f16: one dtype", ("lcpp-04", "kv_cache_dtype"): "q4_0 for K and V",
    ("lcpp-bench-02", "kv_cache_dtype"): "q8_0 for K and V",
    ("lcpp-02", "n_gpu_layers"): "0 layers offloaded (the log's figure; -ngl 90 was asked)",
    ("lcpp-03", "framework"): "llama-cpp-python runs llama.cpp: its log is llama.cpp's",
    **{(i, "cpu_features"): "the instruction-set features that are on, build options left out"
       for i in ("lcpp-03", "lcpp-04", "lcpp-05")},
    ("lcpp-05", "version"): "the build number (its hash is not a version)",
    ("lcpp-bench-01", "version"): "the build number (its hash is not a version)",
}


def _ids() -> list[str]:
    return [e["id"] for e in INDEX]


def _value_in_line(s: Setting) -> bool:
    """The value's own text is in its line (a bool is a statement, checked by the expected value;
    the framework is known by the line's shape)."""
    if isinstance(s.value, bool) or s.value is None or s.name == "framework":
        return True
    line = s.line.replace("\n", "")
    if isinstance(s.value, (int, float)):
        return any(form in line for form in (str(s.value), f"{s.value:,}", repr(s.value)))
    text = str(s.value)
    if s.name in ("cpu_features", "attention_backend", "kv_cache_dtype"):
        words = re.split(r"[ ,/]+", text.replace("K ", "").replace("V ", ""))
        return all(w.lower() in line.lower().replace(" ", "") or w.lower() in line.lower() for w in words if w) or \
            s.name == "attention_backend"  # spelled one way (vllm.backend_name)
    return text in line or (s.name in ("speculative", "quantization") and text == "none" and "None" in line)


@pytest.mark.parametrize("log_id", _ids())
def test_reader_extracts_every_stated_setting_with_its_line(log_id: str) -> None:
    entry = next(e for e in INDEX if e["id"] == log_id)
    text = (DATA / entry["file"]).read_text()
    ev = read_evidence(text)
    got = {k: s.value for k, s in ev.settings.items()}
    assert got == entry["expected"], log_id
    flat = text.replace("\n", "")
    for s in ev.settings.values():
        assert s.source == "log" and s.line_no >= 1
        assert s.line.replace("\n", "") in flat, (log_id, s.name, "its line is not in the text")
        assert _value_in_line(s), (log_id, s.name, s.value, s.line[:200])
    assert set(ev.lines_understood) <= set(range(1, ev.lines_total + 1))
    for name, value in entry["stated_by_researcher"].items():
        if (log_id, name) in READING_DIFFERENCES:
            continue
        assert name in got, (log_id, name, "stated in the thread, not read")
        assert str(got[name]).lower() == str(value).lower(), (log_id, name, got[name], value)


def test_the_corpus_is_what_the_issue_asks() -> None:
    kinds = [(e["framework"], e["kind"]) for e in INDEX if e["kind"] != "bad"]
    assert len(kinds) >= 15 and all(e["source_url"].startswith("https://") for e in INDEX)
    for fw in ("vllm", "sglang", "llama.cpp"):
        assert sum(f == fw for f, _ in kinds) >= 3, fw
    v0 = [e for e in INDEX if e["expected"].get("version", "9").startswith("0.") and e["id"].startswith("v0")]
    v1 = [e for e in INDEX if e["id"].startswith("v1")]
    assert len(v0) >= 3 and len(v1) >= 5
    assert {name for _, name in READING_DIFFERENCES} <= set(CANONICAL)


def test_engine_generation_and_benchmarks_are_read() -> None:
    by_id = {e["id"]: read_evidence((DATA / e["file"]).read_text()) for e in INDEX}
    assert by_id["v0-03"].engine == "V0" and by_id["v1-01"].engine == "V1"
    b = by_id["bench-01"].benchmark
    assert b is not None and b.figures["median_tpot_ms"] == 48.84 and b.figures["request_throughput"] == 32.42
    assert b.decode_tokens_per_s == pytest.approx(1000 / 48.84) and b.ttft_s == pytest.approx(9.4597)
    lb = by_id["lcpp-bench-01"].benchmark
    assert lb is not None and lb.rates == {"pp512": 4035.47, "tg128": 127.43} and lb.decode_tokens_per_s == 127.43


@pytest.mark.parametrize("text", [
    "", "hello world\nnothing here", "Traceback (most recent call last):\n  File \"x.py\", line 1\nKeyError: 'a'",
    "INFO 10-16 llm_engine.py:237] Initializing an LLM engine (v0.6.3) with config: model='m', tensor_par",
    "server_args=ServerArgs(model_path='x', tp_size=", "| model | test | t/s |\n| --- | --- | --- |\n| a | pp512 |",
    "\x00\x01 binary \xff", "============ Serving Benchmark Result ============\nSuccessful requests:",
])
def test_bad_or_truncated_text_never_raises_and_says_what_it_understood(text: str) -> None:
    ev = read_evidence(text)
    assert ev.lines_total == len(text.splitlines())
    assert isinstance(ev.summary(), str) and ev.summary()
    if not ev.understood_anything:
        assert ev.summary().startswith("understood none of")


def test_real_bad_pastes_are_understood_as_nothing() -> None:
    for e in INDEX:
        if e["kind"] == "bad":
            ev = read_evidence((DATA / e["file"]).read_text())
            assert ev.settings == {} or set(ev.settings) <= {"framework", "version"}, e["id"]


def test_a_truncated_config_line_keeps_what_it_has() -> None:
    ev = read_evidence("INFO x llm_engine.py:237] Initializing an LLM engine (v0.6.3) with config: "
                       "model='meta-llama/Llama-3.1-8B', tensor_parallel_size=2, enable_prefix_caching=Tr")
    assert ev.settings["tensor_parallel_size"].value == 2 and ev.settings["version"].value == "0.6.3"
    assert ev.settings["enable_prefix_caching"].value == "Tr"  # cut mid-word: kept as text, never guessed
