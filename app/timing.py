"""Server-side phase timings for the UI breakdown (README, "Benchmarks"), off by default.

With ``INFERSCOPE_PROFILE=1`` in the server's environment each timed phase prints one line
``PROFILE {"what": ..., "t0": epoch ms, "t1": epoch ms}`` to stderr, so a browser-side trace
(Date.now() stamps on the same machine) can be laid beside it.
"""
from __future__ import annotations

import json
import os
import sys
import time
from contextlib import contextmanager
from typing import Iterator

ENABLED = os.environ.get("INFERSCOPE_PROFILE") == "1"


@contextmanager
def phase(what: str) -> Iterator[None]:
    if not ENABLED:
        yield
        return
    t0 = time.time() * 1e3
    try:
        yield
    finally:
        print("PROFILE " + json.dumps({"what": what, "t0": round(t0, 1), "t1": round(time.time() * 1e3, 1)}),
              file=sys.stderr, flush=True)
