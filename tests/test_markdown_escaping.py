"""No user or model text becomes Markdown (issue 7, "Markdown injection").

Request ids, prompts and titles from a shared recording, a pasted config's ``_name_or_path``,
URL values on the fit page, and model output all reached ``st.markdown`` (and captions, errors,
badges, option labels) unescaped: ``![p](https://example.com/p.png)`` in a recording made the
viewer's browser fetch a third-party URL. Everything now goes through one helper,
``visualizers.text.escape_markdown``.

Two kinds of test: the helper over a list of nasty strings, rendered by a real CommonMark parser
(markdown-it-py: nothing but text comes out, and the text is the original), and the pages fed
the same strings, with every Markdown string they send checked for unescaped syntax.
"""
from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import streamlit as st
from markdown_it import MarkdownIt
from streamlit.testing.v1 import AppTest

from app.session import K
from tests.fuzz.recordings import record_json
from visualizers.text import WORD_JOINER, escape_markdown

ROOT = Path(__file__).resolve().parents[1]
MAIN = ROOT / "app" / "main.py"
TIMEOUT = 120

PAYLOADS = (
    "![p](https://example.com/p.png)",
    "[x](javascript:alert(1))",
    "<img src=x onerror=alert(1)>",
    ":red[boom]",
    "$x^2$",
    "<https://example.com/autolink>",
    "**bold** _em_ `code` ~~gone~~",
    ":material/warning: :smile:",
)
NASTY = PAYLOADS + (
    "# heading",
    "- item\n+ item\n* item",
    "1. first\n2) second",
    "> quote",
    "---",
    "title\n===",
    "    indented code",
    "```\nfenced\n```",
    "| a | b |\n|---|---|\n| 1 | 2 |",
    "a\\*b\\",
    "&lt;b&gt; &amp; &#60;",
    "www.example.com and me@example.com",
    "[ref]\n\n[ref]: https://example.com/r.png",
    "line one\r\nline two\u2028line three",
    "snake_case_name __init__ _x_",
    "![p](https://example.com/p.png)\n![q](https://example.com/q.png)",
)
# What remark-gfm's autolink-literal transform links in rendered text (after escapes are resolved).
TEXT_AUTOLINK = re.compile(r"(?i)(https?://|www\.)[-.\w]+|[-.\w+]+@[-\w]+(\.[-\w]+)+")
DANGER = re.compile(r"<img|<a |<h\d|<li|<ol|<ul|<em|<strong|<code|<pre|<blockquote|<table|<del|<s>|<hr")


def commonmark() -> MarkdownIt:
    """CommonMark with raw HTML on (so unescaped HTML would show up), plus GFM tables/strikethrough."""
    return MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])


def rendered_text(markdown: str, joiners: bool = False) -> str:
    """What a reader sees: the rendered HTML's text, whitespace collapsed (and the invisible
    word joiners that break bare URLs dropped, unless ``joiners``)."""
    out = commonmark().render(markdown)
    text = html.unescape(re.sub(r"<[^>]+>", "", out))
    return " ".join(text.split() if joiners else text.replace(WORD_JOINER, "").split())


def unescaped(markdown: str, token: str) -> bool:
    """Does ``token`` occur in ``markdown`` with its first character not backslash-escaped?"""
    for m in re.finditer(re.escape(token), markdown):
        backslashes = len(markdown[:m.start()]) - len(markdown[:m.start()].rstrip("\\"))
        if backslashes % 2 == 0:
            return True
    return False


# -- the helper -----------------------------------------------------------------------------------

@pytest.mark.parametrize("keep_newlines", [False, True])
@pytest.mark.parametrize("text", NASTY)
def test_escaped_text_renders_literally(text: str, keep_newlines: bool) -> None:
    """Rendered by CommonMark, escaped text is plain text (no element but a paragraph and line
    breaks) and reads as the original (line breaks aside, indentation of a code block aside)."""
    escaped = escape_markdown(text, keep_newlines=keep_newlines)
    out = commonmark().render(escaped)
    assert not DANGER.search(out), out
    assert set(re.findall(r"<(\w+)", out)) <= {"p", "br"}, out
    expected = " ".join(text.split())
    assert rendered_text(escaped) == expected
    assert not TEXT_AUTOLINK.search(rendered_text(escaped, joiners=True))  # no bare URL / e-mail left to link
    if not keep_newlines:
        assert "\n" not in escaped and "\r" not in escaped


@pytest.mark.parametrize("text", NASTY)
def test_no_streamlit_syntax_survives(text: str) -> None:
    """What CommonMark does not know but Streamlit does: directives (:red[...], :material/...:),
    LaTeX ($), and link/image brackets - none is left unescaped."""
    escaped = escape_markdown(text)
    for token in ("](", "![", "[", "]", ":", "$", "<", ">", "`", "*", "~", "|", "&", "@"):
        assert not unescaped(escaped, token), (token, escaped)


def test_ordinary_text_is_left_alone() -> None:
    """Escaping only what could be syntax keeps the strings tests and people read as they were."""
    for text in ("block_size must be >= 1", "InternVL2-8B on 1 × Atlas 300V Pro", "--max-model-len 4096",
                 "13.54 GiB", "batch=-5, ctx=lots", "r0, r1, r12"):
        assert rendered_text(escape_markdown(text)) == text
    assert escape_markdown("num_hidden_layers --max-model-len 1.5") == "num_hidden_layers --max-model-len 1.5"


def test_anything_is_turned_into_text() -> None:
    assert escape_markdown(ValueError("a [b]")) == "a \\[b\\]"
    assert escape_markdown(None) == "None"
    assert escape_markdown("") == ""


# -- the pages ------------------------------------------------------------------------------------

pytestmark = pytest.mark.usefixtures("streamlit_clean")


def page_markdown(at: AppTest) -> list[str]:
    """Every string the page sent that Streamlit renders as Markdown."""
    out = [e.value for kind in ("markdown", "caption", "error", "warning", "info", "success", "subheader", "header",
                                "title") for e in getattr(at, kind)]
    out += [m.label for m in at.metric] + [m.value for m in at.metric]
    out += [e.label for e in at.expander] + [t.label for t in at.tabs]
    for group in at.get("button_group"):  # st.segmented_control: option labels are Markdown
        out += [o.content for o in group.proto.options]
    return out


def assert_no_injection(at: AppTest, shown: tuple[str, ...] = ()) -> list[str]:
    """No exception; no payload verbatim in any Markdown string; no unescaped image, link,
    HTML, directive or math syntax; and each of ``shown`` is on the page (escaped)."""
    assert not at.exception, [e.value for e in at.exception]
    strings = page_markdown(at)
    for s in strings:
        for payload in PAYLOADS:
            assert payload not in s, (payload, s)
        for token in ("](", "![", "<img", ":red[", "$x", "<https"):
            assert not unescaped(s, token), (token, s)
        assert not re.search(r"<img|<a ", commonmark().render(s)), s
    for text in shown:
        assert any(escape_markdown(text) in s for s in strings), (text, strings)
    return strings


def _rename_ids(data: Any, names: dict[str, str]) -> Any:
    """Every request id in a recording renamed (request_id fields and id lists alike)."""
    lists = {"owners", "arrived", "preempted", "finished", "waiting", "running"}
    if isinstance(data, dict):
        return {k: (names.get(v, v) if k == "request_id" else
                    [names.get(x, x) for x in v] if k in lists else _rename_ids(v, names))
                for k, v in data.items()}
    if isinstance(data, list):
        return [_rename_ids(x, names) for x in data]
    return data


@pytest.fixture(scope="module")
def nasty_recording() -> bytes:
    """A real recording whose request ids, prompts, title and model name are the payloads."""
    data = json.loads(record_json())
    data = _rename_ids(data, {str(i): p for i, p in enumerate(PAYLOADS)})
    data["meta"]["title"] = "![t](https://example.com/t.png)"
    data["meta"]["model"] = ":blue[model]"
    for snap in [data["initial"], *(s["snapshot"] for s in data["steps"])]:
        for r in snap["requests"]:
            r["prompt"] = r["request_id"]
    return json.dumps(data).encode()


def open_replay(page: str, recording: bytes) -> AppTest:
    at = AppTest.from_file(str(MAIN), default_timeout=TIMEOUT)
    at.session_state[K.model] = "tiny-random"
    at.run()
    at.switch_page(page).run()
    at.file_uploader(key=K.upload).set_value(("nasty.json", recording, "application/json"))
    at.run()
    assert not at.error, [e.value for e in at.error]
    return at


def test_kv_cache_page_escapes_a_replays_ids_and_title(nasty_recording: bytes) -> None:
    at = open_replay("app_pages/kv_cache.py", nasty_recording)
    assert_no_injection(at, shown=("![t](https://example.com/t.png)",))
    for _ in range(2):
        at.button(key="step").click().run()
    strings = assert_no_injection(at, shown=PAYLOADS)  # in "requests arrived" and the highlight options
    assert any("requests arrived" in s for s in strings)


def test_batching_page_escapes_a_replay(nasty_recording: bytes) -> None:
    at = open_replay("app_pages/batching.py", nasty_recording)
    at.button(key="step").click().run()
    assert_no_injection(at, shown=(":blue[model]",))
    at.session_state["batching_tab"] = "Static vs continuous"
    at.run()
    assert_no_injection(at)


def test_prefix_cache_page_escapes_a_replay(nasty_recording: bytes) -> None:
    """Request ids in the lookups and the payloads as the radix-tree nodes' text."""
    data = json.loads(nasty_recording)
    for snap in [data["initial"], *(s["snapshot"] for s in data["steps"])]:
        for i, node in enumerate(snap["prefix_tree"]):
            node["text"] = PAYLOADS[i % len(PAYLOADS)]
    at = open_replay("app_pages/prefix_cache.py", json.dumps(data).encode())
    at.button(key="step").click().run()
    strings = assert_no_injection(at, shown=(":blue[model]",))
    assert sum(" admitted: " in s for s in strings) == 1  # one Markdown list with a line per lookup
    at.session_state["prefix_tab"] = "Caching on vs off"
    at.run()
    assert_no_injection(at)


def test_bad_recording_error_quoting_a_payload_is_escaped(nasty_recording: bytes) -> None:
    data = json.loads(nasty_recording)
    data["steps"][0]["trace"]["arrived"][0] = "![x](https://example.com/ghost.png)"
    at = AppTest.from_file(str(MAIN), default_timeout=TIMEOUT)
    at.session_state[K.model] = "tiny-random"
    at.run()
    at.switch_page("app_pages/kv_cache.py").run()
    at.file_uploader(key=K.upload).set_value(("bad.json", json.dumps(data).encode(), "application/json"))
    at.run()
    assert len(at.error) == 1 and "steps\\[0\\].trace.arrived\\[0\\]" in at.error[0].value
    assert_no_injection(at, shown=("![x](https://example.com/ghost.png)",))


def open_fit(**query: str) -> AppTest:
    at = AppTest.from_file(str(MAIN), default_timeout=TIMEOUT)
    for key, value in query.items():
        at.query_params[key] = value
    at.run()
    at.switch_page("app_pages/fit.py").run()
    return at


def paste_config(**changes: str) -> AppTest:
    """The Fit page with mistral-7b's config, ``changes`` applied, pasted as a custom model."""
    cfg = json.loads((ROOT / "presets" / "models" / "mistral-7b.json").read_text())
    cfg.pop("_source", None)
    cfg.update(changes)
    at = open_fit(model="custom")
    at.text_area(key="cfg_text").input(json.dumps(cfg)).run()
    return at


def test_fit_page_escapes_a_pasted_configs_name() -> None:
    name = "![p](https://example.com/p.png) :red[boom] $x^2$"
    at = paste_config(_name_or_path=name)
    assert not at.error, [e.value for e in at.error]
    strings = assert_no_injection(at, shown=(name,))
    assert strings and at.markdown[0].value.startswith("## :")


def test_fit_page_escapes_a_config_value_quoted_in_a_note() -> None:
    at = paste_config(model_type="[x](javascript:alert(1))")
    assert_no_injection(at, shown=("[x](javascript:alert(1))",))


def test_fit_page_escapes_url_values() -> None:
    at = open_fit(model="![p](https://example.com/p.png)", hw="<img src=x onerror=alert(1)>", batch="$x^2$")
    strings = assert_no_injection(at)
    assert any("Ignored link settings" in s for s in strings)


def test_generate_page_escapes_model_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """Model output - streamed, and shown again from the session on the next run - is text."""
    from engine.serving import generation
    output = "\n".join(PAYLOADS)
    real_start = generation.start

    class Session:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def stream(self) -> Iterator[str]:
            for _ in self.inner.stream():
                pass
            yield from (line + "\n" for line in PAYLOADS)

        def result(self) -> generation.GenerateResult:
            r = self.inner.result()
            return generation.GenerateResult(r.prompt, r.formatted_prompt, output, r.finish_reason,
                                             r.prompt_tokens, r.output_tokens, r.traces)

    monkeypatch.setattr(generation, "start", lambda shared, request: Session(real_start(shared, request)))
    at = AppTest.from_file(str(MAIN), default_timeout=TIMEOUT)
    at.run()
    at.selectbox(key="gen_model").set_value("tiny-random")
    at.number_input(key="gen_max_tokens").set_value(2)
    at.button(key="generate").click().run()
    assert_no_injection(at, shown=PAYLOADS)
    at.run()  # the stored answer, rendered again
    assert_no_injection(at, shown=PAYLOADS)


def test_generate_page_escapes_an_error_quoting_the_prompt(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.serving import generation
    def refuse(shared: Any, request: Any) -> Any:
        raise ValueError(f"prompt: cannot use {request.prompt!r}")

    monkeypatch.setattr(generation, "start", refuse)
    at = AppTest.from_file(str(MAIN), default_timeout=TIMEOUT)
    at.run()
    at.selectbox(key="gen_model").set_value("tiny-random")
    at.text_area(key="gen_prompt").input("![p](https://example.com/p.png)")
    at.button(key="generate").click().run()
    assert len(at.error) == 1
    assert_no_injection(at, shown=("![p](https://example.com/p.png)",))


@pytest.mark.parametrize("text", NASTY)
def test_a_badge_label_is_escaped_once(text: str) -> None:
    """st.badge escapes [ ] in its label itself: with ``brackets=False`` the badge's Markdown
    (``:gray-badge[<label>]``) holds the text literally, brackets escaped exactly once."""
    label = escape_markdown(text, brackets=False)
    body = label.replace("[", "\\[").replace("]", "\\]")  # what st.badge does (streamlit/elements/markdown.py)
    assert body == escape_markdown(text)


def test_figures_show_a_replays_ids_as_text(nasty_recording: bytes) -> None:
    """Plotly renders <a href>, <b>, <span style> in trace names, ticks and hovers: ids from a
    recording reach the figures HTML-escaped (and display as typed: Plotly decodes entities)."""
    from engine.replay.recording import from_json
    from visualizers import batching as vb
    from visualizers import comparison as vc
    from visualizers import kv_blocks as kv

    rec = from_json(nasty_recording)
    snap, traces = rec.snapshots[-1], rec.traces
    runs = dict(rec.comparison)
    figures = [kv.kv_figure(snap, traces[-1]), vb.timeline_figure(traces, snap), vb.latency_figure(snap),
               vc.lanes_side_by_side(runs), vc.latency_comparison_figure(runs)]
    spec = " ".join(json.dumps(json.loads(f.to_json()), ensure_ascii=False) for f in figures)  # to_json writes < as \u003c
    assert "<img" not in spec and "<https" not in spec
    assert "&lt;img src=x onerror=alert(1)&gt;" in spec


def test_patterns_found_in_text_are_broken_invisibly() -> None:
    """Bare URLs, e-mail addresses and :material/...: names are matched in the rendered text
    (escapes cannot stop that): a word joiner sits inside each, and only there."""
    escaped = escape_markdown("https://a.example/x www.b.example c@d.example :material/warning: a:b")
    assert escaped.count(WORD_JOINER) == 4
    assert not TEXT_AUTOLINK.search(rendered_text(escaped, joiners=True))
    assert ":material/" not in rendered_text(escaped, joiners=True)
    assert rendered_text(escaped) == "https://a.example/x www.b.example c@d.example :material/warning: a:b"


def test_speculative_page_escapes_a_replays_tokens_and_ids() -> None:
    """A speculative recording whose request ids and every token piece (sampled, drafts and
    residual entries) are the payloads: the marked output text and the request picker escape them."""
    from engine.model.shared import get_shared_model
    from engine.replay.recording import record, to_json
    from engine.replay.run import LiveRun
    from engine.replay.scenario import load_scenario

    run = LiveRun.from_scenario(load_scenario("chat-burst"), get_shared_model("tiny-random"),
                                speculative_config={"method": "early_exit", "num_layers": 1,
                                                    "num_speculative_tokens": 3})
    run.step(4)
    data = json.loads(to_json(record(run)))
    data = _rename_ids(data, {str(i): p for i, p in enumerate(PAYLOADS)})

    def poison(node: Any, i: list[int]) -> None:
        if isinstance(node, dict):
            if "text" in node and "token_id" in node:
                node["text"] = PAYLOADS[i[0] % len(PAYLOADS)]
                i[0] += 1
            for v in node.values():
                poison(v, i)
        elif isinstance(node, list):
            for v in node:
                poison(v, i)

    poison(data["steps"], [0])
    at = open_replay("app_pages/speculative.py", json.dumps(data).encode())
    for _ in range(4):
        at.button(key="step").click().run()
    strings = assert_no_injection(at)
    assert any("-background[" in s for s in strings), "the marked output text is on the page"
