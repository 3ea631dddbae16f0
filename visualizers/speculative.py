"""Speculative decoding, drawn from the engine's own verifications (StepTrace.spec).

* ``drafts_figure``: the last step, one row per verified request: its k drafts as cells coloured
  accepted / rejected / unverified, then the token the target added (bonus or recovered), with
  p and q of each draft on hover (and the residual's top entries at a rejection);
* ``pq_figure``: one verification's p and q per draft position as bars, with min(1, p/q), the
  acceptance probability of the rejection test;
* ``acceptance_by_position`` / ``spec_summary``: α per draft position and per request, mean tokens
  per target step, from every step so far;
* ``theory_figure``: expected tokens per target step (1 − α^(k+1)) / (1 − α) and expected speedup
  (1 − α^(k+1)) / ((1 − α)(k c + 1)) over k for the measured α and draft cost c, with the
  measured point and the best k;
* ``tokens_per_step_figure``: tokens each verifying target step emitted, per step;
* ``spec_text_markdown``: a request's output with accepted drafts, bonus and recovered tokens
  marked (every piece escaped).

Pure functions of records (engine.core.trace); no engine state.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Mapping

import pandas as pd
import plotly.graph_objects as go

from engine.speculative.theory import best_k, expected_speedup, expected_tokens_per_step
from engine.replay.run import SPECULATION_RUNS, PolicyRun
from engine.core.trace import SpecVerification, StepTrace
from visualizers.events import notes, step_events
from visualizers.figures import Panel, figure, legend_below, live_layout, stack
from visualizers.steps import step_number
from visualizers.text import escape_markdown, escape_plotly
from visualizers.theme import plot_label, request_label, request_sort_key, text_color_on

SPEC_COLORS: dict[str, str] = {  # outcome colours: none is a request colour (theme.STATE_COLOR_MIN_DISTANCE)
    "accepted": "#4DAC26",
    "rejected": "#D73027",
    "unverified": "#DDDDDD",
    "bonus": "#2166AC",
    "recovered": "#F1A340",
}
SPEC_LABELS: dict[str, str] = {
    "accepted": "accepted draft",
    "rejected": "rejected draft",
    "unverified": "not verified (after a rejection)",
    "bonus": "bonus token (all drafts accepted)",
    "recovered": "recovered token (sampled at the rejection)",
}
# Markdown background colours (Streamlit's palette names) for the marked output text.
TEXT_MARKS = {"accepted": "green", "bonus": "blue", "recovered": "orange"}
P_COLOR, Q_COLOR = "#222255", "#BBBBBB"


def readable(text: str) -> str:
    """A byte-level BPE piece as a reader sees it: "Ġ" (a leading space) as a space, "Ċ" as ↵."""
    return text.replace("Ġ", " ").replace("Ċ", "↵")


def _piece(text: str | None, token_id: int) -> str:
    return escape_plotly(readable(text)) if text is not None else f"#{token_id}"


def _final_text(v: SpecVerification, pieces: dict[int, str | None]) -> str | None:
    return pieces.get(v.emitted[-1]) if v.emitted else None


def drafts_figure(trace: StepTrace | None, font_size: int = 12, step: int | None = None) -> go.Figure:
    """Rows of cells: each verified request's drafts (left to right), then its final token.
    Cell colour = outcome; text = the token; hover = p, q, min(1, p/q) (and the residual)."""
    spec = sorted(trace.spec, key=lambda v: request_sort_key(v.request_id)) if trace else []
    pieces = {s.token_id: s.text for s in trace.sampled} if trace else {}
    xs: dict[str, list[Any]] = {k: [] for k in SPEC_COLORS}
    ys: dict[str, list[Any]] = {k: [] for k in SPEC_COLORS}
    texts: dict[str, list[str]] = {k: [] for k in SPEC_COLORS}
    hovers: dict[str, list[str]] = {k: [] for k in SPEC_COLORS}
    labels = [plot_label(v.request_id) for v in spec]
    for v, label in zip(spec, labels):
        for i, d in enumerate(v.drafts):
            ratio = min(1.0, d.p / d.q) if d.q > 0 else 0.0
            xs[d.outcome].append(i + 1)
            ys[d.outcome].append(label)
            texts[d.outcome].append(_piece(d.text, d.token_id))
            wanted = "".join(f"<br>  {_piece(a.text, a.token_id)!r}: {a.prob:.3f}" for a in d.alternatives)
            hovers[d.outcome].append(f"{label} draft {i + 1}: {_piece(d.text, d.token_id)!r}<br>p = {d.p:.3f}, "
                                     f"q = {d.q:.3f}, min(1, p/q) = {ratio:.3f}<br>{d.outcome}"
                                     + (f"<br>the target's top choices:{wanted}" if wanted else ""))
        final = v.final_kind
        xs[final].append(len(v.drafts) + 1)
        ys[final].append(label)
        final_id = v.emitted[-1] if v.emitted else 0
        texts[final].append(_piece(_final_text(v, pieces), final_id))
        residual = "".join(f"<br>  {_piece(r.text, r.token_id)!r}: {r.prob:.3f}" for r in v.residual_top)
        hovers[final].append(f"{label} {final} token: {_piece(_final_text(v, pieces), final_id)!r}"
                             + (f"<br>residual max(0, p − q), top entries:{residual}" if residual else ""))
    data = [dict(type="scatter", mode="markers+text", name=SPEC_LABELS[kind], x=xs[kind], y=ys[kind],
                 text=texts[kind], textposition="middle center",
                 textfont=dict(size=font_size - 1, color=text_color_on(SPEC_COLORS[kind])),
                 marker=dict(symbol="square", size=font_size * 3.6, color=SPEC_COLORS[kind],
                             line=dict(width=1, color="white")),
                 hovertext=hovers[kind], hoverinfo="text", cliponaxis=False)
            for kind in SPEC_COLORS]
    k_max = max((len(v.drafts) for v in spec), default=0)
    emitted = sum(len(v.emitted) for v in spec)
    title = (f"Step {step_number(trace) if trace else '—'}: {len(spec)} requests verified drafts, "
             f"{sum(v.num_accepted for v in spec)} of {sum(len(v.drafts) for v in spec)} accepted, "
             f"{emitted} tokens from {1 if spec else 0} target forward")
    layout = live_layout(title, step, font_size, height=190 + 4 * font_size * max(len(spec), 1),
                         margin=dict(l=70, r=20, t=85, b=50),
                         legend=dict(orientation="h", x=0, y=1.0, yanchor="bottom"),
                         xaxis=dict(title=dict(text="draft position (then the token the target added)"),
                                    range=[0.4, k_max + 1.6], dtick=1, zeroline=False),
                         yaxis=dict(categoryorder="array", categoryarray=labels, autorange="reversed",
                                    zeroline=False))
    return figure(data, layout)


def pq_figure(v: SpecVerification, font_size: int = 12) -> go.Figure:
    """One verification: p (target) and q (draft) of each draft token, and min(1, p/q)."""
    x = [f"{i + 1}: {_piece(d.text, d.token_id)}" for i, d in enumerate(v.drafts)]
    data = [dict(type="bar", name="p (target)", x=x, y=[d.p for d in v.drafts], marker=dict(color=P_COLOR)),
            dict(type="bar", name="q (draft)", x=x, y=[d.q for d in v.drafts], marker=dict(color=Q_COLOR)),
            dict(type="scatter", mode="markers", name="min(1, p/q): acceptance probability", x=x,
                 y=[min(1.0, d.p / d.q) if d.q > 0 else 0.0 for d in v.drafts],
                 marker=dict(size=12, symbol="diamond", color=[SPEC_COLORS[d.outcome] for d in v.drafts],
                             line=dict(width=1, color="#333333")))]
    title = f"{plot_label(v.request_id)} ({v.method}): p and q of each draft token"
    layout = live_layout(title, None, font_size, height=300, barmode="group", margin=dict(l=60, r=20, t=60, b=60),
                         legend=legend_below(), yaxis=dict(range=[0, 1.05], title=dict(text="probability")))
    return figure(data, layout)


NOT_APPLICABLE = "—"  # a table cell with no value (no draft verified): never "None" or NaN


def alpha_cell(accepted: int, proposed: int) -> str:
    """α for a table cell: accepted / proposed as a percentage, "—" when nothing was proposed
    (a run or request without drafts has no acceptance rate, not a rate of None)."""
    return f"{accepted / proposed:.0%}" if proposed else NOT_APPLICABLE


def _verifications(traces: Sequence[StepTrace]) -> list[SpecVerification]:
    return [v for t in traces for v in t.spec]


def acceptance_by_position(traces: Sequence[StepTrace]) -> pd.DataFrame:
    """Per draft position i (1-based): drafts verified there, accepted, α_i = accepted / verified
    ("unverified" drafts, after a rejection, were never tested and do not count)."""
    reached: dict[int, int] = {}
    accepted: dict[int, int] = {}
    for v in _verifications(traces):
        for i, d in enumerate(v.drafts):
            if d.outcome == "unverified":
                break
            reached[i + 1] = reached.get(i + 1, 0) + 1
            accepted[i + 1] = accepted.get(i + 1, 0) + (d.outcome == "accepted")
    rows = [{"position": i, "verified": reached[i], "accepted": accepted[i], "alpha": accepted[i] / reached[i]}
            for i in sorted(reached)]
    return pd.DataFrame(rows, columns=["position", "verified", "accepted", "alpha"])


@dataclass(frozen=True)
class SpecSummary:
    """Speculation totals so far (``spec_summary``); the ratios are None before their first count."""

    verifications: int  # target steps x requests that verified drafts
    proposed: int  # drafts proposed
    accepted: int  # drafts accepted
    alpha: float | None  # accepted / proposed
    mean_accepted: float | None  # accepted drafts per verification
    tokens_per_verification: float | None
    k: int  # the most drafts one verification had


def spec_summary(traces: Sequence[StepTrace]) -> SpecSummary:
    """Totals so far: verifications (target steps x requests), drafts proposed and accepted, α
    (accepted / proposed), mean accepted drafts and mean tokens per verification."""
    vs = _verifications(traces)
    proposed = sum(len(v.drafts) for v in vs)
    accepted = sum(v.num_accepted for v in vs)
    return SpecSummary(verifications=len(vs), proposed=proposed, accepted=accepted,
                       alpha=accepted / proposed if proposed else None,
                       mean_accepted=accepted / len(vs) if vs else None,
                       tokens_per_verification=sum(len(v.emitted) for v in vs) / len(vs) if vs else None,
                       k=max((len(v.drafts) for v in vs), default=0))


def spec_requests_frame(traces: Sequence[StepTrace]) -> pd.DataFrame:
    """Per request: verifications, drafts proposed / accepted, α (``alpha_cell``), tokens per verification."""
    per: dict[str, list[SpecVerification]] = {}
    for v in _verifications(traces):
        per.setdefault(v.request_id, []).append(v)
    rows = []
    for rid in sorted(per, key=request_sort_key):
        vs = per[rid]
        proposed = sum(len(v.drafts) for v in vs)
        accepted = sum(v.num_accepted for v in vs)
        rows.append({"request": request_label(rid), "verifications": len(vs), "proposed": proposed,
                     "accepted": accepted, "alpha": alpha_cell(accepted, proposed),
                     "tokens / verification": sum(len(v.emitted) for v in vs) / len(vs)})
    return pd.DataFrame(rows, columns=["request", "verifications", "proposed", "accepted", "alpha",
                                       "tokens / verification"])


def theory_figure(alpha: float, k: int, c: float, measured_tokens: float | None = None,
                  measured_speedup: float | None = None, font_size: int = 12, k_max: int = 12) -> go.Figure:
    """Two panels over k = 0..k_max for the measured α and draft cost c (a draft step / a target
    step): expected tokens per target step, and expected speedup; the measured points at the
    run's k and the best k marked."""
    ks = list(range(0, k_max + 1))
    tokens = [expected_tokens_per_step(alpha, j) for j in ks]
    speed = [expected_speedup(alpha, j, c) for j in ks]
    best = best_k(alpha, c, k_max)

    def curve(y: list[float], name: str) -> dict[str, Any]:
        return dict(type="scatter", mode="lines+markers", name=name, x=ks, y=y, line=dict(color="#4477AA"),
                    marker=dict(size=5), hovertemplate="k = %{x}: %{y:.2f}<extra></extra>")

    def point(y: float | None, name: str) -> dict[str, Any]:
        return dict(type="scatter", mode="markers", name=name, x=[k] if y is not None else [],
                    y=[y] if y is not None else [], marker=dict(size=13, symbol="star", color="#EE7733"),
                    hovertemplate=f"{name}: %{{y:.2f}} at k = %{{x}}<extra></extra>")

    panels = [
        Panel([curve(tokens, "theory: (1 − α^(k+1)) / (1 − α)"), point(measured_tokens, "measured tokens per step")],
              200, yaxis=dict(title=dict(text="tokens / step")),
              title=f"tokens per target step, α = {alpha:.2f}"),
        Panel([curve(speed, "theory: speedup"), point(measured_speedup, "measured speedup")], 200,
              xaxis=dict(title=dict(text="k (draft tokens per step)"), dtick=1),
              yaxis=dict(title=dict(text="speedup")),
              shapes=[dict(type="line", xref="x", x0=best, x1=best, yref="y domain", y0=0, y1=1,
                           line=dict(color="#228833", dash="dash", width=2))],
              annotations=[dict(xref="x", x=best, yref="y domain", y=1, text=f"best k = {best}", showarrow=False,
                                xanchor="left", yanchor="top")],
              title=f"expected speedup (1 − α^(k+1)) / ((1 − α)(k·c + 1)), c = {c:.3g}"),
    ]
    layout = live_layout(f"Theory for the measured α = {alpha:.2f} and draft cost c = {c:.3g}", None, font_size,
                         legend=legend_below(), margin=dict(l=60, r=20, t=80, b=60))
    return stack(panels, layout, shared_x=True, margin_px=(80, 60))


def tokens_per_step_figure(traces: Sequence[StepTrace], font_size: int = 12, step: int | None = None) -> go.Figure:
    """Per step: the mean tokens each verifying request got from the target forward (1 without
    speculation), and the drafts accepted."""
    steps, mean_tokens, accepted = [], [], []
    for t in traces:
        if t.spec:
            steps.append(step_number(t))
            mean_tokens.append(sum(len(v.emitted) for v in t.spec) / len(t.spec))
            accepted.append(sum(v.num_accepted for v in t.spec))
    data = [dict(type="bar", name="tokens per verifying request", x=steps, y=mean_tokens,
                 marker=dict(color=SPEC_COLORS["accepted"]), hovertemplate="step %{x}: %{y:.2f} tokens<extra></extra>"),
            dict(type="scatter", mode="lines", name="without speculation", x=steps, y=[1.0] * len(steps),
                 line=dict(color="#888888", dash="dot"))]
    layout = live_layout("Tokens per verifying request, per step", step, font_size,
                         height=300, margin=dict(l=60, r=20, t=90, b=50), legend=legend_below(),
                         xaxis=dict(title=dict(text="step")), yaxis=dict(title=dict(text="tokens")),
                         annotations=notes(step_events(traces), font_size, ("rejected draft",)))
    return figure(data, layout)


def token_kinds(traces: Sequence[StepTrace], request_id: str) -> list[tuple[int, str | None, str]]:
    """(token id, piece, how it came) for each token the request received, in order: "accepted"
    (a draft the target accepted), "bonus", "recovered", or "plain" (a step without drafts)."""
    out: list[tuple[int, str | None, str]] = []
    for t in traces:
        mine = [s for s in t.sampled if s.request_id == request_id]
        if not mine:
            continue
        v = next((v for v in t.spec if v.request_id == request_id), None)
        kinds = ["plain"] * len(mine) if v is None else (["accepted"] * v.num_accepted + [v.final_kind])
        out += [(s.token_id, s.text, kind) for s, kind in zip(mine, kinds)]
    return out


def spec_text_markdown(traces: Sequence[StepTrace], request_id: str) -> str:
    """The request's output so far as Markdown: accepted drafts on green, bonus tokens on blue,
    recovered tokens on orange; every piece escaped (model text never reaches Markdown raw)."""
    parts = []
    for token_id, text, kind in token_kinds(traces, request_id):
        piece = escape_markdown(readable(text) if text is not None else f"#{token_id}")
        parts.append(f":{TEXT_MARKS[kind]}-background[{piece}]" if kind in TEXT_MARKS else piece)
    return "".join(parts) or "No output yet."


# -- with vs without speculation (engine.replay.run.compare_speculation) ------------------------------

SPEC_RUN, PLAIN_RUN = SPECULATION_RUNS  # engine.run.compare_speculation's keys
RUN_COLORS = {SPEC_RUN: "#228833", PLAIN_RUN: "#BBBBBB"}


def _decode_only(traces: Sequence[StepTrace]) -> list[StepTrace]:
    return [t for t in traces if t.scheduled and all(c.kind == "decode" for c in t.scheduled)]


def draft_cost(traces: Sequence[StepTrace], plain: Sequence[StepTrace] | None = None) -> float:
    """c = drafting time per draft token / one target step's time. The target step: the median
    decode-only step of the run without speculation when given, else the median forward of this
    run's verifying steps (k + 1 tokens per request: an overestimate of a decode step)."""
    drafted = [t for t in traces if t.spec]
    per_token = sum(t.draft_ms for t in drafted) / max(1, sum(len(v.drafts) for t in drafted for v in t.spec))
    steps = sorted(t.total_ms for t in _decode_only(plain)) if plain else sorted(t.forward_ms for t in drafted)
    target = steps[len(steps) // 2] if steps else 0.0
    return per_token / target if target > 0 else 0.0


def measured_speedup(runs: Mapping[str, PolicyRun]) -> float | None:
    """Engine time without speculation / with it (the same scenario to the end)."""
    spec, plain = runs.get(SPEC_RUN), runs.get(PLAIN_RUN)
    if spec is None or plain is None or spec.engine_ms <= 0:
        return None
    return plain.engine_ms / spec.engine_ms


def comparison_frame(runs: Mapping[str, PolicyRun]) -> pd.DataFrame:
    """One row per run: target steps, output tokens, engine time, tokens per second, α
    (``alpha_cell``: "—" for the run without speculation), and whether every request's text
    equals the other run's."""
    same = runs[SPEC_RUN].outputs == runs[PLAIN_RUN].outputs if {SPEC_RUN, PLAIN_RUN} <= set(runs) else None
    rows = []
    for name in (SPEC_RUN, PLAIN_RUN):
        run = runs.get(name)
        if run is None:
            continue
        tokens = run.num_output_tokens
        ms = run.engine_ms
        rows.append({"run": name, "target steps": run.num_steps, "output tokens": tokens,
                     "engine time (ms)": round(ms, 1), "tokens / s": round(tokens / ms * 1e3, 1) if ms else None,
                     "alpha": alpha_cell(run.num_accepted_tokens, run.num_draft_tokens),
                     "same text as the other run": same})
    return pd.DataFrame(rows)


def comparison_figure(runs: Mapping[str, PolicyRun], font_size: int = 12) -> go.Figure:
    """Cumulative output tokens over target steps, both runs: speculation reaches the end in
    fewer steps when drafts are accepted."""
    data = []
    for name in (SPEC_RUN, PLAIN_RUN):
        run = runs.get(name)
        if run is None:
            continue
        total, xs, ys = 0, [], []
        for t in run.traces:
            total += len(t.sampled)
            xs.append(t.step + 1)
            ys.append(total)
        data.append(dict(type="scatter", mode="lines", name=name, x=xs, y=ys, line=dict(color=RUN_COLORS[name], width=3),
                         hovertemplate=f"{name}: %{{y}} tokens after %{{x}} steps<extra></extra>"))
    speed = measured_speedup(runs)
    title = "Output tokens over target steps" + (f" — engine time ×{speed:.2f} faster with speculation"
                                                  if speed else "")
    layout = live_layout(title, None, font_size, height=320, margin=dict(l=60, r=20, t=60, b=50),
                         legend=legend_below(), xaxis=dict(title=dict(text="target steps")),
                         yaxis=dict(title=dict(text="output tokens")))
    return figure(data, layout)
