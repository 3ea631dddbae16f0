"""Live Plotly charts that are redrawn in place, not rebuilt, on every engine step.

``st.plotly_chart`` (Streamlit 1.67) derives a chart's element id from its figure, so every
step's new figure unmounts the old chart and mounts a new one: a full ``Plotly.newPlot`` plus
React mount per chart per step (measured ~380 ms for the batch timeline on a 2-core box).
This module mounts one small ``st.components.v2`` component per chart key instead; its
JavaScript keeps the same <div> and calls ``Plotly.react`` with the new figure, about half
the cost. Plotly's own toolbar (camera icon = PNG download) is kept.

plotly.js is served by Streamlit's static file serving (``server.enableStaticServing``,
set in .streamlit/config.toml) from app/static/, copied there from the installed ``plotly``
package so the browser draws with the same plotly.js version that built the figures. With
static serving off the charts fall back to ``st.plotly_chart``.
"""
from __future__ import annotations

import shutil
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import plotly
import plotly.graph_objects as go
import streamlit as st
from streamlit.components.v2.types import ComponentRenderer

Width = Literal["stretch", "content"] | int  # st.plotly_chart's width

STATIC_DIR = Path(__file__).resolve().parent / "static"

_JS = """
function ensurePlotly(src) {
  if (window.Plotly) return Promise.resolve(window.Plotly);
  if (!window.__inferscopePlotly) {
    window.__inferscopePlotly = new Promise((resolve, reject) => {
      const script = document.createElement('script');
      script.src = src;
      script.onload = () => resolve(window.Plotly);
      script.onerror = () => { window.__inferscopePlotly = null; reject(new Error('could not load ' + src)); };
      document.head.appendChild(script);
    });
  }
  return window.__inferscopePlotly;
}

export default function (component) {
  const { data, parentElement } = component;
  let div = parentElement.querySelector('div.inferscope-plot');
  if (!div) {
    div = document.createElement('div');
    div.className = 'inferscope-plot';
    div.style.width = '100%';
    parentElement.appendChild(div);
  }
  const spec = JSON.parse(data.spec);
  div.setAttribute('data-step', String(((spec.layout || {}).meta || {}).step));
  ensurePlotly(data.src)
    .then((Plotly) => Plotly.react(div, spec.data, spec.layout, data.config))
    .catch((err) => { div.textContent = 'Chart not drawn: ' + err.message; });
}
"""


@lru_cache(maxsize=1)
def plotly_js_name() -> str:
    """Copy the installed package's plotly.min.js into app/static (once) and return its file name."""
    from plotly.offline import get_plotlyjs_version

    name = f"plotly-{get_plotlyjs_version()}.min.js"
    target = STATIC_DIR / name
    source = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    if not target.exists() or target.stat().st_size != source.stat().st_size:
        STATIC_DIR.mkdir(exist_ok=True)
        tmp = target.with_suffix(".tmp")
        shutil.copyfile(source, tmp)
        tmp.replace(target)
    return name


@lru_cache(maxsize=1)
def _component() -> ComponentRenderer:
    return st.components.v2.component("inferscope_live_plot", js=_JS, isolate_styles=False)


def static_serving() -> bool:
    try:
        return bool(st.get_option("server.enableStaticServing"))
    except RuntimeError:
        return False


def live_chart(fig: go.Figure, key: str, config: dict[str, Any], width: Width = "stretch") -> None:
    """Draw ``fig`` under ``key``; later calls with the same key redraw it in place."""
    if not static_serving():
        st.plotly_chart(fig, key=key, width=width, config=config, theme=None)
        return
    _component()(key=key, data={"spec": fig.to_json(), "config": config,
                                "src": f"./app/static/{plotly_js_name()}"})
