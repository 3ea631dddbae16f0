"""Step presses counted in the browser, so that none is lost (issue 12, "No lost input").

Why not the Step button's own click: a Streamlit button press is a one-shot *trigger* sent with
a rerun request, and Streamlit drops or merges triggers when requests pile up. With
``runner.fastReruns`` (the default) a new request stops the script runner that carried the
previous press, and a runner stopped before it started never runs that press's callback;
with fastReruns off, pending requests are coalesced and two presses become one. Both happen
when a presenter presses while the page is still loading or while a step is running.

So a small component (no visible element of its own) counts every Step press in the page: a
click on the Step button or a PageDown key, intercepted before Streamlit sees it. It sends
the running *count* as its state value. A value, unlike a trigger, survives both cases: the
newest request carries every earlier press, and the views apply ``count - applied`` steps,
in order, as soon as the run exists (``state.apply_queued_steps``). Without JavaScript (AppTest)
nothing is intercepted and the Step button's callback steps as before.

The count belongs to one server session (``epoch``): if the browser ends up on a new session
(a server restart), the page starts counting from zero again instead of replaying old presses.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Callable

import streamlit as st

COMPONENT = "inferscope_step_queue"
STEP_SELECTOR = ".st-key-step button"  # Streamlit marks a keyed widget's container st-key-<key>

_JS = """
const EDITABLE = new Set(['INPUT', 'TEXTAREA', 'SELECT']);

function isEditable(el) {
  return !!el && (el.isContentEditable || EDITABLE.has(el.tagName));
}

function install(selector) {
  const q = { epoch: null, count: 0, send: null };
  const press = (event) => {
    // before Streamlit's own handlers (window, capture phase): the press is counted here only
    event.stopImmediatePropagation();
    event.preventDefault();
    q.count += 1;
    if (q.send) q.send();
  };
  window.addEventListener('click', (event) => {
    const button = event.target instanceof Element ? event.target.closest(selector) : null;
    if (button && !button.disabled) press(event);
  }, true);
  window.addEventListener('keydown', (event) => {
    if (event.key !== 'PageDown' || event.repeat || event.altKey || event.ctrlKey || event.metaKey
        || event.shiftKey || isEditable(event.target)) return;
    press(event);
  }, true);
  return q;
}

export default function (component) {
  const { data, setStateValue } = component;
  const q = window.__inferscopeStepQueue || (window.__inferscopeStepQueue = install(data.selector));
  if (q.epoch !== data.epoch) {  // a new server session: presses of an old one do not carry over
    q.epoch = data.epoch;
    q.count = 0;
  }
  q.send = () => setStateValue('presses', { epoch: q.epoch, count: q.count });
  document.body.classList.add('inferscope-step-queue');
}
"""

# Until the counter is listening, a click would take the trigger path: the button looks busy
# and ignores the pointer for those few milliseconds (a fresh page only).
# (isolate_styles=False: the component's CSS applies to the page.)
CSS = f"body:not(.inferscope-step-queue) {STEP_SELECTOR} {{ opacity: 0.5; pointer-events: none; }}"


@lru_cache(maxsize=1)
def _component():
    return st.components.v2.component(COMPONENT, js=_JS, css=CSS, isolate_styles=False)


def mount(key: str, epoch: str, on_change: Callable[[], None]) -> None:
    """Mount the counter (once per full run, outside the views fragment)."""
    _component()(key=key, data={"epoch": epoch, "selector": STEP_SELECTOR},
                 default={"presses": None}, on_presses_change=on_change, height=0)


def presses(value: object, epoch: str) -> int | None:
    """The count in the component's state ``value`` if it belongs to ``epoch``."""
    if not isinstance(value, dict):
        return None
    sent = value.get("presses")
    if not isinstance(sent, dict) or sent.get("epoch") != epoch:
        return None
    count = sent.get("count")
    return count if isinstance(count, int) and count >= 0 else None
