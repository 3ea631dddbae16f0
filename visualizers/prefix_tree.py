"""Radix-tree prefix cache view: the tree in ``Snapshot.prefix_tree``, laid out in Python.

Each node is a box: its decoded text (truncated; the full text on hover), its blocks, its lock
count, the colours of the running requests that hold its blocks, and for an unlocked node its
LRU rank (1 = the next node eviction takes). Box colour says what the node is (in use /
evictable) or what the last step did to it (SGLang's Fig. 3 colours: hit blue, inserted green,
split sand, evicted red, drawn faded where it was).

Layout: leaf counting (each leaf gets the next slot across, a parent sits centred over its
children), depth downwards. Siblings are ordered by their tokens, so a node keeps its place
from step to step and an evicted node's ghost appears where it was. Past ``max_nodes`` boxes
or ``max_slots`` leaves across, the cold children of a node (subtrees with no lock, not
touched in the last ``cold_steps`` steps) fold into one "+k nodes" box, coldest group first;
the figure zooms by dragging (double-click resets).

Pure functions of engine records (Snapshot, StepTrace) -> plotly Figure / pandas DataFrame.
Records may come from a shared recording: a malformed tree (missing parents, cycles) draws
what is reachable from the root and never raises.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd
import plotly.graph_objects as go

from engine.core.trace import PrefixNode, Snapshot, StepTrace
from visualizers.figures import figure, legend_below, live_layout
from visualizers.text import escape_markdown, escape_plotly
from visualizers.theme import (BLOCK_STATE_COLORS, PREFIX_NODE_COLORS, PREFIX_NODE_LABELS, PREFIX_NODE_STATES,
                               plot_label, request_color, request_label, request_sort_key, text_color_on)

MAX_NODES = 30  # boxes drawn before cold subtrees are folded
MAX_SLOTS = 14  # leaves across before cold subtrees are folded (a box stays wide enough to read)
COLD_STEPS = 4  # a subtree touched within this many steps is never folded
MAX_OWNER_DOTS = 8  # owner squares drawn under a box (the hover lists them all)
PLOT_WIDTH_PX = 1000  # the narrowest plot the labels are fitted to (a 1440-px screen, sidebar open)
MARGIN_X_PX = 20  # the figure's left + right margins
LEVEL_PX = 100  # pixels per tree level (at least; more when the font needs it: level_px)
CHAR_EM = 0.62  # width of a character (bold Source Sans, generous), in ems
LINE_EM = 1.3  # height of a line of text, in ems
BOX_W = 0.88  # box width, in leaf slots
BOX_H = 0.56  # box height, in levels
OWNER_GAP = 0.09  # owner squares sit this far (levels) below their box
GHOST_OPACITY = 0.35
LINE_COLORS: dict[str, str] = {
    "root": "#555555", "in use": "#555555", "evictable": BLOCK_STATE_COLORS["cached outline"],
    "hit": "#225588", "new": "#117733", "split": "#886611", "evicted": "#CC3344", "collapsed": "#999999",
}
LINE_DASH: dict[str, str] = {"evicted": "dash", "collapsed": "dot"}


@dataclass(frozen=True)
class Box:
    """One drawn box: a node, an evicted node's ghost, or the folded cold children of a node."""

    key: str  # "n<id>" node, "g<id>" ghost of an evicted node, "c<id>" node id's folded cold children
    node_id: int
    parent_key: str | None
    state: str  # one of PREFIX_NODE_STATES
    depth: int
    x: float
    text: str  # decoded text of the node (a fold: its top nodes' texts, " | " between)
    num_tokens: int
    block_ids: tuple[int, ...]  # all blocks in the box (every folded node's)
    lock_count: int
    hit_count: int
    last_access: int
    lru_rank: int | None  # 1 = evicted next; a fold: the smallest rank in it
    owners: tuple[str, ...]  # running requests whose block tables hold the node's blocks
    num_nodes: int = 1  # a fold: how many nodes it holds


@dataclass(frozen=True)
class TreeLayout:
    boxes: tuple[Box, ...]  # parents before children
    num_nodes: int  # nodes in the cache, root excluded
    num_collapsed: int  # of those, folded into "+k nodes" boxes
    slots: int  # leaf slots across
    depth: int  # deepest level (root = 0)
    enabled: bool  # the snapshot has a tree at all (prefix caching on)


# -- what the records say ---------------------------------------------------------------------

def find_root(nodes: Sequence[PrefixNode]) -> PrefixNode | None:
    """The root: the first node without a parent (records list parents first)."""
    return next((n for n in nodes if n.parent_id is None), None)


def children_of(nodes: Iterable[PrefixNode]) -> dict[int, list[PrefixNode]]:
    """Parent id -> its children, ordered by their tokens (then id): a stable place per node."""
    out: dict[int, list[PrefixNode]] = {}
    for n in nodes:
        if n.parent_id is not None and n.parent_id != n.node_id:
            out.setdefault(n.parent_id, []).append(n)
    for kids in out.values():
        kids.sort(key=lambda n: (n.token_ids, n.node_id))
    return out


def reachable(nodes: Sequence[PrefixNode]) -> list[PrefixNode]:
    """Nodes reachable from the root, parents before children (each once, whatever the input)."""
    root = find_root(nodes)
    if root is None:
        return []
    kids = children_of(nodes)
    out, seen, stack = [], {root.node_id}, [root]
    while stack:
        n = stack.pop()
        out.append(n)
        for child in reversed(kids.get(n.node_id, [])):
            if child.node_id not in seen:
                seen.add(child.node_id)
                stack.append(child)
    return out


def lru_order(nodes: Sequence[PrefixNode]) -> list[int]:
    """The order in which LRU eviction would take the unlocked nodes, if it had to take them all.

    The engine's rule: the unlocked leaf with the smallest ``(last_access, node_id)`` goes first;
    a parent becomes a candidate once its last child is gone. The root is never evicted.
    """
    tree = reachable(nodes)
    if not tree:
        return []
    root_id = tree[0].node_id
    by_id = {n.node_id: n for n in tree}
    remaining = {n.node_id: 0 for n in tree}
    for n in tree[1:]:
        assert n.parent_id is not None  # reachable: every node but the root has its parent in the tree
        remaining[n.parent_id] += 1
    heap = [(n.last_access, n.node_id) for n in tree[1:] if n.lock_count == 0 and remaining[n.node_id] == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        _, nid = heapq.heappop(heap)
        order.append(nid)
        parent = by_id[nid].parent_id
        assert parent is not None
        remaining[parent] -= 1
        p = by_id[parent]
        if parent != root_id and p.lock_count == 0 and remaining[parent] == 0:
            heapq.heappush(heap, (p.last_access, p.node_id))
    return order


def lru_ranks(nodes: Sequence[PrefixNode]) -> dict[int, int]:
    """Node id -> its place in ``lru_order`` (1 = evicted next)."""
    return {nid: i + 1 for i, nid in enumerate(lru_order(nodes))}


def node_owners(snapshot: Snapshot) -> dict[int, tuple[str, ...]]:
    """Node id -> the running requests whose block tables hold any of the node's blocks."""
    holders: dict[int, set[str]] = {}
    for r in snapshot.requests:
        if r.status == "running":
            for b in r.block_table:
                holders.setdefault(b, set()).add(r.request_id)
    out = {}
    for n in snapshot.prefix_tree:
        ids: set[str] = set()
        for b in n.block_ids:
            ids |= holders.get(b, set())
        out[n.node_id] = tuple(sorted(ids, key=request_sort_key))
    return out


def step_marks(trace: StepTrace | None) -> dict[int, str]:
    """Node id -> what the step did to it: "hit" (on a newly admitted request's matched path),
    "split" (the head part of a split), "new" (inserted); later marks win."""
    marks: dict[int, str] = {}
    if trace is None:
        return marks
    events = trace.prefix
    for lookup in events.lookups:
        for nid in lookup.node_ids:
            marks[nid] = "hit"
    for nid in events.split:
        marks[nid] = "split"
    for nid in events.inserted:
        marks[nid] = "new"
    return marks


def touched(traces: Sequence[StepTrace], window: int) -> set[int]:
    """Nodes matched, inserted or split in the last ``window`` steps."""
    out: set[int] = set()
    for t in traces[-window:] if window > 0 else ():
        out.update(nid for lookup in t.prefix.lookups for nid in lookup.node_ids)
        out.update(t.prefix.inserted)
        out.update(t.prefix.split)
    return out


# -- layout -----------------------------------------------------------------------------------

def _subtree_ids(start: int, kids: Mapping[int, list[PrefixNode]]) -> list[int]:
    out, stack = [], [start]
    while stack:
        nid = stack.pop()
        out.append(nid)
        stack.extend(c.node_id for c in kids.get(nid, []))
    return out


@dataclass(frozen=True)
class Fold:
    """Cold children of one node drawn as one "+k nodes" box."""

    parent_id: int
    top_ids: tuple[int, ...]  # the folded children
    node_ids: tuple[int, ...]  # every node in their subtrees


def fold_plan(tree: Sequence[PrefixNode], hot: set[int], max_nodes: int = MAX_NODES,
              max_slots: int = MAX_SLOTS) -> dict[int, Fold]:
    """Which cold children to fold, so that at most ``max_nodes`` boxes and ``max_slots`` leaves
    across remain (when folding cold subtrees can get there).

    ``tree``: reachable nodes, root first. A node is cold when neither it nor any descendant is
    ``hot``; the cold children of a node that is not cold fold into one box, the group whose most
    recent access is oldest first. Groups of a single node are never folded (nothing saved).
    -> parent id -> its Fold.
    """
    kids = children_of(tree)
    hot = hot | {tree[0].node_id}
    size: dict[int, int] = {}
    leaves: dict[int, int] = {}
    cold: dict[int, bool] = {}
    recency: dict[int, int] = {}
    for n in reversed(tree):  # children before parents
        ch = [c.node_id for c in kids.get(n.node_id, [])]
        size[n.node_id] = 1 + sum(size[c] for c in ch)
        leaves[n.node_id] = sum(leaves[c] for c in ch) or 1
        cold[n.node_id] = n.node_id not in hot and all(cold[c] for c in ch)
        recency[n.node_id] = max([n.last_access, *(recency[c] for c in ch)])
    boxes, slots = len(tree) - 1, leaves[tree[0].node_id]
    if boxes <= max_nodes and slots <= max_slots:
        return {}
    groups = []
    for n in tree:
        if cold[n.node_id]:
            continue
        tops = [c.node_id for c in kids.get(n.node_id, []) if cold[c.node_id]]
        if sum(size[c] for c in tops) >= 2:
            groups.append((max(recency[c] for c in tops), n.node_id, tops))
    plan: dict[int, Fold] = {}
    for _, parent, tops in sorted(groups):
        if boxes <= max_nodes and slots <= max_slots:
            break
        ids = tuple(i for c in tops for i in _subtree_ids(c, kids))
        plan[parent] = Fold(parent, tuple(tops), ids)
        boxes -= len(ids) - 1
        slots -= sum(leaves[c] for c in tops) - 1
    return plan


@dataclass
class _Draft:
    """A box before its x position is known."""

    box: dict[str, Any]
    children: list[str]
    order: tuple[Any, ...]  # sibling order: by tokens, then node id; a fold last


def _node_box(n: PrefixNode, parent_key: str | None, state: str, depth: int, rank: int | None,
              owners: tuple[str, ...], key: str | None = None) -> dict[str, Any]:
    return dict(key=key or f"n{n.node_id}", node_id=n.node_id, parent_key=parent_key, state=state, depth=depth,
                text=n.text, num_tokens=len(n.token_ids), block_ids=tuple(n.block_ids), lock_count=n.lock_count,
                hit_count=n.hit_count, last_access=n.last_access, lru_rank=rank, owners=owners)


def _fold_box(fold: Fold, by_id: Mapping[int, PrefixNode], parent_key: str, depth: int,
              ranks: Mapping[int, int]) -> dict[str, Any]:
    members = [by_id[i] for i in fold.node_ids]
    member_ranks = [ranks[i] for i in fold.node_ids if i in ranks]
    return dict(key=f"c{fold.parent_id}", node_id=fold.top_ids[0], parent_key=parent_key, state="collapsed",
                depth=depth, text=" | ".join(by_id[i].text for i in fold.top_ids[:6]),
                num_tokens=sum(len(m.token_ids) for m in members),
                block_ids=tuple(b for m in members for b in m.block_ids), lock_count=0,
                hit_count=sum(m.hit_count for m in members), last_access=max(m.last_access for m in members),
                lru_rank=min(member_ranks) if member_ranks else None, owners=(), num_nodes=len(members))


def _ghost_parents(evicted: Sequence[PrefixNode], drawn: Mapping[int, str], root_key: str) -> dict[int, str]:
    """Each evicted node's drawn parent: its parent's box, its parent's ghost, or the root."""
    ghost_ids = {g.node_id for g in evicted}
    out = {}
    for g in evicted:
        pid = g.parent_id
        if pid is not None and pid in ghost_ids and pid != g.node_id:
            out[g.node_id] = f"g{pid}"
        elif pid is not None and pid in drawn:
            out[g.node_id] = drawn[pid]
        else:
            out[g.node_id] = root_key
    return out


def tree_layout(snapshot: Snapshot, trace: StepTrace | None = None, traces: Sequence[StepTrace] = (),
                max_nodes: int = MAX_NODES, cold_steps: int = COLD_STEPS, max_slots: int = MAX_SLOTS) -> TreeLayout:
    """Boxes and positions for the tree after ``trace`` (see the module doc)."""
    tree = reachable(snapshot.prefix_tree)
    if not tree:
        return TreeLayout((), 0, 0, 0, 0, bool(snapshot.prefix_tree))
    by_id = {n.node_id: n for n in tree}
    kids = children_of(tree)
    marks = step_marks(trace)
    ranks = lru_ranks(tree)
    owners = node_owners(snapshot)
    hot = touched(traces, cold_steps) | set(marks) | {n.node_id for n in tree if n.lock_count > 0}
    plan = fold_plan(tree, hot, max_nodes, max_slots)
    root = tree[0]
    drafts: dict[str, _Draft] = {}
    drawn: dict[int, str] = {}  # node id -> key of the box that shows it
    stack: list[tuple[PrefixNode, str | None, int]] = [(root, None, 0)]
    while stack:
        n, parent_key, depth = stack.pop()
        state = "root" if n is root else marks.get(n.node_id, "in use" if n.lock_count else "evictable")
        box = _node_box(n, parent_key, state, depth, ranks.get(n.node_id), owners.get(n.node_id, ()))
        _attach(drafts, _Draft(box, [], (0, n.token_ids, n.node_id)))
        drawn[n.node_id] = box["key"]
        fold = plan.get(n.node_id)
        folded = set(fold.top_ids) if fold else set()
        stack.extend((c, box["key"], depth + 1) for c in reversed(kids.get(n.node_id, []))
                     if c.node_id not in folded)
        if fold:
            fbox = _fold_box(fold, by_id, box["key"], depth + 1, ranks)
            _attach(drafts, _Draft(fbox, [], (1,)))
            drawn.update((i, fbox["key"]) for i in fold.node_ids)
    _add_ghosts(drafts, drawn, trace, by_id)
    for d in drafts.values():  # folds were attached before their siblings: order them all
        d.children.sort(key=lambda k: drafts[k].order)
    boxes, slots = _place(drafts, f"n{root.node_id}")
    num_folded = sum(len(f.node_ids) for f in plan.values())
    return TreeLayout(tuple(boxes), len(tree) - 1, num_folded, slots, max(b.depth for b in boxes), True)


def _attach(drafts: dict[str, _Draft], draft: _Draft) -> None:
    drafts[draft.box["key"]] = draft
    parent = draft.box["parent_key"]
    if parent is not None:
        drafts[parent].children.append(draft.box["key"])


def _add_ghosts(drafts: dict[str, _Draft], drawn: Mapping[int, str], trace: StepTrace | None,
                live: Mapping[int, PrefixNode]) -> None:
    """The last step's evicted nodes as faded boxes under their (drawn) parent, parents first;
    they sort among their siblings by their tokens, so a ghost stands where its node stood."""
    evicted = [g for g in (trace.prefix.evicted if trace else ()) if g.node_id not in live]
    if not evicted:
        return
    root_key = next(iter(drafts))
    parents = _ghost_parents(evicted, drawn, root_key)
    pending = {g.node_id: g for g in evicted}
    while pending:  # ghosts whose parent is placed (a box or an earlier ghost) go first
        ready = [g for g in pending.values() if parents[g.node_id] in drafts]
        if not ready:  # a cycle among ghosts: hang the rest under the root
            ready = list(pending.values())
            for g in ready:
                parents[g.node_id] = root_key
        for g in sorted(ready, key=lambda g: g.node_id):
            depth = drafts[parents[g.node_id]].box["depth"] + 1
            box = _node_box(g, parents[g.node_id], "evicted", depth, None, (), key=f"g{g.node_id}")
            _attach(drafts, _Draft(box, [], (0, g.token_ids, g.node_id)))
            del pending[g.node_id]


def _place(drafts: Mapping[str, _Draft], root_key: str) -> tuple[list[Box], int]:
    """Leaf counting: leaves take slots 0, 1, 2… in depth-first order; a parent is centred over
    its first and last child. -> boxes in pre-order, number of slots."""
    x: dict[str, float] = {}
    order: list[str] = []
    slot = 0
    stack: list[tuple[str, bool]] = [(root_key, False)]
    while stack:
        key, done = stack.pop()
        kids = drafts[key].children
        if done:
            x[key] = (x[kids[0]] + x[kids[-1]]) / 2
            continue
        order.append(key)
        if not kids:
            x[key] = float(slot)
            slot += 1
            continue
        stack.append((key, True))
        stack.extend((k, False) for k in reversed(kids))
    boxes = [Box(x=x[k], **drafts[k].box) for k in order]
    return boxes, max(slot, 1)


# -- the figure -------------------------------------------------------------------------------

def truncate(text: str, chars: int) -> str:
    """Text for a box: newlines visible (⏎), at most ``chars`` characters, escaped for Plotly."""
    flat = text.replace("\r", "").replace("\n", "⏎")
    shown = flat if len(flat) <= chars else flat[:max(chars - 1, 0)] + "…"
    return escape_plotly(shown)


def wrap(text: str, width: int = 60, max_lines: int = 8) -> str:
    """Full text for a hover: escaped, in lines of ``width`` characters (``<br>``), cut after ``max_lines``."""
    flat = text.replace("\r", "").replace("\n", "⏎")
    lines = [flat[i:i + width] for i in range(0, len(flat), width)] or [""]
    cut = len(lines) > max_lines
    lines = lines[:max_lines]
    if cut:
        lines[-1] += "…"
    return "<br>".join(escape_plotly(line) for line in lines)


def text_sizes(font_size: int) -> tuple[int, int]:
    """(the box's bold text, its two caption lines) in px: both scale with the figure's font."""
    return max(font_size - 1, 8), max(font_size - 3, 8)


def level_px(font_size: int) -> int:
    """Pixels per tree level: a box (BOX_H levels tall) holds its three lines of text."""
    main, small = text_sizes(font_size)
    return max(LEVEL_PX, math.ceil((LINE_EM * (main + 2 * small) + 6) / BOX_H))


def box_px(slots: int) -> float:
    """A box's width in pixels when ``slots`` leaves share the narrowest plot (PLOT_WIDTH_PX)."""
    return (PLOT_WIDTH_PX - MARGIN_X_PX) / max(slots, 1) * BOX_W


def label_chars(slots: int, font_size: int) -> int:
    """How many characters of a line at ``font_size`` px fit in a box (``box_px``), padding
    kept: a longer line is cut with an ellipsis (``truncate``), never drawn past the box."""
    return max(1, min(28, int((box_px(slots) - 4) / (font_size * CHAR_EM))))


def caption(box: Box) -> tuple[str, str]:
    """The box's two small lines under its text: blocks and lock count or LRU rank (a fold: how
    many nodes it holds; a ghost: that it was evicted)."""
    blocks = f"{len(box.block_ids)} block" + ("s" if len(box.block_ids) != 1 else "")
    if box.state == "collapsed":
        return f"+{box.num_nodes} nodes", blocks
    if box.state == "evicted":
        return "evicted", blocks
    if box.lock_count == 0 and box.lru_rank is not None:
        return blocks, f"LRU {box.lru_rank}"
    return blocks, f"lock {box.lock_count}"


def box_text(box: Box, slots: int, font_size: int, captions: bool = True) -> str:
    """Bold text (a fold: how many nodes), then the two small caption lines (unless not
    ``captions``); every line cut to what fits the box at its own size (``label_chars``)."""
    main, small = text_sizes(font_size)
    if box.state == "root":
        return f"<b>{truncate('root', label_chars(slots, main))}</b>"
    first, second = caption(box)
    quoted = box.text or "·"
    if box.state == "collapsed":
        quoted, first = first, quoted
    if not captions:
        return f"<b>{truncate(quoted, label_chars(slots, main))}</b>"
    cut = label_chars(slots, small)
    return (f"<b>{truncate(quoted, label_chars(slots, main))}</b><br><span style=\"font-size:{small}px\">"
            f"{truncate(first, cut)}<br>{truncate(second, cut)}</span>")


def hover_text(box: Box) -> str:
    """Everything about a box, for its hover (text escaped)."""
    if box.state == "root":
        return "root (holds no tokens)"
    head = (f"{box.num_nodes} nodes folded (cold: no lock, not touched lately)"
            if box.state == "collapsed" else f"node {box.node_id} · {PREFIX_NODE_LABELS[box.state]}")
    blocks = ", ".join(str(b) for b in box.block_ids[:12]) + (" …" if len(box.block_ids) > 12 else "")
    lines = [head, f"\"{wrap(box.text)}\"", f"{box.num_tokens} tokens in {len(box.block_ids)} blocks: {blocks}",
             f"lock count {box.lock_count} · hits {box.hit_count} · last access {box.last_access}"]
    if box.lru_rank is not None:
        lines.append(f"LRU rank {box.lru_rank}" + (" (evicted next)" if box.lru_rank == 1 else ""))
    if box.owners:
        lines.append("held by " + ", ".join(plot_label(r) for r in box.owners))
    return "<br>".join(lines)


def _outline(boxes: Sequence[Box]) -> tuple[list[float | None], list[float | None]]:
    """Closed rectangles, one per box, separated by None (one fill="toself" trace draws them all)."""
    xs: list[float | None] = []
    ys: list[float | None] = []
    w, h = BOX_W / 2, BOX_H / 2
    for b in boxes:
        xs += [b.x - w, b.x + w, b.x + w, b.x - w, b.x - w, None]
        ys += [b.depth - h, b.depth - h, b.depth + h, b.depth + h, b.depth - h, None]
    return xs, ys


def _edges(boxes: Sequence[Box], ghosts: bool) -> dict[str, Any]:
    by_key = {b.key: b for b in boxes}
    xs: list[float | None] = []
    ys: list[float | None] = []
    for b in boxes:
        parent = by_key.get(b.parent_key or "")
        if parent is None or (b.state == "evicted") != ghosts:
            continue
        xs += [parent.x, b.x, None]
        ys += [parent.depth + BOX_H / 2 + (2 * OWNER_GAP if parent.owners else 0.0), b.depth - BOX_H / 2, None]
    color = PREFIX_NODE_COLORS["evicted"] if ghosts else "#888888"
    return dict(type="scatter", mode="lines", x=xs, y=ys, hoverinfo="skip", showlegend=False,
                name="evicted edges" if ghosts else "edges", opacity=GHOST_OPACITY if ghosts else 1.0,
                line=dict(color=color, width=1.5, dash="dash" if ghosts else "solid"))


def _state_trace(state: str, boxes: Sequence[Box]) -> dict[str, Any]:
    xs, ys = _outline(boxes)
    return dict(type="scatter", mode="lines", x=xs or [None], y=ys or [None], fill="toself",
                fillcolor=PREFIX_NODE_COLORS[state], name=PREFIX_NODE_LABELS[state], legendgroup=state,
                opacity=GHOST_OPACITY if state == "evicted" else 1.0, hoverinfo="skip",
                line=dict(color=LINE_COLORS[state], width=2 if state in ("hit", "new", "split") else 1.2,
                          dash=LINE_DASH.get(state, "solid")))


def _owner_dots(boxes: Sequence[Box]) -> dict[str, Any]:
    """A small square per owner just under each box, in the owner's request colour."""
    xs, ys, colors, names = [], [], [], []
    for b in boxes:
        shown = b.owners[:MAX_OWNER_DOTS]
        step = min(BOX_W / max(len(shown), 1), 0.11)
        left = b.x - step * (len(shown) - 1) / 2
        for i, rid in enumerate(shown):
            xs.append(left + i * step)
            ys.append(b.depth + BOX_H / 2 + OWNER_GAP)
            colors.append(request_color(rid))
            names.append(plot_label(rid))
    return dict(type="scatter", mode="markers", x=xs, y=ys, name="owners", showlegend=False,
                marker=dict(symbol="square", size=9, color=colors, line=dict(color="#333333", width=0.5)),
                customdata=names, hovertemplate="held by %{customdata}<extra></extra>")


def _hover_trace(boxes: Sequence[Box]) -> dict[str, Any]:
    return dict(type="scatter", mode="markers", x=[b.x for b in boxes], y=[b.depth for b in boxes],
                name="nodes", showlegend=False, marker=dict(size=26, opacity=0),
                customdata=[[b.node_id, b.key] for b in boxes], hovertext=[hover_text(b) for b in boxes],
                hovertemplate="%{hovertext}<extra></extra>")


def tree_title(layout: TreeLayout, snapshot: Snapshot) -> str:
    if not layout.enabled:
        return f"Radix tree after {snapshot.step} steps: prefix caching is off"
    cached = sum(len(n.block_ids) for n in reachable(snapshot.prefix_tree))
    folded = f", {layout.num_collapsed} folded" if layout.num_collapsed else ""
    return (f"Radix tree after {snapshot.step} steps: {layout.num_nodes} nodes{folded}, {cached} blocks cached "
            f"({snapshot.num_evictable_blocks} evictable)")


def tree_figure(snapshot: Snapshot, trace: StepTrace | None = None, traces: Sequence[StepTrace] = (),
                font_size: int = 12, max_nodes: int = MAX_NODES, cold_steps: int = COLD_STEPS,
                max_slots: int = MAX_SLOTS, max_height: int | None = None) -> go.Figure:
    """The radix tree after ``trace`` (the snapshot's step), with what that step did highlighted.

    Traces: edges, evicted edges, one filled-rectangle trace per node state (the legend), the
    box texts, the owners' squares, and invisible markers carrying each box's hover.
    ``max_height`` (px; presentation mode): the figure is held to it, and where a box is then too
    short for its three lines it shows only its text (blocks and locks stay in its hover).
    """
    layout = tree_layout(snapshot, trace, traces, max_nodes, cold_steps, max_slots)
    boxes = layout.boxes
    needed = (layout.depth + 1) * level_px(font_size) + 130  # every level tall enough for three lines
    height = max(260, needed) if max_height is None else min(max(260, needed), max_height)
    captions = max_height is None or needed <= max_height
    data = [_edges(boxes, ghosts=False), _edges(boxes, ghosts=True)]
    for state in PREFIX_NODE_STATES[1:]:
        data.append(_state_trace(state, [b for b in boxes if b.state == state]))
    data.append(_state_trace("root", [b for b in boxes if b.state == "root"]) | {"showlegend": False})
    data.append(dict(type="scatter", mode="text", x=[b.x for b in boxes], y=[b.depth for b in boxes],
                     text=[box_text(b, layout.slots, font_size, captions) for b in boxes],
                     textfont=dict(size=text_sizes(font_size)[0],
                                   color=[text_color_on(PREFIX_NODE_COLORS[b.state]) for b in boxes]),
                     hoverinfo="skip", showlegend=False, name="labels"))
    data.append(_owner_dots(boxes))
    data.append(_hover_trace(boxes))
    notes = [] if boxes and len(boxes) > 1 else [dict(
        text=("Prefix caching is off (enable_prefix_caching = false): nothing is cached." if not layout.enabled
              else "Nothing cached yet: a request's blocks enter the tree as they fill."),
        showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")]
    spec = live_layout(tree_title(layout, snapshot), snapshot.step, font_size, height=height,
                       margin=dict(l=10, r=10, t=60, b=70), annotations=notes, hovermode="closest",
                       legend=legend_below(itemclick=False, itemdoubleclick=False),
                       xaxis=dict(visible=False, range=[-0.6, layout.slots - 0.4]),
                       yaxis=dict(visible=False, range=[layout.depth + 0.55, -0.55]))
    spec.update(dragmode="zoom", uirevision="prefix-tree")  # drag to zoom; kept while the view is redrawn
    return figure(data, spec)


def tree_frame(snapshot: Snapshot) -> pd.DataFrame:
    """One row per cached node (root excluded), parents before children."""
    tree = reachable(snapshot.prefix_tree)
    ranks = lru_ranks(tree)
    owners = node_owners(snapshot)
    depth: dict[int, int] = {}
    rows = []
    for n in tree:
        depth[n.node_id] = 0 if n.parent_id is None else depth.get(n.parent_id, 0) + 1
        if n.parent_id is None:
            continue
        rows.append({"node": n.node_id, "parent": n.parent_id, "depth": depth[n.node_id],
                     "tokens": len(n.token_ids), "blocks": ", ".join(str(b) for b in n.block_ids),
                     "lock count": n.lock_count, "hits": n.hit_count, "last access": n.last_access,
                     "LRU rank": ranks.get(n.node_id),
                     "held by": ", ".join(request_label(r) for r in owners[n.node_id]),
                     "text": n.text})
    return pd.DataFrame(rows, columns=["node", "parent", "depth", "tokens", "blocks", "lock count", "hits",
                                       "last access", "LRU rank", "held by", "text"])


# -- what the last step did -------------------------------------------------------------------

def events_markdown(trace: StepTrace | None, block_size: int) -> str:
    """The last step's prefix-cache events as a Markdown list (ids and request names escaped)."""
    if trace is None:
        return "No step yet: press **Step** (PageDown)."
    ev = trace.prefix
    lines = []
    for h in ev.lookups:
        path = " → ".join(str(i) for i in h.node_ids) or "none"
        lines.append(f"- {escape_markdown(request_label(h.request_id))} admitted: **{h.num_cached_tokens}** of "
                     f"{h.num_tokens} tokens from the cache ({h.num_cached_tokens // block_size} blocks; "
                     f"nodes {escape_markdown(path)})")
    counts = [("nodes inserted", ev.inserted), ("nodes split", ev.split),
              ("nodes evicted", tuple(n.node_id for n in ev.evicted))]
    for what, ids in counts:
        if ids:
            lines.append(f"- {what}: **{len(ids)}** ({', '.join(str(i) for i in ids)})")
    if ev.evicted:
        lines.append(f"- blocks freed by eviction: **{sum(len(n.block_ids) for n in ev.evicted)}**")
    for c in ev.copies:
        lines.append(f"- copy-on-write: {escape_markdown(request_label(c.request_id))} copied block "
                     f"{c.src_block} → {c.dst_block}")
    if ev.forked:
        lines.append("- parallel sampling, sequences created: "
                     + escape_markdown(", ".join(request_label(r) for r in ev.forked)))
    return "\n".join(lines) or "Nothing in the prefix cache changed in the last step."
