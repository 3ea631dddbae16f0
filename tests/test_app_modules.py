"""The app's module rules, read from the source (no Streamlit run):

* app/session.py is the only module that touches ``st.session_state``: every key goes through
  one of its typed slots.
* app/models.py is the only module that loads model weights (one process-wide cache).
"""
from __future__ import annotations

import ast
from pathlib import Path

from app import session

APP = Path(__file__).resolve().parent.parent / "app"
LOADERS = {"get_shared_model", "load_model", "load_weights"}  # engine.engine / engine.models.loader


def _modules() -> list[Path]:
    return sorted(APP.rglob("*.py"))


def _touches_session_state(tree: ast.AST) -> list[int]:
    """Lines that name ``session_state``: an attribute (``st.session_state``), a bare name, or an
    import of it (``from streamlit import session_state``)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "session_state":
            lines.append(node.lineno)
        elif isinstance(node, ast.Name) and node.id == "session_state":
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and any(a.name == "session_state" for a in node.names):
            lines.append(node.lineno)
    return lines


def _imported_loaders(tree: ast.AST) -> list[str]:
    """Weight loaders imported from the engine (at module level or inside a function)."""
    return [a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            and (node.module or "").startswith("engine") for a in node.names if a.name in LOADERS]


def test_only_the_session_module_touches_session_state() -> None:
    offenders = {str(p.relative_to(APP.parent)): lines for p in _modules()
                 if p.name != "session.py" or p.parent != APP
                 for lines in [_touches_session_state(ast.parse(p.read_text(), str(p)))] if lines}
    assert offenders == {}, f"st.session_state outside app/session.py (file: lines): {offenders}"


def test_the_rule_sees_every_way_of_touching_it() -> None:
    """The check itself: each spelling is caught (a rule that sees nothing passes everything)."""
    for text in ("import streamlit as st\nst.session_state['x'] = 1\n",
                 "from streamlit import session_state\n",
                 "import streamlit\nv = streamlit.session_state.get('x')\n"):
        assert _touches_session_state(ast.parse(text)), text
    assert _touches_session_state(ast.parse((APP / "session.py").read_text()))


def test_only_the_model_module_loads_weights() -> None:
    offenders = {str(p.relative_to(APP.parent)): names for p in _modules() if p != APP / "models.py"
                 for names in [_imported_loaders(ast.parse(p.read_text(), str(p)))] if names}
    assert offenders == {}, f"weights loaded outside app/models.py: {offenders}"
    assert _imported_loaders(ast.parse((APP / "models.py").read_text()))


def test_every_session_key_has_one_slot() -> None:
    """No two names for one key, and every declared key name has its slot."""
    names = {k: v for k, v in vars(session.K).items() if not k.startswith("__")}
    assert len(set(names.values())) == len(names), "two K names for one key"
    slots = [v for v in vars(session).values() if isinstance(v, session.Slot)]
    keys = [s.key for s in slots]
    assert len(set(keys)) == len(keys), "two slots for one key"
    assert set(keys) | {session.K.knob} == set(names.values())


def test_the_app_and_the_engine_share_one_copy_of_the_weights() -> None:
    """app/models.py keeps no cache of its own over the engine's: a session's run gets the very
    copy the engine's own loads get (a draft model, the quantization measurements)."""
    from app import models
    from engine.core.config import EngineConfig
    from engine.model.shared import get_shared_model

    assert models.shared_model("tiny-random") is get_shared_model("tiny-random")
    int8 = models.shared_model("tiny-random", EngineConfig.from_knobs(quantization="int8"))
    assert int8 is get_shared_model("tiny-random", quantization="int8")
    assert int8 is not models.shared_model("tiny-random")
