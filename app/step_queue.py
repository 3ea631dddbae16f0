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

Play/Pause is counted the same way (a click on its button or P), in the same value: while Play
runs, the views fragment reruns on every tick, and a Pause trigger sent among those reruns could
be lost (the browser suite saw a Pause not take effect in 60 s). The server toggles Play once per
new press (app/playback.py ``apply_queued_plays``; an even number cancels out).

The count belongs to one server session (``epoch``): if the browser ends up on a new session
(a server restart), the page starts counting from zero again instead of replaying old presses.

The same listener is the speaker's keyboard (``KEYS``): the other keys click their button
(``.st-key-<widget key> button``, Streamlit's own click path) or, for the next / previous live
page, send a ``navigate`` value (a numbered move, +1 / -1) that the entry point turns into
``st.switch_page``.
It listens on the window in the capture phase, so it hears a key whatever element has the
focus — a sidebar selectbox, toggle, slider or button clicked last — except while the user
types: a text or number input, a text area, an open dropdown. Enter in a text or number input
commits the value (Streamlit's own handler) and then leaves the field, so the keys work again.
Keys with Ctrl, Alt, Meta or Shift, and auto-repeat, are left to the browser; so is a key whose
button is not on the page (the browser keeps PageUp's scroll there).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import streamlit as st
from streamlit.components.v2.types import ComponentRenderer

COMPONENT = "inferscope_step_queue"
STEP_SELECTOR = ".st-key-step button"  # Streamlit marks a keyed widget's container st-key-<key>
PLAY_SELECTOR = ".st-key-play button"


@dataclass(frozen=True)
class Key:
    """One entry of the speaker's key map: what it does, the keys (``KeyboardEvent.key``
    values; letters in either case), and the widget key of the button it clicks ("" for Step,
    which is counted, and for page navigation, which is a value the entry point reads)."""

    action: str
    keys: tuple[str, ...]
    button: str = ""


# Keys browsers and Streamlit keep for themselves are avoided: Space, Enter, arrows, Home/End
# (scrolling and widgets), C and R (Streamlit's clear-cache and rerun), Ctrl/Alt/Meta chords.
KEYS = (
    Key("Step", ("PageDown", "S")),
    Key("Step back", ("PageUp", "B"), button="step_back"),
    Key("Run N", ("N",), button="run_n_button"),
    Key("Play/Pause", ("P",)),
    Key("Reset", ("0",), button="reset"),
    Key("Next page", ("]",)),
    Key("Previous page", ("[",)),
)
STEP, PLAY, NEXT_PAGE, PREVIOUS_PAGE = "Step", "Play/Pause", "Next page", "Previous page"
NAVIGATE = {NEXT_PAGE: 1, PREVIOUS_PAGE: -1}


def key_map() -> dict[str, dict[str, object]]:
    """``KeyboardEvent.key`` (letters lower-cased) -> what the browser does with it."""
    out: dict[str, dict[str, object]] = {}
    for entry in KEYS:
        for name in entry.keys:
            if entry.action == STEP:
                what: dict[str, object] = {"step": True}
            elif entry.action == PLAY:
                what = {"play": True}
            elif entry.action in NAVIGATE:
                what = {"navigate": NAVIGATE[entry.action]}
            else:
                what = {"click": f".st-key-{entry.button} button"}
            out[name.lower() if len(name) == 1 else name] = what
    return out


def keys_caption() -> str:
    """The key map in one line of Markdown (the sidebar's "Keys" caption, the toggle's help)."""
    return " · ".join(f"{'/'.join(f'`{k}`' for k in entry.keys)} {entry.action}" for entry in KEYS)


_JS = """
const TYPED = new Set(['text', 'number', 'search', 'email', 'password', 'url', 'tel', 'date', 'time',
                       'datetime-local', 'month', 'week']);

function typingIn(el) {
  // true while keys belong to the element: a text area, an editable element, an open dropdown,
  // a text-like input (a closed selectbox's combobox input is not one: the keys work there)
  if (!el) return false;
  if (el.isContentEditable || el.tagName === 'TEXTAREA' || el.tagName === 'SELECT') return true;
  if (el.tagName !== 'INPUT' || !TYPED.has((el.type || 'text').toLowerCase())) return false;
  return el.getAttribute('role') !== 'combobox' || el.getAttribute('aria-expanded') === 'true';
}

function install(selector, playSelector) {
  const q = { epoch: null, count: 0, plays: 0, send: null, navigate: null, moves: 0, keys: {}, host: null };
  // the live controls are on this page: this component (mounted just before the Step button, which
  // the browser may draw a moment later on a fresh page) or the Step button itself
  const live = () => !!(q.host && q.host.isConnected) || !!document.querySelector(selector);
  const counted = (event, what) => {
    // before Streamlit's own handlers (window, capture phase): the press is counted here only
    event.stopImmediatePropagation();
    event.preventDefault();
    q[what] += 1;
    if (q.send) q.send();
  };
  const press = (event) => counted(event, 'count');
  window.addEventListener('click', (event) => {
    const target = event.target instanceof Element ? event.target : null;
    const step = target ? target.closest(selector) : null;
    const play = target ? target.closest(playSelector) : null;
    if (step && !step.disabled) press(event);
    else if (play && !play.disabled && q.send) counted(event, 'plays');
  }, true);
  window.addEventListener('keydown', (event) => {
    const target = event.target instanceof Element ? event.target : null;
    if (event.key === 'Enter' && target && target.tagName === 'INPUT' && typingIn(target)
        && target.getAttribute('role') !== 'combobox') {
      setTimeout(() => target.blur(), 0);  // after Streamlit's handler committed the value
      return;
    }
    if (event.repeat || event.altKey || event.ctrlKey || event.metaKey || event.shiftKey
        || typingIn(target) || !live()) return;
    const what = q.keys[event.key.length === 1 ? event.key.toLowerCase() : event.key];
    if (!what) return;
    if (what.step) {
      press(event);
    } else if (what.play) {
      const button = document.querySelector(playSelector);
      if (button && !button.disabled && q.send) counted(event, 'plays');
    } else if (what.navigate) {
      if (!q.navigate) return;
      event.stopImmediatePropagation();
      event.preventDefault();
      q.navigate(what.navigate);
    } else {
      const button = document.querySelector(what.click);
      if (!button || button.disabled) return;
      event.stopImmediatePropagation();
      event.preventDefault();
      button.click();
    }
  }, true);
  return q;
}

export default function (component) {
  const { data, setStateValue, parentElement } = component;
  const q = window.__inferscopeStepQueue
    || (window.__inferscopeStepQueue = install(data.selector, data.play_selector));
  if (q.epoch !== data.epoch) {  // a new server session: presses of an old one do not carry over
    q.epoch = data.epoch;
    q.count = 0;
    q.plays = 0;
  }
  q.keys = data.keys;
  q.host = parentElement;
  q.send = () => setStateValue('presses', { epoch: q.epoch, count: q.count, plays: q.plays });
  // a value, like the presses: each page key is a new one (a trigger's callback did not fire here)
  q.navigate = (direction) => setStateValue('navigate', { move: ++q.moves, direction });
  document.body.classList.add('inferscope-step-queue');
}
"""

# Until the counter is listening, a click would take the trigger path: the button looks busy
# and ignores the pointer for those few milliseconds (a fresh page only).
# (isolate_styles=False: the component's CSS applies to the page.)
CSS = f"body:not(.inferscope-step-queue) {STEP_SELECTOR} {{ opacity: 0.5; pointer-events: none; }}"


@lru_cache(maxsize=1)
def _component() -> ComponentRenderer:
    return st.components.v2.component(COMPONENT, js=_JS, css=CSS, isolate_styles=False)


def mount(key: str, epoch: str, on_change: Callable[[], None], on_navigate: Callable[[], None]) -> None:
    """Mount the counter and key map (once per full run, outside the views fragment);
    ``on_navigate`` runs when a page key was pressed (``navigation`` reads which)."""
    _component()(key=key, data={"epoch": epoch, "selector": STEP_SELECTOR, "play_selector": PLAY_SELECTOR,
                                "keys": key_map()},
                 default={"presses": None, "navigate": None}, on_presses_change=on_change,
                 on_navigate_change=on_navigate,
                 height=0)


def navigation(value: object) -> int:
    """+1 / -1 for a next / previous page key in the component's session-state ``value``, else 0."""
    move = value.get("navigate") if isinstance(value, dict) else None
    direction = move.get("direction") if isinstance(move, dict) else None
    return direction if direction in (1, -1) else 0


def presses(value: object, epoch: str, what: str = "count") -> int | None:
    """The Step-press count (``what`` "count") or the Play/Pause-press count ("plays") in the
    component's state ``value`` if it belongs to ``epoch``."""
    if not isinstance(value, dict):
        return None
    sent = value.get("presses")
    if not isinstance(sent, dict) or sent.get("epoch") != epoch:
        return None
    count = sent.get(what, 0)
    return count if isinstance(count, int) and not isinstance(count, bool) and count >= 0 else None
