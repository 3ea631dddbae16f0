"""Replay files are validated whole on load (issue 7, "Replay files and pages").

Regression tests for the defects found: ``comparison=[]``, ``steps={}``, ``block_size=0``,
``num_blocks=-5``, ``block_id=-1``, NaN or string timings, 100k-deep JSON and oversized uploads
were accepted (or crashed with a RecursionError) and later put an exception box on the live
pages. Now each is one ValueError naming the path of the bad field, the page shows it as a
message, and the live run is untouched. A valid recording still loads to identical records.
"""
from __future__ import annotations

import enum
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from app.session import K
from engine.replay.recording import MAX_BYTES, MAX_DEPTH, from_json, to_json
from engine.core.schema import Range, SchemaError, decode
from tests.fuzz.recordings import DELETE, dumps, record_json, set_path

ROOT = Path(__file__).resolve().parents[1]
MAIN = ROOT / "app" / "main.py"


def rejected(text: str | bytes) -> str:
    with pytest.raises(ValueError) as info:
        from_json(text)
    message = str(info.value)
    assert message.startswith("recording: "), message
    assert "\n" not in message
    return message


# -- a valid recording ------------------------------------------------------------------------

@pytest.mark.parametrize("scenario, steps", [("chat-burst", 200), ("memory-pressure", 400)])
def test_a_complete_run_loads_back_identically(scenario: str, steps: int) -> None:
    """Every record of a real run (to the end, preemptions included, with both policies) passes."""
    original = record_json(steps=steps, scenario=scenario)
    loaded = from_json(original)
    assert to_json(loaded) == original
    assert from_json(original.encode()) == loaded


def test_status_is_the_engines_enum() -> None:
    """One vocabulary: the engine's RequestStatus is the records' (a replay loads members, not strings)."""
    import engine.core.request
    from engine.core.trace import RequestState, RequestStatus

    assert engine.core.request.RequestStatus is RequestStatus
    assert typing.get_type_hints(RequestState)["status"] is RequestStatus
    loaded = from_json(record_json(steps=3))
    assert all(type(r.status) is RequestStatus for s in loaded.snapshots for r in s.requests)


# -- the defects found --------------------------------------------------------------------------

@pytest.mark.parametrize("path, value, message", [
    ("comparison", [], "comparison: must be an object, got an array"),
    ("steps", {}, "steps: must be an array, got an object"),
    ("initial.block_size", 0, "initial.block_size: must be an integer >= 1, got 0"),
    ("initial.num_blocks", -5, "initial.num_blocks: must be an integer >= 1, got -5"),
    ("initial.blocks[0].block_id", -1, "initial.blocks[0].block_id: must be an integer >= 0, got -1"),
    ("steps[1].trace.forward_ms", float("nan"), "steps[1].trace.forward_ms: must be a finite number >= 0, got NaN"),
    ("steps[1].trace.schedule_ms", "fast", 'steps[1].trace.schedule_ms: must be a finite number >= 0, got "fast"'),
    ("steps[3].trace.scheduled[0].num_tokens", -2,
     "steps[3].trace.scheduled[0].num_tokens: must be an integer >= 1, got -2"),
    ("steps[0].snapshot.requests[0].block_table[0]", 10**6,
     "steps[0].snapshot.requests[0].block_table[0]: block id must be < num_blocks = 160, got 1000000"),
    ("steps[2].trace.step", 7, "steps[2].trace.step: must be 2 (steps are numbered from 0 without gaps), got 7"),
    ("steps[1].trace.scheduled[0].request_id", "ghost",
     'steps[1].trace.scheduled[0].request_id: request "ghost" is not in the snapshot\'s requests'),
    ("meta.config.block_size", 32, "meta.config.block_size: must match the snapshots' block_size = 16, got 32"),
    ("steps[0].trace.token_budget", DELETE, "steps[0].trace.token_budget: missing (a StepTrace needs it)"),
])
def test_bad_field_is_one_value_error_naming_its_path(recording_data: dict, path: str, value: Any, message: str) -> None:
    assert rejected(dumps(set_path(recording_data, path, value))) == f"recording: {message}"


def test_deep_nesting_is_a_value_error_not_a_recursion_error() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    assert f"nested deeper than {MAX_DEPTH}" in rejected(deep)
    inside = '{"format":"inferscope-recording","version":1,"meta":' + "[" * 100_000 + "]" * 100_000 + "}"
    assert "nested deeper" in rejected(inside)


def test_oversized_upload_is_refused_unread() -> None:
    assert "limited to 50 MiB" in rejected(b" " * (MAX_BYTES + 1))


@pytest.mark.parametrize("blob, words", [
    (b"{not json", "not valid JSON"),
    (b"\xff\xfe{}", "not UTF-8"),
    (b'{"format": "something-else"}', "not an InferScope recording"),
    (b'{"format": "inferscope-recording", "version": 2}', "version 2 is not supported"),
    (b'{"format": "inferscope-recording", "version": true}', "version true is not supported"),
    (b'{"format": "inferscope-recording", "version": 1, "x": 1' + b"0" * 5000 + b"}", "not valid JSON"),
])
def test_not_a_recording(blob: bytes, words: str) -> None:
    assert words in rejected(blob)


# -- the page -----------------------------------------------------------------------------------



@pytest.mark.usefixtures("streamlit_clean")
def test_bad_upload_is_a_message_and_the_live_run_stays(recording_data: dict) -> None:
    """A recording the views would crash on (block_size 0 divides by zero in the waste view)
    is an error message naming the field; the live run, its engine and its step stay."""
    import torch

    threads = torch.get_num_threads()
    at = AppTest.from_file(str(MAIN), default_timeout=120)
    at.session_state[K.model] = "tiny-random"
    at.run()
    at.switch_page("app_pages/kv_cache.py").run()
    at.button(key="step").click().run()
    live = at.session_state[K.run]
    bad = dumps(set_path(recording_data, "initial.block_size", 0)).encode()
    at.file_uploader(key=K.upload).set_value(("bad.json", bad, "application/json"))
    at.run()
    torch.set_num_threads(threads)
    assert not at.exception, [e.value for e in at.exception]
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and "initial.block_size" in errors[0] and "must be an integer" in errors[0]
    assert at.session_state[K.run] is live and len(live.traces) == 1
    assert any("LIVE engine" in m.value for m in at.markdown)
    assert re.search(r"Steps done", " ".join(m.label for m in at.metric))


# -- the generic decoder ------------------------------------------------------------------------

@dataclass(frozen=True)
class Inner:
    n: Annotated[int, Range(1, 9)]
    x: float
    tag: Literal["a", "b"] = "a"


@dataclass(frozen=True)
class Outer:
    items: tuple[Inner, ...]
    name: str | None
    flags: dict[str, bool]


def test_schema_decodes_by_annotation() -> None:
    """engine.core.schema: the rules its docstring states, on small dataclasses of its own."""
    out = decode(Outer, {"items": [{"n": 2, "x": 3}], "name": None, "flags": {"on": True}})
    assert out == Outer((Inner(2, 3.0),), None, {"on": True}) and isinstance(out.items[0].x, float)
    cases = [
        ({"items": [{"n": True, "x": 1}], "name": None, "flags": {}}, "items[0].n: must be an integer in 1 .. 9, got true"),
        ({"items": [{"n": 10, "x": 1}], "name": None, "flags": {}}, "items[0].n: must be an integer in 1 .. 9, got 10"),
        ({"items": [{"n": 1, "x": 1, "tag": "c"}], "name": None, "flags": {}}, 'items[0].tag: must be one of "a", "b", got "c"'),
        ({"items": [], "name": 3, "flags": {}}, "name: must be null or a string, got 3"),
        ({"items": [], "name": None, "flags": {"a b": 1}}, 'flags["a b"]: must be true or false, got 1'),
        ({"items": [], "name": None}, "flags: missing (a Outer needs it)"),
        ({"items": [], "name": None, "flags": {}, "more": 1}, "more: unknown field in Outer (expected flags, items, name)"),
        ([], "must be an object (Outer), got an array"),
    ]
    for value, message in cases:
        with pytest.raises(SchemaError) as info:
            decode(Outer, value)
        assert str(info.value) == message
    with pytest.raises(TypeError):
        decode(set[int], [1])  # an annotation the schema has no rule for is a bug, not bad data


class Colour(str, enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.Enum):
    ONE = 1


def test_schema_decodes_an_enum_by_value() -> None:
    """An Enum annotation: the JSON value of a member -> the member; anything else names the path."""
    assert decode(Colour, "red") is Colour.RED
    assert decode(Colour | None, None) is None and decode(Colour | None, "blue") is Colour.BLUE
    assert decode(tuple[Colour, ...], ["blue", "red"]) == (Colour.BLUE, Colour.RED)
    assert decode(Level, 1) is Level.ONE
    for tp, value, message in [
        (Colour, "RED", 'must be one of "red", "blue", got "RED"'),  # the value, not the member name
        (Colour, ["red"], 'must be one of "red", "blue", got an array'),  # unhashable: still a SchemaError
        (Colour | None, 3, 'must be null or one of "red", "blue", got 3'),
        (tuple[Colour, ...], ["red", {}], '[1]: must be one of "red", "blue", got an object'),
        (Level, True, "must be one of 1, got true"),  # true == 1 in Python, but not in the schema
        (Level, 1.0, "must be one of 1, got 1.0"),
    ]:
        with pytest.raises(SchemaError) as info:
            decode(tp, value)
        assert str(info.value) == message
