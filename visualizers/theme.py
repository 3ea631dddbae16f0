"""One palette for every view: a colour means the same thing on every page.

Small on purpose: request colours (one per request id, cycling), block-state colours (paged
KV cache), memory-component colours (the calculator's stacked bars), and verdict colours.
Colour-blind-safe choices (Okabe-Ito / Tol based) so a projector in a talk still separates them.
"""
from __future__ import annotations

from visualizers.text import escape_plotly

# Requests: a request keeps its colour in every view (block grid, batch bars, timelines).
# 24 colours (Tol's bright, muted, light and dark schemes): every scenario's requests differ.
REQUEST_COLORS: tuple[str, ...] = (
    "#4477AA",  # blue
    "#EE6677",  # red
    "#228833",  # green
    "#CCBB44",  # yellow
    "#66CCEE",  # cyan
    "#AA3377",  # purple
    "#EE7733",  # orange
    "#009988",  # teal
    "#BBBBBB",  # grey
    "#332288",  # indigo
    "#882255",  # wine
    "#44AA99",  # sea green
    "#999933",  # olive
    "#AA4499",  # magenta
    "#77AADD",  # light blue
    "#EE8866",  # salmon
    "#DDCC77",  # sand
    "#117733",  # dark green
    "#FFAABB",  # pink
    "#99DDFF",  # pale cyan
    "#BBCC33",  # pear
    "#CC6677",  # rose
    "#222255",  # night blue
    "#663333",  # brown
)


SEQUENCE_COLOR_STRIDE = 7  # parallel sampling: sequence i of request p takes colour p + 7 i (7 is coprime to 24)


def _sequence(request_id: str) -> tuple[int, int] | None:
    """The engine's ids as (request, sequence): "3" -> (3, 0); parallel sampling's "3#2" -> (3, 2)."""
    head, sep, tail = str(request_id).partition("#")
    if head.isdigit() and (not sep or tail.isdigit()):
        return int(head), int(tail) if sep else 0
    return None


def request_color(request_id: int | str) -> str:
    """Stable colour for a request id (engine ids map in order, parallel-sampling sequences
    "p#i" a stride away from request p's; other strings through a stable hash)."""
    if isinstance(request_id, int):
        index = request_id
    elif (seq := _sequence(request_id)) is not None:  # the engine's own ids ("0", "1", "0#1") keep arrival order
        index = seq[0] + SEQUENCE_COLOR_STRIDE * seq[1]
    else:
        index = sum((i + 1) * ord(c) for i, c in enumerate(str(request_id)))
    return REQUEST_COLORS[index % len(REQUEST_COLORS)]


# State colours (what a block, a node, a request in a step or a draft is) never equal a request
# colour, nor come within STATE_COLOR_MIN_DISTANCE of one (RGB distance): a swim-lane cell or a
# tree box must not read as "request r0". Achromatic greys for the busy states, one red for a
# preemption, pale green for finished; tests/test_views_talk.py checks every palette below.
STATE_COLOR_MIN_DISTANCE = 28.0

# Paged KV-cache blocks.
BLOCK_STATE_COLORS: dict[str, str] = {
    "free": "#E8E8E8",
    "used": "#5A5A5A",
    # Prefix cache: a block a radix-tree node holds. Evictable (ref count 0) = pale fill with the
    # cache's outline; in use = the owner's colour with the same outline. An outline, not only a
    # fill, because a request's colour at low fill opacity can come close to any pale colour.
    "cached": "#CDEFF4",
    "cached outline": "#117788",
    "shared": "#000000",  # ref count > 1 (black: no request has it)
    "reserved": "#D4D4D4",
    "allocated outline": "#222222",  # allocated in the last step
    "freed outline": "#D73027",  # freed in the last step
}

# Prefix cache (radix tree): what a node is, and what the last step did to it. Locked nodes
# are in use; evictable ones share the cyan of cached-evictable blocks in the pool grid; the
# last step's marks follow SGLang's figure (green new, blue hit, red evicted).
PREFIX_NODE_STATES: tuple[str, ...] = ("root", "in use", "evictable", "hit", "new", "split", "evicted",
                                       "collapsed")
PREFIX_NODE_COLORS: dict[str, str] = {
    "root": "#FFFFFF",
    "in use": "#DDDDDD",  # locked: a running sequence's cached prefix runs through it
    "evictable": BLOCK_STATE_COLORS["cached"],  # lock 0: LRU eviction may take it
    "hit": "#9ECAE1",  # matched by a request admitted in the last step
    "new": "#A6D96A",  # inserted in the last step
    "split": "#FEE391",  # the head part of a node split in the last step
    "evicted": "#F4A582",  # evicted in the last step (drawn faded where it was)
    "collapsed": "#F4F4F4",  # cold subtrees folded into one box
}
PREFIX_NODE_LABELS: dict[str, str] = {
    "root": "root",
    "in use": "in use (locked)",
    "evictable": "cached, evictable (lock 0)",
    "hit": "hit this step",
    "new": "inserted this step",
    "split": "split this step (head part)",
    "evicted": "evicted this step",
    "collapsed": "cold subtree, collapsed",
}
# Caching on / off side by side.
CACHING_COLORS: dict[str, str] = {"caching on": "#228833", "caching off": "#BBBBBB"}

# Hardware-fit calculator: components of device memory.
MEMORY_COLORS: dict[str, str] = {
    "weights": "#4477AA",
    "vision": "#332288",
    "kv_cache": "#228833",
    "activations": "#CCBB44",
    "mask": "#EE7733",
    "overhead": "#AA3377",
    "free": "#E8E8E8",
    "over": "#EE6677",
}

# Attention architectures (the Attention architectures page): one colour per kind of layout.
LAYOUT_COLORS: dict[str, str] = {
    "MHA": "#EE6677",
    "GQA": "#4477AA",
    "MQA": "#228833",
    "MLA": "#AA3377",
    "sliding + global": "#CCBB44",
    "SSM": "#66CCEE",
    "hybrid": "#EE7733",
    "other": "#BBBBBB",
}

# Verdicts (also used for table cells).
VERDICT_COLORS: dict[str, str] = {
    "fits": "#228833",
    "needs_more_devices": "#EE7733",
    "does_not_fit": "#EE6677",
}


# Live engine views (paged KV cache, batch composition). --------------------------------------

# The swim lane: what a request did in one engine step.
LANE_STATES: tuple[str, ...] = ("not arrived", "waiting", "prefill", "decode", "preempted", "finished")
LANE_STATE_COLORS: dict[str, str] = {
    "not arrived": "#FFFFFF",
    "waiting": "#DDDDDD",
    "prefill": "#3B3B3B",  # prompt (or recompute) chunk: dark
    "decode": "#A3A3A3",  # one generated token: mid grey
    "preempted": "#B2182B",
    "finished": "#E5F5E0",
}

# Chunk kinds in the token-budget bars (a bar's colour is its request; its opacity is its kind:
# solid prefill chunk, faded decode). Opacity, not a fill pattern: patterns cost the browser a
# <pattern> per bar on every redraw.
CHUNK_OPACITY: dict[str, float] = {"prefill": 1.0, "decode": 0.55}
CHUNK_KIND_COLORS: dict[str, str] = {"prefill": LANE_STATE_COLORS["prefill"], "decode": LANE_STATE_COLORS["decode"]}

# Scheduling policies side by side.
POLICY_COLORS: dict[str, str] = {"static": "#BBBBBB", "continuous": "#228833"}

# Queue lines over time.
QUEUE_COLORS: dict[str, str] = {"waiting": "#8C8C8C", "running": "#2B2B2B", "preempted": LANE_STATE_COLORS["preempted"]}


def discrete_colorscale(colors: list[str] | tuple[str, ...]) -> list[list[float | str]]:
    """A stepped Plotly colorscale: integer code i (with zmin=0, zmax=len-1) gets colors[i].

    Plotly interpolates between stops, so each colour gets a flat band with duplicated stops:
    [[0, c0], [1/n, c0], [1/n, c1], [2/n, c1], ...].
    """
    n = len(colors)
    scale: list[list[float | str]] = []
    for i, color in enumerate(colors):
        scale.append([i / n, color])
        scale.append([(i + 1) / n, color])
    return scale


def plot_label(request_id: str) -> str:
    """``request_label`` for Plotly text (names, ticks, hovers): a recording's ids may hold tags."""
    return escape_plotly(request_label(request_id))


def request_label(request_id: str) -> str:
    """How a request is named in every view: "r3" for the engine's id "3" ("r3#1" for its second
    parallel-sampling sequence "3#1"), else the id itself."""
    return f"r{request_id}" if _sequence(request_id) is not None else str(request_id)


def request_sort_key(request_id: str) -> tuple[int, int | str, int]:
    """Engine ids sort numerically ("2" before "10", "2#1" right after "2"); other ids after
    them, alphabetically."""
    seq = _sequence(request_id)
    return (0, seq[0], seq[1]) if seq is not None else (1, str(request_id), 0)

# Quantization page: the scheme charts (trade-offs, KV dtypes) and a weight before and after
# quantization with the grid it lands on.
QUANT_COLORS: dict[str, str] = {
    "measured": "#4477AA",  # batch-1 decode tok/s, measured
    "calculator": "#EE7733",  # the calculator's expected tok/s
    "bound": "#222222",  # read bandwidth / weight bytes
    "ppl": "#AA3377",  # perplexity vs fp32
    "capacity": "#228833",  # KV tokens a pool holds
    "k error": "#EE6677",
    "v error": "#CCBB44",
    "original": "#4477AA",
    "dequantized": "#EE7733",
    "grid": "#BBBBBB",
    "rounding": "#999999",
    "scales": "#228833",
}

# Pipeline parallelism: a colour per unit (micro-batch or in-flight batch), and the kinds of
# worker time that are not compute on a unit.
PIPELINE_UNIT_COLORS: tuple[str, ...] = ("#4477AA", "#EE7733", "#228833", "#AA3377", "#66CCEE", "#CCBB44",
                                         "#332288", "#EE6677")
PIPELINE_COLORS: dict[str, str] = {
    "send": "#222222",  # activations posted to the next stage
    "all_reduce": "#882255",  # tensor-parallel all-reduce inside a forward
    "recv": "#D6E4F0",  # blocked waiting for the previous stage (a bubble)
    "idle": "#E0E0E0",  # nothing at all (a bubble)
    "measured": "#4477AA",
    "theory": "#EE7733",
    "weights": MEMORY_COLORS["weights"],
    "kv_cache": MEMORY_COLORS["kv_cache"],
}


# Text on coloured cells: WCAG 2 contrast. ------------------------------------------------------

MIN_TEXT_CONTRAST = 4.5  # WCAG AA for normal-size text
TEXT_DARK, TEXT_LIGHT = "#000000", "#FFFFFF"


def _rgb(color: str) -> tuple[int, int, int]:
    h = color.lstrip("#")
    if len(h) == 3:
        h = "".join(c * 2 for c in h)
    return int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16)


def relative_luminance(color: str) -> float:
    """WCAG 2 relative luminance of a "#RRGGBB" colour: 0 (black) .. 1 (white)."""
    def channel(v: int) -> float:
        c = v / 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = _rgb(color)
    return 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b)


def contrast_ratio(a: str, b: str) -> float:
    """WCAG 2 contrast ratio (L1 + 0.05) / (L2 + 0.05), L1 the lighter: 1 .. 21."""
    hi, lo = sorted((relative_luminance(a), relative_luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def blend(color: str, opacity: float, over: str = "#FFFFFF") -> str:
    """The colour a cell of ``color`` at ``opacity`` shows over ``over`` (the white plot)."""
    top, base = _rgb(color), _rgb(over)
    mixed = (round(t * opacity + b * (1 - opacity)) for t, b in zip(top, base))
    return "#" + "".join(f"{v:02X}" for v in mixed)


def text_color_on(background: str) -> str:
    """Black or white, whichever contrasts more with ``background``. One of the two always
    reaches at least 4.58:1 (the worst background, luminance 0.179, has 4.58 with both), so
    text on any cell colour meets MIN_TEXT_CONTRAST."""
    dark, light = contrast_ratio(background, TEXT_DARK), contrast_ratio(background, TEXT_LIGHT)
    return TEXT_DARK if dark >= light else TEXT_LIGHT
