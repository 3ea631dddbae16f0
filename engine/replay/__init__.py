"""Replay: scenarios, runs over them, and recordings that replay without the model.

    scenario.py   scenario files (presets/scenarios) -> a built engine with its requests queued
    run.py        LiveRun / PolicyRun: a scenario stepped to the end, with run metadata
    recording.py  runs <-> JSON files (validated on load against the records' schema)
    bundled.py    the bundled recordings (presets/recordings; ``python -m engine.bundled``)
"""
