"""Untrusted text made safe for Streamlit Markdown: the one helper every page uses.

Streamlit renders Markdown in ``st.markdown``, ``st.write``/``st.write_stream``, ``st.caption``,
``st.error``/``warning``/``info``/``success``, badges, metric/tab/expander/widget labels and
option labels (``format_func``), and ``help=`` tooltips. Text that did not come from this code
- request ids and prompts in a shared recording, a pasted config's ``_name_or_path``, a URL's
query values, model output, error messages that quote any of those - must not be able to
become an image (the viewer's browser would fetch its URL), a link, HTML, LaTeX, a colour or
icon directive, a heading or a list. ``escape_markdown`` backslash-escapes it so it renders as
the literal characters it is (CommonMark renders ``\\X`` as ``X`` for any ASCII punctuation X).
"""
from __future__ import annotations

import html
import re

# Escaped wherever they appear: emphasis and code (* ` ~), links and images ([ ]), HTML and
# autolinks (< >), entities (&), LaTeX ($), Streamlit directives and emoji (:), tables (|),
# email autolinks (@), and the backslash itself.
ALWAYS = frozenset("\\`*~[]<>&$:|@")
# Escaped at the start of a line (after optional spaces): headings, lists, quotes, rules, setext.
LINE_START = frozenset("#-+=>")
_LINE_BREAKS = re.compile(r"\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")
_ORDERED = re.compile(r"^(\s*\d{1,9})([.)])(?=\s|$)")  # "1. item" / "2) item"
# Some patterns are found in the *text* after escapes are resolved, so a backslash cannot stop
# them: bare URLs and e-mail addresses (remark-gfm's autolink-literal transform) and Streamlit's
# ":material/icon:" names. An invisible WORD JOINER inside "://" and ":material/", after "www"
# and after "@" breaks the pattern each looks for.
WORD_JOINER = "\u2060"
_TEXT_PATTERNS = re.compile(r"(?i)(?<=\\:)(?=//|material/)|(?<=www)(?=\.)|(?<=\\@)")


def _marker_positions(line: str) -> set[int]:
    """Indexes of characters that would start a block construct: a heading/list/quote marker
    after the line's indentation, or the ``.``/``)`` of an ordered-list number."""
    first = len(line) - len(line.lstrip(" \t"))
    marks = {first} if line[first:first + 1] in LINE_START else set()
    ordered = _ORDERED.match(line)
    if ordered:
        marks.add(ordered.end(1))
    return marks


def _escape_line(line: str, always: frozenset[str]) -> str:
    """One line: every ``always`` character, a non-intraword ``_``, block markers, ``www.``."""
    marks = _marker_positions(line)
    out: list[str] = []
    for i, ch in enumerate(line):
        if ch in always or i in marks:
            out.append("\\" + ch)
        elif ch == "_" and not (0 < i < len(line) - 1 and line[i - 1].isalnum() and line[i + 1].isalnum()):
            out.append("\\_")  # snake_case stays as is: an intraword _ cannot start emphasis
        else:
            out.append(ch)
    escaped = _TEXT_PATTERNS.sub(WORD_JOINER, "".join(out))
    indent = len(escaped) - len(escaped.lstrip(" \t"))
    return escaped.lstrip(" \t") if indent >= 4 else escaped


def escape_markdown(text: object, *, keep_newlines: bool = False, brackets: bool = True) -> str:
    """``text`` (anything; ``str()`` is taken) as Markdown that renders literally.

    Rule: backslash-escape every character in ``ALWAYS``; ``_`` unless it sits between two
    letters/digits; ``# - + = >`` and an ordered-list ``1.`` at the start of a line; put an
    invisible WORD JOINER inside ``://`` and ``:material/``, after ``www`` and after ``@`` (bare
    URLs, e-mail addresses and icon names are found in the text itself); drop indentation of 4+ spaces (an indented code
    block). Line breaks become one
    space, or with ``keep_newlines`` a Markdown hard break (each line escaped on its own).

    ``brackets=False`` leaves ``[`` and ``]`` for a caller that escapes them itself: ``st.badge``
    backslash-escapes them in its label, and escaping twice would undo it (``\\[``).
    """
    always = ALWAYS if brackets else ALWAYS - {"[", "]"}
    lines = _LINE_BREAKS.split(str(text))
    escaped = [_escape_line(line, always) for line in lines]
    return "  \n".join(escaped) if keep_newlines else " ".join(escaped)


def escape_plotly(text: object) -> str:
    """``text`` for a Plotly trace name, tick label or hover: ``& < >`` as entities.

    Plotly renders a few HTML tags in those (``<a href>``, ``<b>``, ``<span style>``, ``<br>``)
    and decodes entities back for display, so escaped text shows as typed and is never a tag.
    """
    return html.escape(str(text), quote=False)
