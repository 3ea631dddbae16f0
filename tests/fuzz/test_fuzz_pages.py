"""Fuzz: the pages (AppTest). Bad replay uploads on each live page - in live mode and while a
replay runs - and bad pasted configs and bad link numbers on the fit page. Each must end in a
message on the page (st.error / st.warning) and no exception element; on the live pages the
session's run (live or replay) must be the one it had before.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from app.session import K
from engine.replay.recording import MAX_BYTES
from tests.fuzz.harness import expect_page_message
from tests.fuzz.recordings import DELETE, dumps, record_json, set_path
from visualizers.text import escape_markdown

ROOT = Path(__file__).resolve().parents[2]
MAIN = ROOT / "app" / "main.py"
TIMEOUT = 120
LIVE_PAGES = ("app_pages/kv_cache.py", "app_pages/batching.py")


def shown(path: str) -> str:
    """A field path as the page shows it (escaped for Markdown), as a regex."""
    return re.escape(escape_markdown(path))


# (case id, mutation of the valid recording's data or a whole file, what the message names)
UPLOADS: list[tuple[str, Any, str]] = [
    ("not json", b"{not json", "not valid JSON"),
    ("empty", b"", "not valid JSON"),
    ("deep", b"[" * 100_000 + b"]" * 100_000, "nested deeper"),
    ("block_size 0", ("initial.block_size", 0), shown("initial.block_size")),
    ("num_blocks -5", ("initial.num_blocks", -5), shown("initial.num_blocks")),
    ("block_id -1", ("steps[0].snapshot.blocks[0].block_id", -1), shown("steps[0].snapshot.blocks[0].block_id")),
    ("NaN timing", ("steps[1].trace.forward_ms", float("nan")), shown("steps[1].trace.forward_ms")),
    ("string timing", ("steps[2].trace.sample_ms", "slow"), shown("steps[2].trace.sample_ms")),
    ("steps object", ("steps", {}), shown("steps")),
    ("comparison array", ("comparison", []), shown("comparison")),
    ("unknown request", ("steps[1].trace.scheduled[0].request_id", "ghost"),
     shown("steps[1].trace.scheduled[0].request_id")),
    ("block past pool", ("steps[0].snapshot.requests[0].block_table[0]", 10**6),
     shown("steps[0].snapshot.requests[0].block_table[0]")),
    ("missing meta", ("meta", DELETE), shown("meta")),
    ("version 2", ("version", 2), "version 2 is not supported"),
]


pytestmark = pytest.mark.usefixtures("streamlit_clean")


@pytest.fixture(scope="module")
def valid() -> str:
    return record_json()


def blob(spec: Any, valid: str) -> bytes:
    if isinstance(spec, bytes):
        return spec
    path, value = spec
    return dumps(set_path(json.loads(valid), path, value)).encode()


def open_live(page: str) -> AppTest:
    at = AppTest.from_file(str(MAIN), default_timeout=TIMEOUT)
    at.session_state[K.model] = "tiny-random"
    at.run()
    at.switch_page(page).run()
    at.button(key="step").click().run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def upload(at: AppTest, data: bytes, name: str = "run.json") -> AppTest:
    at.file_uploader(key=K.upload).set_value((name, data, "application/json"))
    return at.run()


@pytest.fixture(scope="module", params=LIVE_PAGES, ids=["kv_cache", "batching"])
def live_page(request: pytest.FixtureRequest) -> Iterator[AppTest]:
    """One session per live page, shared by its cases: a user trying one bad file after another."""
    import torch

    threads = torch.get_num_threads()
    at = open_live(request.param)
    yield at
    torch.set_num_threads(threads)


@pytest.mark.parametrize("case_id, spec, match", UPLOADS, ids=[u[0] for u in UPLOADS])
def test_bad_upload_on_a_live_page(live_page: AppTest, valid: str, case_id: str, spec: Any, match: str) -> None:
    before = live_page.session_state[K.run]
    upload(live_page, blob(spec, valid), f"{case_id}.json")
    expect_page_message(live_page, match)
    assert live_page.session_state[K.run] is before and len(before.traces) == 1  # the live run stays
    assert any("LIVE engine" in m.value for m in live_page.markdown)


def test_oversized_upload_on_the_kv_page() -> None:
    at = open_live(LIVE_PAGES[0])
    upload(at, b" " * (MAX_BYTES + 1), "huge.json")
    expect_page_message(at, "limited to 50 MiB")
    assert any("LIVE engine" in m.value for m in at.markdown)


@pytest.mark.parametrize("page", LIVE_PAGES, ids=["kv_cache", "batching"])
def test_bad_upload_during_a_replay_keeps_the_replay(page: str, valid: str) -> None:
    at = open_live(page)
    upload(at, valid.encode(), "good.json")
    assert not at.error and any("REPLAY" in m.value for m in at.markdown)
    replay = at.session_state[K.run]
    at.button(key="step").click().run()
    upload(at, blob(("steps[3].trace.scheduled[0].num_tokens", -2), valid), "bad.json")
    expect_page_message(at, shown("steps[3].trace.scheduled[0].num_tokens") + r".*must be an integer \\?>= 1, got -2")
    assert at.session_state[K.run] is replay and replay.cursor == 1
    assert any("REPLAY" in m.value for m in at.markdown)


# -- the fit page ---------------------------------------------------------------------------------

LLAMA = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
         "intermediate_size": 128, "vocab_size": 100}
CONFIGS: list[tuple[str, str, str]] = [
    ("empty object", "{}", "model_type"),
    ("array", "[]", "JSON object"),
    ("not json", "nope", "malformed config JSON"),
    ("truncated", json.dumps(LLAMA)[:-5], "malformed config JSON"),
    ("deep", "[" * 100_000 + "]" * 100_000, "."),
    ("NaN width", json.dumps({**LLAMA, "hidden_size": float("nan")}), "hidden_size"),
    ("string width", json.dumps({**LLAMA, "hidden_size": "big"}), "hidden_size"),
    ("zero layers", json.dumps({**LLAMA, "num_hidden_layers": 0}), "num_hidden_layers"),
    ("negative layers", json.dumps({**LLAMA, "num_hidden_layers": -2}), "num_hidden_layers"),
    ("zero heads", json.dumps({**LLAMA, "num_attention_heads": 0}), "num_attention_heads"),
    ("heads do not divide", json.dumps({**LLAMA, "num_attention_heads": 3}), "divisible"),
    ("1e300 width", json.dumps({**LLAMA, "hidden_size": 1e300}), "."),
]


def open_fit(**query: str) -> AppTest:
    at = AppTest.from_file(str(MAIN), default_timeout=TIMEOUT)
    for key, value in query.items():
        at.query_params[key] = value
    at.run()
    return at.switch_page("app_pages/fit.py").run()


@pytest.fixture(scope="module")
def custom_fit() -> AppTest:
    """One session on the fit page with 'custom' chosen: each case pastes another config."""
    return open_fit(model="custom")


@pytest.mark.parametrize("case_id, text, match", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_bad_pasted_config(custom_fit: AppTest, case_id: str, text: str, match: str) -> None:
    custom_fit.text_area(key="cfg_text").input(text).run()
    expect_page_message(custom_fit, match)


LINKS: list[tuple[str, dict[str, str], str]] = [
    ("negative batch", {"batch": "-5"}, "Ignored link settings.*batch=-5"),
    ("zero context", {"ctx": "0"}, "Ignored link settings.*ctx=0"),
    ("context 1e30", {"ctx": "1e30"}, "Ignored link settings.*ctx=1e30"),
    ("words for numbers", {"out": "lots", "tp": "two"}, "Ignored link settings.*out=lots"),
    ("memory fraction 5", {"util": "5"}, "Ignored link settings.*util=5"),
    ("NaN fraction", {"eta_m": "nan"}, "Ignored link settings.*eta\\\\?_m=nan"),
    ("block 0", {"block": "0"}, "Ignored link settings.*block=0"),
    ("negative custom memory", {"hw": "custom", "c_mem": "-1"}, "Ignored link settings.*c\\\\?_mem=-1"),
    ("unknown device", {"hw": "h100-ultra"}, "Ignored link settings.*hw=h100-ultra"),
    ("tp does not divide", {"model": "llama-2-7b", "hw": "t4", "tp": "3"}, "does not divide"),
    ("pipeline deeper than layers", {"model": "smollm2-135m", "hw": "t4", "pp": "40"}, "layers"),
    ("output longer than context", {"model": "llama-2-7b", "hw": "t4", "ctx": "100", "out": "200"}, "context"),
]


@pytest.mark.parametrize("case_id, query, match", LINKS, ids=[c[0] for c in LINKS])
def test_bad_numbers_in_a_fit_link(case_id: str, query: dict[str, str], match: str) -> None:
    expect_page_message(open_fit(**query), match)
