"""Evidence readers: one module per format, each ``read(lines) -> Found`` that never raises.

    vllm.py       vLLM (V0, V1) and vllm-ascend startup logs
    sglang.py     SGLang startup logs
    llamacpp.py   llama.cpp logs and llama-bench tables
    bench.py      serving benchmark result blocks (vllm bench serve, SGLang bench_serving)
    commands.py   server command lines pasted with a log
    common.py     the result record and the key=value scanners

``read_evidence(text)`` runs them all and merges what they found (engine/audit/evidence.py).
"""
from __future__ import annotations

from engine.audit.evidence import Benchmark, Evidence, Setting
from engine.audit.readers import bench, commands, llamacpp, sglang, vllm
from engine.audit.readers.common import Found

#: (format name, reader) in the order their statements win: a printed log over a pasted command
READERS = (("vllm", vllm.read), ("sglang", sglang.read), ("llama.cpp", llamacpp.read), ("bench", bench.read),
           ("command", commands.read))
#: the longest text read (a startup log is tens of KB; a paste past this is cut, with a warning)
MAX_CHARS = 2_000_000


def read_evidence(text: str) -> Evidence:
    """What every reader understood of ``text`` (a log, a benchmark block, or several pasted
    together). Never raises: unknown text is evidence of nothing, with its lines counted."""
    warnings: list[str] = []
    if len(text) > MAX_CHARS:
        warnings.append(f"the text is {len(text):,} characters: read its first {MAX_CHARS:,}")
        text = text[:MAX_CHARS]
    lines = text.splitlines()
    settings: dict[str, Setting] = {}
    benchmark: Benchmark | None = None
    formats: list[str] = []
    used: set[int] = set()
    engine: str | None = None
    devices: list[tuple[str, int]] = []
    frameworks: dict[str, Setting] = {}
    for name, reader in READERS:
        try:
            found: Found = reader(lines)
        except Exception as e:  # a reader's bug must not lose the others' findings
            warnings.append(f"{name} reader failed on this text ({type(e).__name__}: {e}); its findings are left out")
            continue
        if not (found.settings or found.benchmark):
            continue
        formats.append(name)
        used |= found.lines
        warnings.extend(found.warnings)
        engine = engine or found.engine
        devices += found.devices
        benchmark = benchmark or found.benchmark
        for s in found.settings:
            if s.name == "framework":
                frameworks.setdefault(str(s.value), s)
            settings.setdefault(s.name, s)
    if len(frameworks) > 1:
        warnings.append(f"the text names several frameworks ({', '.join(frameworks)}): the first, "
                        f"{next(iter(frameworks))}, is taken")
    return Evidence(tuple(formats), settings, benchmark, len(lines), tuple(sorted(used)), tuple(warnings), engine,
                    tuple(devices))
