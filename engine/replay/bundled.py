"""Bundled recordings: one small recording of each live page's scenario on SmolLM2, so a talk
runs on any laptop without the model (``presets/recordings/<scenario>.json``).

Each file is a real engine run (``LiveRun`` on the converted SmolLM2-135M, then
``engine.replay.recording.record``), trimmed so that it stays well under ``MAX_FILE_BYTES``: only the
scenario's first ``requests`` requests, each generating at most ``max_tokens`` tokens, run to
the end (every request finished). Every file is loaded back through ``from_json`` (the same
validation as an upload) before it is written. Remake them all with::

    .venv/bin/python -m engine.bundled            # or: -m engine.bundled spec-copy pipeline
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from engine.replay.recording import Recording, from_json, to_json
from engine.replay.run import LiveRun
from engine.replay.scenario import Scenario, load_scenario

RECORDING_DIR = Path(__file__).resolve().parents[2] / "presets" / "recordings"
MODEL = "smollm2-135m"
MAX_FILE_BYTES = 1_000_000
MAX_STEPS = 200  # a trimmed scenario finishes far sooner; more is a mistake in the trim


@dataclass(frozen=True)
class Bundle:
    """How one scenario is trimmed for its bundled recording."""

    scenario: str
    requests: int  # the scenario's first requests, in file order
    max_tokens: int  # generated tokens per request, at most


BUNDLES: tuple[Bundle, ...] = (
    Bundle("spec-copy", requests=3, max_tokens=40),
    Bundle("pipeline", requests=4, max_tokens=12),
    Bundle("mixed-lengths", requests=4, max_tokens=16),
    Bundle("memory-pressure", requests=6, max_tokens=40),  # 6 x 40 outgrows the 40-block pool: a preemption
    Bundle("shared-prefix", requests=6, max_tokens=12),
)


def bundled_names() -> list[str]:
    """Names of the bundled recordings present on disk (file stems), sorted."""
    return sorted(p.stem for p in RECORDING_DIR.glob("*.json"))


def bundled_path(name: str) -> Path:
    """The file of bundled recording ``name``; ValueError (naming ``recording``) for any other
    name, so a link's ``?recording=`` can never reach outside the folder."""
    names = bundled_names()
    if name not in names:
        raise ValueError(f"recording: no bundled recording {name!r}; choose one of {names}")
    return RECORDING_DIR / f"{name}.json"


def load_bundled(name: str) -> Recording:
    """Bundled recording ``name``, validated like any uploaded recording."""
    return from_json(bundled_path(name).read_bytes())


def trimmed(scenario: Scenario, requests: int, max_tokens: int) -> Scenario:
    """The scenario's first ``requests`` requests, each capped at ``max_tokens`` generated tokens."""
    if requests < 1 or max_tokens < 1:
        raise ValueError("bundle: requests and max_tokens must be >= 1")
    kept = tuple(replace(r, max_tokens=min(r.max_tokens, max_tokens)) for r in scenario.requests[:requests])
    return replace(scenario, requests=kept)


def make(bundle: Bundle, model: Any = MODEL) -> Recording:
    """Run the bundle's trimmed scenario to the end on the real engine and record it
    (``model``: a name or a SharedModel)."""
    from engine.replay.recording import record

    sc = trimmed(load_scenario(bundle.scenario), bundle.requests, bundle.max_tokens)
    run = LiveRun.from_scenario(sc, model)
    try:
        while not run.done:
            if run.num_steps >= MAX_STEPS:
                raise RuntimeError(f"bundle {bundle.scenario}: not finished after {MAX_STEPS} steps")
            run.step()
        return record(run)
    finally:
        run.close()


def write(bundle: Bundle, model: Any = MODEL) -> tuple[Path, int, int]:
    """Make, validate (``from_json``) and write one bundled recording -> (path, bytes, steps)."""
    recording = make(bundle, model)
    text = to_json(recording)
    size = len(text.encode("utf-8"))
    if size > MAX_FILE_BYTES:
        raise RuntimeError(f"bundle {bundle.scenario}: {size:,} bytes, over {MAX_FILE_BYTES:,}; trim it further")
    from_json(text)  # refuses what an upload would refuse
    RECORDING_DIR.mkdir(parents=True, exist_ok=True)
    path = RECORDING_DIR / f"{bundle.scenario}.json"
    path.write_text(text)
    return path, size, len(recording.traces)


def main(argv: list[str]) -> int:
    chosen = [b for b in BUNDLES if not argv or b.scenario in argv]
    if argv and len(chosen) != len(set(argv)):
        print(f"unknown bundle in {argv}; bundles: {[b.scenario for b in BUNDLES]}", file=sys.stderr)
        return 2
    import torch

    from engine.model.shared import get_shared_model

    # One intra-op thread, as the app runs (app/models.configure_torch): the recorded step times
    # are what a page shows, and on a small shared machine more threads only fight over cores.
    torch.set_num_threads(max(1, int(os.environ.get("INFERSCOPE_TORCH_THREADS", "1"))))
    shared = get_shared_model(MODEL)  # loaded once for every bundle
    for bundle in chosen:
        path, size, steps = write(bundle, shared)
        print(f"{path.relative_to(RECORDING_DIR.parent.parent)}: {steps} steps, {size / 1024:.0f} KiB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
