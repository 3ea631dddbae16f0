"""The Audit page: pure views of an audit (engine.audit records -> DataFrame / Figure / Markdown).

Every number and word here is read from the records (``Evidence``, ``AuditReport``, ``Ablation``),
so the tables, the picture and the exports of one audit agree. Text that came from a log (a
setting's line, a value) lands in DataFrame cells, Plotly text (HTML-escaped) or the exported
Markdown file, never in Markdown that the page renders.
"""
from __future__ import annotations

import json
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from pandas.io.formats.style import Styler
from plotly.subplots import make_subplots

from engine.audit.__main__ import report_json
from engine.audit.audit import AuditReport, CheckItem, Roofline
from engine.audit.evidence import Evidence, Setting
from engine.audit.this_engine import Ablation
from visualizers.text import escape_plotly

#: each checklist status with a symbol that reads without colour, and its cell colour
STATUS_LABEL = {"on": "✅ on", "off": "⭕ off", "unsupported": "⛔ unsupported", "not applicable": "➖ not applicable",
                "unknown": "❔ unknown"}
STATUS_COLOR = {"on": "#D5F5E3", "off": "#FDEBD0", "unsupported": "#FADBD8", "not applicable": "#EAECEE",
                "unknown": "#FCF3CF"}
SOURCE_LABEL = {"log": "log", "setting": "your setting", "default": "version default"}
BAR_COLORS = {"bound": "#7F8C8D", "typical": "#5DADE2", "predicted": "#2874A6", "measured": "#E67E22"}
SHARE_COLORS = {"gemm_s": "#1F77B4", "attention_s": "#FF7F0E", "elementwise_s": "#2CA02C", "comm_s": "#9467BD",
                "overhead_s": "#C0392B"}
SHARE_NAMES = {"gemm_s": "GEMMs", "attention_s": "attention", "elementwise_s": "element-wise", "comm_s": "communication",
               "overhead_s": "step overhead"}


def _value(v: object) -> str:
    return "" if v is None else str(v)


def _first_line(s: Setting) -> str:
    """The line a setting was read from; a pasted command spans several lines (joined by '\\')."""
    return " ".join(part.strip() for part in s.line.splitlines()) if s.line else ""


def detected_frame(settings: dict[str, Setting]) -> pd.DataFrame:
    """One row per setting: its value, where it came from (log / your setting / version default),
    the line number and the line (for a default: the version's words)."""
    rows = [{"setting": s.name, "value": _value(s.value), "source": SOURCE_LABEL.get(s.source, s.source),
             "line": s.line_no or None, "from": _first_line(s)} for s in settings.values()]
    frame = pd.DataFrame(rows, columns=["setting", "value", "source", "line", "from"])
    frame["line"] = frame["line"].astype("Int64")
    return frame


def benchmark_frame(evidence: Evidence) -> pd.DataFrame:
    """The figures a benchmark block states, as printed (ms for latencies), and llama-bench's rates."""
    b = evidence.benchmark
    if b is None:
        return pd.DataFrame(columns=["figure", "value"])
    rows = [{"figure": k, "value": v} for k, v in b.figures.items()]
    rows += [{"figure": f"{k} (tokens/s)", "value": v} for k, v in b.rates.items()]
    return pd.DataFrame(rows, columns=["figure", "value"])


def status_label(item: CheckItem) -> str:
    return STATUS_LABEL[item.status]


def gain_here(item: CheckItem) -> str:
    """The expected gain, except for an item this hardware or version cannot run (its gain is moot)."""
    return "— (cannot run here)" if item.status == "unsupported" else item.expected_gain


def how_or_why_not(item: CheckItem) -> str:
    """What to do about an item: the flag that turns it on (off), why it cannot run here
    (unsupported) or why it does not apply; nothing for an item that is on or unknown."""
    if item.status == "off":
        return item.how
    if item.status == "unsupported":
        return item.supported_why
    if item.status == "not applicable":
        return item.applies_why
    return ""


def checklist_frame(report: AuditReport) -> pd.DataFrame:
    """The checklist at a glance: status (symbol and word), the optimisation, the evidence for its
    status, the predicted gain here, and how to turn it on or why it cannot be (``how_or_why_not``)."""
    rows = [{"status": status_label(i), "optimisation": i.title, "evidence": i.evidence,
             "expected gain here": gain_here(i), "how / why not": how_or_why_not(i), "name": i.name}
            for i in report.checklist]
    return pd.DataFrame(rows, columns=["status", "optimisation", "evidence", "expected gain here", "how / why not",
                                       "name"])


def _status_css(label: object) -> str:
    for status, text in STATUS_LABEL.items():
        if label == text:
            return f"background-color: {STATUS_COLOR[status]}; color: #000000"
    return ""


def styled_status(frame: pd.DataFrame, column: str = "status") -> Styler:
    """``frame`` with its status column coloured by status (the symbols carry it without colour)."""
    return frame.style.map(_status_css, subset=[column])


def recommendations_frame(report: AuditReport) -> pd.DataFrame:
    """Ranked by predicted gain: numbers first (the factor), then the table's sourced words."""
    rows = [{"rank": n, "change": r.title, "predicted gain": r.gain,
             "factor": round(r.gain_ratio, 3) if r.gain_ratio is not None else None, "how": r.how}
            for n, r in enumerate(report.recommendations, 1)]
    return pd.DataFrame(rows, columns=["rank", "change", "predicted gain", "factor", "how"])


def roofline_figure(rl: Roofline, font_size: int = 12) -> go.Figure:
    """The decode roofline gap: the bandwidth bound, what the hardware typically reaches (the
    preset's memory efficiency x the bound), the calculator's prediction and the measured figure,
    tokens/s per sequence at the audited batch; below, the simulator's decode step by part."""
    bars = [("bound (bandwidth)", rl.decode_bound_tokens_per_s, "bound", "the roofline: weights + KV read once per step"),
            ("typical here", rl.decode_bound_tokens_per_s * rl.typical_utilisation, "typical",
             f"{rl.typical_utilisation:.0%} of the bound ({escape_plotly(rl.typical_source)})"),
            ("predicted", rl.decode_predicted_tokens_per_s, "predicted", "the calculator, with the preset's efficiency")]
    if rl.decode_measured_tokens_per_s is not None:
        util = f"{rl.bandwidth_utilisation:.0%} of the bound" if rl.bandwidth_utilisation is not None else ""
        bars.append(("measured", rl.decode_measured_tokens_per_s, "measured", util))
    fig = make_subplots(rows=2, cols=1, row_heights=[0.72, 0.28], vertical_spacing=0.22,
                        subplot_titles=(f"Decode, tokens/s per sequence (batch {rl.batch}, context {rl.context:,})",
                                        "Where a decode step's time goes (simulator)"))
    labels = [b[0] for b in bars]
    fig.add_trace(go.Bar(y=labels, x=[b[1] for b in bars], orientation="h", showlegend=False,
                         marker_color=[BAR_COLORS[b[2]] for b in bars], customdata=[b[3] for b in bars],
                         text=[f"{b[1]:,.3g}" for b in bars], textposition="auto",
                         hovertemplate="%{y}: %{x:,.3g} tokens/s<br>%{customdata}<extra></extra>"), row=1, col=1)
    total = sum(rl.step_shares.values()) or 1.0
    for key, share in rl.step_shares.items():
        if share <= 0:
            continue
        name = SHARE_NAMES.get(key, key)
        fig.add_trace(go.Bar(y=["decode step"], x=[share / total], orientation="h", name=name,
                             marker_color=SHARE_COLORS.get(key, "#95A5A6"), text=[f"{share / total:.0%}"],
                             textposition="inside", insidetextanchor="middle",
                             hovertemplate=f"{name}: %{{x:.0%}}<extra></extra>"), row=2, col=1)
    fig.update_yaxes(autorange="reversed", row=1, col=1)
    fig.update_xaxes(rangemode="tozero", row=1, col=1)  # (the subplot's title names the unit)
    fig.update_xaxes(tickformat=".0%", range=[0, 1], row=2, col=1)
    fig.update_layout(barmode="stack", height=400, font=dict(size=font_size), template="plotly_white",
                      margin=dict(t=40, b=40, l=10, r=10),
                      legend=dict(orientation="h", yanchor="top", y=-0.12, x=0),
                      meta={"figure": "audit_roofline"})
    return fig


# -- exports ---------------------------------------------------------------------------------------

def report_as_json(report: AuditReport) -> str:
    """The CLI's JSON (``python -m engine.audit --json``), indented."""
    return json.dumps(report_json(report), indent=1, default=str)


def _cell(text: object) -> str:
    """A Markdown table cell: one line, backslashes and pipes escaped, and no HTML tag a renderer would
    draw (a log's text is data here too)."""
    return (" ".join(_value(text).split()).replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;")
            .replace(">", "&gt;"))


def _table(header: list[str], rows: list[list[object]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return out


def report_markdown(report: AuditReport, evidence: Evidence | None = None) -> str:
    """The audit as a Markdown document: the same content as the page (and as the CLI's text)."""
    r = report
    lines = [f"# Audit: {_cell(r.model)} on {_cell(r.hardware)}, {_cell(r.framework)} {_cell(r.version)}"
             + (f" ({_cell(r.engine)})" if r.engine else ""), ""]
    lines.append("Predicted by InferScope's calculator, serving simulator and knowledge table, except the figures a "
                 "benchmark block or you gave (marked measured).")
    lines.append("")
    if evidence is not None:
        lines += [f"Evidence: {_cell(evidence.summary())}", ""]
    if r.warnings:
        lines += ["## Warnings", ""] + [f"- {_cell(w)}" for w in r.warnings] + [""]
    lines += ["## Settings", ""]
    lines += _table(["setting", "value", "source", "line", "from"],
                    [[s.name, s.value, SOURCE_LABEL.get(s.source, s.source), s.line_no or "", _first_line(s)]
                     for s in r.detected.values()]) + [""]
    lines += ["## Checklist", ""]
    lines += _table(["status", "optimisation", "evidence", "expected gain here", "how / why not"],
                    [[status_label(i), i.title, i.evidence, gain_here(i), how_or_why_not(i)]
                     for i in r.checklist]) + [""]
    if r.roofline:
        rl = r.roofline
        lines += ["## Roofline gap", "",
                  f"- batch {rl.batch}, context {rl.context:,}",
                  f"- decode bound (bandwidth): {rl.decode_bound_tokens_per_s:.3g} tokens/s per sequence",
                  f"- typical here: {rl.typical_utilisation:.0%} of the bound ({_cell(rl.typical_source)})",
                  f"- predicted (calculator): {rl.decode_predicted_tokens_per_s:.3g} tokens/s per sequence"]
        if rl.decode_measured_tokens_per_s is not None:
            lines.append(f"- measured: {rl.decode_measured_tokens_per_s:.3g} tokens/s per sequence"
                         + (f" = {rl.bandwidth_utilisation:.0%} of the bound" if rl.bandwidth_utilisation else ""))
        lines.append(f"- prefill bound (compute): {rl.prefill_bound_s:.3g} s for a {rl.context:,}-token prompt")
        if rl.ttft_measured_s is not None:
            lines.append(f"- measured TTFT: {rl.ttft_measured_s:.3g} s"
                         + (f" = {rl.compute_utilisation:.1%} compute utilisation" if rl.compute_utilisation else ""))
        if rl.step_shares:
            lines.append("- decode step (simulator): " + ", ".join(
                f"{SHARE_NAMES.get(k, k)} {v:.0%}" for k, v in rl.step_shares.items() if v > 0))
        lines += [f"- {_cell(w)}" for w in rl.attribution] + [""]
    lines += ["## Recommendations (predicted gain first)", ""]
    lines += [f"{n}. **{_cell(x.title)}**: {_cell(x.gain)}" + (f" (`{x.how}`)" if x.how else "")
              for n, x in enumerate(r.recommendations, 1)] or ["none"]
    lines.append("")
    if r.cannot:
        lines += ["## Not possible here", ""] + [f"- **{_cell(t)}**: {_cell(w)}" for t, w in r.cannot] + [""]
    return "\n".join(lines)


# -- this engine, measured -------------------------------------------------------------------------

def ablation_frame(a: Ablation) -> pd.DataFrame:
    """The measured ablation in the checklist's form: the baseline, then each optimisation as run
    (off: a default turned off; on: an opt-in turned on), its makespan, speed-up over the baseline
    (> 1: faster), p50 TTFT and p50 TPOT."""
    def ms(x: float | None) -> float | None:
        return None if x is None else x * 1e3

    b = a.baseline
    rows: list[dict[str, Any]] = [{"status": "baseline", "optimisation": "the engine's defaults",
                                   "makespan (s)": b.makespan_s, "speed-up": 1.0, "output tok/s": b.output_tokens_per_s,
                                   "TTFT p50 (ms)": ms(b.ttft_p50_s), "TPOT p50 (ms)": ms(b.tpot_p50_s)}]
    rows += [{"status": STATUS_LABEL["on" if r.direction == "on" else "off"], "optimisation": r.title,
              "makespan (s)": r.figures.makespan_s, "speed-up": r.speedup, "output tok/s": r.figures.output_tokens_per_s,
              "TTFT p50 (ms)": ms(r.figures.ttft_p50_s), "TPOT p50 (ms)": ms(r.figures.tpot_p50_s)} for r in a.rows]
    return pd.DataFrame(rows)


def ablation_figure(a: Ablation, font_size: int = 12) -> go.Figure:
    """Speed-up of each flipped optimisation over the baseline (measured makespan ratio), and the
    baseline's decode against this machine's batch-1 bandwidth bound."""
    fig = make_subplots(rows=1, cols=2, column_widths=[0.64, 0.36], horizontal_spacing=0.2,
                        subplot_titles=("Speed-up over the baseline (makespan)", "Decode vs the bound"))
    names = [f"{r.title} {r.direction}" for r in a.rows]
    fig.add_trace(go.Bar(y=names, x=[r.speedup for r in a.rows], orientation="h", showlegend=False,
                         marker_color=["#1E8449" if r.speedup >= 1 else "#C0392B" for r in a.rows],
                         text=[f"×{r.speedup:.2f}" for r in a.rows], textposition="auto",
                         hovertemplate="%{y}: ×%{x:.2f}<extra></extra>"), row=1, col=1)
    fig.add_vline(x=1.0, line=dict(color="#34495E", dash="dash"), row=1, col=1)
    bars: list[tuple[str, float, str]] = []
    if a.decode_bound_tokens_per_s is not None:  # None: a model the calculator does not know (tiny-random)
        bars.append(("bound, batch 1", a.decode_bound_tokens_per_s, BAR_COLORS["bound"]))
    if a.decode_measured_tokens_per_s is not None:
        bars.append(("measured", a.decode_measured_tokens_per_s, BAR_COLORS["measured"]))
    fig.add_trace(go.Bar(x=[b[0] for b in bars], y=[b[1] for b in bars], marker_color=[b[2] for b in bars],
                         showlegend=False, text=[f"{b[1]:,.3g}" for b in bars], textposition="auto",
                         hovertemplate="%{x}: %{y:,.3g} tokens/s per sequence<extra></extra>"), row=1, col=2)
    fig.update_yaxes(autorange="reversed", row=1, col=1)
    fig.update_xaxes(title_text="× (measured; > 1 is faster)", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="tokens/s per sequence", rangemode="tozero", row=1, col=2)
    fig.update_layout(height=380, font=dict(size=font_size), template="plotly_white",
                      title="This engine, measured on this machine", margin=dict(t=80, b=40, l=10, r=10),
                      meta={"figure": "audit_ablation"})
    return fig
