"""Hardware-fit calculator: "does model X fit on device Y, and how fast?"

Pure Python — importing this module never imports torch or transformers. The implementation
lives in ``engine/sizing/`` (one concept per file: ``arch`` config -> parameters and KV,
``formats`` bytes per format and the dtype vocabulary, ``hardware`` presets and this machine,
``models`` where a model comes from; the plan by concern: ``budget`` the framework's budget rule,
``precision`` formats and weight bytes, ``parallel`` TP/PP and the fewest-devices layout,
``workload`` token counts and their maxima; ``plan`` memory and roofline from those, ``estimate``
the answer and its searches, ``advice`` formats to try / what would fit / command lines,
``formulas`` every formula with its numbers, ``cli`` the command line; ``units`` the one GiB).

    >>> from engine.memory import estimate, Workload
    >>> e = estimate("internvl2-8b", "atlas-300v-pro")
    >>> e.fits, round(e.decode_tokens_per_s_roofline, 1)

Command line (a stable contract):

    python -m engine.memory --model internvl2-8b --hardware atlas-300v-pro [--json]
"""
from engine.sizing import *  # noqa: F401,F403 - the public API
from engine.sizing import __all__  # noqa: F401
from engine.sizing.cli import JSON_KEYS, main, render_text  # noqa: F401

if __name__ == "__main__":
    raise SystemExit(main())
