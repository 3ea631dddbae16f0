"""Record a run to JSON and load it back, to replay without the model (talks on any laptop).

File format (``"format": "inferscope-recording"``, version 1)::

    {"format": ..., "version": 1,
     "meta": {model, scenario, title, config, max_model_len, kv_bytes_per_token, chat_template},
     "initial": <Snapshot before step 0>,
     "steps": [{"trace": <StepTrace>, "snapshot": <Snapshot after it>}, ...],
     "comparison": {"static": {"traces": [...], "final": <Snapshot>}, ...}}

Records are serialised with ``engine.trace.to_dict`` (type-tagged), so loading gives back the
same frozen records the live engine produced and the views cannot tell the difference.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from engine.run import PolicyRun, RunMeta
from engine.trace import Snapshot, StepTrace, from_dict, to_dict

FORMAT = "inferscope-recording"
VERSION = 1


@dataclass(frozen=True)
class Recording:
    meta: RunMeta
    traces: tuple[StepTrace, ...]
    snapshots: tuple[Snapshot, ...]  # snapshots[0] before any step, snapshots[i] after step i-1
    comparison: Mapping[str, PolicyRun] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.snapshots) != len(self.traces) + 1:
            raise ValueError("recording: needs one snapshot before the first step and one after each step")


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
    """Parse a recording; anything malformed is a ValueError saying what is wrong."""
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"recording: not valid JSON ({e})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"recording: not an InferScope recording (expected \"format\": \"{FORMAT}\")")
    if data.get("version") != VERSION:
        raise ValueError(f"recording: version {data.get('version')!r} is not supported (expected {VERSION})")
    try:
        meta = RunMeta(**data["meta"])
        initial = from_dict(data["initial"])
        traces = tuple(from_dict(s["trace"]) for s in data["steps"])
        snapshots = (initial, *(from_dict(s["snapshot"]) for s in data["steps"]))
        comparison = {p: PolicyRun(p, tuple(from_dict(r["traces"])), from_dict(r["final"]))
                      for p, r in data.get("comparison", {}).items()}
    except (KeyError, TypeError) as e:
        raise ValueError(f"recording: missing or malformed field ({e})") from None
    if not all(isinstance(t, StepTrace) for t in traces) or not all(isinstance(s, Snapshot) for s in snapshots):
        raise ValueError("recording: steps must hold StepTrace and Snapshot records")
    return Recording(meta, traces, snapshots, comparison)
