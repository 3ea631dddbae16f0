"""``python -m engine.audit`` — which known optimisations a deployment applies (docs/audit.md).

    python -m engine.audit --model M --hardware H --framework F [--version V] [--log FILE]...
        [--set NAME=VALUE]... [--measured-decode-tok-s X] [--measured-ttft-s Y] [--batch B]
        [--context TOKENS] [--no-simulate] [--json]
    python -m engine.audit --this-engine [--json]      (the real engine here, each optimisation off and on)

``--log -`` reads standard input. A bad value exits with status 2 and one line on stderr.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, NoReturn

from engine.audit.audit import AuditReport, run_audit
from engine.audit.evidence import CANONICAL, Evidence, Value
from engine.audit.readers import read_evidence
from engine.audit.readers.common import literal
from engine.sizing.cli import one_line


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _Refused(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m engine.audit", description="Which known optimisations does this deployment apply, "
                "how far is it from the roofline, and what to change first? (InferScope audit)")
    p.add_argument("--model", help="calculator model name or config path")
    p.add_argument("--hardware", help="hardware preset name")
    p.add_argument("--framework", help="vllm | sglang | vllm-ascend | mindie | tensorrt-llm | llama.cpp | ...")
    p.add_argument("--version", help="the framework's version (e.g. 0.6.3, 0.10.1; llama.cpp b4589)")
    p.add_argument("--log", action="append", default=[], metavar="FILE",
                   help="a startup log, benchmark block or llama-bench table (repeatable; - = stdin)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help=f"a setting as deployed (canonical names: {', '.join(CANONICAL)})")
    p.add_argument("--measured-decode-tok-s", type=float, help="measured decode tokens/s per sequence")
    p.add_argument("--measured-ttft-s", type=float, help="measured time to first token, seconds")
    p.add_argument("--batch", type=int, default=1, help="concurrent sequences (default 1)")
    p.add_argument("--context", type=int, default=4096, help="tokens per sequence (default 4096)")
    p.add_argument("--no-simulate", action="store_true", help="skip the serving simulator's predicted gains")
    p.add_argument("--this-engine", action="store_true",
                   help="measure this project's engine here with each optimisation off and on")
    p.add_argument("--json", action="store_true", help="print JSON")
    return p


def _evidence(paths: list[str]) -> Evidence | None:
    if not paths:
        return None
    texts = []
    for p in paths:
        try:
            texts.append(sys.stdin.read() if p == "-" else Path(p).read_text(errors="replace"))
        except OSError as e:
            raise _Refused(f"--log: cannot read {p!r}: {e.strerror or e}") from None
    return read_evidence("\n".join(texts))


def _settings(pairs: list[str]) -> dict[str, Value]:
    out: dict[str, Value] = {}
    for pair in pairs:
        name, eq, raw = pair.partition("=")
        if not eq or name not in CANONICAL:
            raise _Refused(f"--set: expected NAME=VALUE with NAME one of {', '.join(CANONICAL)}, got {pair!r}")
        out[name] = literal(raw)
    return out


def report_json(r: AuditReport) -> dict[str, Any]:
    """The CLI's JSON (issue #23's keys)."""
    return {
        "model": r.model, "hardware": r.hardware, "framework": r.framework, "version": r.version, "engine": r.engine,
        "detected": {n: {"value": s.value, "source": s.source, "line": s.line or None}
                     for n, s in r.detected.items()},
        "checklist": [{"name": i.name, "title": i.title, "status": i.status, "applies": i.applies,
                       "supported": i.supported, "enabled": i.enabled, "evidence": i.evidence,
                       "expected_gain": i.expected_gain, "how": i.how, "source": i.source} for i in r.checklist],
        "roofline": asdict(r.roofline) if r.roofline else None,
        "recommendations": [asdict(x) for x in r.recommendations],
        "cannot": [{"title": t, "why": w} for t, w in r.cannot], "warnings": list(r.warnings),
    }


def report_text(r: AuditReport) -> str:
    lines = [f"Audit: {r.model} on {r.hardware}, {r.framework} {r.version}" + (f" ({r.engine})" if r.engine else ""),
             ""]
    for w in r.warnings:
        lines.append(f"warning: {w}")
    lines.append("Checklist:")
    for i in r.checklist:
        lines.append(f"  [{i.status:>14}] {i.title}: {i.evidence}" + (f"; turn on: {i.how}" if i.status == "off" and
                                                                      i.how else ""))
    if r.roofline:
        rl = r.roofline
        lines += ["", f"Roofline (batch {rl.batch}, context {rl.context:,}): decode bound "
                      f"{rl.decode_bound_tokens_per_s:.3g} tokens/s per sequence, predicted "
                      f"{rl.decode_predicted_tokens_per_s:.3g}"]
        if rl.decode_measured_tokens_per_s:
            lines.append(f"  measured {rl.decode_measured_tokens_per_s:.3g} tokens/s = "
                         f"{(rl.bandwidth_utilisation or 0):.0%} of the bound (the preset expects "
                         f"{rl.typical_utilisation:.0%})")
        lines += [f"  - {w}" for w in rl.attribution]
    lines += ["", "Recommendations (predicted gain first):"]
    lines += [f"  {n}. {x.title}: {x.gain}" + (f" -> {x.how}" if x.how else "")
              for n, x in enumerate(r.recommendations, 1)] or ["  none"]
    if r.cannot:
        lines += ["", "Not possible here:"] + [f"  {t}: {w}" for t, w in r.cannot]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.this_engine:
            from engine.audit.this_engine import ablation, ablation_json, ablation_text
            result = ablation(progress=lambda s: print(s, file=sys.stderr, flush=True))
            print(json.dumps(ablation_json(result), indent=1) if args.json else ablation_text(result))
            return 0
        for name in ("model", "hardware", "framework"):
            if not getattr(args, name):
                raise _Refused(f"--{name}: required (or --this-engine)")
        report = run_audit(args.model, args.hardware, args.framework, args.version,
                           settings=_settings(args.set), evidence=_evidence(args.log),
                           measured_decode_tok_s=args.measured_decode_tok_s, measured_ttft_s=args.measured_ttft_s,
                           batch=args.batch, context=args.context, simulate_gains=not args.no_simulate)
    except (_Refused, ValueError) as e:
        print(one_line(f"error: {e}"), file=sys.stderr)
        return 2
    print(json.dumps(report_json(report), indent=1, default=str) if args.json else report_text(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
