"""Fuzz: replay files. One real recording (tiny-random, chat-burst, 4 steps plus both policies
run to the end), mutated at every kind of field path - wrong type, negative, zero, fractional,
NaN/Infinity, huge, null, missing, an extra key, inconsistent values - and at the file level
(truncated, empty, not UTF-8, too deep, too big, wrong format/version). Each must be the one
ValueError of ``engine.replay.recording.from_json`` naming the field's path, within the time limit;
a few documented acceptances (integer timings, a default left out, brackets inside strings)
must load.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from engine.replay.recording import MAX_BYTES, MAX_DEPTH, from_json, to_json
from tests.fuzz.harness import expect_accepted, expect_rejected
from tests.fuzz.recordings import DELETE, dumps, get_path, set_path

SNAP = "steps[0].snapshot"
TRACE = "steps[1].trace"
CHUNK = "steps[1].trace.scheduled[0]"
SAMPLED = "steps[1].trace.sampled[0]"
BLOCK = "steps[0].snapshot.blocks[0]"
REQUEST = "steps[0].snapshot.requests[0]"
METRICS = "steps[0].snapshot.metrics[0]"

# field path -> kind; the kind picks the mutations below
COUNTS = [f"{TRACE}.step", f"{TRACE}.num_batched_tokens", f"{TRACE}.num_free_blocks", f"{TRACE}.num_used_blocks",
          f"{TRACE}.num_waiting", f"{TRACE}.num_running", f"{CHUNK}.start", f"{SAMPLED}.token_id", f"{BLOCK}.block_id",
          f"{BLOCK}.ref_count", f"{BLOCK}.num_tokens", f"{REQUEST}.arrival_step", f"{REQUEST}.num_prompt_tokens",
          f"{REQUEST}.num_output_tokens", f"{REQUEST}.num_computed_tokens", f"{REQUEST}.num_preemptions",
          f"{METRICS}.arrival_step", f"{METRICS}.num_output_tokens", f"{METRICS}.num_preemptions", f"{SNAP}.step",
          "comparison.static.traces[5].num_running", "comparison.continuous.final.step"]
POSITIVES = [f"{TRACE}.token_budget", f"{CHUNK}.num_tokens", f"{REQUEST}.max_tokens", f"{SNAP}.block_size",
             f"{SNAP}.num_blocks", f"{SNAP}.kv_bytes_per_token", "initial.num_blocks", "meta.max_model_len",
             "meta.kv_bytes_per_token"]
OPTIONAL_COUNTS = [f"{METRICS}.first_token_step", f"{METRICS}.ttft_steps", f"{METRICS}.finished_step"]
MILLIS = [f"{TRACE}.schedule_ms", f"{TRACE}.forward_ms", f"{TRACE}.sample_ms", "comparison.static.traces[0].forward_ms"]
OPTIONAL_MILLIS = [f"{METRICS}.ttft_ms", f"{METRICS}.tpot_ms", f"{METRICS}.e2e_ms"]
REQUEST_IDS = [f"{CHUNK}.request_id", f"{SAMPLED}.request_id", f"{REQUEST}.request_id", f"{METRICS}.request_id",
               f"{BLOCK}.owners[0]", f"{TRACE}.finished", f"{SNAP}.running[0]"]
TEXTS = [f"{BLOCK}.text", f"{REQUEST}.prompt", f"{REQUEST}.output_text", "meta.title", "meta.model",
         "meta.scenario"]
BOOLS = [f"{CHUNK}.resumed", "meta.chat_template", "meta.config.enable_chunked_prefill"]
ARRAYS = ["steps", f"{TRACE}.scheduled", f"{TRACE}.arrived", f"{TRACE}.sampled", f"{TRACE}.blocks_allocated",
          f"{SNAP}.blocks", f"{SNAP}.requests", f"{SNAP}.waiting", f"{SNAP}.metrics", f"{BLOCK}.token_ids",
          f"{REQUEST}.block_table", "comparison.static.traces"]
RECORDS = ["meta", "initial", "steps[0]", TRACE, CHUNK, SAMPLED, BLOCK, REQUEST, METRICS, "comparison.static",
           "comparison.static.final"]
REQUIRED = [f"{TRACE}.sample_ms", f"{CHUNK}.kind", f"{SAMPLED}.text", f"{BLOCK}.owners", f"{REQUEST}.finish_reason",
            f"{METRICS}.tpot_ms", f"{SNAP}.metrics", "meta.config", "initial", "steps", "steps[2].snapshot",
            "comparison.static.final"]


@dataclass(frozen=True)
class Case:
    id: str
    path: str  # where to mutate ("" for a whole-file case)
    value: Any = None  # the new value; DELETE; or a function of the whole valid data
    match: str | None = None  # regex the message must match; default: the path itself
    text: Callable[[str], str | bytes] | None = None  # a whole-file mutation instead

    def expected(self) -> str:
        """The message names the path (and no longer one: ``owners[0]`` is not ``owners[0]x``)."""
        return self.match if self.match is not None else re.escape(self.path) + r"(?![A-Za-z0-9_])"


def _field_cases() -> list[Case]:
    cases = []
    bad_ints = (("string", "7"), ("negative", -1), ("fraction", 1.5), ("bool", True), ("huge", 10**20),
                ("null", None), ("array", [1]), ("missing", DELETE))
    for i, p in enumerate(COUNTS + POSITIVES):  # three of the eight per field, every one on ten fields
        for name, value in (bad_ints[i % 8], bad_ints[(i + 3) % 8], bad_ints[(i + 6) % 8]):
            cases.append(Case(f"{p}={name}", p, value, re.escape(p) + (": missing" if value is DELETE else ": must be")))
    cases += [Case(f"{p}=0", p, 0, re.escape(p) + r": must be an integer >= 1, got 0") for p in POSITIVES]
    for p in OPTIONAL_COUNTS:
        cases += [Case(f"{p}={n}", p, v, re.escape(p) + r": must be null or an integer >= 0")
                  for n, v in (("negative", -3), ("string", "1"), ("float", 2.0))]
    bad_floats = (("nan", float("nan")), ("inf", float("inf")), ("-inf", float("-inf")), ("negative", -0.5),
                  ("string", "fast"), ("bool", False))
    for i, p in enumerate(MILLIS + OPTIONAL_MILLIS):
        for name, value in (bad_floats[i % 6], bad_floats[(i + 2) % 6], bad_floats[(i + 4) % 6]):
            cases.append(Case(f"{p}={name}", p, value, re.escape(p) + r": must be (null or )?a finite number >= 0"))
    for p in MILLIS:
        cases.append(Case(f"{p}=null", p, None, re.escape(p) + r": must be a finite number >= 0, got null"))
    bad_ids = (("int", 5), ("empty", ""), ("long", "r" * 300), ("null", None))
    for i, p in enumerate(REQUEST_IDS):
        for name, value in (bad_ids[i % 4], bad_ids[(i + 2) % 4]):
            if p.endswith(".finished"):
                value = [value]
            cases.append(Case(f"{p}={name}", p, value))
    bad_texts = (("int", 5), ("array", ["a"]), ("missing", DELETE))
    for i, p in enumerate(TEXTS):
        cases += [Case(f"{p}={name}", p, value) for name, value in (bad_texts[i % 3], bad_texts[(i + 1) % 3])]
    for p in BOOLS:
        cases += [Case(f"{p}=int", p, 1), Case(f"{p}=string", p, "true"), Case(f"{p}=null", p, None)]
    bad_arrays = (("object", {}), ("string", "[]"), ("null", None))
    for i, p in enumerate(ARRAYS):
        cases += [Case(f"{p}={name}", p, value) for name, value in (bad_arrays[i % 3], bad_arrays[(i + 1) % 3])]
    cases += [Case(f"{p}.extra", f"{p}.bogus", 1, re.escape(p) + r"\.bogus: unknown field") for p in RECORDS]
    cases += [Case(f"{p}=missing", p, DELETE, re.escape(p) + ": missing") for p in REQUIRED]
    cases += [Case(f"{p}=array", p, [], re.escape(p) + ": must be an object") for p in RECORDS + ["comparison"]]
    return cases


def _rule_cases() -> list[Case]:
    """Right types, wrong values: enum fields, type tags, and what the views rely on."""
    def plus_one(path: str) -> Callable[[dict[str, Any]], int]:
        return lambda data: get_path(data, path) + 1

    return [
        Case("kind", f"{CHUNK}.kind", "chunk", re.escape(f"{CHUNK}.kind") + r': must be one of "prefill", "decode"'),
        Case("status", f"{REQUEST}.status", "done", re.escape(f"{REQUEST}.status") + r': must be one of "pending", "waiting", "running", "preempted", "finished", got "done"'),
        Case("finish_reason", f"{REQUEST}.finish_reason", ""),
        Case("token_id", f"{SAMPLED}.token_id", 2**31),
        Case("type tag", f"{TRACE}._type", "Snapshot", re.escape(f"{TRACE}._type") + r': must be tagged "_type": "StepTrace"'),
        Case("no type tag", f"{BLOCK}._type", DELETE, re.escape(f"{BLOCK}._type")),
        Case("block order", f"{BLOCK}.block_id", 5, re.escape(f"{BLOCK}.block_id") + ": must be 0"),
        Case("overfull block", f"{BLOCK}.num_tokens", 17, re.escape(f"{BLOCK}.num_tokens") + ": must be <= block_size = 16"),
        Case("fill vs ids", f"{BLOCK}.token_ids", [1], re.escape(f"{BLOCK}.token_ids") + ": must hold num_tokens"),
        Case("ref below owners", f"{BLOCK}.ref_count", 0, re.escape(f"{BLOCK}.ref_count")),
        Case("used, no owner", f"{BLOCK}.owners", [], re.escape(f"{BLOCK}.ref_count") + ": must be the number of owners"),
        Case("unknown owner", f"{BLOCK}.owners[0]", "ghost", re.escape(f"{BLOCK}.owners[0]") + ': request "ghost"'),
        Case("block past pool", f"{REQUEST}.block_table[2]", 160, re.escape(f"{REQUEST}.block_table[2]") + ": block id must be < num_blocks = 160"),
        Case("table vs owners", f"{REQUEST}.block_table[2]", 150, re.escape(f"{REQUEST}.block_table[2]") + ": block 150 does not list"),
        Case("duplicate request", f"{SNAP}.requests[1].request_id", "0", re.escape(f"{SNAP}.requests[1].request_id") + ': .*appears twice'),
        Case("unknown waiting", f"{SNAP}.waiting", ["ghost"], re.escape(f"{SNAP}.waiting[0]")),
        Case("unknown running", f"{SNAP}.running[0]", "ghost", re.escape(f"{SNAP}.running[0]")),
        Case("unknown metrics", f"{METRICS}.request_id", "ghost", re.escape(f"{METRICS}.request_id")),
        Case("duplicate chunk", f"{TRACE}.scheduled[1].request_id", "0", re.escape(f"{TRACE}.scheduled[1].request_id") + ": .*appears twice"),
        Case("unknown chunk", f"{CHUNK}.request_id", "ghost", re.escape(f"{CHUNK}.request_id") + ": request"),
        Case("unknown arrival", "steps[0].trace.arrived[0]", "ghost", re.escape("steps[0].trace.arrived[0]")),
        Case("unknown sample", f"{SAMPLED}.request_id", "ghost", re.escape(f"{SAMPLED}.request_id")),
        Case("allocated past pool", "steps[0].trace.blocks_allocated[0]", 160, re.escape("steps[0].trace.blocks_allocated[0]")),
        Case("freed past pool", f"{TRACE}.blocks_freed", [10**6], re.escape(f"{TRACE}.blocks_freed[0]")),
        Case("free + used", f"{TRACE}.num_free_blocks", plus_one(f"{TRACE}.num_free_blocks"), re.escape(f"{TRACE}.num_used_blocks") + ": num_free_blocks \\+ num_used_blocks"),
        Case("batched vs chunks", f"{TRACE}.num_batched_tokens", plus_one(f"{TRACE}.num_batched_tokens"), re.escape(f"{TRACE}.num_batched_tokens") + ": must be the scheduled chunks' sum"),
        Case("over budget", "steps[0].trace.token_budget", 1, re.escape("steps[0].trace.num_batched_tokens") + ": must be <= token_budget = 1"),
        Case("trace step gap", "steps[2].trace.step", 9, re.escape("steps[2].trace.step") + ": must be 2"),
        Case("snapshot step gap", "steps[2].snapshot.step", 9, re.escape("steps[2].snapshot.step") + ": must be 3"),
        Case("initial step", "initial.step", 1, re.escape("initial.step") + ": must be 0"),
        Case("block size changes", "steps[1].snapshot.block_size", 32, re.escape("steps[1].snapshot.block_size") + ": must be 16"),
        Case("pool changes", "steps[1].snapshot.num_blocks", 161, re.escape("steps[1].snapshot.num_blocks") + ": must be 160"),
        Case("kv bytes change", "steps[3].snapshot.kv_bytes_per_token", 7, re.escape("steps[3].snapshot.kv_bytes_per_token")),
        Case("pool not listed", "initial.blocks", lambda data: data["initial"]["blocks"][:-1], re.escape("initial.blocks") + ": must list every block"),
        Case("config policy", "meta.config.policy", "fifo", re.escape("meta.config.policy") + ": must be"),
        Case("config block size", "meta.config.block_size", 0, re.escape("meta.config.block_size") + ": must be"),
        Case("config unknown", "meta.config.turbo", True, re.escape("meta.config.turbo") + ": unknown engine setting"),
        Case("config nested", "meta.config.seed", {"a": 1}, re.escape("meta.config.seed") + ": must be a string, a finite number"),
        Case("config huge", "meta.config.max_num_seqs", 10**30, re.escape("meta.config.max_num_seqs") + ": must be a string, a finite number"),
        Case("config NaN", "meta.config.seed", float("nan"), re.escape("meta.config.seed") + ": must be a string, a finite number"),
        Case("config vs pool", "meta.config.num_blocks", 10, re.escape("meta.config.num_blocks") + ": must match"),
        Case("meta kv bytes", "meta.kv_bytes_per_token", 1024, re.escape("meta.kv_bytes_per_token") + ": must match"),
        Case("unknown policy", "comparison.fifo", lambda data: data["comparison"]["static"], re.escape("comparison.fifo")),
        Case("comparison final step", "comparison.static.final.step", 3, re.escape("comparison.static.final.step") + ": must be the number of traces"),
        Case("comparison trace step", "comparison.static.traces[3].step", 9, re.escape("comparison.static.traces[3].step") + ": must be 3"),
        Case("comparison unknown id", "comparison.continuous.traces[0].scheduled[0].request_id", "ghost",
             re.escape("comparison.continuous.traces[0].scheduled[0].request_id")),
        Case("comparison other pool", "comparison.static.final.block_size", 8, re.escape("comparison.static.final.block_size")),
        Case("comparison null", "comparison", None, r"comparison: must be an object, got null"),
    ]


def _file_cases() -> list[Case]:
    """Whole-file mutations of the valid text."""
    deep = "[" * 100_000 + "]" * 100_000
    nested = lambda n: '{"format":"inferscope-recording","version":1,"meta":' + "[" * n + "]" * n + "}"  # noqa: E731
    return [
        Case("truncated 10%", "", text=lambda t: t[: len(t) // 10], match="not valid JSON"),
        Case("truncated 50%", "", text=lambda t: t[: len(t) // 2], match="not valid JSON"),
        Case("truncated 1 char", "", text=lambda t: t[:-1], match="not valid JSON"),
        Case("empty", "", text=lambda t: "", match="not valid JSON"),
        Case("whitespace", "", text=lambda t: b"  \n ", match="not valid JSON"),
        Case("null", "", text=lambda t: "null", match="not an InferScope recording"),
        Case("array", "", text=lambda t: "[]", match="not an InferScope recording"),
        Case("number", "", text=lambda t: "1e999", match="not an InferScope recording"),
        Case("100k deep", "", text=lambda t: deep, match=f"nested deeper than {MAX_DEPTH}"),
        Case("100k deep objects", "", text=lambda t: '{"a":' * 100_000 + "1" + "}" * 100_000, match="nested deeper"),
        Case("deep in meta", "", text=lambda t: nested(100_000), match="nested deeper"),
        Case("just too deep", "", text=lambda t: nested(MAX_DEPTH), match="nested deeper"),
        Case("unbalanced deep", "", text=lambda t: "[" * 100_000, match="nested deeper|not valid JSON"),
        Case("too big", "", text=lambda t: b" " * (MAX_BYTES + 1), match="limited to 50 MiB"),
        Case("too big valid", "", text=lambda t: t + " " * (MAX_BYTES - len(t) + 1), match="limited to 50 MiB"),
        Case("not utf-8", "", text=lambda t: t.encode()[:-1] + b"\xff", match="not UTF-8"),
        Case("utf-16", "", text=lambda t: t.encode("utf-16"), match="not UTF-8"),
        Case("byte order mark", "", text=lambda t: "\ufeff" + t, match="not valid JSON"),
        Case("huge integer literal", "", text=lambda t: t.replace('"num_blocks":160', '"num_blocks":1' + "0" * 5000, 1),
             match="not valid JSON"),
        Case("NaN literal", "", text=lambda t: re.sub(r'"forward_ms":[0-9.e-]+', '"forward_ms":NaN', t, count=1),
             match=r"steps\[0\]\.trace\.forward_ms: must be a finite number >= 0, got NaN"),
        Case("Infinity literal", "", text=lambda t: re.sub(r'"e2e_ms":null', '"e2e_ms":-Infinity', t, count=1),
             match=r"e2e_ms: must be null or a finite number >= 0, got -Infinity"),
        Case("format", "format", "inferscope-recordings", "not an InferScope recording"),
        Case("no format", "format", DELETE, "not an InferScope recording"),
        Case("version 2", "version", 2, "version 2 is not supported"),
        Case("version string", "version", "1", 'version "1" is not supported'),
        Case("version float", "version", 1.0, "version 1.0 is not supported"),
        Case("version null", "version", None, "version null is not supported"),
        Case("top-level extra", "bogus", 1, r"^recording: bogus: unknown field"),
    ]


CASES = _field_cases() + _rule_cases() + _file_cases()


def mutated(case: Case, text: str, data: dict[str, Any]) -> str | bytes:
    if case.text is not None:
        return case.text(text)
    value = case.value(data) if callable(case.value) else case.value
    return dumps(set_path(data, case.path, value))


def test_enough_cases() -> None:
    assert len(CASES) >= 80 and len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_recording_is_rejected_naming_the_field(case: Case, recording_text: str, recording_data: dict[str, Any]) -> None:
    blob = mutated(case, recording_text, recording_data)
    error = expect_rejected(lambda: from_json(blob), match=case.expected(), seconds=20)
    message = str(error)
    assert message.startswith("recording: ") and "\n" not in message and len(message) < 400, message


# -- documented acceptances ------------------------------------------------------------------------

def test_valid_recording_loads_identically(recording_text: str) -> None:
    loaded = expect_accepted(lambda: from_json(recording_text))
    assert to_json(loaded) == recording_text


@pytest.mark.parametrize("path, value", [
    ("comparison", DELETE),  # a recording without side-by-side runs
    (f"{CHUNK}.resumed", DELETE),  # a field with a default may be left out
    ("meta.chat_template", DELETE),
    (f"{TRACE}.forward_ms", 0),  # an integer timing is a number
    (f"{REQUEST}.prompt", "[" * 100_000 + "{" * 1000),  # brackets inside a string are not nesting
    (f"{METRICS}.ttft_ms", None),  # optional metrics may be null
    ("meta.title", "![p](https://example.com/p.png)"),  # any text is data; the pages escape it
])
def test_documented_acceptances(recording_data: dict[str, Any], path: str, value: Any) -> None:
    loaded = expect_accepted(lambda: from_json(dumps(set_path(recording_data, path, value))))
    assert len(loaded.traces) == 4
