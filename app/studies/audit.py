"""The Audit page's studies: a deployment's audit from pasted or uploaded logs (engine.audit), and
this project's engine measured with each optimisation off and on (engine.audit.this_engine).

The audit is cached process-wide by its inputs (the serving simulator's predicted gains take a
few seconds; the same inputs again are instant, in any session). The measured ablation is the
real engine on this machine: it runs only when asked and its result is kept in the session
(app/session.py), never rerun by a redraw. Every bad input is a ValueError naming the field.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import streamlit as st

from app.models import MODELS
from engine.audit.audit import AuditReport, run_audit
from engine.audit.evidence import Evidence
from engine.audit.knowledge import knowledge
from engine.audit.readers import read_evidence
from engine.audit.this_engine import VARIANTS, Ablation, ablation, standard_workload
from engine.simulate.workload import Workload

#: the version choice that lets the log say (else the table's newest, with a warning)
AS_THE_LOG_SAYS = "as the log says"
#: bytes read of one uploaded file (a startup log is tens of KB; the readers stop at 2 M characters anyway)
MAX_FILE_BYTES = 4 << 20
#: this project's engine models the ablation can run (the live pages' models)
ENGINE_MODELS: tuple[str, ...] = MODELS
#: the ablation's workloads: the standard one (about 2 min for SmolLM2-135M here) and a quick one
WORKLOADS: dict[str, Callable[[], Workload]] = {
    "standard": standard_workload,
    "quick": lambda: standard_workload(num_requests=4, prompt=48, output=6, prefix=16),
}
#: runs of one ablation: the baseline and one per optimisation flipped
RUNS = len(VARIANTS) + 1


def frameworks() -> list[str]:
    """The frameworks the knowledge table knows (presets/optimisations.json)."""
    return list(knowledge().frameworks)


def versions(framework: str) -> list[str]:
    """``AS_THE_LOG_SAYS``, then the table's versions of ``framework``, newest first."""
    known = knowledge().frameworks.get(framework, {})
    return [AS_THE_LOG_SAYS, *sorted(known, key=lambda v: known[v].parsed, reverse=True)]


@dataclass(frozen=True)
class LogText:
    """The pasted text and the uploaded files as one text (the readers number its lines), and
    which lines came from where."""

    text: str
    parts: tuple[tuple[str, int, int], ...]  # (where from, first line, last line), 1-based

    def where(self) -> str:
        """'lines 1-33: pasted text; lines 34-90: vllm.log' (empty for no text)."""
        return "; ".join(f"lines {a:,}–{b:,}: {name}" if b > a else f"line {a:,}: {name}" for name, a, b in self.parts)


def combine(pasted: str, files: Sequence[tuple[str, bytes]]) -> LogText:
    """The pasted text, then each file in order (its first ``MAX_FILE_BYTES``, decoded as UTF-8
    with bad bytes replaced), one after the other, as the CLI's repeated --log does."""
    chunks: list[str] = []
    parts: list[tuple[str, int, int]] = []
    line = 1
    for name, text in [("pasted text", pasted), *((n, b[:MAX_FILE_BYTES].decode("utf-8", errors="replace"))
                                                   for n, b in files)]:
        if not text.strip():
            continue
        n = len(text.splitlines())
        chunks.append(text.rstrip("\n"))
        parts.append((name, line, line + n - 1))
        line += n
    return LogText("\n".join(chunks), tuple(parts))


@dataclass(frozen=True)
class AuditInputs:
    """Everything an audit depends on (the cache key)."""

    model: str
    hardware: str
    framework: str
    version: str = AS_THE_LOG_SAYS
    batch: int = 1
    context: int = 4096
    log_text: str = ""
    measured_decode_tok_s: float | None = None
    measured_ttft_s: float | None = None
    simulate_gains: bool = True


@st.cache_resource(show_spinner=False, max_entries=32)
def evidence(text: str) -> Evidence | None:
    """What the readers understood of ``text`` (None: no text). Never raises."""
    return read_evidence(text) if text.strip() else None


@st.cache_resource(show_spinner=False, max_entries=32)
def _audit(model: str, hardware: str, framework: str, version: str, batch: int, context: int, log_text: str,
           decode: float | None, ttft: float | None, simulate_gains: bool) -> AuditReport:
    return run_audit(model, hardware, framework, None if version == AS_THE_LOG_SAYS else version,
                     evidence=evidence(log_text), measured_decode_tok_s=decode, measured_ttft_s=ttft, batch=batch,
                     context=context, simulate_gains=simulate_gains)


def audit(inputs: AuditInputs) -> AuditReport:
    """The audit of ``inputs`` (cached by them; a ValueError naming the field for a bad one)."""
    return _audit(inputs.model, inputs.hardware, inputs.framework, inputs.version, inputs.batch, inputs.context,
                  inputs.log_text, inputs.measured_decode_tok_s, inputs.measured_ttft_s, inputs.simulate_gains)


def measure(model: str, workload: str, progress: Callable[[float, str], object] | None = None) -> Ablation:
    """This engine on this machine: ``workload`` (a ``WORKLOADS`` key) served once as the engine's
    defaults and once per optimisation flipped; ``progress(done share, what runs now)``."""
    if model not in ENGINE_MODELS:
        raise ValueError(f"model: choose one of {', '.join(ENGINE_MODELS)}, got {model!r}")
    if workload not in WORKLOADS:
        raise ValueError(f"workload: choose one of {', '.join(WORKLOADS)}, got {workload!r}")
    said: list[str] = []

    def say(message: str) -> None:
        if progress is not None:
            progress(len(said) / RUNS, message)
        said.append(message)
    return ablation(model, WORKLOADS[workload](), say)
