"""Mutation suite for replay files (issue #26, items 2 and 3): real tiny-random recordings of every
feature - speculation (a draft model), prefix caching with forks (n > 1), copies and evictions on
an int8 KV cache, a pipeline run (p = 2, real worker processes) with a layer split - each recorded
once per module, then mutated systematically at every field kind.

How a mutation is classified (``Mutation.valid``), from the field's annotation, name and the
tables below - never by asking the loader:

* nonsense, must be refused with a ValueError naming the mutated field's path: a wrong JSON type
  for the field's annotation, a negative count, an unknown key, a required key removed, a literal
  outside its values, an id that names no request / node, an int far beyond any bound the file
  states (10**12: pool size, tokens, steps, ranks, stages, layout - the layout and geometry are
  restated by the config and every snapshot), a list emptied or an item duplicated where the
  records say how many there are (every list not in ``FREE_LISTS`` / ``DUPLICATE_FREE``),
  start/end reversed;
* valid, must load and draw: a token id changed within the vocabulary, a text changed, a key
  with a default removed where the value was the default, a huge value where no rule bounds it
  (``UNBOUNDED``: measured durations, the LRU clock, batch numbers), a list emptied / duplicated
  where its length is not recorded elsewhere (``FREE_LISTS`` / ``DUPLICATE_FREE``).

The refusal must name the mutated path (or a path inside it) - or, where the value is one side of
a rule and the loader cannot tell which side is wrong, the other side, listed per field by
``contradicted()`` (a request's counts restated in its metrics entry, ``ref_count`` vs
``owners``, the first snapshot's geometry vs the config and the next snapshot...). Nothing else
counts as naming it.

Speed (the default run): every mutation of one occurrence of each (record, field) is loaded -
from the parsed data (``from_data``), cut to the steps up to the mutated one, so a load costs
milliseconds - and every accepted nonsense file is drawn, but of the valid files only one per
operator plus a fixed-seed sample (``DRAWN``), at the mutated step. ``INFERSCOPE_MUTATIONS=all``
mutates three occurrences of each field and draws every accepted file (minutes).
"""
from __future__ import annotations

import json
import os
import random
import re
import typing
from collections.abc import Iterable, Iterator
from dataclasses import MISSING, dataclass, fields
from typing import Any

import pytest

from engine.replay.recording import Recording, from_data, from_json, to_json
from engine.replay.run import RunMeta
from engine.core.trace import TAGGED, to_dict
from tests.fuzz.recordings import DELETE, dumps, get_path, set_path

CLASSES = {c.__name__: c for c in (*TAGGED, RunMeta)}
HUGE = 10**12
# ints no rule bounds from above (see the module docstring); a huge value there is still a valid file
UNBOUNDED = {"PrefixNode.last_access", "PipelineUnit.batch"}
# lists whose emptying / duplicated item the records do not contradict
FREE_LISTS = {"StepTrace.arrived", "StepTrace.sampled", "StepTrace.blocks_allocated", "StepTrace.blocks_freed",
              "PipelineTimeline.events", "DraftToken.alternatives", "SpecVerification.residual_top",
              "PrefixLookup.node_ids", "PrefixCacheEvents.copies", "PrefixCacheEvents.lookups",
              "PrefixCacheEvents.inserted", "PrefixCacheEvents.split", "StepTrace.preempted", "StepTrace.finished",
              "PrefixCacheEvents.forked", "StepTrace.preempted"}
DUPLICATE_FREE = {"StepTrace.sampled", "PipelineTimeline.events", "DraftToken.alternatives",
                  "SpecVerification.residual_top", "PrefixCacheEvents.copies", "StepTrace.blocks_allocated",
                  "StepTrace.blocks_freed", "PrefixCacheEvents.lookups", "PrefixLookup.node_ids",
                  "PrefixCacheEvents.inserted", "PrefixCacheEvents.split"}
ID_FIELDS = {"request_id", "owners", "waiting", "running", "arrived", "preempted", "finished", "forked",
             "request_ids", "parent_id"}
NODE_REFS = {"PrefixLookup.node_ids", "PrefixCacheEvents.inserted", "PrefixCacheEvents.split"}
TOKEN_IDS = {"SampledToken.token_id", "ResidualToken.token_id"}  # a draft's id is repeated in emitted
TEXTS = {"text", "prompt", "output_text", "title"}
EXHAUSTIVE = os.environ.get("INFERSCOPE_MUTATIONS") == "all"  # the slow sweep: see drawn() and SAMPLES
SAMPLES = 3 if EXHAUSTIVE else 1  # occurrences mutated per (record type, field)
SEED = 26
DRAWN = 12  # accepted mutations drawn per recording by default
_COMMON = {"added key", "removed", "removed (was the default)", "negative", "string", "fraction", "huge", "null",
           "array", "object", "emptied", "item duplicated", "unknown id", "changed text", "number", "int", "NaN",
           "other token", "unknown node"}
OPERATORS = {"spec": _COMMON | {"above 1"}, "prefix": _COMMON, "pipeline": _COMMON | {"out of range", "after end"}}


@dataclass(frozen=True)
class Mutation:
    id: str
    path: str
    value: Any  # the new value, or DELETE
    valid: bool
    names: tuple[str, ...] = ()  # other paths the refusal may name (what the value contradicts)

    @property
    def op(self) -> str:
        """The operator: "huge", "unknown id", "emptied"..."""
        return self.id.split(" ", 1)[1]


# -- the recordings (once per module) ---------------------------------------------------------

def _record(scenario: str, steps: int, **knobs: Any) -> str:
    import torch

    from engine.model.shared import get_shared_model
    from engine.replay.recording import record
    from engine.replay.run import LiveRun
    from engine.replay.scenario import load_scenario

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    run = LiveRun.from_scenario(load_scenario(scenario), get_shared_model("tiny-random"), **knobs)
    try:
        run.step(steps)
        return to_json(record(run))
    finally:
        run.close()
        torch.set_num_threads(before)


RECORDINGS = {
    "spec": lambda: _record("spec-chat", 6, speculative_config={"method": "draft_model", "num_speculative_tokens": 3,
                                                                "model": "tiny-random"}),
    "prefix": lambda: _record("parallel-sampling", 30, num_blocks=24, kv_cache_dtype="int8"),
    "pipeline": lambda: _record("pipeline", 3, pipeline_layer_split=(1, 1)),
}


@pytest.fixture(scope="module")
def recordings() -> dict[str, str]:
    return {name: make() for name, make in RECORDINGS.items()}


# -- generating mutations -----------------------------------------------------------------------

def _walk(data: Any, path: str = "") -> Iterator[tuple[str, str, Any]]:
    """(path, "Record.field", value) for every field of every tagged record in ``data``."""
    if isinstance(data, dict):
        tag = "RunMeta" if path == "meta" else data.get("_type")
        for k, v in data.items():
            if k == "_type":
                continue
            sub = f"{path}.{k}" if path else k
            if tag is not None:
                yield sub, f"{tag}.{k}", v
            yield from _walk(v, sub)
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _walk(v, f"{path}[{i}]")


def _hint(kind: str) -> tuple[Any, Any]:
    """The field's annotation and its default (MISSING if required)."""
    cls_name, name = kind.split(".")
    cls = CLASSES[cls_name]
    f = next(f for f in fields(cls) if f.name == name)
    return typing.get_type_hints(cls)[name], f.default


def _optional(tp: Any) -> bool:
    return type(None) in typing.get_args(tp)


def _base(tp: Any) -> Any:
    """int / float / str / bool / tuple / a record / an enum, under Annotated and Optional."""
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp = typing.get_args(tp)[0]
        elif type(None) in typing.get_args(tp):
            tp = next(a for a in typing.get_args(tp) if a is not type(None))
        else:
            return origin or tp


# (record.field, operator) -> what the changed value contradicts, where the loader may name that
# instead (paths relative to the mutated record: "^" its parent list, "~" the file's root)
RESTATED = {f"RequestState.{n}": "metrics" for n in ("arrival_step", "num_output_tokens", "num_preemptions",
                                                    "num_cached_tokens")}


CONFIG_STATES = {"Snapshot.kv_bytes_per_token": "meta.kv_bytes_per_token",
                 "ParallelLayout.schedule": "meta.config.pipeline_schedule",
                 **{k: "meta.config.pipeline_layer_split"
                    for k in ("ParallelLayout.stages", "StageLayout.start_layer", "StageLayout.end_layer")}}


SIBLING = {"BlockState.owners": "ref_count", "PrefixNode.block_ids": "token_ids"}


def contradicted(path: str, kind: str) -> tuple[str, ...]:
    """The other fields a mutation of ``kind`` at ``path`` may be refused at: a value restated
    elsewhere (a request's counts in its metrics entry, the first snapshot's geometry and layout
    in the next snapshot, the meta's bytes per token in the first snapshot), or the other end of
    a range / sum the field is one side of."""
    record, name = path.rsplit(".", 1)
    snap = re.match(r"initial|steps\[\d+\]\.(snapshot|trace)|comparison\.\w+\.(final|traces\[\d+\])", path)
    out: list[str] = []
    if kind in RESTATED:
        out.append(path.replace(".requests[", f".{RESTATED[kind]}["))
    if kind == "Snapshot.requests" and snap:
        out += [f"{snap.group(0)}.{n}" for n in ("waiting", "running", "metrics")]
    if kind == "StepTrace.scheduled":
        out.append(f"{record}.num_batched_tokens")
    if kind in SIBLING:  # the two sides of one rule in the same record
        out.append(f"{record}.{SIBLING[kind]}")
    if kind in ("RequestState.block_table", "Snapshot.prefix_tree") and snap:  # blocks' owners / cached marks
        out.append(f"{snap.group(0)}.blocks")
    if kind.startswith(("TensorShard.", "StageLayout.")) and name.endswith("_start"):
        out.append(f"{record}.{name[:-6]}_end")
    if kind == "StageLayout.start_layer":
        out.append(f"{record}.end_layer")
    if kind == "RequestState.request_id" and snap:
        out += [f"{snap.group(0)}.{n}" for n in ("waiting", "running", "blocks")]  # its queue, its blocks' owners
    if kind == "StageLayout.end_layer":
        i = int(record.rsplit("[", 1)[1][:-1])
        out.append(f"{record.rsplit('[', 1)[0]}[{i + 1}].start_layer")
    if path.startswith("initial."):  # the config and the meta state the first snapshot's geometry and layout,
        out.append(CONFIG_STATES.get(kind, "meta.config." + name))  # every later snapshot repeats them
        out.append("steps[0].snapshot" + path[len("initial"):])
    return tuple(out)


def _mutations_of(path: str, kind: str, value: Any, data: dict) -> Iterator[Mutation]:
    names = contradicted(path, kind)
    for m in _mutations_of_field(path, kind, value, data):
        yield Mutation(m.id, m.path, m.value, m.valid, m.names + names) if not m.valid else m


def _mutations_of_field(path: str, kind: str, value: Any, data: dict) -> Iterator[Mutation]:
    tp, default = _hint(kind)
    base, name = _base(tp), kind.split(".")[1]
    opt = _optional(tp)
    yield Mutation(f"{kind} added key", path.rsplit(".", 1)[0] + ".bogus", 1, False)
    if default is MISSING:
        yield Mutation(f"{kind} removed", path, DELETE, False)
    elif value == to_dict(default):
        yield Mutation(f"{kind} removed (was the default)", path, DELETE, True)
    if base is int and not isinstance(value, bool):
        yield Mutation(f"{kind} negative", path, -1, False)
        yield Mutation(f"{kind} string", path, str(value), False)
        yield Mutation(f"{kind} fraction", path, 1.5, False)
        if kind in TOKEN_IDS:
            yield Mutation(f"{kind} other token", path, 1, True)
        elif name not in ("step", "node_id"):  # renumbering: the references say whether it is valid
            yield Mutation(f"{kind} huge", path, HUGE, kind in UNBOUNDED)
    elif base is float:
        yield Mutation(f"{kind} negative", path, -1.0, False)
        yield Mutation(f"{kind} NaN", path, float("nan"), False)
        yield Mutation(f"{kind} string", path, "fast", False)
        if name.endswith("_ms") and name != "start_ms":
            yield Mutation(f"{kind} huge", path, 1e12, True)
        if name in ("p", "q", "prob"):
            yield Mutation(f"{kind} above 1", path, 1.5, False)
    elif base is str and name in ID_FIELDS:
        yield Mutation(f"{kind} unknown id", path, "ghost", False)
        yield Mutation(f"{kind} number", path, 7, False)
    elif base is str and name in TEXTS:
        yield Mutation(f"{kind} changed text", path, "a different text ![x](y)", True)
        yield Mutation(f"{kind} number", path, 7, False)
    elif base is bool:
        yield Mutation(f"{kind} int", path, 1, False)
    elif base is tuple and isinstance(value, list):
        yield from _list_mutations(path, kind, value)
    if not opt and value is not None:
        yield Mutation(f"{kind} null", path, None, False)
    if base not in (tuple, str) and not isinstance(value, dict):
        yield Mutation(f"{kind} array", path, [value], False)
    if name in ("rank", "stage", "tp_rank", "unit"):
        yield Mutation(f"{kind} out of range", path, 99 if name == "rank" else 7, False)
    if kind == "WorkEvent.start_ms":
        end = get_path(data, path.rsplit(".", 1)[0] + ".end_ms")
        if end > value:
            yield Mutation(f"{kind} after end", path, end + 1.0, False, (path.rsplit(".", 1)[0] + ".end_ms",))


def _list_mutations(path: str, kind: str, value: list) -> Iterator[Mutation]:
    name = kind.split(".")[1]
    if value:
        yield Mutation(f"{kind} emptied", path, [], kind in FREE_LISTS
                       or (kind == "Snapshot.prefix_tree" and len(value) == 1))  # a root alone: as caching off
        yield Mutation(f"{kind} item duplicated", path, value + [value[0]], kind in DUPLICATE_FREE)
        if name in ID_FIELDS:
            yield Mutation(f"{kind} unknown id", f"{path}[0]", "ghost", False)
        if kind in NODE_REFS:
            yield Mutation(f"{kind} unknown node", f"{path}[0]", 10**6, False)
    yield Mutation(f"{kind} object", path, {}, False)


def mutations(data: dict) -> list[Mutation]:
    """Up to SAMPLES occurrences of every (record type, field), each mutated every applicable way."""
    seen: dict[str, int] = {}
    out: list[Mutation] = []
    for path, kind, value in _walk(data):
        if seen.get(kind, 0) >= SAMPLES or (isinstance(value, list) and not value and seen.get(kind, 0)):
            continue
        seen[kind] = seen.get(kind, 0) + 1
        out += _mutations_of(path, kind, value, data)
    return out


# -- drawing a replayed run the way the pages do -------------------------------------------------

def draw_every_page(rec: Recording, at: Iterable[int] | None = None) -> None:
    """Every visualizer a page calls for a replayed run (app/app_pages/*.py), at the page's step
    slider positions ``at`` (snapshot indices; default every step)."""
    from engine.parallel.stats import merge_timelines, pipeline_stats
    from visualizers import batching as vb
    from visualizers import comparison as vc
    from visualizers import kv_blocks as kv
    from visualizers import pipeline as pv
    from visualizers import prefix_stats as ps
    from visualizers import prefix_tree as pt
    from visualizers import speculative as sv
    from visualizers.steps import step_table

    for i in sorted(set(range(len(rec.traces) + 1) if at is None else at)):
        traces, snap = rec.traces[:i], rec.snapshots[i]
        last = traces[-1] if traces else None
        vb.timeline_figure(traces, snap)
        vb.latency_figure(snap)
        vb.latency_frame(snap)
        focus = snap.requests[0].request_id if snap.requests else None
        kv.kv_figure(snap, last, focus)
        kv.step_events_markdown(kv.step_events_frame(last))
        frame = kv.waste_frame(snap, rec.meta.max_model_len)
        kv.waste_figure(frame, snap.num_blocks * snap.block_size, snap.step)
        kv.block_table_frame(snap)
        pt.tree_figure(snap, last, traces)
        pt.tree_frame(snap)
        ps.cache_figure(traces, snap)
        ps.cache_stats_frame(traces)
        sv.spec_summary(traces)
        sv.drafts_figure(last, 12, i)
        sv.tokens_per_step_figure(traces, 12, i)
        sv.spec_requests_frame(traces)
        for rid in {v.request_id for t in traces for v in t.spec}:
            sv.spec_text_markdown(traces, rid)
            mine = next((v for t in reversed(traces) for v in t.spec if v.request_id == rid and v.drafts), None)
            if mine is not None:
                sv.pq_figure(mine)
        step_table(traces)
        timed = pv.timed_steps(traces)
        if timed:
            timeline = merge_timelines([line for _, line in timed])
            pipeline_stats(timeline)
            pv.gantt_figure(timeline, snap.parallel, 12, i)
            pv.gantt_figure(timed[-1][1], snap.parallel, 12, i)
            pv.stats_frame(traces)
    if rec.comparison:
        vc.latency_comparison_figure(rec.comparison)


# -- running one mutation -------------------------------------------------------------------------

_STEP = re.compile(r"steps\[(\d+)\]")


def mutated_file(data: dict, m: Mutation) -> tuple[dict, tuple[int, ...]]:
    """The parsed recording with ``m`` applied (copies along its path, the rest shared), and the
    step slider positions that show it. A mutation inside ``steps[k]`` keeps steps 0..k only: a
    prefix of a valid run is a valid recording, every rule about step k reads steps <= k, and the
    changed records show from snapshot k+1 on (the last one kept)."""
    step = _STEP.match(m.path)
    if step is not None:
        k = int(step.group(1))
        data = {**data, "steps": data["steps"][:k + 1]}
        return set_path(data, m.path, m.value), (k + 1,)
    return set_path(data, m.path, m.value), (0, len(data["steps"]))


def names(message: str, m: Mutation) -> bool:
    """The refusal ``recording: <path>: <problem>`` points at the mutated value: its path is
    ``m.path`` or inside it, or one of ``m.names`` (what the value contradicts) or inside it."""
    head, sep, _ = message.partition(": ")
    path, sep2, _ = message[len(head) + 2:].partition(": ")
    if head != "recording" or not sep or not sep2:
        return False
    return any(path == p or path.startswith((f"{p}.", f"{p}[")) for p in (m.path, *m.names))


def judge(data: dict, m: Mutation, draw: bool) -> str | None:
    """What is wrong with how the loader (and, for an accepted file, the pages) took ``m``; None
    if nothing. Anything raised other than the loader's ValueError propagates and fails the test."""
    blob, at = mutated_file(data, m)
    try:
        loaded = from_data(blob)
    except ValueError as e:
        message = str(e)
        if m.valid:
            return f"{m.id} @ {m.path}: a valid file refused: {message}"
        if not names(message, m):
            return f"{m.id} @ {m.path}: the message does not name the path: {message}"
        return None
    if draw or not m.valid:
        draw_every_page(loaded, at)
    return None if m.valid else f"{m.id} @ {m.path}: nonsense accepted"


def drawn(cases: list[Mutation]) -> set[str]:
    """The valid mutations whose accepted files the default run draws: one per operator, then a
    fixed-seed sample up to ``DRAWN`` (drawing a page costs about as much as 100 loads); every one
    with ``INFERSCOPE_MUTATIONS=all``."""
    valid = [m for m in cases if m.valid]
    if EXHAUSTIVE:
        return {m.id + m.path for m in valid}
    rng = random.Random(SEED)
    rng.shuffle(valid)
    chosen: dict[str, Mutation] = {}
    for m in valid:
        chosen.setdefault(m.op, m)
    for m in valid:
        if len(chosen) >= DRAWN:
            break
        chosen.setdefault(m.id + m.path, m)
    return {m.id + m.path for m in chosen.values()}


# -- the tests ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(RECORDINGS))
def test_every_mutation_is_refused_naming_its_path_or_loads_and_draws(recordings: dict[str, str], name: str) -> None:
    text = recordings[name]
    original = from_json(text)
    assert to_json(original) == text
    draw_every_page(original, (0, len(original.traces)))
    data = json.loads(text)
    cases = mutations(data)
    assert len(cases) >= 500, len(cases)
    assert {m.op for m in cases} >= OPERATORS[name], OPERATORS[name] - {m.op for m in cases}
    draw = drawn(cases)
    wrong = [w for m in cases if (w := judge(data, m, m.id + m.path in draw)) is not None]
    assert not wrong, f"{len(wrong)} of {len(cases)}:\n" + "\n".join(wrong)


# -- regressions: issue #26 items 2 and 3 -------------------------------------------------------

def test_pipeline_recording_with_a_layer_split_round_trips(recordings: dict[str, str]) -> None:
    """Item 2: a run recorded with pipeline_layer_split loaded back (it was refused: "must be a
    string, a finite number, true/false or null, got an array"); the tuple is kept and the
    replayed records equal the recorded ones."""
    text = recordings["pipeline"]
    loaded = from_json(text)
    assert loaded.meta.config.parallel_config.pipeline_layer_split == (1, 1)
    assert type(loaded.meta.config.parallel_config.pipeline_layer_split) is tuple
    assert to_json(loaded) == text and from_json(to_json(loaded)) == loaded
    assert all(t.pipeline is not None for t in loaded.traces)
    draw_every_page(loaded)


def test_event_on_a_worker_the_layout_lacks_is_refused(recordings: dict[str, str]) -> None:
    """Item 3: an event with rank 99 was accepted and raised IndexError in the Pipeline page's Gantt
    (the split is left to its default, the same even layout, so the file reached that far before
    item 2's fix too)."""
    data = set_path(json.loads(recordings["pipeline"]), "meta.config.pipeline_layer_split", DELETE)
    draw_every_page(from_json(dumps(data)), (2,))
    path = "steps[1].trace.pipeline.events[0].rank"
    with pytest.raises(ValueError, match=re.escape(f"recording: {path}: must be stage x t + tp_rank")):
        from_json(dumps(set_path(data, path, 99)))
