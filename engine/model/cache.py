"""The converted-model cache: entries keyed by the content of their source file.

Rules:
- an entry is ``<root>/models/gguf-<sha256 of the source>-v<CACHE_VERSION>/``; names never
  pick a path (a file called ``..gguf`` cannot point anywhere), and ``safe_name`` is the only
  way a name reaches a path (a readable temp-dir prefix);
- a file's sha256 is computed once (streamed) and remembered in ``<root>/gguf-index.json`` by
  (real path, size, mtime_ns), so an unchanged file is not re-hashed at each start;
- an entry is written in a temp dir under ``<root>/tmp/`` and published by one ``rename`` after
  its marker, so a crash or an error mid-write never leaves an entry that later loads;
- nothing is ever deleted outside the entry being written (a broken entry of the very same
  digest is the only thing replaced) and the writer's own temp dir.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

CACHE_VERSION = 3  # 3: entries keyed by content (models/gguf-<sha256>-v3)
MARKER = "inferscope-source.json"
_INDEX_VERSION = 1
_INDEX_LIMIT = 256  # files remembered in gguf-index.json
_CHUNK = 1 << 20
_HEX64 = re.compile(r"[0-9a-f]{64}")


def cache_root() -> Path:
    """INFERSCOPE_CACHE, else $XDG_CACHE_HOME/inferscope (~/.cache/inferscope)."""
    env = os.environ.get("INFERSCOPE_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "inferscope"


def safe_name(name: str, limit: int = 40) -> str:
    """``name`` reduced to [A-Za-z0-9._-], no leading dots, at most ``limit`` characters, never
    empty: fit for a path component (used only for readable temp-dir prefixes)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".")[:limit]
    return cleaned or "model"


def file_digest(path: Path) -> str:
    """sha256 of the file's bytes, read in 1 MiB pieces (never the whole file in memory)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _index_path() -> Path:
    return cache_root() / "gguf-index.json"


def _read_index() -> dict[str, dict[str, Any]]:
    """The index (realpath -> size, mtime_ns, sha256); unreadable or odd content is empty."""
    try:
        data = json.loads(_index_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    files = data.get("files") if isinstance(data, dict) and data.get("version") == _INDEX_VERSION else None
    return {k: v for k, v in files.items() if isinstance(v, dict)} if isinstance(files, dict) else {}


def _write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temp file beside ``path`` then rename it over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".index-", dir=str(path.parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def content_digest(gguf_path: Path) -> str:
    """The file's sha256, hashed once and remembered by (real path, size, mtime_ns) in the
    cache's small index, so an unchanged file (the bundled model) is not re-hashed each start."""
    real = os.path.realpath(gguf_path)
    st = os.stat(real)
    index = _read_index()
    known = index.get(real)
    if (known and known.get("size") == st.st_size and known.get("mtime_ns") == st.st_mtime_ns
            and isinstance(known.get("sha256"), str) and _HEX64.fullmatch(known["sha256"])):
        return str(known["sha256"])
    digest = file_digest(Path(real))
    index.pop(real, None)
    index[real] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest}
    keep = dict(list(index.items())[-_INDEX_LIMIT:])
    with contextlib.suppress(OSError):  # a read-only cache still works, it just re-hashes
        _write_atomic(_index_path(), json.dumps({"version": _INDEX_VERSION, "files": keep}))
    return digest


def entry_path(digest: str) -> Path:
    """The cache entry for a GGUF with this content: ``models/gguf-<sha256>-v<version>``."""
    if not _HEX64.fullmatch(digest):
        raise ValueError(f"model: bad content digest {digest[:80]!r}")
    return cache_root() / "models" / f"gguf-{digest}-v{CACHE_VERSION}"


def entry_ok(entry: Path, digest: str) -> bool:
    """A published entry: its marker (written last, before the rename) names this digest."""
    try:
        info = json.loads((entry / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(info, dict) and info.get("sha256") == digest and info.get("version") == CACHE_VERSION


def publish(tmp: Path, entry: Path, digest: str) -> Path:
    """Rename the finished ``tmp`` into place. If another process published the same content
    first, keep theirs; a broken entry of this very digest is moved aside and removed (the
    only thing this cache ever deletes besides its own temp dirs)."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(tmp, entry)
        return entry
    except OSError:
        if entry_ok(entry, digest):
            return entry
    aside = Path(tempfile.mkdtemp(prefix="stale-", dir=str(tmp.parent)))
    os.rename(entry, aside / "entry")
    os.rename(tmp, entry)
    shutil.rmtree(aside, ignore_errors=True)
    return entry


def staging_dir(name: str) -> Path:
    """A fresh, private temp dir inside the cache root (same file system as the entries, so
    ``publish`` is a rename), prefixed by the sanitised ``name`` for readability."""
    tmp_root = cache_root() / "tmp"
    tmp_root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{safe_name(name)}-", dir=str(tmp_root)))
