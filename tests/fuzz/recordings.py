"""A real recording to break: record a short `tiny-random` run once, then mutate its JSON at a
field path written the way ``engine.replay.recording.from_json`` names it in its errors
(``steps[3].trace.scheduled[0].num_tokens``), so a case's expected message is its own path.
"""
from __future__ import annotations

import copy
import json
import re
from typing import Any

STEPS = 4  # chat-burst: step 0 prefills 8 requests; steps 1-3 decode them, request 8 arrives at 2
DELETE = object()  # set_path(..., DELETE) removes the key
_SEGMENT = re.compile(r"\.?([A-Za-z_][A-Za-z_0-9]*)|\[(\d+)\]")


def record_json(steps: int = STEPS, comparison: bool = True, scenario: str = "chat-burst") -> str:
    """A real run of ``scenario`` on tiny-random, ``steps`` steps (plus both policies run to the
    end for the comparison), as recording JSON."""
    import torch

    from engine.model.shared import get_shared_model
    from engine.replay.recording import record, to_json
    from engine.replay.run import LiveRun, compare_policies
    from engine.replay.scenario import load_scenario

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = get_shared_model("tiny-random")
        sc = load_scenario(scenario)
        run = LiveRun.from_scenario(sc, model)
        run.step(steps)
        if comparison:
            run.comparison.update(compare_policies(sc, model))
        return to_json(record(run))
    finally:
        torch.set_num_threads(before)


def segments(path: str) -> list[str | int]:
    """``steps[3].trace.num_tokens`` -> ["steps", 3, "trace", "num_tokens"]."""
    out: list[str | int] = []
    pos = 0
    while pos < len(path):
        m = _SEGMENT.match(path, pos)
        if m is None:
            raise ValueError(f"bad path {path!r} at {pos}")
        out.append(m.group(1) if m.group(1) is not None else int(m.group(2)))
        pos = m.end()
    return out


def get_path(data: Any, path: str) -> Any:
    for seg in segments(path):
        data = data[seg]
    return data


def set_path(data: Any, path: str, value: Any) -> Any:
    """``data`` with the value at ``path`` replaced (or removed: ``DELETE``); ``data`` itself is
    left as it was (the containers along the path are copied, the rest is shared)."""
    *parents, last = segments(path)
    root = copy.copy(data)
    target = root
    for seg in parents:
        target[seg] = copy.copy(target[seg])
        target = target[seg]
    if value is DELETE:
        del target[last]
    else:
        target[last] = value
    return root


def dumps(data: Any) -> str:
    """JSON as a hand-edited file might say it (NaN / Infinity allowed through, like Python's)."""
    return json.dumps(data, separators=(",", ":"))
