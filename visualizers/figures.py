"""Fast figure construction for live views.

Plotly validates every property when traces are added one by one (``add_trace`` ~1.5 ms a
trace, ``make_subplots`` ~30 ms); a live view redraws several figures per engine step, so the
views build plain dict specs and wrap them once, unvalidated. Tests run ``validated`` on every
figure, so a misspelt property still fails a test.
"""
from __future__ import annotations

from typing import Any

import plotly.graph_objects as go


def figure(data: list[dict[str, Any]], layout: dict[str, Any]) -> go.Figure:
    """A Figure from trace dicts (each with "type") and a layout dict, without validation."""
    return go.Figure(data=data, layout=layout, _validate=False)


def validated(fig: go.Figure) -> go.Figure:
    """Re-build ``fig`` with full validation (raises ValueError on an invalid property)."""
    return go.Figure(fig.to_dict())


def hline(y: float, text: str, xref: str = "x", yref: str = "y", domain_ref: str = "x domain") -> tuple[dict, dict]:
    """A dashed horizontal rule across a subplot and its label: (shape, annotation)."""
    shape = dict(type="line", xref=domain_ref, x0=0, x1=1, yref=yref, y0=y, y1=y,
                 line=dict(color="#333333", dash="dash", width=2))
    note = dict(xref=domain_ref, x=0, yref=yref, y=y, text=text, showarrow=False, xanchor="left", yanchor="bottom")
    return shape, note


def vline(x: float, text: str, xref: str = "x", yref: str = "y domain") -> tuple[dict, dict]:
    """A dashed vertical rule and its label at the top: (shape, annotation)."""
    shape = dict(type="line", xref=xref, x0=x, x1=x, yref=yref, y0=0, y1=1,
                 line=dict(color="#333333", dash="dash", width=2))
    note = dict(xref=xref, x=x, yref=yref, y=1, text=text, showarrow=False, xanchor="center", yanchor="bottom")
    return shape, note
