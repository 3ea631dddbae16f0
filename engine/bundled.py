"""``python -m engine.bundled [scenario ...]``: remake the bundled recordings (presets/recordings/).

The command stays here, beside ``python -m engine.memory``; what it does is engine/replay/bundled.py.
"""
from __future__ import annotations

import sys

from engine.replay.bundled import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
