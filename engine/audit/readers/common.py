"""What every reader shares: its result record and the scanners for ``key=value`` text.

A framework prints its configuration as Python reprs: ``key=value, key=value`` (vLLM's engine
config line, SGLang's ``ServerArgs(...)``, vLLM's ``Namespace(...)``) or a dict (vLLM's
``non-default args: {...}``). ``scan_pairs`` splits such text at the top level only (commas inside
quotes, brackets or parentheses stay in their value) and also where a comma is missing, as vLLM
0.6's ``chunked_prefill_enabled=False multi_step_stream_outputs=True``.
"""
from __future__ import annotations

import re
from typing import NamedTuple

from engine.audit.evidence import Benchmark, Setting, Value

_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=(?!=)")
_OPEN, _CLOSE = "([{", ")]}"


class Found(NamedTuple):
    """What one reader took from a text."""

    settings: list[Setting]
    benchmark: Benchmark | None
    lines: set[int]  # 1-based line numbers it took something from
    warnings: list[str]
    engine: str | None = None  # vLLM's engine generation when the log says ("V0" | "V1")
    devices: tuple[tuple[str, int], ...] = ()  # (the device the log names, its 1-based line)


_CONFIG = re.compile(r"with config: |ServerArgs\(|Namespace\(|non-default args: \{")
_RECORD = re.compile(r"^\s*(?:>\s*)?(?:INFO|WARNING|WARN|DEBUG|ERROR|CRITICAL|\(|\[|[0-9]{2,4}[-/:]|[A-Za-z_][\w.]*:\s|[$>#|=-]{2})")


def join_wrapped(lines: list[str]) -> list[tuple[int, str]]:
    """(1-based line number, text) of each logical line: a pasted config line that a terminal or
    a web page wrapped (``... chunked_prefill_enabled=False, use_async_out`` + ``put_proc=True``)
    is put back together; a line that starts a new log record never joins."""
    out: list[tuple[int, str]] = []
    for n, line in enumerate(lines, 1):
        if out and _CONFIG.search(out[-1][1]) and line.strip() and not _RECORD.match(line):
            out[-1] = (out[-1][0], out[-1][1] + line)
        else:
            out.append((n, line))
    return out


def nothing() -> Found:
    return Found([], None, set(), [])


def _walk(text: str) -> list[tuple[int, str]]:
    """(index, character) of every character at depth 0 outside quotes."""
    out: list[tuple[int, str]] = []
    depth, quote, i = 0, "", 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 2
                continue
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
            if depth == 0:
                out.append((i, ch))
        elif ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append((i, ch))
        i += 1
    return out


def _split(text: str, starts: list[tuple[int, int]]) -> dict[str, str]:
    """Values between key starts, each cut at its first top-level comma (a repr never has one
    inside a value: commas there are inside quotes or brackets)."""
    commas = [i for i, ch in _walk(text) if ch == ","]
    out: dict[str, str] = {}
    for n, (k0, v0) in enumerate(starts):
        end = starts[n + 1][0] if n + 1 < len(starts) else len(text)
        cut = next((c for c in commas if v0 <= c < end), end)
        key = text[k0:v0].rstrip("=: ").strip("'\"")
        out.setdefault(key, text[v0:cut].strip())
    return out


def scan_pairs(text: str) -> dict[str, str]:
    """``key=value`` pairs at the top level of ``text`` (module doc); values are raw text."""
    top = {i for i, _ in _walk(text)}
    starts: list[tuple[int, int]] = []
    for m in _KEY.finditer(text):
        i = m.start()
        if i in top and (i == 0 or text[i - 1] in " ,(\t"):
            starts.append((i, m.end()))
    return _split(text, starts)


_DICT_KEY = re.compile(r"'([A-Za-z_][A-Za-z0-9_]*)'\s*:\s*")


def scan_dict(text: str) -> dict[str, str]:
    """``'key': value`` items at the top level of a dict repr's inside."""
    quotes = {i for i, ch in _walk(text) if ch == "'"}
    return _split(text, [(m.start(), m.end()) for m in _DICT_KEY.finditer(text) if m.start() in quotes])


def literal(raw: str) -> Value:
    """A Python repr's value: True/False/None, an int or float, else the text without quotes."""
    v = raw.strip()
    if v in ("True", "true"):
        return True
    if v in ("False", "false"):
        return False
    if v in ("None", "null", ""):
        return None
    if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
        return v[1:-1]
    try:
        return int(v.replace("_", "")) if re.fullmatch(r"-?[0-9][0-9_]*", v) else float(v)
    except ValueError:
        return v


def number(text: str) -> float:
    """``1,234.5`` -> 1234.5."""
    return float(text.replace(",", ""))
