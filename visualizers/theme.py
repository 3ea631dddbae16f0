"""One palette for every view: a colour means the same thing on every page.

Small on purpose: request colours (one per request id, cycling), block-state colours (paged
KV cache), memory-component colours (the calculator's stacked bars), and verdict colours.
Colour-blind-safe choices (Okabe-Ito / Tol based) so a projector in a talk still separates them.
"""
from __future__ import annotations

# Requests: a request keeps its colour in every view (block grid, batch bars, timelines).
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
)


def request_color(request_id: int | str) -> str:
    """Stable colour for a request id (ints map in order; strings through a stable hash)."""
    if isinstance(request_id, int):
        index = request_id
    else:
        index = sum((i + 1) * ord(c) for i, c in enumerate(str(request_id)))
    return REQUEST_COLORS[index % len(REQUEST_COLORS)]


# Paged KV-cache blocks.
BLOCK_STATE_COLORS: dict[str, str] = {
    "free": "#E8E8E8",
    "used": "#4477AA",
    "cached": "#66CCEE",  # evictable: in the prefix cache, no running request holds it
    "shared": "#AA3377",  # ref count > 1
    "reserved": "#BBBBBB",
}

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

# Verdicts (also used for table cells).
VERDICT_COLORS: dict[str, str] = {
    "fits": "#228833",
    "fits_with_more": "#EE7733",
    "does_not_fit": "#EE6677",
}
