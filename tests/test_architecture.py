"""The package map's rules (docs/architecture.md), checked on the real source.

- ``lint-imports`` keeps every contract in pyproject.toml's ``[tool.importlinter]``: the layers
  (each engine package imports only those below it), no import loop inside any package, the
  engine never imports the UI, the calculator never imports torch. Imports inside functions
  and under TYPE_CHECKING count (``test_function_level_loop_is_caught`` proves the tool sees them).
- No module imports a private name (``_x``) from another module.
"""
from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint_imports(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    exe = str(LINT_IMPORTS) if LINT_IMPORTS.exists() else shutil.which("lint-imports")
    assert exe, "lint-imports is not installed (requirements.txt pins import-linter)"
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run([exe, "--no-logo", "--no-cache", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_import_contracts_are_kept() -> None:
    result = _lint_imports(ROOT)
    assert result.returncode == 0, f"a layering contract is broken:\n{result.stdout}\n{result.stderr}"
    assert "BROKEN" not in result.stdout and "KEPT" in result.stdout


def test_function_level_loop_is_caught(tmp_path: Path) -> None:
    """A loop closed only by an import inside a function (how engine -> executor -> worker ->
    engine once looped) breaks the acyclic contract, and a function-level import upwards breaks
    the layers."""
    pkg = tmp_path / "looppkg"
    (pkg / "low").mkdir(parents=True)
    (pkg / "high").mkdir()
    for init in (pkg / "__init__.py", pkg / "low" / "__init__.py", pkg / "high" / "__init__.py"):
        init.write_text("")
    (pkg / "low" / "a.py").write_text("from looppkg.low import b\n")
    (pkg / "low" / "b.py").write_text(textwrap.dedent("""\
        def late() -> None:
            from looppkg.low import a  # closes the loop a -> b -> a, at call time only
            from looppkg.high import c  # an upward import, at call time only
        """))
    (pkg / "high" / "c.py").write_text("from looppkg.low import a\n")
    (tmp_path / ".importlinter").write_text(textwrap.dedent("""\
        [importlinter]
        root_package = looppkg

        [importlinter:contract:layers]
        name = layers
        type = layers
        layers =
            looppkg.high
            looppkg.low

        [importlinter:contract:acyclic]
        name = acyclic
        type = acyclic_siblings
        ancestors = looppkg
        """))
    result = _lint_imports(tmp_path)
    assert result.returncode != 0
    assert "layers BROKEN" in result.stdout and "acyclic BROKEN" in result.stdout, result.stdout
    assert "looppkg.low.b -> looppkg.high.c" in result.stdout


def _private_imports(path: Path) -> list[str]:
    """``from x import _name`` lines in ``path`` (dunders and ``import y as _alias`` are fine)."""
    tree = ast.parse(path.read_text("utf-8"), str(path))
    return [f"{path.relative_to(ROOT)}:{node.lineno}: from {'.' * node.level}{node.module or ''} import {a.name}"
            for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module != "__future__"
            for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]


def test_no_private_name_is_imported_from_another_module() -> None:
    found = [line for package in ("engine", "app", "visualizers") for path in sorted((ROOT / package).rglob("*.py"))
             for line in _private_imports(path)]
    assert not found, "private names imported across modules (make them public or move them):\n" + "\n".join(found)
