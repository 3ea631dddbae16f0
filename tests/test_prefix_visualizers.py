"""Prefix-cache views (visualizers/prefix_tree.py, prefix_stats.py, the cached state in kv_blocks.py)
checked on their data.

The first part uses small hand-made trees (tests/prefix_records.py) whose drawing is worked out
by hand here: LRU order, owners, the leaf-counting layout, ghosts of evicted nodes, folding of
cold subtrees, escaping. The last part uses real runs of the engine on ``tiny-random``: the LRU
rank against the engine's own eviction, owners against the pool, the caching on/off tables
against the traces, and a replayed recording against the live run. Every figure also passes
Plotly's full validation.
"""
from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

import plotly.graph_objects as go
import pytest

from engine.replay.recording import from_json, record, to_json
from engine.replay.run import LiveRun, ReplayRun, compare_prefix_caching
from engine.replay.scenario import load_scenario
from engine.core.trace import BlockCopy, PrefixCacheEvents, PrefixLookup
from tests.prefix_records import BLOCK_SIZE, Req, Tree, node, root, snapshot, trace
from visualizers import kv_blocks as vk
from visualizers import prefix_stats as ps
from visualizers import prefix_tree as pt
from visualizers.figures import validated
from visualizers.theme import BLOCK_STATE_COLORS, PREFIX_NODE_COLORS, PREFIX_NODE_LABELS, request_color, request_label

if TYPE_CHECKING:
    from engine.model.shared import SharedModel

NASTY = "<img src=x onerror=alert(1)> & <b>bold</b>\nline two"


def check(fig: go.Figure) -> go.Figure:
    validated(fig)
    json.loads(fig.to_json())
    return fig


def by_name(fig: go.Figure, name: str) -> Any:
    found = [t for t in fig.data if t.name == name]
    assert len(found) == 1, [t.name for t in fig.data]
    return found[0]


def grid_trace(fig: go.Figure, name: str) -> Any:
    """A trace of the block-pool grid (the first panel, axis "x") by name."""
    found = [t for t in fig.data if (t.xaxis or "x") == "x" and t.name == name]
    assert len(found) == 1, [t.name for t in fig.data]
    return found[0]


def boxes_in(fig: go.Figure, state: str) -> int:
    """Rectangles drawn by a state's fill trace (5 corners + a None separator each)."""
    xs = list(by_name(fig, PREFIX_NODE_LABELS[state]).x)
    return 0 if xs == [None] else len(xs) // 6


def sample_tree() -> Tree:
    """root ─ 1 [1,2] lock 2 ─┬ 2 [3]   lock 1 (r0)
                             ├ 3 [4]   lock 1 (r1) ─ 5 [6] lock 0 last 4
                             └ 4 [5]   lock 0 last 2
       root ─ 6 [7] lock 0 last 1 ─ 7 [8] lock 0 last 3
    """
    t = Tree()
    t.add(1, 0, [1, 2], lock=2, last=9).add(2, 1, [3], lock=1, last=9).add(3, 1, [4], lock=1, last=8)
    t.add(4, 1, [5], last=2).add(5, 3, [6], last=4).add(6, 0, [7], last=1).add(7, 6, [8], last=3)
    return t


SAMPLE_REQS = [Req("0", (1, 2, 3, 20)), Req("1", (1, 2, 4, 21)), Req("2", (1, 2), status="finished"),
               Req("3", (7,), status="waiting")]


# -- records -> facts -------------------------------------------------------------------------

def test_lru_order_takes_leaves_oldest_first_and_parents_after_their_children() -> None:
    """Evictable = lock 0. Leaves 4 (last 2), 5 (4), 7 (3); 6 becomes a leaf once 7 is gone:
    4, 7, then 6 (last 1) before 5 (last 4). Locked nodes and the root never appear."""
    nodes = sample_tree().nodes
    assert pt.lru_order(nodes) == [4, 7, 6, 5]
    assert pt.lru_ranks(nodes) == {4: 1, 7: 2, 6: 3, 5: 4}


def test_lru_order_breaks_ties_by_node_id_like_the_engine() -> None:
    t = Tree().add(3, 0, [1], last=5).add(2, 0, [2], last=5).add(1, 0, [3], last=6)
    assert pt.lru_order(t.nodes) == [2, 3, 1]


def test_owners_are_the_running_requests_whose_block_tables_hold_the_nodes_blocks() -> None:
    """Finished and waiting requests own nothing; a node shared by two tables lists both, in id order."""
    owners = pt.node_owners(snapshot(sample_tree().nodes, SAMPLE_REQS))
    assert owners == {0: (), 1: ("0", "1"), 2: ("0",), 3: ("1",), 4: (), 5: (), 6: (), 7: ()}


def test_step_marks_new_beats_split_beats_hit() -> None:
    ev = PrefixCacheEvents(lookups=(PrefixLookup("0", 12, 8, (1, 3)),), split=(3,), inserted=(5,))
    assert pt.step_marks(trace(0, ev)) == {1: "hit", 3: "split", 5: "new"}
    assert pt.step_marks(None) == {}


def test_touched_looks_only_at_the_last_window_steps() -> None:
    old = trace(0, PrefixCacheEvents(inserted=(1,)))
    mid = trace(1, PrefixCacheEvents(lookups=(PrefixLookup("0", 8, 4, (2,)),)))
    new = trace(2, PrefixCacheEvents(split=(3,)))
    assert pt.touched([old, mid, new], 2) == {2, 3}
    assert pt.touched([old, mid, new], 3) == {1, 2, 3}
    assert pt.touched([old, mid, new], 0) == set()


# -- layout -----------------------------------------------------------------------------------

def test_layout_counts_leaves_left_to_right_and_centres_parents() -> None:
    """Leaves in depth-first order, siblings by their tokens: 2, 5, 4, 7 take slots 0..3; 3 sits over
    5 (its only child), 1 between 2 and 4, 6 over 7, the root between 1 and 6."""
    layout = pt.tree_layout(snapshot(sample_tree().nodes, SAMPLE_REQS))
    x = {b.node_id: b.x for b in layout.boxes}
    depth = {b.node_id: b.depth for b in layout.boxes}
    assert (x[2], x[5], x[4], x[7]) == (0, 1, 2, 3)
    assert x[3] == 1 and x[1] == 1 and x[6] == 3 and x[0] == 2
    assert depth == {0: 0, 1: 1, 2: 2, 3: 2, 4: 2, 5: 3, 6: 1, 7: 2}
    assert [b.node_id for b in layout.boxes] == [0, 1, 2, 3, 5, 4, 6, 7]  # pre-order: parents first
    assert (layout.slots, layout.depth, layout.num_nodes, layout.num_collapsed) == (4, 3, 7, 0)
    states = {b.node_id: b.state for b in layout.boxes}
    assert states == {0: "root", 1: "in use", 2: "in use", 3: "in use", 4: "evictable", 5: "evictable",
                      6: "evictable", 7: "evictable"}
    assert {b.node_id: b.lru_rank for b in layout.boxes if b.lru_rank} == {4: 1, 7: 2, 6: 3, 5: 4}


def test_siblings_keep_their_place_when_a_new_sibling_arrives() -> None:
    """Order by tokens, not by id or age: a node inserted later with smaller tokens goes left."""
    t = Tree().add(5, 0, [9]).add(6, 0, [30])
    before = {b.node_id: b.x for b in pt.tree_layout(snapshot(t.nodes)).boxes}
    after = {b.node_id: b.x for b in pt.tree_layout(snapshot(t.add(7, 0, [20]).nodes)).boxes}
    assert before[5] < before[6] and after[5] < after[7] < after[6]


def test_last_steps_events_colour_their_nodes() -> None:
    ev = PrefixCacheEvents(lookups=(PrefixLookup("1", 13, 12, (1, 3)),), inserted=(5,), split=(1,))
    layout = pt.tree_layout(snapshot(sample_tree().nodes, SAMPLE_REQS), trace(3, ev))
    states = {b.node_id: b.state for b in layout.boxes}
    assert (states[1], states[3], states[5], states[2]) == ("split", "hit", "new", "in use")


def test_evicted_nodes_are_ghosts_where_they_stood() -> None:
    """Node 8 (under 4) and its child 9 were evicted last step: ghosts nested under 4; node 10 (under
    the root, tokens between 1's and 6's) stands between them; 11 had a parent that no longer exists."""
    ev = PrefixCacheEvents(evicted=(node(9, 8, [13]), node(8, 4, [12]), node(10, 0, [6]), node(11, 42, [14])))
    layout = pt.tree_layout(snapshot(sample_tree().nodes, SAMPLE_REQS), trace(5, ev))
    boxes = {b.key: b for b in layout.boxes}
    assert {k for k, b in boxes.items() if b.state == "evicted"} == {"g8", "g9", "g10", "g11"}
    assert boxes["g8"].parent_key == "n4" and boxes["g9"].parent_key == "g8"
    assert (boxes["g8"].depth, boxes["g9"].depth) == (3, 4)
    assert boxes["g10"].parent_key == "n0" and boxes["n1"].x < boxes["g10"].x < boxes["n6"].x
    assert boxes["g11"].parent_key == "n0"
    assert [b.key for b in layout.boxes].index("g8") > [b.key for b in layout.boxes].index("n4")
    assert layout.num_nodes == 7  # ghosts are not in the cache
    later = pt.tree_layout(snapshot(sample_tree().nodes, SAMPLE_REQS), trace(6))
    assert not [b for b in later.boxes if b.state == "evicted"], "a ghost lasts one step"


def wide_tree(n_cold: int) -> Tree:
    """root ─ 1 (locked, r0) ─ 2 (locked); root ─ 3 (cold) ─ n_cold cold leaves;
    root ─ 4 (cold, newer) ─ 2 leaves."""
    t = Tree().add(1, 0, [1], lock=1, last=50).add(2, 1, [2], lock=1, last=50)
    t.add(3, 0, [3], last=1)
    for i in range(n_cold):
        t.add(10 + i, 3, [10 + i], last=2 + i)
    t.add(4, 0, [4], last=40).add(5, 4, [5], last=41).add(6, 4, [6], last=42)
    return t


def test_small_trees_are_never_folded() -> None:
    layout = pt.tree_layout(snapshot(wide_tree(3).nodes, [Req("0", (1, 2))]))
    assert layout.num_collapsed == 0 and not [b for b in layout.boxes if b.state == "collapsed"]


def test_cold_subtrees_fold_coldest_first_until_the_tree_fits() -> None:
    """40 cold leaves under node 3 make the tree too wide: the root's cold children (3 with its leaves,
    and 4 with its two) are one group, folded into one "+k nodes" box; the locked path stays."""
    t = wide_tree(40)
    layout = pt.tree_layout(snapshot(t.nodes, [Req("0", (1, 2))]))
    folds = [b for b in layout.boxes if b.state == "collapsed"]
    assert len(folds) == 1
    fold = folds[0]
    assert fold.key == "c0" and fold.parent_key == "n0" and fold.num_nodes == 41 + 3
    assert fold.lru_rank == 1 and fold.lock_count == 0 and fold.owners == ()
    assert len(fold.block_ids) == 44 and fold.depth == 1
    assert {b.node_id for b in layout.boxes if b.state != "collapsed"} == {0, 1, 2}
    assert layout.num_collapsed == 44 and layout.num_nodes == 46
    assert [b.key for b in layout.boxes if b.parent_key == "n0"] == ["n1", "c0"]  # a fold comes last


def test_recently_touched_subtrees_stay_unfolded() -> None:
    """Node 4's subtree was matched two steps ago (within COLD_STEPS): only node 3's cold leaves fold,
    as one box under node 3 (3 itself was touched too)."""
    t = wide_tree(40)
    recent = [trace(0, PrefixCacheEvents(lookups=(PrefixLookup("9", 8, 4, (4, 5)),))),
              trace(1, PrefixCacheEvents(lookups=(PrefixLookup("8", 8, 4, (3,)),))), trace(2)]
    layout = pt.tree_layout(snapshot(t.nodes, [Req("0", (1, 2))]), recent[-1], recent)
    folds = [b for b in layout.boxes if b.state == "collapsed"]
    assert [(f.key, f.parent_key, f.num_nodes) for f in folds] == [("c3", "n3", 40)]
    assert {4, 5, 6, 3} <= {b.node_id for b in layout.boxes if b.state != "collapsed"}
    far = pt.tree_layout(snapshot(t.nodes, [Req("0", (1, 2))]), recent[-1], recent, cold_steps=1)
    assert [f.key for f in far.boxes if f.state == "collapsed"] == ["c0"]


def test_fold_plan_stops_once_under_budget() -> None:
    """Two cold groups: folding the colder one is enough, so the other stays drawn."""
    t = Tree().add(1, 0, [1], lock=1).add(2, 0, [2], lock=1)
    for i in range(6):
        t.add(10 + i, 1, [10 + i], last=1)
        t.add(20 + i, 2, [20 + i], last=5)
    nodes = pt.reachable(t.nodes)
    plan = pt.fold_plan(nodes, {1, 2}, max_nodes=12, max_slots=100)
    assert list(plan) == [1] and plan[1].top_ids == tuple(range(10, 16))
    assert pt.fold_plan(nodes, {1, 2}, max_nodes=14, max_slots=100) == {}


def test_a_broken_tree_from_a_recording_draws_what_the_root_reaches() -> None:
    """A node whose parent is missing, a cycle, a self-parent: drawn without them, no exception."""
    nodes = [root(), node(1, 0, [1]), node(2, 99, [2]), node(3, 4, [3]), node(4, 3, [4]), node(5, 5, [5])]
    layout = pt.tree_layout(snapshot(nodes))
    assert {b.node_id for b in layout.boxes} == {0, 1}
    check(pt.tree_figure(snapshot(nodes)))
    assert pt.tree_layout(snapshot([node(1, 0, [1])])).boxes == ()  # no root at all


# -- the figure -------------------------------------------------------------------------------

def test_tree_figure_draws_one_box_per_node_in_its_states_trace() -> None:
    ev = PrefixCacheEvents(lookups=(PrefixLookup("1", 13, 12, (1, 3)),), inserted=(2,),
                           evicted=(node(8, 4, [12]),))
    snap = snapshot(sample_tree().nodes, SAMPLE_REQS, step=7)
    fig = check(pt.tree_figure(snap, trace(6, ev), font_size=12))
    counts = {s: boxes_in(fig, s) for s in ("in use", "evictable", "hit", "new", "split", "evicted", "collapsed")}
    assert counts == {"in use": 0, "evictable": 4, "hit": 2, "new": 1, "split": 0, "evicted": 1, "collapsed": 0}
    for state in counts:
        t = by_name(fig, PREFIX_NODE_LABELS[state])
        assert t.fillcolor == PREFIX_NODE_COLORS[state] and t.fill == "toself"
    assert fig.layout.meta == {"step": 7}
    assert fig.layout.title.text.startswith("Radix tree after 7 steps: 7 nodes, 8 blocks cached (")
    assert fig.layout.dragmode == "zoom" and fig.layout.uirevision == "prefix-tree"
    hover = by_name(fig, "nodes")
    assert len(hover.x) == 9  # root + 7 nodes + 1 ghost
    assert [cd[0] for cd in hover.customdata] == [0, 1, 2, 3, 5, 4, 8, 6, 7]


def test_owner_squares_use_the_request_colours_of_the_other_views() -> None:
    fig = check(pt.tree_figure(snapshot(sample_tree().nodes, SAMPLE_REQS)))
    owners = by_name(fig, "owners")
    # node 1 (r0, r1), node 2 (r0), node 3 (r1): four squares, each under its node
    assert list(owners.marker.color) == [request_color("0"), request_color("1"), request_color("0"),
                                         request_color("1")]
    assert list(owners.customdata) == ["r0", "r1", "r0", "r1"]


def test_node_text_is_escaped_in_labels_and_hovers() -> None:
    t = Tree().add(1, 0, [1], text=NASTY)
    fig = check(pt.tree_figure(snapshot(t.nodes), font_size=12, max_nodes=30))
    labels = " ".join(by_name(fig, "labels").text)
    hovers = " ".join(by_name(fig, "nodes").hovertext)
    for text in (labels, hovers):
        assert "<img" not in text and "<b>bold" not in text
        assert "&lt;img" in text
    assert "&lt;img src=x onerror=alert(1)&gt; &amp; &lt;b&gt;bold&lt;/b&gt;⏎line two" in hovers


def test_labels_are_cut_to_fit_and_the_hover_keeps_the_full_text() -> None:
    long = "word " * 60
    t = Tree().add(1, 0, [1], text=long)
    for i in range(2, 12):
        t.add(i, 0, [i], text=long)
    fig = pt.tree_figure(snapshot(t.nodes))
    chars = pt.label_chars(11, pt.text_sizes(12)[0])  # the bold line's size at font 12
    first = by_name(fig, "labels").text[1]
    shown = first.split("<br>")[0].removeprefix("<b>").removesuffix("</b>")
    assert len(shown) == chars and shown.endswith("…")
    assert long.strip()[:120] in by_name(fig, "nodes").hovertext[1].replace("<br>", "")


def test_captions_say_blocks_lock_and_lru_rank() -> None:
    layout = pt.tree_layout(snapshot(sample_tree().nodes, SAMPLE_REQS))
    captions = {b.node_id: pt.caption(b) for b in layout.boxes if b.state != "root"}
    assert captions[1] == ("2 blocks", "lock 2") and captions[4] == ("1 block", "LRU 1")
    assert captions[5] == ("1 block", "LRU 4")


def test_a_tree_held_to_a_height_keeps_its_text_inside_its_boxes() -> None:
    """Presentation mode holds the main chart to the first screen: where a level is then too short
    for a box's three lines, the box shows its text only (the blocks and the lock count stay in
    its hover); they overflowed onto the owner squares and the next level (issue 19, item 9)."""
    snap = snapshot(sample_tree().nodes, SAMPLE_REQS)
    full = check(pt.tree_figure(snap, font_size=19))
    natural = full.layout.height
    assert any("lock 2" in t for t in by_name(full, "labels").text)
    held = check(pt.tree_figure(snap, font_size=19, max_height=natural - 1))
    assert held.layout.height == natural - 1
    assert not any("<br>" in t for t in by_name(held, "labels").text)
    assert any("lock count 2" in h for h in by_name(held, "nodes").hovertext)
    roomy = check(pt.tree_figure(snap, font_size=19, max_height=natural))
    assert roomy.to_dict() == full.to_dict()


def test_empty_and_disabled_trees_say_so() -> None:
    off = check(pt.tree_figure(snapshot([])))
    assert "prefix caching is off" in off.layout.title.text
    assert "off" in off.layout.annotations[0].text
    empty = check(pt.tree_figure(snapshot([root()])))
    assert "Nothing cached yet" in empty.layout.annotations[0].text


def test_a_big_tree_stays_small_on_the_wire() -> None:
    """300 cached nodes, none recently touched: folded to a few boxes, a figure of a few kB."""
    t = Tree().add(1, 0, [1], lock=1)
    for i in range(2, 302):
        t.add(i, 1 if i < 100 else (i // 10), [i], last=i)
    fig = check(pt.tree_figure(snapshot(t.nodes, [Req("0", (1,))], num_blocks=320)))
    assert len(by_name(fig, "nodes").x) <= pt.MAX_NODES + 1
    assert len(fig.to_json()) < 30_000


def test_tree_frame_one_row_per_node() -> None:
    frame = pt.tree_frame(snapshot(sample_tree().nodes, SAMPLE_REQS))
    assert list(frame["node"]) == [1, 2, 3, 5, 4, 6, 7]
    row = frame.set_index("node").loc[1]
    assert (row["parent"], row["depth"], row["tokens"], row["blocks"], row["held by"]) == (0, 1, 8, "1, 2", "r0, r1")
    assert frame.set_index("node").loc[4, "LRU rank"] == 1


def test_events_markdown_lists_the_steps_cache_events_escaped() -> None:
    ev = PrefixCacheEvents(lookups=(PrefixLookup("*x*", 20, 16, (1, 3)),), inserted=(5,), split=(1,),
                           evicted=(node(8, 4, [12, 13]),), copies=(BlockCopy("0#1", 4, 9),), forked=("0#1",))
    text = pt.events_markdown(trace(2, ev), BLOCK_SIZE)
    assert "\\*x\\* admitted: **16** of 20 tokens from the cache (4 blocks; nodes 1 → 3)" in text
    assert "nodes inserted: **1** (5)" in text and "nodes split: **1** (1)" in text
    assert "nodes evicted: **1** (8)" in text and "blocks freed by eviction: **2**" in text
    assert "- copy-on-write: r0#1 copied block 4 → 9" in text
    assert "- parallel sampling, sequences created: r0#1" in text
    assert pt.events_markdown(trace(2), BLOCK_SIZE) == "Nothing in the prefix cache changed in the last step."
    assert "No step yet" in pt.events_markdown(None, BLOCK_SIZE)


# -- over time --------------------------------------------------------------------------------

def test_stats_frame_hit_rates_step_and_cumulative() -> None:
    steps = [trace(0, PrefixCacheEvents(lookups=(PrefixLookup("0", 20, 0, ()),)), prefill=20, cached_blocks=5),
             trace(1, PrefixCacheEvents(), cached_blocks=5),
             trace(2, PrefixCacheEvents(lookups=(PrefixLookup("1", 24, 16, (1,)), PrefixLookup("2", 16, 12, (1,)))),
                   prefill=12, cached_blocks=7, evictable_blocks=2),
             trace(3, PrefixCacheEvents(evicted=(node(4, 0, [3, 4]), node(5, 0, [6])), copies=(BlockCopy("1", 1, 2),)))]
    frame = ps.cache_stats_frame(steps)
    assert list(frame["lookup tokens"]) == [20, 0, 40, 0] and list(frame["cached tokens"]) == [0, 0, 28, 0]
    assert frame["hit rate"][0] == 0 and math.isnan(frame["hit rate"][1]) and frame["hit rate"][2] == pytest.approx(0.7)
    assert list(frame["cumulative hit rate"]) == pytest.approx([0, 0, 28 / 60, 28 / 60])
    assert list(frame["evicted blocks"]) == [0, 0, 0, 3] and list(frame["evicted nodes"]) == [0, 0, 0, 2]
    assert list(frame["copies"]) == [0, 0, 0, 1] and list(frame["prefill tokens"]) == [20, 0, 12, 0]
    assert ps.hit_rate(steps) == pytest.approx(28 / 60) and ps.hit_rate([]) is None
    assert ps.cache_stats_frame([]).empty and list(ps.cache_stats_frame([]).columns) == ps.STATS_COLUMNS


def test_cache_figure_panels_follow_the_frame() -> None:
    steps = [trace(i, PrefixCacheEvents(lookups=(PrefixLookup("0", 10, 4 * (i % 2), ()),)), prefill=10 - 4 * (i % 2),
                   cached_blocks=i) for i in range(5)]
    snap = snapshot(sample_tree().nodes, SAMPLE_REQS, step=5)
    fig = check(ps.cache_figure(steps, snap))
    assert fig.layout.meta == {"step": 5} and fig.layout.title.text == "Prefix cache after 5 steps: hit rate 16%"
    assert list(by_name(fig, "hit rate, so far").y) == pytest.approx([0, 0.2, 4 / 30, 0.2, 8 / 50])
    assert list(by_name(fig, "prefill tokens saved (from cache)").y) == [0, 4, 0, 4, 0]
    assert list(by_name(fig, "blocks in the tree").y) == [0, 1, 2, 3, 4]
    cached = by_name(fig, "cached, evictable")  # the pool panel draws the evictable blocks
    assert sorted(int(cd[0]) for cd in cached.customdata) == [5, 6, 7, 8]


# -- the KV page's cached state ---------------------------------------------------------------

def test_pool_grid_draws_evictable_cached_blocks_apart_and_outlines_cached_blocks_in_use() -> None:
    """Blocks 5-8 (cached, ref 0) -> "cached, evictable"; blocks 1-4 (cached, in use) keep their
    owner's trace (or "shared") with the cache's outline; block 20 (in use, not cached) has none."""
    snap = snapshot(sample_tree().nodes, SAMPLE_REQS)
    fig = check(vk.kv_figure(snap, None))
    grid = [t for t in fig.data if (t.xaxis or "x") == "x"]
    names = [t.name for t in grid]
    assert names == ["free", "cached, evictable", "r0", "r1", "shared (ref>1)", vk.CACHED_IN_USE]
    cached = grid_trace(fig, "cached, evictable")
    assert cached.marker.color == BLOCK_STATE_COLORS["cached"]
    assert sorted(int(cd[0]) for cd in cached.customdata) == [5, 6, 7, 8]
    assert all("cached, evictable" in cd[5] for cd in cached.customdata)
    outline = BLOCK_STATE_COLORS["cached outline"]
    assert list(cached.marker.line.color) == [outline] * 4
    shared = grid_trace(fig, "shared (ref>1)")
    assert sorted(int(cd[0]) for cd in shared.customdata) == [1, 2]
    assert list(shared.marker.line.color) == [outline] * 2
    r0 = grid_trace(fig, "r0")
    lines = {int(cd[0]): (c, w) for cd, c, w in zip(r0.customdata, r0.marker.line.color, r0.marker.line.width)}
    assert lines[3] == (outline, 2.0) and lines[20] == ("rgba(0,0,0,0)", 0.0)
    assert "cached and in use" in dict((int(cd[0]), cd[5]) for cd in r0.customdata)[3]
    free = grid_trace(fig, "free")
    assert len(free.x) == snap.num_free_blocks == 64 - 10
    title = next(a.text for a in fig.layout.annotations if a.text.startswith("<b>Block pool"))
    assert title == "<b>Block pool: 6 used, 54 free, 4 evictable / 64</b>"


def test_allocated_and_freed_outlines_win_over_the_cache_outline() -> None:
    snap = snapshot(sample_tree().nodes, SAMPLE_REQS)
    step = trace(0)
    step = type(step)(**{**step.__dict__, "blocks_allocated": (3,), "blocks_freed": (5,)})
    fig = vk.kv_figure(snap, step)
    r0, cached = grid_trace(fig, "r0"), grid_trace(fig, "cached, evictable")
    line = {int(cd[0]): c for cd, c in zip(r0.customdata, r0.marker.line.color)}
    assert line[3] == vk.ALLOCATED_OUTLINE
    line = {int(cd[0]): c for cd, c in zip(cached.customdata, cached.marker.line.color)}
    assert line[5] == vk.FREED_OUTLINE and line[6] == BLOCK_STATE_COLORS["cached outline"]


# -- real runs (tiny-random) ------------------------------------------------------------------

def run_live(model: "SharedModel", name: str, steps: int | None = None, **knobs: Any) -> LiveRun:
    run = LiveRun.from_scenario(load_scenario(name), model, **knobs)
    run.step(10_000 if steps is None else steps)
    return run


@pytest.mark.parametrize("name, steps", [("cache-pressure", 20), ("multi-turn", 30), ("shared-prefix", None)])
def test_lru_rank_is_the_order_the_engine_evicts_in(tiny: "SharedModel", torch_single_thread: None, name: str,
                                                    steps: int | None) -> None:
    """Ask the engine's own cache to evict everything it can (mid-run, with some nodes locked, or
    after the last request): the nodes go in ``lru_order``, locked ones never."""
    run = run_live(tiny, name, steps)
    snap = run.engine.snapshot()
    expected = pt.lru_order(snap.prefix_tree)
    assert expected, "the scenario has unlocked nodes at this step"
    locked = [n.node_id for n in snap.prefix_tree if n.lock_count and n.parent_id is not None]
    assert bool(locked) == (steps is not None), "mid-run some nodes are locked; at the end none"
    cache = run.engine.kv.prefix_cache
    cache.drain_events()
    cache.evict(snap.num_blocks)
    assert [n.node_id for n in cache.drain_events().evicted] == expected


def test_real_tree_every_node_drawn_with_the_pools_owners(tiny: "SharedModel", torch_single_thread: None) -> None:
    run = LiveRun.from_scenario(load_scenario("shared-prefix"), tiny)
    for _ in range(12):
        run.step(1)
        v = run.view()
        snap = v.snapshot
        layout = pt.tree_layout(snap, v.last_trace, v.traces, max_nodes=1000, max_slots=1000)
        live_ids = {n.node_id for n in snap.prefix_tree}
        assert {b.node_id for b in layout.boxes if b.state != "evicted"} == live_ids
        pool = {b.block_id: b for b in snap.blocks}
        running = set(snap.running)
        for n in snap.prefix_tree:
            holders = {o for b in n.block_ids for o in pool[b].owners if o in running}
            assert set(pt.node_owners(snap)[n.node_id]) == holders
            assert all(pool[b].cached for b in n.block_ids)
            assert n.lock_count == 0 or holders, "a locked node's blocks are in running block tables"
        check(pt.tree_figure(snap, v.last_trace, v.traces))
        check(ps.cache_figure(v.traces, snap))
    assert pt.tree_layout(snap).num_nodes > 8, "eight questions behind one prefix: a branch each"


def test_caching_on_vs_off_tables_follow_the_traces(tiny: "SharedModel", torch_single_thread: None) -> None:
    runs = compare_prefix_caching(load_scenario("shared-prefix"), tiny)
    assert list(runs) == ["caching on", "caching off"]
    summary = ps.caching_summary(runs).set_index("run")
    for name, run in runs.items():
        assert summary.loc[name, "prefill tokens computed"] == sum(t.num_prefill_tokens for t in run.traces)
        assert summary.loc[name, "steps"] == len(run.traces)
    assert summary.loc["caching off", "from cache"] == 0 and not runs["caching off"].final.prefix_tree
    computed = summary["prefill tokens computed"]
    assert 0 < computed["caching on"] < computed["caching off"]
    frame = ps.caching_requests_frame(runs).set_index("request")
    assert len(frame) == 8
    for side in ("on", "off"):
        run = runs[f"caching {side}"]
        metrics = {request_label(m.request_id): m for m in run.final.metrics}
        assert frame[f"prefill computed ({side})"].sum() == sum(t.num_prefill_tokens for t in run.traces)
        for label, row in frame.iterrows():
            assert row[f"TTFT steps ({side})"] == metrics[label].ttft_steps
            if side == "on":
                assert row["from cache"] == metrics[label].num_cached_tokens
    assert frame["from cache"].iloc[0] == 0 and (frame["from cache"].iloc[1:] > 0).all()
    fig = check(ps.caching_comparison_figure(runs))
    bars = [t for t in fig.data if t.name == "caching on"]
    assert list(bars[0].y) == list(frame["prefill computed (on)"])


@pytest.mark.parametrize("name", ["multi-turn", "cache-pressure"])
def test_a_replayed_recording_draws_the_same_figures_at_every_step(tiny: "SharedModel", torch_single_thread: None,
                                                                   name: str) -> None:
    """Record a real run, load the JSON back (no model), step the replay: at every step the tree
    and the cache panels are the live run's, number for number."""
    run = LiveRun.from_scenario(load_scenario(name), tiny)
    live = []
    while not run.done:
        run.step(1)
        v = run.view()
        live.append((pt.tree_figure(v.snapshot, v.last_trace, v.traces).to_dict(),
                     ps.cache_figure(v.traces, v.snapshot).to_dict()))
    assert any(t.prefix.evicted for t in run.traces) or name != "cache-pressure"
    replay = ReplayRun(from_json(to_json(record(run))))
    for tree, stats in live:
        replay.step(1)
        v = replay.view()
        assert pt.tree_figure(v.snapshot, v.last_trace, v.traces).to_dict() == tree
        assert ps.cache_figure(v.traces, v.snapshot).to_dict() == stats
    assert replay.done
