"""Record a run to JSON and load it back, to replay without the model (talks on any laptop).

File format (``"format": "inferscope-recording"``, version 1)::

    {"format": ..., "version": 1,
     "meta": {model, scenario, title, config, max_model_len, kv_bytes_per_token, chat_template},
     "initial": <Snapshot before step 0>,
     "steps": [{"trace": <StepTrace>, "snapshot": <Snapshot after it>}, ...],
     "comparison": {"static": {"traces": [...], "final": <Snapshot>}, ...}}

Records are serialised with ``engine.trace.to_dict`` (type-tagged), so loading gives back the
same frozen records the live engine produced and the views cannot tell the difference.

Loading trusts nothing (a recording is a file someone shared). ``from_json`` refuses, with one
ValueError naming the path of the first bad value (``recording: steps[3].trace.scheduled[0].
num_tokens: must be an integer >= 1, got -2``):

* a file over ``MAX_BYTES`` (50 MiB; a finished demo scenario records to about 2 MB), JSON
  nested deeper than ``MAX_DEPTH`` (checked before parsing, so no RecursionError), invalid JSON;
* any value whose type or range does not match its record field (the annotations in
  ``engine.trace`` / ``engine.run.RunMeta``: counts >= 0, sizes >= 1, finite timings >= 0, no
  NaN, no unknown or missing keys) - see ``engine.schema``;
* anything inconsistent the views rely on (``check_snapshot`` / ``check_trace`` /
  ``check_history``): block ids below ``num_blocks`` and equal to their position, fill <=
  block_size, request ids that exist and are unique, step numbers consecutive from 0, free +
  used = num_blocks, batched tokens = the chunks' sum <= the budget, one block geometry
  throughout, a config the engine accepts.
"""
from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal, Mapping

from engine.config import EngineConfig
from engine.run import PolicyRun, RunMeta
from engine.schema import SchemaError, decode, key_segment, show
from engine.trace import TAGGED, Snapshot, StepTrace, to_dict

FORMAT = "inferscope-recording"
VERSION = 1
MAX_BYTES = 50 * 1024 * 1024  # 50 MiB: an upload larger than this is refused unread
MAX_DEPTH = 32  # arrays/objects nested deeper than this are refused before parsing (the format needs 7)
POLICIES = ("static", "continuous")


@dataclass(frozen=True)
class Recording:
    meta: RunMeta
    traces: tuple[StepTrace, ...]
    snapshots: tuple[Snapshot, ...]  # snapshots[0] before any step, snapshots[i] after step i-1
    comparison: Mapping[str, PolicyRun] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.snapshots) != len(self.traces) + 1:
            raise ValueError("recording: needs one snapshot before the first step and one after each step")


# The file's own layout, as dataclasses, so engine.schema checks it like the records inside.
@dataclass(frozen=True)
class StepEntry:
    trace: StepTrace
    snapshot: Snapshot


@dataclass(frozen=True)
class PolicyRunEntry:
    traces: tuple[StepTrace, ...]
    final: Snapshot


@dataclass(frozen=True)
class RecordingFile:
    format: Literal["inferscope-recording"]
    version: Literal[1]
    meta: RunMeta
    initial: Snapshot
    steps: tuple[StepEntry, ...]
    comparison: Mapping[str, PolicyRunEntry] = field(default_factory=dict)


def record(run: Any) -> Recording:
    """The history of a LiveRun (or a ReplayRun's own recording) as a Recording."""
    if getattr(run, "is_replay", False):
        return run.recording
    with run.lock:
        return Recording(run.meta, tuple(run.traces), tuple(run.snapshots), dict(run.comparison))


def to_json(recording: Recording) -> str:
    data = {
        "format": FORMAT,
        "version": VERSION,
        "meta": asdict(recording.meta),
        "initial": to_dict(recording.snapshots[0]),
        "steps": [{"trace": to_dict(t), "snapshot": to_dict(s)}
                  for t, s in zip(recording.traces, recording.snapshots[1:])],
        "comparison": {p: {"traces": to_dict(r.traces), "final": to_dict(r.final)}
                       for p, r in recording.comparison.items()},
    }
    return json.dumps(data, separators=(",", ":"))


def from_json(text: str | bytes) -> Recording:
    """Parse and validate a recording; anything malformed is one ValueError starting
    ``recording:`` that names the path of the bad value (see the module docstring)."""
    try:
        data = parse(text)
        check_header(data)
        file = decode(RecordingFile, data, TAGGED)
        return to_recording(file)
    except SchemaError as e:
        raise ValueError(f"recording: {e}") from None


# -- parsing ----------------------------------------------------------------------------------

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_INNERMOST = re.compile(r"\[\]|\{\}")


def parse(text: str | bytes) -> Any:
    """JSON text -> Python data, refusing what is too big, too deep or not JSON (SchemaError)."""
    if not isinstance(text, (str, bytes, bytearray)):
        raise SchemaError(f"must be JSON text, got {type(text).__name__}")
    size = len(text) if not isinstance(text, str) else len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_BYTES:
        raise SchemaError(f"the file is {size / 2**20:.1f} MiB; recordings are limited to "
                          f"{MAX_BYTES // 2**20} MiB")
    if not isinstance(text, str):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise SchemaError(f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    if nesting_depth(text) > MAX_DEPTH:
        raise SchemaError(f"JSON nested deeper than {MAX_DEPTH} levels; a recording needs 7")
    try:
        return json.loads(text)
    except RecursionError:  # belt and braces: nesting_depth should have refused it
        raise SchemaError(f"JSON nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as e:  # JSONDecodeError, or an integer literal over Python's digit limit
        raise SchemaError(f"not valid JSON ({e})") from None


def nesting_depth(text: str) -> int:
    """How deeply arrays/objects nest in ``text`` (strings skipped), without recursion.

    Innermost ``[]`` / ``{}`` pairs are peeled off one level per pass (each pass a C-speed
    regex substitution), stopping one pass past ``MAX_DEPTH``; malformed bracketing stops early
    and is left for the JSON parser to report.
    """
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    depth = 0
    while brackets and depth <= MAX_DEPTH:
        peeled = _INNERMOST.sub("", brackets)
        if peeled == brackets:
            break
        brackets, depth = peeled, depth + 1
    return depth


def check_header(data: Any) -> None:
    """The format tag and version, checked first so an old or foreign file says what it is."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise SchemaError(f"not an InferScope recording (expected \"format\": \"{FORMAT}\")")
    version = data.get("version")
    if type(version) is not int or version != VERSION:
        raise SchemaError(f"version {show(version)} is not supported (expected {VERSION})", "version")


# -- consistency the views rely on ------------------------------------------------------------

def _require(ok: bool, path: str, problem: str) -> None:
    if not ok:
        raise SchemaError(problem, path)


def _within(path: str, check: Any, *args: Any) -> None:
    """Run ``check(*args)``; a SchemaError it raises gets ``path`` in front of its own."""
    try:
        check(*args)
    except SchemaError as e:
        raise e.under(path) from None


def _unique(ids: Sequence[str], path: str, what: str) -> None:
    """No id twice in ``ids`` (the ``request_id`` field of the items at ``path``)."""
    seen: set[str] = set()
    for i, rid in enumerate(ids):
        _require(rid not in seen, f"{path}[{i}].request_id", f"{what} {show(rid)} appears twice")
        seen.add(rid)


def _known(ids: Iterable[str], known: set[str], path: str, suffix: str = "") -> None:
    """Every id in ``ids`` names a request of the snapshot (``suffix``: the id's field in an item)."""
    for i, rid in enumerate(ids):
        _require(rid in known, f"{path}[{i}]{suffix}", f"request {show(rid)} is not in the snapshot's requests")


def _block_ids(ids: Sequence[int], num_blocks: int, path: str) -> None:
    for i, b in enumerate(ids):
        _require(b < num_blocks, f"{path}[{i}]", f"block id must be < num_blocks = {num_blocks}, got {b}")


def check_snapshot(s: Snapshot) -> None:
    """One snapshot on its own: every block once, in order; fills within a block; block tables
    and owners that agree; request ids unique; queues and metrics naming known requests."""
    _require(len(s.blocks) == s.num_blocks, "blocks",
             f"must list every block: num_blocks is {s.num_blocks}, got {len(s.blocks)} blocks")
    ids = [r.request_id for r in s.requests]
    _unique(ids, "requests", "request id")
    known = set(ids)
    for i, b in enumerate(s.blocks):
        path = f"blocks[{i}]"
        _require(b.block_id == i, f"{path}.block_id", f"must be {i} (blocks are listed in id order), got {b.block_id}")
        _require(b.num_tokens <= s.block_size, f"{path}.num_tokens",
                 f"must be <= block_size = {s.block_size}, got {b.num_tokens}")
        _require(len(b.token_ids) == b.num_tokens, f"{path}.token_ids",
                 f"must hold num_tokens = {b.num_tokens} ids, got {len(b.token_ids)}")
        _require(b.ref_count >= len(b.owners), f"{path}.ref_count",
                 f"must be >= the number of owners ({len(b.owners)}), got {b.ref_count}")
        _require(b.ref_count == 0 or len(b.owners) > 0, f"{path}.owners",
                 f"a block in use (ref_count {b.ref_count}) must name its owners")
        _known(b.owners, known, f"{path}.owners")
    owners = {b.block_id: set(b.owners) for b in s.blocks}
    for i, r in enumerate(s.requests):
        path = f"requests[{i}].block_table"
        _block_ids(r.block_table, s.num_blocks, path)
        for j, block_id in enumerate(r.block_table):
            _require(r.request_id in owners[block_id], f"{path}[{j}]",
                     f"block {block_id} does not list request {show(r.request_id)} among its owners")
    _known(s.waiting, known, "waiting")
    _known(s.running, known, "running")
    _check_tree(s)
    metric_ids = [m.request_id for m in s.metrics]
    _unique(metric_ids, "metrics", "request id")
    _known(metric_ids, known, "metrics", ".request_id")


def _check_tree(s: Snapshot) -> None:
    """The radix tree: one root first, parents before children, whole blocks, and each node's
    blocks marked cached in the pool, every cached block in exactly one node."""
    if not s.prefix_tree:
        _require(not any(b.cached for b in s.blocks), "blocks", "blocks are cached but prefix_tree is empty")
        return
    seen: set[int] = set()
    in_tree: set[int] = set()
    for i, node in enumerate(s.prefix_tree):
        path = f"prefix_tree[{i}]"
        _require(node.node_id not in seen, f"{path}.node_id", f"node id {node.node_id} appears twice")
        if i == 0:
            _require(node.parent_id is None and not node.token_ids, path, "the first node must be the empty root")
        else:
            _require(node.parent_id in seen, f"{path}.parent_id", "must name a node listed before it")
        _require(len(node.token_ids) == len(node.block_ids) * s.block_size, f"{path}.token_ids",
                 f"must hold block_size x {len(node.block_ids)} blocks = {len(node.block_ids) * s.block_size} "
                 f"ids, got {len(node.token_ids)}")
        _block_ids(node.block_ids, s.num_blocks, f"{path}.block_ids")
        for j, b in enumerate(node.block_ids):
            _require(b not in in_tree, f"{path}.block_ids[{j}]", f"block {b} is in two nodes")
            _require(s.blocks[b].cached, f"{path}.block_ids[{j}]", f"block {b} is not marked cached")
            in_tree.add(b)
        seen.add(node.node_id)
    stray = [b.block_id for b in s.blocks if b.cached and b.block_id not in in_tree]
    _require(not stray, "blocks", f"blocks {stray[:5]} are marked cached but in no node")


def check_trace(t: StepTrace, after: Snapshot) -> None:
    """One step against the snapshot taken after it: requests it names exist, block ids are in
    the pool, its counts add up (free + used = num_blocks, batched = sum of chunks <= budget)."""
    known = {r.request_id for r in after.requests}
    chunk_ids = [c.request_id for c in t.scheduled]
    _unique(chunk_ids, "scheduled", "request")
    _known(chunk_ids, known, "scheduled", ".request_id")
    for name in ("arrived", "preempted", "finished"):
        _known(getattr(t, name), known, name)
    _known([x.request_id for x in t.sampled], known, "sampled", ".request_id")
    _block_ids(t.blocks_allocated, after.num_blocks, "blocks_allocated")
    _block_ids(t.blocks_freed, after.num_blocks, "blocks_freed")
    _require(t.num_free_blocks + t.num_used_blocks + t.num_evictable_blocks == after.num_blocks, "num_used_blocks",
             f"num_free_blocks + num_used_blocks + num_evictable_blocks must be num_blocks = {after.num_blocks}, "
             f"got {t.num_free_blocks} + {t.num_used_blocks} + {t.num_evictable_blocks}")
    _require(t.num_evictable_blocks <= t.num_cached_blocks, "num_evictable_blocks",
             f"must be <= num_cached_blocks = {t.num_cached_blocks}, got {t.num_evictable_blocks}")
    total = sum(c.num_tokens for c in t.scheduled)
    _require(t.num_batched_tokens == total, "num_batched_tokens",
             f"must be the scheduled chunks' sum ({total}), got {t.num_batched_tokens}")
    _require(total <= t.token_budget, "num_batched_tokens",
             f"must be <= token_budget = {t.token_budget}, got {total}")


def _step(actual: int, i: int, path: str) -> None:
    _require(actual == i, f"{path}.step", f"must be {i} (steps are numbered from 0 without gaps), got {actual}")


def _same_geometry(s: Snapshot, first: Snapshot, path: str, like: str) -> None:
    """``s`` has ``first``'s block geometry (``like``: how the message names ``first``)."""
    for name in ("block_size", "num_blocks", "kv_bytes_per_token"):
        _require(getattr(s, name) == getattr(first, name), f"{path}.{name}",
                 f"must be {getattr(first, name)} like {like}, got {getattr(s, name)}")


def snapshot_path(i: int) -> str:
    """Where snapshot i sits in the file: ``initial`` before step 0, then after each step."""
    return "initial" if i == 0 else f"steps[{i - 1}].snapshot"


def check_history(traces: Sequence[StepTrace], snapshots: Sequence[Snapshot]) -> None:
    """A run's steps in order: step i's trace says step i and is followed by snapshot i+1;
    snapshot i says step i; every snapshot has the first one's block geometry."""
    first = snapshots[0]
    for i, s in enumerate(snapshots):
        path = snapshot_path(i)
        _step(s.step, i, path)
        _same_geometry(s, first, path, "the first snapshot's")
        _within(path, check_snapshot, s)
    for i, t in enumerate(traces):
        path = f"steps[{i}].trace"
        _step(t.step, i, path)
        _within(path, check_trace, t, snapshots[i + 1])


def check_meta(meta: RunMeta, first: Snapshot) -> None:
    """The run's config must be one the engine accepts, with the snapshots' block geometry."""
    known = {f.name for f in fields(EngineConfig)}
    for key in meta.config:
        close = difflib.get_close_matches(key, sorted(known), 1)
        _require(key in known, f"meta.config.{key_segment(key)}",
                 "unknown engine setting" + (f" (did you mean {close[0]!r}?)" if close else
                                             " (the EngineConfig fields are listed in engine/config.py)"))
    try:
        config = EngineConfig(**meta.config)
    except (ValueError, TypeError) as e:  # EngineConfig names the field first: "block_size: must be >= 1, got 0"
        name, _, problem = str(e).partition(": ")
        if name.split(".")[0] in known and problem:
            raise SchemaError(problem, f"meta.config.{name}") from None
        raise SchemaError(str(e), "meta.config") from None
    for name in ("block_size", "num_blocks"):
        _require(getattr(config, name) == getattr(first, name), f"meta.config.{name}",
                 f"must match the snapshots' {name} = {getattr(first, name)}, got {getattr(config, name)}")
    _require(meta.kv_bytes_per_token == first.kv_bytes_per_token, "meta.kv_bytes_per_token",
             f"must match the snapshots' kv_bytes_per_token = {first.kv_bytes_per_token}, "
             f"got {meta.kv_bytes_per_token}")


def check_comparison(comparison: Mapping[str, PolicyRunEntry], first: Snapshot) -> None:
    """Side-by-side runs: known policy names, each a complete history on the same pool."""
    for policy, run in comparison.items():
        path = f"comparison.{key_segment(policy)}"
        _require(policy in POLICIES, path, f"unknown policy (expected {' or '.join(POLICIES)})")
        final = run.final
        _require(final.step == len(run.traces), f"{path}.final.step",
                 f"must be the number of traces ({len(run.traces)}), got {final.step}")
        _same_geometry(final, first, f"{path}.final", "the recording's snapshots")
        _within(f"{path}.final", check_snapshot, final)
        for i, t in enumerate(run.traces):
            _step(t.step, i, f"{path}.traces[{i}]")
            _within(f"{path}.traces[{i}]", check_trace, t, final)


def to_recording(file: RecordingFile) -> Recording:
    """A decoded file -> Recording, after every consistency check above."""
    traces = tuple(s.trace for s in file.steps)
    snapshots = (file.initial, *(s.snapshot for s in file.steps))
    check_history(traces, snapshots)
    check_meta(file.meta, file.initial)
    check_comparison(file.comparison, file.initial)
    comparison = {p: PolicyRun(p, r.traces, r.final) for p, r in file.comparison.items()}
    return Recording(file.meta, traces, snapshots, comparison)
