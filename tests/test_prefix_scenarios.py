"""The prefix-caching scenarios (presets/scenarios/) do what their descriptions say, on the real engine.

Each runs to the end on ``tiny-random`` with every manager's ``check_integrity()`` after every
step; the prompts are built the way the descriptions claim (each chat turn extends the
previous one; RAG prompts share exactly their common documents); and the cache-pressure story
("NORTH survives, SOUTH and EAST evict each other") is checked on the bundled SmolLM2-135M,
the model the page shows it with.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from engine.replay.scenario import build_engine, load_scenario
from tests.conftest import run_to_completion

if TYPE_CHECKING:
    from engine.model.shared import SharedModel

PREFIX_SCENARIOS = ("shared-prefix", "multi-turn", "rag", "parallel-sampling", "cache-pressure")


def common_prefix(a: str, b: str) -> int:
    return len(os.path.commonprefix([a, b]))


@pytest.mark.parametrize("name", PREFIX_SCENARIOS)
def test_scenario_runs_with_caching_on_and_its_knob_says_so(tiny: "SharedModel", torch_single_thread: None,
                                                            name: str) -> None:
    sc = load_scenario(name)
    assert sc.knobs["enable_prefix_caching"] is True
    engine = build_engine(sc, tiny)
    traces = run_to_completion(engine)
    events = [t.prefix for t in traces]
    cached = sum(e.num_cached_tokens for e in events)
    finished = {r.request_id for r in engine.snapshot().requests if r.status == "finished"}
    assert len(finished) == sum(r.n for r in sc.requests)
    if name == "parallel-sampling":
        assert sum(len(e.copies) for e in events) >= 1 and sum(len(e.forked) for e in events) == 6
    else:
        assert cached > 0, "requests share prefixes: some prompt tokens come from the cache"
    if name == "cache-pressure":
        assert sum(len(e.evicted) for e in events) > 0


def test_multi_turn_each_turn_extends_the_previous_one() -> None:
    sc = load_scenario("multi-turn")
    chats: dict[str, list[tuple[int, str]]] = {}
    for r in sc.requests:
        chats.setdefault(r.prompt.split("<|im_end|>")[0], []).append((r.arrival_step, r.prompt))
    assert len(chats) == 2 and all(len(turns) == 4 for turns in chats.values())
    for turns in chats.values():
        for (arrive_a, a), (arrive_b, b) in zip(turns, turns[1:]):
            assert b.startswith(a) and arrive_b - arrive_a > sc.requests[0].max_tokens, "after the turn finished"


def test_rag_prompts_share_exactly_their_common_leading_documents() -> None:
    """Same documents in the same order: everything up to the question; the same two documents in
    the other order: only the instruction line."""
    prompts = [r.prompt for r in load_scenario("rag").requests]
    header = prompts[0].split("[Document")[0]
    assert common_prefix(prompts[0], prompts[1]) >= prompts[0].index("Question:")
    assert common_prefix(prompts[0], prompts[2]) == prompts[0].index("[Document B") + len("[Document ")  # A only
    assert "[Document B" in prompts[3] and prompts[3].index("[Document B") < prompts[3].index("[Document A")
    assert common_prefix(prompts[0], prompts[3]) == len(header) + len("[Document ")


@pytest.mark.slow
def test_cache_pressure_on_smollm2_keeps_north_and_evicts_the_others() -> None:
    """On the bundled model: every NORTH question after the first hits its cached list; SOUTH and
    EAST are evicted and prefilled again each time; the evicted nodes hold their lists."""
    from engine.model.shared import get_shared_model

    sc = load_scenario("cache-pressure")
    engine = build_engine(sc, get_shared_model("smollm2-135m"))
    traces = run_to_completion(engine)
    lookups = {h.request_id: h for t in traces for h in t.prefix.lookups}
    lists = {str(i): r.prompt.split()[1] for i, r in enumerate(sc.requests)}  # "NORTH" / "SOUTH" / "EAST"
    north = [rid for rid, name in lists.items() if name == "NORTH"]
    others = [rid for rid, name in lists.items() if name != "NORTH"]
    assert lookups[north[0]].num_cached_tokens == 0
    assert all(lookups[rid].num_cached_tokens >= 100 for rid in north[1:])
    assert all(lookups[rid].num_cached_tokens == 0 for rid in others)
    evicted_text = " ".join(n.text for t in traces for n in t.prefix.evicted)
    assert "Warehouse SOUTH" in evicted_text and "Warehouse EAST" in evicted_text
    assert "Warehouse NORTH" not in evicted_text
