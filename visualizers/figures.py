"""Fast figure construction for live views, and panels stacked into one figure.

Plotly validates every property when traces are added one by one (``add_trace`` ~1.5 ms a
trace, ``make_subplots`` ~30 ms); a live view redraws on every engine step, so the views build
plain dict specs and wrap them once, unvalidated. Tests run ``validated`` on every figure,
so a misspelt property still fails a test.

In the browser each chart costs a fixed ~40 ms per redraw on a small machine, on top of its
data, so a live page stacks related views as panels of one figure (``stack``): the token
budget, the swim lane and the queues share one step axis, and stay aligned.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import plotly.graph_objects as go


FONT_FAMILY = '"Source Sans", "Source Sans Pro", "Helvetica Neue", Arial, sans-serif'


@lru_cache(maxsize=1)
def _template() -> dict[str, Any]:
    """Plotly's "plotly_white", fixed here so a figure never picks up whatever template is the
    process default (Streamlit installs one with placeholder colours)."""
    import plotly.io as pio

    template: dict[str, Any] = pio.templates["plotly_white"].to_plotly_json()
    return template


def _axis(spec: dict[str, Any]) -> dict[str, Any]:
    """An axis as plotly.js 3+ reads it: a title given as a string becomes ``{"text": ...}``
    (plotly.js dropped the string form, and an unvalidated figure is not converted by plotly.py:
    the axis would show no title at all), and ``automargin`` makes room for its tick labels and
    title instead of cutting them off."""
    out = dict(spec)
    if isinstance(out.get("title"), str):
        out["title"] = {"text": out["title"]}
    out.setdefault("automargin", True)
    return out


def figure(data: list[dict[str, Any]], layout: dict[str, Any]) -> go.Figure:
    """A Figure from trace dicts (each with "type") and a layout dict, without validation
    (axes through ``_axis``)."""
    layout = {k: _axis(v) if k.startswith(("xaxis", "yaxis")) and isinstance(v, dict) else v
              for k, v in layout.items()}
    layout.setdefault("template", _template())
    font = dict(layout.get("font", {}))
    font.setdefault("family", FONT_FAMILY)
    layout["font"] = font
    return go.Figure(data=data, layout=layout, _validate=False)


def live_layout(title: str, step: int | None, font_size: int, **extra: Any) -> dict[str, Any]:
    """Layout shared by the live views: title, font, no drag, and ``meta.step`` (the step the
    figure shows; the browser tests and the UI benchmark wait on it)."""
    return dict(title=dict(text=title, font=dict(size=font_size + 3)), font=dict(size=font_size),
                plot_bgcolor="white", dragmode=False, meta={"step": step}, **extra)


def legend_below(**extra: Any) -> dict[str, Any]:
    """A horizontal legend at the bottom of the figure, under the x axis title.

    In container coordinates plotly makes room for it (the plot area gives up the height); at a
    guessed paper ``y < 0`` it lands wherever that is, on the axis title when the plot is short.
    """
    return dict(orientation="h", yref="container", y=0, yanchor="bottom", x=0, xanchor="left", **extra)


NOMINAL_WIDTH_PX = 1000  # a chart's width at 1440 px when the figure does not fix its own


def legend_height_px(data: list[dict[str, Any]], width_px: int, font_size: int) -> int:
    """About how tall a horizontal legend of ``data``'s entries is at ``width_px``: plotly puts
    an entry (symbol + text) after the last while it fits, else starts a row."""
    names = [str(t["name"]) for t in data if t.get("name") and t.get("showlegend", t.get("type") != "heatmap")]
    rows, x = 1, 0.0
    for name in dict.fromkeys(names):  # a legend group's traces of one name show once
        item = 46 + 0.55 * font_size * len(name)
        if x and x + item > width_px:
            rows, x = rows + 1, 0.0
        x += item
    return rows * round(1.6 * font_size + 4) + 8 if names else 0


def validated(fig: go.Figure) -> go.Figure:
    """Re-build ``fig`` with full validation (raises ValueError on an invalid property)."""
    return go.Figure(fig.to_dict())


@dataclass
class Panel:
    """One subplot: traces on axes "x"/"y", their axis layouts, its height in pixels.

    Shapes and annotations may refer to "x", "y", "x domain", "y domain"; ``stack`` renames
    them with the panel's axes.
    """

    data: list[dict[str, Any]]
    height: int
    xaxis: dict[str, Any] = field(default_factory=dict)
    yaxis: dict[str, Any] = field(default_factory=dict)
    shapes: list[dict[str, Any]] = field(default_factory=list)
    annotations: list[dict[str, Any]] = field(default_factory=list)
    title: str = ""


def _rename(ref: str, x: str, y: str) -> str:
    head, _, tail = ref.partition(" ")
    if head == "x":
        head = x
    elif head == "y":
        head = y
    return f"{head} {tail}" if tail else head


def stack(panels: list[Panel], layout: dict[str, Any], gap_px: int = 56, shared_x: bool = False,
          margin_px: tuple[int, int] = (60, 50)) -> go.Figure:
    """Panels top to bottom in one figure; heights in pixels, gaps between them.

    With ``shared_x`` every panel's x axis matches the first one (same step range), and only
    the bottom panel keeps its tick labels and title.
    """
    top, bottom = margin_px
    font_size = int(layout.get("font", {}).get("size", 12))
    title_size = font_size + 1  # panel titles scale with the figure's font
    plot_h = sum(p.height for p in panels) + gap_px * (len(panels) - 1)
    if layout.get("legend", {}).get("yref") == "container":  # legend_below: it gets its own rows
        bottom += legend_height_px([t for p in panels for t in p.data],
                                   int(layout.get("width") or NOMINAL_WIDTH_PX), font_size)
    total = plot_h + top + bottom
    data: list[dict[str, Any]] = []
    axes: dict[str, Any] = {}
    shapes: list[dict[str, Any]] = []
    notes: list[dict[str, Any]] = []
    y_cursor = plot_h  # pixels from the bottom of the plot area
    for i, p in enumerate(panels):
        n = "" if i == 0 else str(i + 1)
        x, y = "x" + n, "y" + n
        hi = y_cursor / plot_h
        lo = (y_cursor - p.height) / plot_h
        y_cursor -= p.height + gap_px
        for trace in p.data:
            t = dict(trace)
            t["xaxis"], t["yaxis"] = x, y
            data.append(t)
        xa = dict(p.xaxis, anchor=y)
        if shared_x and i > 0:
            xa["matches"] = "x"
        if shared_x and i < len(panels) - 1:
            xa["showticklabels"] = False
            xa.pop("title", None)
        axes["xaxis" + n] = xa
        axes["yaxis" + n] = dict(p.yaxis, anchor=x, domain=[max(lo, 0.0), min(hi, 1.0)])
        for s in p.shapes:
            shapes.append(dict(s, xref=_rename(s.get("xref", "x"), x, y), yref=_rename(s.get("yref", "y"), x, y)))
        for a in p.annotations:
            notes.append(dict(a, xref=_rename(a.get("xref", "x"), x, y), yref=_rename(a.get("yref", "y"), x, y)))
        if p.title:
            notes.append(dict(text=f"<b>{p.title}</b>", xref="paper", yref="paper", x=0, y=min(hi, 1.0),
                              xanchor="left", yanchor="bottom", showarrow=False, font=dict(size=title_size)))
    out = dict(layout, height=total, shapes=shapes + list(layout.get("shapes", [])),
               annotations=notes + list(layout.get("annotations", [])), **axes)
    out["margin"] = {"l": 10, "r": 10, **layout.get("margin", {}), "t": top, "b": bottom}  # the heights above
    return figure(data, out)


def hline(y: float, text: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A dashed horizontal rule across a panel and its label: (shape, annotation)."""
    shape = dict(type="line", xref="x domain", x0=0, x1=1, yref="y", y0=y, y1=y,
                 line=dict(color="#333333", dash="dash", width=2))
    note = dict(xref="x domain", x=0, yref="y", y=y, text=text, showarrow=False, xanchor="left", yanchor="bottom")
    return shape, note


def vline(x: float, text: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A dashed vertical rule and its label at the top: (shape, annotation)."""
    shape = dict(type="line", xref="x", x0=x, x1=x, yref="y domain", y0=0, y1=1,
                 line=dict(color="#333333", dash="dash", width=2))
    note = dict(xref="x", x=x, yref="y domain", y=1, text=text, showarrow=False, xanchor="center", yanchor="bottom")
    return shape, note
