"""Record a run to JSON and load it back, to replay without the model (talks on any laptop).

File format (``"format": "inferscope-recording"``, version 1)::

    {"format": ..., "version": 1,
     "meta": {model, scenario, title, config, max_model_len, kv_bytes_per_token, chat_template},
     "initial": <Snapshot before step 0>,
     "steps": [{"trace": <StepTrace>, "snapshot": <Snapshot after it>}, ...],
     "comparison": {"static": {"traces": [...], "final": <Snapshot>}, ...}}

Records are serialised with ``engine.core.trace.to_dict`` (type-tagged), so loading gives back the
same frozen records the live engine produced and the views cannot tell the difference.

Loading trusts nothing (a recording is a file someone shared). ``from_json`` refuses, with one
ValueError naming the path of the first bad value (``recording: steps[3].trace.scheduled[0].
num_tokens: must be an integer >= 1, got -2``):

* a file over ``MAX_BYTES`` (50 MiB; a finished demo scenario records to about 2 MB), JSON
  nested deeper than ``MAX_DEPTH`` (checked before parsing, so no RecursionError), invalid JSON;
* any value whose type or range does not match its record field (the annotations in
  ``engine.core.trace`` / ``engine.replay.run.RunMeta``: counts >= 0, sizes >= 1, finite timings >= 0, no
  NaN, no unknown or missing keys) - see ``engine.core.schema``;
* anything inconsistent the views rely on (``check_snapshot`` / ``check_trace`` /
  ``check_history``): block ids below ``num_blocks`` and equal to their position, fill <=
  block_size, request ids that exist and are unique, step numbers consecutive from 0, free +
  used = num_blocks, batched tokens = the chunks' sum <= the budget, one block geometry
  throughout, a config the engine accepts.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Annotated, Any, Literal, Mapping

from engine.core.config import (KNOB_PLACES, MAX_MODEL_LEN, MAX_TOKENS, MAX_MICROBATCHES,
                                MAX_SPECULATIVE_TOKENS, MAX_WORKERS, EngineConfig, unknown_knob)
from engine.replay.run import Name, PolicyRun, RunMeta, Title
from engine.core.schema import Nested, SchemaError, decode, key_segment, show
from engine.core.trace import (TAGGED, Positive, ParallelLayout, PipelineTimeline, PrefixCacheEvents, PrefixNode, RequestState,
                          RequestStatus, ScheduledChunk, Snapshot, StepTrace, to_dict)

QUEUED = (RequestStatus.PENDING, RequestStatus.WAITING, RequestStatus.PREEMPTED)
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
class MetaEntry:
    """RunMeta as the file holds it: the config as its flat knobs (``EngineConfig.to_knobs``, the
    form every recording has had), turned into an EngineConfig by ``check_meta``."""

    model: Name
    scenario: Name
    title: Title
    config: Annotated[Mapping[str, Any], Nested(("speculative_config",))]
    max_model_len: Positive
    kv_bytes_per_token: Positive
    chat_template: bool = False


@dataclass(frozen=True)
class RecordingFile:
    format: Literal["inferscope-recording"]
    version: Literal[1]
    meta: MetaEntry
    initial: Snapshot
    steps: tuple[StepEntry, ...]
    comparison: Mapping[str, PolicyRunEntry] = field(default_factory=dict)


def record(run: Any) -> Recording:
    """The history of a LiveRun (or a ReplayRun's own recording) as a Recording."""
    if getattr(run, "is_replay", False):
        recording: Recording = run.recording
        return recording
    with run.lock:
        return Recording(run.meta, tuple(run.traces), tuple(run.snapshots), dict(run.comparison))


def to_json(recording: Recording) -> str:
    data = {
        "format": FORMAT,
        "version": VERSION,
        "meta": {**{f.name: getattr(recording.meta, f.name) for f in fields(MetaEntry)},
                 "config": recording.meta.config.to_knobs()},
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
    except SchemaError as e:
        raise ValueError(f"recording: {e}") from None
    return from_data(data)


def from_data(data: Any) -> Recording:
    """``from_json`` after parsing: already-parsed JSON data (dicts, lists, scalars) checked and
    decoded the same way, with the same ValueError."""
    try:
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


def _unique_ids(ids: Sequence[str], path: str) -> None:
    """No id twice in the list of ids at ``path``."""
    seen: set[str] = set()
    for i, rid in enumerate(ids):
        _require(rid not in seen, f"{path}[{i}]", f"request {show(rid)} appears twice")
        seen.add(rid)


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
    and owners that agree exactly (ref_count = owners); request ids unique; queues naming known
    requests, each request in its status's queue; one metrics entry per request, agreeing with it; the tree and the layout."""
    _require(len(s.blocks) == s.num_blocks, "blocks",
             f"must list every block: num_blocks is {s.num_blocks}, got {len(s.blocks)} blocks")
    ids = [r.request_id for r in s.requests]
    _unique(ids, "requests", "request id")
    known = set(ids)
    for name, statuses in (("waiting", QUEUED), ("running", (RequestStatus.RUNNING,))):
        ids = getattr(s, name)
        _known(ids, known, name)
        _unique_ids(ids, name)
        want = sum(1 for r in s.requests if r.status in statuses)
        _require(len(ids) == want, name, f"must list the {want} requests whose status is "
                 f"{' or '.join(st.value for st in statuses)}, got {len(ids)}")
    for i, b in enumerate(s.blocks):
        path = f"blocks[{i}]"
        _require(b.block_id == i, f"{path}.block_id", f"must be {i} (blocks are listed in id order), got {b.block_id}")
        _require(b.num_tokens <= s.block_size, f"{path}.num_tokens",
                 f"must be <= block_size = {s.block_size}, got {b.num_tokens}")
        _require(len(b.token_ids) == b.num_tokens, f"{path}.token_ids",
                 f"must hold num_tokens = {b.num_tokens} ids, got {len(b.token_ids)}")
        _require(b.ref_count == len(b.owners), f"{path}.ref_count",
                 f"must be the number of owners ({len(b.owners)}), got {b.ref_count}")
        _known(b.owners, known, f"{path}.owners")
    _check_requests(s, known)
    _check_owners(s)
    _check_tree(s)
    _check_metrics(s)
    if s.parallel is not None:
        _within("parallel", check_layout, s.parallel)


def _check_requests(s: Snapshot, known: set[str]) -> None:
    """Each request: listed in the queue of its status (waiting / running); a block table of
    distinct pool blocks that list it as an owner (only a running request holds blocks), counts
    within its tokens (computed <= prompt + output, output <= max_tokens, cached <= prompt),
    arrival and preemptions no later than the snapshot, a parent that exists."""
    queued, running = set(s.waiting), set(s.running)
    for i, r in enumerate(s.requests):
        path = f"requests[{i}]"
        queue = "running" if r.status is RequestStatus.RUNNING else "waiting" if r.status in QUEUED else None
        _require(queue is None or r.request_id in (running if queue == "running" else queued), f"{path}.request_id",
                 f"a {r.status.value} request is listed in {queue}; {show(r.request_id)} is not")
        _block_ids(r.block_table, s.num_blocks, f"{path}.block_table")
        _require(not r.block_table or r.status is RequestStatus.RUNNING, f"{path}.block_table",
                 f"a {r.status.value} request holds no blocks, got {len(r.block_table)}")
        seen: set[int] = set()
        for j, block_id in enumerate(r.block_table):
            _require(block_id not in seen, f"{path}.block_table[{j}]", f"block {block_id} appears twice")
            _require(r.request_id in s.blocks[block_id].owners, f"{path}.block_table[{j}]",
                     f"block {block_id} does not list request {show(r.request_id)} among its owners")
            seen.add(block_id)
        total = r.num_prompt_tokens + r.num_output_tokens
        _require(r.num_computed_tokens <= total, f"{path}.num_computed_tokens",
                 f"must be <= num_prompt_tokens + num_output_tokens = {total}, got {r.num_computed_tokens}")
        _require(r.max_tokens <= MAX_TOKENS, f"{path}.max_tokens", f"must be <= {MAX_TOKENS}, got {r.max_tokens}")
        _require(r.num_output_tokens <= r.max_tokens, f"{path}.num_output_tokens",
                 f"must be <= max_tokens = {r.max_tokens}, got {r.num_output_tokens}")
        _require(r.num_cached_tokens <= r.num_prompt_tokens, f"{path}.num_cached_tokens",
                 f"must be <= num_prompt_tokens = {r.num_prompt_tokens}, got {r.num_cached_tokens}")
        _require(r.num_preemptions <= s.step, f"{path}.num_preemptions",
                 f"must be <= the step ({s.step}): one preemption per step at most, got {r.num_preemptions}")
        _require(r.status is RequestStatus.PENDING or r.arrival_step <= s.step, f"{path}.arrival_step",
                 f"a {r.status.value} request arrived by step {s.step}, got {r.arrival_step}")
        _require(r.parent_id is None or r.parent_id in known, f"{path}.parent_id",
                 f"request {show(r.parent_id)} is not in the snapshot's requests")


def _check_owners(s: Snapshot) -> None:
    """Each block's owners: exactly the requests whose block table holds it, each once."""
    holders: dict[int, int] = {}
    for r in s.requests:
        for block_id in r.block_table:
            holders[block_id] = holders.get(block_id, 0) + 1
    for i, b in enumerate(s.blocks):
        _require(len(set(b.owners)) == len(b.owners) == holders.get(i, 0), f"blocks[{i}].owners",
                 f"must name each request whose block table holds block {i} once ({holders.get(i, 0)}), "
                 f"got {len(b.owners)}")


def _check_metrics(s: Snapshot) -> None:
    """One metrics entry per request, in the requests' order, repeating its counts; steps in
    order (arrival <= first token <= finished <= the snapshot); finished iff the request is."""
    _require(len(s.metrics) == len(s.requests), "metrics",
             f"must hold one entry per request ({len(s.requests)}), got {len(s.metrics)}")
    for i, (m, r) in enumerate(zip(s.metrics, s.requests)):
        path = f"metrics[{i}]"
        _require(m.request_id == r.request_id, f"{path}.request_id",
                 f"must be {show(r.request_id)} (metrics follow the requests' order), got {show(m.request_id)}")
        for name in ("arrival_step", "num_output_tokens", "num_preemptions", "num_cached_tokens"):
            _require(getattr(m, name) == getattr(r, name), f"{path}.{name}",
                     f"must equal the request's {name} ({getattr(r, name)}), got {getattr(m, name)}")
        first, done = m.first_token_step, m.finished_step
        _require(first is None or m.arrival_step <= first <= s.step, f"{path}.first_token_step",
                 f"must be in arrival_step .. step = {m.arrival_step} .. {s.step}, got {first}")
        _require((done is None) == (r.status is not RequestStatus.FINISHED), f"{path}.finished_step",
                 f"must be {'set' if done is None else 'null'} for a {r.status.value} request, got {show(done)}")
        _require(done is None or m.arrival_step <= done <= s.step, f"{path}.finished_step",
                 f"must be in arrival_step .. step = {m.arrival_step} .. {s.step}, got {done}")
        _require(m.ttft_steps is None or m.ttft_steps <= s.step + 1, f"{path}.ttft_steps",
                 f"must be <= step + 1 = {s.step + 1}, got {m.ttft_steps}")
        _require(m.num_accepted_tokens <= m.num_draft_tokens, f"{path}.num_accepted_tokens",
                 f"must be <= num_draft_tokens = {m.num_draft_tokens}, got {m.num_accepted_tokens}")
        _require(m.num_draft_tokens <= m.num_verify_steps * MAX_SPECULATIVE_TOKENS, f"{path}.num_draft_tokens",
                 f"must be <= {MAX_SPECULATIVE_TOKENS} per verify step ({m.num_verify_steps}), got {m.num_draft_tokens}")
        _require(m.num_verify_steps <= s.step, f"{path}.num_verify_steps",
                 f"must be <= the step ({s.step}), got {m.num_verify_steps}")


def check_layout(layout: ParallelLayout) -> None:
    """The layer split: stage i owns the layers after stage i-1's (from 0, at least one each),
    p stages; t tensor shards numbered 0 .. t-1, each range start <= end."""
    p, t = layout.pipeline_parallel_size, layout.tensor_parallel_size
    for name in ("pipeline_parallel_size", "tensor_parallel_size"):
        _require(getattr(layout, name) <= MAX_WORKERS, name, f"must be <= {MAX_WORKERS}, got {getattr(layout, name)}")
    _require(layout.num_workers <= MAX_WORKERS, "tensor_parallel_size",
             f"pipeline_parallel_size x tensor_parallel_size must be <= {MAX_WORKERS}, got {p} x {t}")
    _require(layout.num_microbatches <= MAX_MICROBATCHES, "num_microbatches",
             f"must be <= {MAX_MICROBATCHES}, got {layout.num_microbatches}")
    _require(len(layout.stages) == p, "stages", f"must list pipeline_parallel_size = {p} stages, got {len(layout.stages)}")
    _require(len(layout.shards) == t, "shards", f"must list tensor_parallel_size = {t} shards, got {len(layout.shards)}")
    end = 0
    for i, st in enumerate(layout.stages):
        _require(st.stage == i, f"stages[{i}].stage", f"must be {i}, got {st.stage}")
        _require(st.start_layer == end, f"stages[{i}].start_layer", f"must be {end} (the previous stage's end), got {st.start_layer}")
        _require(st.end_layer > st.start_layer, f"stages[{i}].end_layer",
                 f"must be > start_layer = {st.start_layer}, got {st.end_layer}")
        end = st.end_layer
    for i, sh in enumerate(layout.shards):
        _require(sh.tp_rank == i, f"shards[{i}].tp_rank", f"must be {i}, got {sh.tp_rank}")
        for name in ("q", "kv", "mlp"):
            lo, hi = getattr(sh, f"{name}_start"), getattr(sh, f"{name}_end")
            _require(lo < hi, f"shards[{i}].{name}_end", f"must be > {name}_start = {lo}, got {hi}")


def _check_tree(s: Snapshot) -> None:
    """The radix tree: one root first, parents before children, whole blocks, and each node's
    blocks marked cached in the pool, every cached block in exactly one node."""
    if not s.prefix_tree:
        _require(not any(b.cached for b in s.blocks), "blocks", "blocks are cached but prefix_tree is empty")
        return
    seen: set[int] = set()
    in_tree: set[int] = set()
    active = sum(1 for r in s.requests if r.status is not RequestStatus.FINISHED)
    admissions = sum(1 + r.num_preemptions for r in s.requests)
    for i, node in enumerate(s.prefix_tree):
        path = f"prefix_tree[{i}]"
        _require(node.node_id not in seen, f"{path}.node_id", f"node id {node.node_id} appears twice")
        if i == 0:
            _require(node.parent_id is None, f"{path}.parent_id", f"the first node is the root: null, got {show(node.parent_id)}")
            _require(not node.token_ids, f"{path}.token_ids", "the first node is the root: no tokens")
        else:
            _require(node.parent_id in seen, f"{path}.parent_id", "must name a node listed before it")
        _check_node(node, s, active, admissions, path)
        for j, b in enumerate(node.block_ids):
            _require(b not in in_tree, f"{path}.block_ids[{j}]", f"block {b} is in two nodes")
            _require(s.blocks[b].cached, f"{path}.block_ids[{j}]", f"block {b} is not marked cached")
            in_tree.add(b)
        seen.add(node.node_id)
    stray = [b.block_id for b in s.blocks if b.cached and b.block_id not in in_tree]
    _require(not stray, "blocks", f"blocks {stray[:5]} are marked cached but in no node")


def _check_node(node: PrefixNode, s: Snapshot, active: int, admissions: int, path: str) -> None:
    """A node (in the tree or just evicted from it): whole blocks of the pool; locked by at most
    the requests not finished; hit at most once per admission (arrival or resume)."""
    _require(len(node.token_ids) == len(node.block_ids) * s.block_size, f"{path}.token_ids",
             f"must hold block_size x {len(node.block_ids)} blocks = {len(node.block_ids) * s.block_size} "
             f"ids, got {len(node.token_ids)}")
    _block_ids(node.block_ids, s.num_blocks, f"{path}.block_ids")
    _require(len(set(node.block_ids)) == len(node.block_ids), f"{path}.block_ids", "a block appears twice")
    _require(node.lock_count <= active, f"{path}.lock_count",
             f"must be <= the requests not finished ({active}), got {node.lock_count}")
    _require(node.hit_count <= admissions, f"{path}.hit_count",
             f"must be <= the admissions so far ({admissions}), got {node.hit_count}")


def check_trace(t: StepTrace, after: Snapshot) -> None:
    """One step against the snapshot taken after it: requests it names exist, block ids are in
    the pool, its counts add up (free + used = num_blocks, batched = sum of chunks <= budget)."""
    known = {r.request_id for r in after.requests}
    chunk_ids = [c.request_id for c in t.scheduled]
    _unique(chunk_ids, "scheduled", "request")
    _known(chunk_ids, known, "scheduled", ".request_id")
    for name in ("arrived", "preempted", "finished"):
        _known(getattr(t, name), known, name)
        _unique_ids(getattr(t, name), name)
    for name in ("num_waiting", "num_running"):
        _require(getattr(t, name) <= len(after.requests), name,
                 f"must be <= the requests ({len(after.requests)}), got {getattr(t, name)}")
    _require(t.num_waiting + t.num_running <= len(after.requests), "num_running",
             f"num_waiting + num_running must be <= the requests ({len(after.requests)}), "
             f"got {t.num_waiting} + {t.num_running}")
    _require(t.num_cached_blocks <= after.num_blocks, "num_cached_blocks",
             f"must be <= num_blocks = {after.num_blocks}, got {t.num_cached_blocks}")
    _known([x.request_id for x in t.sampled], known, "sampled", ".request_id")
    _block_ids(t.blocks_allocated, after.num_blocks, "blocks_allocated")
    _block_ids(t.blocks_freed, after.num_blocks, "blocks_freed")
    for name in ("num_free_blocks", "num_used_blocks", "num_evictable_blocks"):
        _require(getattr(t, name) <= after.num_blocks, name,
                 f"must be <= num_blocks = {after.num_blocks}, got {getattr(t, name)}")
    _require(t.num_free_blocks + t.num_used_blocks + t.num_evictable_blocks == after.num_blocks, "num_used_blocks",
             f"num_free_blocks + num_used_blocks + num_evictable_blocks must be num_blocks = {after.num_blocks}, "
             f"got {t.num_free_blocks} + {t.num_used_blocks} + {t.num_evictable_blocks}")
    _require(t.num_evictable_blocks <= t.num_cached_blocks, "num_evictable_blocks",
             f"must be <= num_cached_blocks = {t.num_cached_blocks}, got {t.num_evictable_blocks}")
    requests = {r.request_id: r for r in after.requests}
    for i, c in enumerate(t.scheduled):
        _within(f"scheduled[{i}]", _check_chunk, c, requests[c.request_id])
    total = sum(c.num_tokens for c in t.scheduled)
    _require(t.num_batched_tokens == total, "num_batched_tokens",
             f"must be the scheduled chunks' sum ({total}), got {t.num_batched_tokens}")
    _require(total <= t.token_budget, "num_batched_tokens",
             f"must be <= token_budget = {t.token_budget}, got {total}")
    _within("spec", _check_spec, t)
    _within("prefix", _check_prefix, t.prefix, after, known)
    if t.pipeline is not None:
        _within("pipeline", _check_timeline, t.pipeline, after, known, t.scheduled)


def _check_chunk(c: ScheduledChunk, r: RequestState) -> None:
    """A chunk computes positions its request has (start + tokens - drafts <= its tokens after the
    step); a decode chunk is one position plus the drafts it verifies."""
    total = r.num_prompt_tokens + r.num_output_tokens
    _require(c.num_spec_tokens < c.num_tokens, "num_spec_tokens",
             f"must be < num_tokens = {c.num_tokens}, got {c.num_spec_tokens}")
    _require(c.num_tokens - c.num_spec_tokens <= total, "num_tokens",
             f"num_tokens - num_spec_tokens must be <= the request's tokens ({total}), "
             f"got {c.num_tokens} - {c.num_spec_tokens}")
    _require(c.start + c.num_tokens - c.num_spec_tokens <= total, "start",
             f"start + num_tokens - num_spec_tokens must be <= the request's tokens ({total}), "
             f"got {c.start} + {c.num_tokens} - {c.num_spec_tokens}")
    _require(c.kind == "prefill" or c.num_tokens == 1 + c.num_spec_tokens, "num_tokens",
             f"a decode chunk is 1 + num_spec_tokens = {1 + c.num_spec_tokens} tokens, got {c.num_tokens}")


def _check_spec(t: StepTrace) -> None:
    """Speculative records: one per chunk that verified drafts (its request, as many drafts as
    the chunk's num_spec_tokens); outcomes accepted*, then one rejected and the rest unverified;
    emitted = the accepted drafts + one final token, a "bonus" exactly when all were accepted."""
    drafts = {c.request_id: c.num_spec_tokens for c in t.scheduled if c.num_spec_tokens}
    ids = [v.request_id for v in t.spec]
    _unique(ids, "", "speculative record of request")
    for i, v in enumerate(t.spec):
        path = f"[{i}]"
        _require(v.request_id in drafts, f"{path}.request_id",
                 f"request {show(v.request_id)} verified no drafts this step (no scheduled chunk with num_spec_tokens)")
        _require(len(v.drafts) == drafts[v.request_id], f"{path}.drafts",
                 f"must hold the chunk's num_spec_tokens = {drafts[v.request_id]} drafts, got {len(v.drafts)}")
        outcomes = "".join(d.outcome[0] for d in v.drafts)  # a*(ru*)?
        accepted = len(outcomes) - len(outcomes.lstrip("a"))
        _require(outcomes[accepted:].rstrip("u") in ("", "r"), f"{path}.drafts",
                 "outcomes must be accepted..., then one rejected and the rest unverified")
        _require(len(v.emitted) == accepted + 1, f"{path}.emitted",
                 f"must hold the {accepted} accepted drafts + 1 final token, got {len(v.emitted)}")
        _require(list(v.emitted[:-1]) == [d.token_id for d in v.drafts[:accepted]], f"{path}.emitted",
                 "must start with the accepted drafts' token ids")
        bonus = accepted == len(v.drafts)
        _require((v.final_kind == "bonus") == bonus, f"{path}.final_kind",
                 f"must be {'bonus' if bonus else 'recovered'} with {accepted} of {len(v.drafts)} accepted, "
                 f"got {show(v.final_kind)}")
    _require(set(ids) == set(drafts), "", f"requests {sorted(set(drafts) - set(ids))[:5]} verified drafts "
             "but have no speculative record")


def _check_prefix(events: PrefixCacheEvents, after: Snapshot, known: set[str]) -> None:
    """Lookups, copies and forks name known requests; copies and evicted nodes name pool blocks;
    an evicted node was unlocked; a lookup's cached tokens are fewer than its tokens."""
    for i, h in enumerate(events.lookups):
        path = f"lookups[{i}]"
        _require(h.request_id in known, f"{path}.request_id", f"request {show(h.request_id)} is not in the snapshot's requests")
        total = next((r.num_prompt_tokens + r.num_output_tokens for r in after.requests
                      if r.request_id == h.request_id), 0)
        _require(h.num_tokens <= total, f"{path}.num_tokens",
                 f"must be <= the request's tokens ({total}), got {h.num_tokens}")
        _require(h.num_cached_tokens < h.num_tokens, f"{path}.num_cached_tokens",
                 f"must be < num_tokens = {h.num_tokens} (the last token is always computed), got {h.num_cached_tokens}")
    for i, c in enumerate(events.copies):
        path = f"copies[{i}]"
        _require(c.request_id in known, f"{path}.request_id", f"request {show(c.request_id)} is not in the snapshot's requests")
        for name in ("src_block", "dst_block"):
            _require(getattr(c, name) < after.num_blocks, f"{path}.{name}",
                     f"block id must be < num_blocks = {after.num_blocks}, got {getattr(c, name)}")
        _require(c.src_block != c.dst_block, f"{path}.dst_block", f"must differ from src_block {c.src_block}")
    _known(events.forked, known, "forked")
    _unique_ids(events.forked, "forked")
    parents = {r.request_id: r.parent_id for r in after.requests}
    for i, rid in enumerate(events.forked):
        _require(parents[rid] is not None, f"forked[{i}]", f"request {show(rid)} has no parent_id")
    active = sum(1 for r in after.requests if r.status is not RequestStatus.FINISHED)
    admissions = sum(1 + r.num_preemptions for r in after.requests)
    for i, node in enumerate(events.evicted):
        _check_node(node, after, active, admissions, f"evicted[{i}]")
        _require(node.lock_count == 0, f"evicted[{i}].lock_count", f"an evicted node was unlocked, got {node.lock_count}")
        _require(node.parent_id is not None, f"evicted[{i}].parent_id", "the root is never evicted")


def _check_timeline(p: PipelineTimeline, after: Snapshot, known: set[str],
                    scheduled: Sequence[ScheduledChunk]) -> None:
    """The workers' timed work: the run's layout (p, t, schedule, m), units numbered in order,
    each carrying the next scheduled requests in order (at least one) and their tokens, all of
    them together; every event on a worker of the layout (rank = stage x t + tp_rank), of a
    listed unit, start <= end."""
    layout = after.parallel
    _require(layout is not None, "", "a pipeline timeline needs the snapshot's parallel layout")
    assert layout is not None
    for name in ("pipeline_parallel_size", "tensor_parallel_size", "schedule", "num_microbatches"):
        _require(getattr(p, name) == getattr(layout, name), name,
                 f"must be the layout's {show(getattr(layout, name))}, got {show(getattr(p, name))}")
    _require(len(p.units) <= p.num_microbatches, "units",
             f"must hold at most num_microbatches = {p.num_microbatches} units, got {len(p.units)}")
    for i, u in enumerate(p.units):
        _require(u.unit == i, f"units[{i}].unit", f"must be {i}, got {u.unit}")
        _require(u.microbatch == i, f"units[{i}].microbatch", f"must be {i} (the unit's piece of the batch), got {u.microbatch}")
    chunks = list(scheduled)
    for i, u in enumerate(p.units):
        path = f"units[{i}]"
        _known(u.request_ids, known, f"{path}.request_ids")
        _unique_ids(u.request_ids, f"{path}.request_ids")
        mine, chunks = chunks[:len(u.request_ids)], chunks[len(u.request_ids):]
        _require(bool(u.request_ids) and [c.request_id for c in mine] == list(u.request_ids), f"{path}.request_ids",
                 f"must be the next {len(u.request_ids) or 'one or more'} scheduled requests in order "
                 f"({[c.request_id for c in mine] or 'none left'}), got {list(u.request_ids)}")
        tokens = sum(c.num_tokens for c in mine)
        _require(u.num_tokens == tokens, f"{path}.num_tokens", f"must be its requests' scheduled tokens ({tokens}), "
                 f"got {u.num_tokens}")
    _require(not chunks, "units", f"must carry every scheduled request; {[c.request_id for c in chunks][:5]} "
             "are in no unit")
    pp, tp = p.pipeline_parallel_size, p.tensor_parallel_size
    for i, e in enumerate(p.events):
        path = f"events[{i}]"
        _require(e.stage < pp, f"{path}.stage", f"must be < pipeline_parallel_size = {pp}, got {e.stage}")
        _require(e.tp_rank < tp, f"{path}.tp_rank", f"must be < tensor_parallel_size = {tp}, got {e.tp_rank}")
        _require(e.rank == e.stage * tp + e.tp_rank, f"{path}.rank",
                 f"must be stage x t + tp_rank = {e.stage * tp + e.tp_rank}, got {e.rank}")
        _require(e.unit < len(p.units), f"{path}.unit", f"must name one of the {len(p.units)} units, got {e.unit}")
        _require(e.start_ms <= e.end_ms, f"{path}.end_ms", f"must be >= start_ms = {e.start_ms}, got {e.end_ms}")


def _step(actual: int, i: int, path: str) -> None:
    _require(actual == i, f"{path}.step", f"must be {i} (steps are numbered from 0 without gaps), got {actual}")


def _same_geometry(s: Snapshot, first: Snapshot, path: str, like: str) -> None:
    """``s`` has ``first``'s block geometry (``like``: how the message names ``first``)."""
    for name in ("block_size", "num_blocks", "kv_bytes_per_token"):
        _require(getattr(s, name) == getattr(first, name), f"{path}.{name}",
                 f"must be {getattr(first, name)} like {like}, got {getattr(s, name)}")
    if s.parallel != first.parallel:
        where, mine, theirs = _difference(s.parallel, first.parallel)
        raise SchemaError(f"must be {show(theirs)} like {like} parallel layout, got {show(mine)}",
                          f"{path}.parallel{where}")


def _difference(a: Any, b: Any) -> tuple[str, Any, Any]:
    """The path (".stages[1].end_layer") of the first value where records / tuples ``a`` and
    ``b`` differ, and the two values there ("" and themselves if they differ as a whole)."""
    if type(a) is type(b) and is_dataclass(a):
        for f in fields(a):
            x, y = getattr(a, f.name), getattr(b, f.name)
            if x != y:
                where, x, y = _difference(x, y)
                return f".{f.name}{where}", x, y
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                where, x, y = _difference(x, y)
                return f"[{i}]{where}", x, y
    return "", a, b


def snapshot_path(i: int) -> str:
    """Where snapshot i sits in the file: ``initial`` before step 0, then after each step."""
    return "initial" if i == 0 else f"steps[{i - 1}].snapshot"


def check_history(traces: Sequence[StepTrace], snapshots: Sequence[Snapshot]) -> None:
    """A run's steps in order (after ``check_meta``): step i's trace says step i and is followed
    by snapshot i+1; snapshot i says step i; every snapshot has the first one's block geometry
    and layout."""
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
        _within(path, check_transition, t, snapshots[i], snapshots[i + 1])


def check_transition(t: StepTrace, before: Snapshot, after: Snapshot) -> None:
    """A step between its two snapshots: its counts are the after-snapshot's (queues, free and
    cached blocks); nodes it inserted or split are in the tree after it, the nodes it evicted
    (each once) are exactly those in the tree before and gone after, and its lookups matched
    nodes that exist."""
    for name, value in (("num_waiting", len(after.waiting)), ("num_running", len(after.running)),
                        ("num_free_blocks", after.num_free_blocks),
                        ("num_cached_blocks", sum(1 for b in after.blocks if b.cached))):
        _require(getattr(t, name) == value, name, f"must be the snapshot's {value}, got {getattr(t, name)}")
    tree_before = {n.node_id for n in before.prefix_tree}
    tree_after = {n.node_id for n in after.prefix_tree}
    evicted = {n.node_id for n in t.prefix.evicted}
    for name in ("inserted", "split"):
        for i, node_id in enumerate(getattr(t.prefix, name)):
            _require(node_id in tree_after, f"prefix.{name}[{i}]", f"node {node_id} is not in the tree after the step")
    listed: set[int] = set()
    for i, n in enumerate(t.prefix.evicted):
        _require(n.node_id in tree_before and n.node_id not in tree_after, f"prefix.evicted[{i}].node_id",
                 f"node {n.node_id} must be in the tree before the step and not after it")
        _require(n.node_id not in listed, f"prefix.evicted[{i}].node_id", f"node {n.node_id} appears twice")
        listed.add(n.node_id)
    gone = sorted(tree_before - tree_after - listed)
    _require(not gone, "prefix.evicted", f"nodes {gone[:5]} left the tree in this step (only eviction removes "
             "a node) but are not listed")
    for i, h in enumerate(t.prefix.lookups):
        for j, node_id in enumerate(h.node_ids):
            _require(node_id in tree_after or node_id in evicted, f"prefix.lookups[{i}].node_ids[{j}]",
                     f"node {node_id} is in neither the tree after the step nor its evictions")


def check_meta(meta: MetaEntry, first: Snapshot) -> RunMeta:
    """The run's config must be one the engine accepts, with the first snapshot's block geometry,
    bytes per token and parallel layout (p, t, schedule, m, layers per stage); checked before
    the snapshots' own rules, and every later snapshot repeats the first's (``check_history``).
    Returns the RunMeta with the config as an EngineConfig."""
    found = unknown_knob(meta.config)
    if found is not None:
        key, close = found
        raise SchemaError("unknown engine setting" + (f" (did you mean {close!r}?)" if close else
                          " (the engine knobs are listed in engine/core/config.py KNOB_PLACES)"),
                          f"meta.config.{key_segment(key)}")
    try:
        config = EngineConfig.from_knobs(**meta.config)
    except (ValueError, TypeError) as e:  # EngineConfig names the knob first: "block_size: must be >= 1, got 0"
        name, _, problem = str(e).partition(": ")
        if name.split(".")[0] in KNOB_PLACES and problem:
            raise SchemaError(problem, f"meta.config.{name}") from None
        raise SchemaError(str(e), "meta.config") from None
    cache, parallel = config.cache_config, config.parallel_config
    for name in ("block_size", "num_blocks"):
        _require(getattr(cache, name) == getattr(first, name), f"meta.config.{name}",
                 f"must match the snapshots' {name} = {getattr(first, name)}, got {getattr(cache, name)}")
    limit = config.scheduler_config.max_model_len
    _require(meta.max_model_len <= MAX_MODEL_LEN and limit in (None, meta.max_model_len),
             "meta.max_model_len", f"must be <= {MAX_MODEL_LEN} and the config's max_model_len when set "
             f"({limit}), got {meta.max_model_len}")
    layout = first.parallel
    _require((layout is None) == (parallel.world_size == 1), "initial.parallel",
             f"must be {'null' if layout is None else 'set'}: the config runs {parallel.world_size} worker process(es)")
    if layout is not None:
        for name in ("pipeline_parallel_size", "tensor_parallel_size", "pipeline_schedule", "num_microbatches"):
            own = getattr(layout, name.replace("pipeline_schedule", "schedule"))
            _require(getattr(parallel, name) == own, f"meta.config.{name}",
                     f"must match the snapshots' layout ({show(own)}), got {show(getattr(parallel, name))}")
        split = tuple(s.end_layer - s.start_layer for s in layout.stages)
        _require(parallel.pipeline_layer_split in (None, split), "meta.config.pipeline_layer_split",
                 f"must match the layout's layers per stage {list(split)}, got {list(parallel.pipeline_layer_split or ())}")
    _require(meta.kv_bytes_per_token == first.kv_bytes_per_token, "meta.kv_bytes_per_token",
             f"must match the snapshots' kv_bytes_per_token = {first.kv_bytes_per_token}, "
             f"got {meta.kv_bytes_per_token}")
    return RunMeta(meta.model, meta.scenario, meta.title, config, meta.max_model_len, meta.kv_bytes_per_token,
                   meta.chat_template)


def check_limits(meta: RunMeta, traces: Sequence[StepTrace], snapshots: Sequence[Snapshot], where: str) -> None:
    """The run's limits hold throughout: every step's budget <= max_num_batched_tokens, every
    request's prompt + output <= max_model_len (``where(i)`` names snapshot i's path)."""
    budget = meta.config.scheduler_config.max_num_batched_tokens
    for i, t in enumerate(traces):
        _require(t.token_budget <= budget, f"{where}traces[{i}].token_budget" if where else f"steps[{i}].trace.token_budget",
                 f"must be <= the config's max_num_batched_tokens = {budget}, got {t.token_budget}")
    for i, s in enumerate(snapshots):
        for j, r in enumerate(s.requests):
            _require(r.num_prompt_tokens + r.num_output_tokens <= meta.max_model_len,
                     f"{where}final.requests[{j}].num_prompt_tokens" if where
                     else f"{snapshot_path(i)}.requests[{j}].num_prompt_tokens",
                     f"num_prompt_tokens + num_output_tokens must be <= max_model_len = {meta.max_model_len}, "
                     f"got {r.num_prompt_tokens} + {r.num_output_tokens}")


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
    _step(file.initial.step, 0, "initial")
    meta = check_meta(file.meta, file.initial)
    check_history(traces, snapshots)
    check_comparison(file.comparison, file.initial)
    check_limits(meta, traces, snapshots, "")
    for policy, run in file.comparison.items():
        check_limits(meta, run.traces, (run.final,), f"comparison.{key_segment(policy)}.")
    comparison = {p: PolicyRun(p, r.traces, r.final) for p, r in file.comparison.items()}
    return Recording(meta, traces, snapshots, comparison)
