"""Recordings made before the engine was regrouped (issue #20: packages by concept, EngineConfig as
sub-configs) still load and replay unchanged.

tests/data/recordings-before-20/ holds files written by commit 266ba04, the last commit before that
change: four small tiny-random runs made there (int4 weights + int8 KV cache, a pipeline with a
layer split in real worker processes, early-exit speculation, the static policy without prefix
caching) and the bundled SmolLM2 pipeline recording of that commit. Their config is the flat knob
set of that time: it lacks ``runner``, ``attention_backend``, ``scheduling_policy``,
``prefill_schedule`` and ``decode_grouping``, added since, which load as their defaults.

"Unchanged" here means: every record decodes and re-encodes to exactly the bytes the old code
wrote (the meta differs only by the knobs added since, at their defaults), a ReplayRun steps through
every recorded step with the recorded traces, and every page's visualizers draw every step.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.core.config import EngineConfig
from engine.replay.recording import Recording, from_json, to_json
from engine.replay.run import ReplayRun, precision_label, speculation_label
from tests.test_replay_mutations import draw_every_page

OLD = Path(__file__).parent / "data" / "recordings-before-20"
FILES = sorted(OLD.glob("*.json"))
ADDED_SINCE = {"runner": "auto", "attention_backend": "torch",  # knobs the old files do not have
               "scheduling_policy": "fcfs", "prefill_schedule": "mixed", "decode_grouping": True,
               "device": "cpu"}


def test_the_old_recordings_are_there() -> None:
    assert [f.stem for f in FILES] == ["chat-burst-int4-kv-int8", "pipeline-split", "smollm2-pipeline-bundled",
                                       "spec-early-exit", "static-no-prefix-cache"]


@pytest.fixture(scope="module", params=FILES, ids=lambda f: f.stem)
def old(request: pytest.FixtureRequest) -> tuple[str, Recording]:
    text = request.param.read_text()
    return text, from_json(text)


def test_records_round_trip_to_the_bytes_the_old_code_wrote(old: tuple[str, Recording]) -> None:
    text, rec = old
    before, after = json.loads(text), json.loads(to_json(rec))
    assert not set(ADDED_SINCE) & set(before["meta"]["config"])
    assert after["meta"]["config"] == {**before["meta"]["config"], **ADDED_SINCE}
    after["meta"]["config"] = before["meta"]["config"]
    assert after == before
    assert from_json(to_json(rec)) == rec


def test_the_config_is_the_one_recorded(old: tuple[str, Recording]) -> None:
    text, rec = old
    knobs = json.loads(text)["meta"]["config"]
    config = rec.meta.config
    assert isinstance(config, EngineConfig) and config == EngineConfig.from_knobs(**knobs)
    assert (config.cache_config.block_size, config.cache_config.num_blocks) == (rec.snapshots[0].block_size,
                                                                               rec.snapshots[0].num_blocks)
    assert config.scheduler_config.policy == knobs["policy"] == rec.meta.policy
    assert config.parallel_config.world_size == knobs["pipeline_parallel_size"] * knobs["tensor_parallel_size"]


def test_labels_name_what_was_recorded() -> None:
    labels = {f.stem: from_json(f.read_text()).meta for f in FILES}
    assert precision_label(labels["chat-burst-int4-kv-int8"].config) == "int4 g32 · KV int8"
    assert speculation_label(labels["spec-early-exit"].config) == "early exit 1 layers k=3"
    assert labels["static-no-prefix-cache"].policy == "static"
    assert not labels["static-no-prefix-cache"].config.cache_config.enable_prefix_caching
    assert labels["pipeline-split"].config.parallel_config.pipeline_layer_split == (1, 1)


def test_replay_steps_through_the_recorded_steps(old: tuple[str, Recording]) -> None:
    _, rec = old
    run = ReplayRun(rec)
    stepped = []
    while not run.done:
        stepped += run.step()
        view = run.view()
        assert view.snapshot == rec.snapshots[view.step] and view.traces == rec.traces[:view.step]
    assert tuple(stepped) == rec.traces and len(stepped) >= 10


def test_every_page_draws_every_step(old: tuple[str, Recording]) -> None:
    _, rec = old
    draw_every_page(rec)
